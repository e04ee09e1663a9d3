"""A run's curves for TensorBoard (`Config.tensorboard`): `torch.utils.tensorboard.SummaryWriter` event
files in output_dir/tensorboard/<run>/ (one folder per run, named by its start time, as TensorBoard
expects), which `tensorboard --logdir runs` shows beside every other run.

Written by rank 0 as the run goes, so a run still training shows its curves so far:
- `step/loss` and `step/lr` for every optimizer step (x: the run's global step);
- `epoch/<name>` for every number of the epoch's history row (x: the epoch): train and validation loss
  and top-1, images/s, the data-wait share, epoch seconds, peak memory, and the EMA/SWA/TTA scores when
  the run has them;
- `step/grad_norm` for every step with `grad_norm_log`;
- `utilisation/<name>` for every sample of `monitor_interval`'s monitor (process CPU %, resident memory,
  and per GPU its utilisation, memory and power), at the sample's wall-clock time.
The ledger and the history stay the record; these files are the view a PyTorch user expects.
"""
from __future__ import annotations

import math
import os
import time
from pathlib import Path

from course_lib.config import ConfigError

FOLDER = "tensorboard"  # inside output_dir


def _number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


class TensorBoardLog:
    """The event-file writer of one run; `close()` when done (fit does, whatever ends the run)."""

    def __init__(self, folder: str | Path):
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError:  # torch's module needs the tensorboard package, which writes the event files
            raise ConfigError("tensorboard=true needs the tensorboard package: pip install tensorboard "
                              "(`make venv` installs it)") from None
        self.folder = Path(folder)
        self.writer = SummaryWriter(log_dir=str(self.folder))
        self._steps_written = self._grad_norms_written = 0
        self._started = time.time()

    @classmethod
    def for_run(cls, folder: str | Path) -> TensorBoardLog:
        """A log in a new run folder under `folder`: `<date>-<time>-<pid>`, so reruns sit side by side."""
        return cls(Path(folder) / f"{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}")

    def steps(self, rows: list[dict]) -> None:
        """The run's optimizer steps not written yet (`RunState.step_log`: step, lr, loss)."""
        for row in rows[self._steps_written:]:
            self.writer.add_scalar("step/loss", row["loss"], row["step"])
            self.writer.add_scalar("step/lr", row["lr"], row["step"])
        self._steps_written = len(rows)

    def epoch(self, row: dict) -> None:
        """Every finite number of an epoch's history row, at its epoch."""
        for name, value in row.items():
            if name != "epoch" and _number(value):
                self.writer.add_scalar(f"epoch/{name}", value, row["epoch"])
        self.writer.flush()

    def grad_norms(self, rows: list[dict]) -> None:
        """The gradient-norm log's rows not written yet (`GradientNormLog.rows`: global_step, grad_norm)."""
        for row in rows[self._grad_norms_written:]:
            if _number(row["grad_norm"]):
                self.writer.add_scalar("step/grad_norm", row["grad_norm"], row["global_step"])
        self._grad_norms_written = len(rows)

    def utilisation(self, samples: list[dict], started_wall_time: float | None = None) -> None:
        """The monitor's samples (`UtilisationMonitor.samples`: seconds since its start, then its readings)."""
        start = self._started if started_wall_time is None else started_wall_time
        for index, sample in enumerate(samples):
            for name, value in sample.items():
                if name != "seconds" and _number(value):
                    self.writer.add_scalar(f"utilisation/{name}", value, index, walltime=start + sample["seconds"])

    def close(self) -> None:
        self.writer.flush()
        self.writer.close()


def read_scalars(folder: str | Path) -> dict[str, list[tuple[int, float]]]:
    """Every scalar series of the event files in `folder`, tag -> [(step, value), ...], read back with
    TensorBoard's own reader (what its web page would plot)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    accumulator = EventAccumulator(str(folder), size_guidance={"scalars": 0})  # 0: keep every point
    accumulator.Reload()
    return {tag: [(event.step, event.value) for event in accumulator.Scalars(tag)]
            for tag in accumulator.Tags()["scalars"]}
