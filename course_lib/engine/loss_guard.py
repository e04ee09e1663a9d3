"""The non-finite loss guard: the engine hands it every micro-batch loss (a device tensor, no sync)
and asks it every `train.SYNC_EVERY_STEPS` optimizer steps whether one of them was NaN or infinite.
If so the run stops with `NonFiniteLossError`, naming the first bad optimizer step and the likely
causes, instead of training on for hours with NaN weights.
"""
from __future__ import annotations

import torch


class NonFiniteLossError(RuntimeError):
    """The loss became NaN or infinite; the message names the step and the likely causes."""


class LossGuard:
    """Holds the losses since the last check; `check` reads them (one CPU-GPU sync) and raises
    NonFiniteLossError on the first NaN/inf.

        guard = LossGuard(config.accumulation_steps, config.lr, precision)
        guard.add(loss)                         # every micro-batch
        values = guard.check(epoch, step)       # every few optimizer steps: CPU losses since the last check
    """

    def __init__(self, accumulation_steps: int, lr: float, precision: str):
        self.accumulation_steps, self.lr, self.precision = accumulation_steps, lr, precision
        self.pending: list[torch.Tensor] = []  # one loss per micro-batch, on the device

    def add(self, loss: torch.Tensor) -> None:
        self.pending.append(loss.detach())

    def check(self, epoch: int, step: int) -> torch.Tensor:
        """The pending losses as a float CPU tensor (then forgotten). `epoch` is 0-based, `step`
        the 1-based optimizer step of this epoch that the last added loss belongs to."""
        values = torch.stack(self.pending).float().cpu()  # note: a CPU-GPU sync point
        self.pending = []
        bad = (~torch.isfinite(values)).nonzero()
        if len(bad):
            index = int(bad[0])
            first_step = step - len(values) // self.accumulation_steps + 1
            raise NonFiniteLossError(f"loss became {values[index].item()} at epoch {epoch + 1}, step "
                                     f"{first_step + index // self.accumulation_steps}; likely causes: "
                                     f"{'; '.join(self.likely_causes())}")
        return values

    def likely_causes(self) -> list[str]:
        """What most often makes a loss NaN/inf, most likely first, each with its fix."""
        if self.precision == "fp16":
            numeric = "fp16 overflow (try precision=bf16 or off)"
        elif self.precision != "off":
            numeric = "fp16/bf16 overflow (try precision=off)"
        else:
            numeric = "exploding gradients (try grad_clip_norm=1.0)"
        return [f"a learning rate too high for this model and batch (lr={self.lr:g}; try 10x lower or "
                "warmup_epochs>0)", "inputs that are not normalized or contain NaN/inf", numeric]
