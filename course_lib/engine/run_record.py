"""The ledger row of a training run (kind "train"): written once, by rank 0, when the run ends,
with status "ok" and the last epoch's metrics plus a summary, or "failed" with the error (an
interrupted run too). `workbook ledger --kind train` lists them; `train.recorded_compile_runs`
reads them back.
"""
from __future__ import annotations

import time

import torch

from course_lib import ledger
from course_lib.config import Config


class RunRecorder:
    """`succeeded(...)` or `failed(...)` once per run; other ranks than 0 record nothing."""

    def __init__(self, config: Config, is_main: bool, world_size: int, device: torch.device, started: float):
        self.config, self.is_main, self.world_size, self.device = config, is_main, world_size, device
        self.started = started  # time.perf_counter() when the run began

    def succeeded(self, history: list[dict], precision: str, **summary) -> int | None:
        return self._record("ok", history, precision, summary)

    def failed(self, history: list[dict], precision: str, error: BaseException) -> int | None:
        return self._record("failed", history, precision, {"error": f"{type(error).__name__}: {error}"[:500]})

    def _record(self, status: str, history: list[dict], precision: str, extra: dict) -> int | None:
        if not self.is_main:
            return None
        metrics = {**(history[-1] if history else {}), **extra}
        # Every epoch's speed, not only the last: repeated timings give a noise estimate (notebook 10's DDP stage).
        metrics["epoch_images_per_second"] = [row["images_per_second"] for row in history if "images_per_second" in row]
        parameters = {**self.config.to_dict(), "precision_used": precision, "device_used": str(self.device),
                      "world_size": self.world_size}
        return ledger.record("train", self.config.model, status=status,
                             duration_seconds=time.perf_counter() - self.started, parameters=parameters,
                             metrics=metrics)
