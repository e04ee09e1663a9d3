"""The training step, written once: `training_step` runs one micro-batch (forward under autocast,
loss, scaled backward of loss / accumulation_steps) and `optimizer_step` applies what the
micro-batches added up (unscale and clip when asked, GradScaler step and update, zero_grad).

The engine (`train.train_one_epoch`), the memory probe (`measure.memory_probe.TrainingStepProbe`), the
DDP probe (`ddp_probe`), the learning-rate range test (`lr_finder`) and gradient accumulation
(`accumulation`) all call these two, so what they measure is the step the engine trains with.
Each part runs inside a named `torch.profiler.record_function` region ("forward", "backward",
"optimizer"), so a trace groups the step's operators by part (notebook 14); with no profiler
running `region` opens none (an open one costs about 18 us, measured on the 2 shared cores here). One code path for every precision, as in nanoGPT: autocast is a no-op for "off" and a disabled
GradScaler passes every call straight through (`precision.grad_scaler`). Mixed precision and loss
scaling: Micikevicius et al. 2018, arXiv:1710.03740; https://pytorch.org/docs/stable/amp.html.
"""
from __future__ import annotations

from contextlib import nullcontext

import torch
from torch.profiler import record_function

from course_lib.engine.precision import autocast


def region(name: str):
    """A named `torch.profiler` region while a profiler runs, else a no-op context (a flag read)."""
    return record_function(name) if torch.autograd.profiler._is_profiler_enabled else nullcontext()


def training_step(model: torch.nn.Module, images: torch.Tensor, targets: torch.Tensor, criterion,
                  scaler: torch.amp.GradScaler, precision: str = "off", *, accumulation_steps: int = 1,
                  sync_gradients: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """One micro-step on a batch already on the device; returns (loss, logits), detached.

    The loss is divided by `accumulation_steps` before backward, so that N micro-batches add up
    to the mean gradient of one batch N times larger. `sync_gradients=False` runs the backward
    under DDP's `no_sync()`: the gradients add up locally without the all-reduce, which is only
    needed on the last micro-batch of a step (the model must then be a DistributedDataParallel)."""
    with nullcontext() if sync_gradients else model.no_sync():
        with autocast(precision, images.device), region("forward"):
            logits = model(images)
            loss = criterion(logits, targets)
        with region("backward"):
            scaler.scale(loss / accumulation_steps).backward()
    return loss.detach(), logits.detach()


def optimizer_step(optimizer: torch.optim.Optimizer, scaler: torch.amp.GradScaler, *,
                   clip_norm: float = 0.0, norm_log=None) -> bool:
    """Apply the accumulated gradients and clear them. Returns True when GradScaler skipped the
    step because fp16 gradients overflowed (always False without fp16).

    `clip_norm > 0` clips the global L2 norm of the optimizer's gradients to `clip_norm` first
    (parameters without a gradient, such as a frozen backbone's, are left out). `norm_log` (a
    `grad_norm.GradientNormLog`) is handed that norm, before clipping, as a device tensor."""
    with region("optimizer"):
        return _optimizer_step(optimizer, scaler, clip_norm, norm_log)


def _optimizer_step(optimizer, scaler, clip_norm: float, norm_log) -> bool:
    if clip_norm > 0 or norm_log is not None:
        scaler.unscale_(optimizer)  # clip and log the true gradients, not the scaled ones
        parameters = [p for group in optimizer.param_groups for p in group["params"] if p.grad is not None]
        if clip_norm > 0:
            norm = torch.nn.utils.clip_grad_norm_(parameters, clip_norm)  # returns the norm before clipping
        else:
            norm = torch.nn.utils.get_total_norm([p.grad for p in parameters])
        if norm_log is not None:
            norm_log.add(norm)
    # note: get_scale() is a CPU-GPU sync point; it only happens when fp16 scaling is on.
    scale_before = scaler.get_scale() if scaler.is_enabled() else 0.0
    scaler.step(optimizer)  # skips optimizer.step() when the unscaled gradients hold inf/NaN
    scaler.update()
    optimizer.zero_grad(set_to_none=True)  # set_to_none frees the gradients until the next backward
    return scaler.is_enabled() and scaler.get_scale() < scale_before  # the scale only shrinks after a skip
