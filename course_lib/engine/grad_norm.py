"""The gradient-norm log and its two detectors. With `grad_norm_log=true`, `step.optimizer_step` hands
it the total L2 norm of each step's gradients (the value `clip_grad_norm_` returns, before clipping;
a device tensor, no sync), and the engine reads the pending norms every `train.SYNC_EVERY_STEPS`
steps, like the loss guard. Two detectors then name a problem in one line, with its step:
- vanishing gradients: the norm stayed below `vanishing_grad_norm` for `vanishing_grad_steps` steps;
- exploding gradients: a step's norm over `exploding_grad_factor` times the median of the previous
  `EXPLODING_WINDOW` norms.
Unlike a NaN loss these do not stop the run (it may recover); they are logged and kept in the ledger.
The second article's advice: watch the gradient norms during training (Pascanu et al. 2013,
"On the difficulty of training recurrent neural networks", arXiv:1211.5063, names both failures).
"""
from __future__ import annotations

import csv
import math
from collections import deque
from pathlib import Path

import numpy as np
import torch

LOG_FILE = "grad_norms.csv"
EXPLODING_WINDOW = 10  # previous steps whose median a jump is measured against


class GradientNormLog:
    """Holds the norms since the last check; `check` reads them (one CPU-GPU sync), runs the detectors
    and returns their one-line findings.

        norms = GradientNormLog(floor=1e-4, patience=20, factor=10.0)
        norms.add(total_norm)                             # every optimizer step (step.optimizer_step)
        for line in norms.check(epoch, step, global_step):  # every few steps
            log(line)
    """

    def __init__(self, floor: float = 1e-4, patience: int = 20, factor: float = 10.0):
        self.floor, self.patience, self.factor = floor, patience, factor
        self.pending: list[torch.Tensor] = []
        self.rows: list[dict] = []  # epoch (1-based), step (1-based, in its epoch), global_step, grad_norm
        self.findings: list[str] = []
        self._below = 0  # consecutive steps under the floor so far
        self._below_since: dict | None = None
        self._recent: deque[float] = deque(maxlen=EXPLODING_WINDOW)

    @classmethod
    def from_config(cls, config) -> GradientNormLog:
        return cls(config.vanishing_grad_norm, config.vanishing_grad_steps, config.exploding_grad_factor)

    def add(self, norm: torch.Tensor) -> None:
        self.pending.append(norm.detach())

    def check(self, epoch: int, step: int, global_step: int) -> list[str]:
        """Read the pending norms; `epoch` is 0-based, `step` the 1-based step of this epoch and
        `global_step` the run's step count that the last added norm belongs to. Returns new findings."""
        if not self.pending:
            return []
        values = torch.stack(self.pending).float().cpu().tolist()  # note: a CPU-GPU sync point
        self.pending = []
        found = []
        for offset, value in enumerate(values):
            back = len(values) - 1 - offset
            row = {"epoch": epoch + 1, "step": step - back, "global_step": global_step - back, "grad_norm": value}
            self.rows.append(row)
            found += self._detect(row)
        self.findings += found
        return found

    def _detect(self, row: dict) -> list[str]:
        value, found = row["grad_norm"], []
        if not math.isfinite(value):  # fp16 overflow: GradScaler skips that step and counts it
            return found
        where = f"epoch {row['epoch']}, step {row['step']} (run step {row['global_step']})"
        if self.factor > 0 and len(self._recent) >= 2:
            typical = float(np.median(self._recent))
            if typical > 0 and value > self.factor * typical:
                found.append(f"exploding gradients at {where}: the gradient norm jumped to {value:.3g}, "
                             f"{value / typical:.1f}x the median {typical:.3g} of the previous {len(self._recent)} "
                             f"steps (exploding_grad_factor={self.factor:g}); try grad_clip_norm=1.0, a lower lr or "
                             "warmup_epochs>0")
        self._recent.append(value)
        if value < self.floor:
            self._below += 1
            self._below_since = self._below_since or row
            if self._below == self.patience:
                start = self._below_since
                found.append(f"vanishing gradients at {where}: the gradient norm stayed below {self.floor:g} for "
                             f"{self.patience} steps since epoch {start['epoch']}, step {start['step']} "
                             f"(now {value:.3g}); check the lr (too low?), a frozen backbone, or saturated activations")
        else:
            self._below, self._below_since = 0, None
        return found

    @property
    def norms(self) -> list[float]:
        return [row["grad_norm"] for row in self.rows]

    def summary(self) -> dict:
        """Flat numbers for the ledger row (prefixed `grad_norm_`) plus a short series for the report's plot."""
        from course_lib.engine.monitor import downsample

        finite = [v for v in self.norms if math.isfinite(v)]
        out = {"grad_norm_steps": len(self.rows), "grad_norm_findings": list(self.findings)}
        if finite:
            out.update(grad_norm_first=finite[0], grad_norm_last=finite[-1], grad_norm_min=min(finite),
                       grad_norm_max=max(finite), grad_norm_median=float(np.median(finite)),
                       grad_norm_series=downsample(finite))
        return out

    def summary_line(self) -> str:
        from course_lib.engine.monitor import sparkline

        summary = self.summary()
        if "grad_norm_median" not in summary:
            return f"gradient norms: {summary['grad_norm_steps']} steps, none finite"
        verdict = f"{len(self.findings)} finding(s) above" if self.findings else "no vanishing or exploding gradients"
        return (f"gradient norms over {summary['grad_norm_steps']} steps: first {summary['grad_norm_first']:.3g}, "
                f"last {summary['grad_norm_last']:.3g}, min {summary['grad_norm_min']:.3g}, max "
                f"{summary['grad_norm_max']:.3g}; {verdict}\n  gradient norm: {sparkline(summary['grad_norm_series'])}")

    def write_csv(self, path: str | Path) -> Path:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("w", newline="") as handle:
            writer = csv.DictWriter(handle, fieldnames=["epoch", "step", "global_step", "grad_norm"])
            writer.writeheader()
            writer.writerows(self.rows)
        return path
