"""Gradient accumulation: N micro-batches of B images, each loss divided by N, add up to the
gradient of one batch of N*B images, so a small-memory device can train with a large batch.
The equivalence is exact only when no layer mixes images within a batch: BatchNorm normalises
with per-batch statistics, so its micro-batch gradients differ (Ioffe & Szegedy 2015,
arXiv:1502.03167). Every loop here calls `step.training_step` (the micro-step that divides the
loss by N) and `step.optimizer_step`, exactly as the engine's `train.train_one_epoch` does.
"""
from __future__ import annotations

import copy

import torch

from course_lib.engine.precision import grad_scaler
from course_lib.engine.step import optimizer_step, training_step


def batch_gradients(model: torch.nn.Module, loss_function, images: torch.Tensor,
                    targets: torch.Tensor) -> dict[str, torch.Tensor]:
    """Gradient of the mean loss over the whole batch, per parameter name (the model is copied,
    so its weights, gradients and BatchNorm statistics are left untouched)."""
    return accumulated_gradients(model, loss_function, images, targets, accumulation_steps=1)


def accumulated_gradients(model: torch.nn.Module, loss_function, images: torch.Tensor, targets: torch.Tensor,
                          accumulation_steps: int) -> dict[str, torch.Tensor]:
    """Gradient after `accumulation_steps` backward passes over equal micro-batches, each loss
    divided by `accumulation_steps`."""
    if len(images) % accumulation_steps:
        raise ValueError(f"{len(images)} images do not split into {accumulation_steps} equal micro-batches")
    model = copy.deepcopy(model).train()
    model.zero_grad(set_to_none=True)
    scaler = grad_scaler("off", images.device)  # disabled: fp32 gradients, passed straight through
    for micro_images, micro_targets in zip(images.chunk(accumulation_steps), targets.chunk(accumulation_steps)):
        # .grad adds up across backward calls until zero_grad
        training_step(model, micro_images, micro_targets, loss_function, scaler,
                      accumulation_steps=accumulation_steps)
    return {name: p.grad.detach().clone() for name, p in model.named_parameters() if p.grad is not None}


def max_relative_difference(first: dict[str, torch.Tensor], second: dict[str, torch.Tensor]) -> float:
    """The largest |a - b| / max|a| over all parameters (0 = identical gradients)."""
    worst = 0.0
    for name, a in first.items():
        b = second[name]
        scale = a.abs().max().clamp_min(1e-12)
        worst = max(worst, ((a - b).abs().max() / scale).item())
    return worst


def step_peak_bytes(model: torch.nn.Module, micro_batch: int, accumulation_steps: int, image_size: int,
                    num_classes: int, device="cpu", precision: str = "off") -> int:
    """Peak bytes allocated during one optimizer step made of `accumulation_steps` micro-batches of
    `micro_batch` random images, above what was live before (weights and optimizer state):
    activations, gradients and temporaries. CUDA: the allocator's peak; CPU: the profiler's tensor
    accounting (`instruments.peak_memory.peak_bytes_during`)."""
    import torch.nn.functional as F

    from course_lib.instruments.peak_memory import peak_bytes_during

    device = torch.device(device)
    model = copy.deepcopy(model).to(device).train()
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)
    scaler = grad_scaler(precision, device)

    def one_step():
        for _ in range(accumulation_steps):
            images = torch.randn(micro_batch, 3, image_size, image_size, device=device)
            targets = torch.randint(0, num_classes, (micro_batch,), device=device)
            training_step(model, images, targets, F.cross_entropy, scaler, precision,
                          accumulation_steps=accumulation_steps)
        optimizer_step(optimizer, scaler)

    one_step()  # creates the momentum buffers, so the measured step starts like every later one
    return peak_bytes_during(one_step, device)
