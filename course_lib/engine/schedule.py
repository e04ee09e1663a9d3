"""Optimizers and learning-rate schedules: SGD with momentum or AdamW (Loshchilov & Hutter 2019,
"Decoupled Weight Decay Regularization", arXiv:1711.05101), linear warmup (Goyal et al. 2017,
"Accurate, Large Minibatch SGD", arXiv:1706.02677) then cosine decay (Loshchilov & Hutter 2017,
"SGDR", arXiv:1608.03983), built from torch.optim.lr_scheduler and stepped once per optimizer step.
"""
from __future__ import annotations

import math

import torch
from torch.optim.lr_scheduler import CosineAnnealingLR, LinearLR, SequentialLR

from course_lib.config import Config, ConfigError


def make_optimizer(model: torch.nn.Module, config: Config) -> torch.optim.Optimizer:
    """SGD (heavy-ball momentum, L2 weight decay) or AdamW (decoupled weight decay).
    Biases and normalization weights get no weight decay: shrinking them only hurts."""
    decay, no_decay = [], []
    for parameter in model.parameters():
        if parameter.requires_grad:
            (no_decay if parameter.ndim <= 1 else decay).append(parameter)
    groups = [{"params": decay, "weight_decay": config.weight_decay},
              {"params": no_decay, "weight_decay": 0.0}]
    if config.optimizer == "sgd":
        return torch.optim.SGD(groups, lr=config.lr, momentum=config.momentum)
    if config.optimizer == "adamw":
        return torch.optim.AdamW(groups, lr=config.lr)
    raise ConfigError(f"optimizer={config.optimizer!r} is not one of sgd, adamw")


def warmup_steps_for(config: Config, steps_per_epoch: int) -> int:
    return int(round(config.warmup_epochs * steps_per_epoch))


def make_scheduler(optimizer: torch.optim.Optimizer, config: Config, steps_per_epoch: int):
    """Linear warmup over `warmup_epochs`, then cosine decay to `min_lr` at the last step.
    Call `.step()` after every optimizer step (not every epoch)."""
    total_steps = max(1, config.epochs * steps_per_epoch)
    warmup_steps = min(warmup_steps_for(config, steps_per_epoch), total_steps - 1)
    eta_min = min(config.min_lr, config.lr)
    cosine = CosineAnnealingLR(optimizer, T_max=max(1, total_steps - warmup_steps), eta_min=eta_min)
    if warmup_steps <= 0:
        return cosine
    # start_factor 1/(W+1): step i of warmup uses lr * (i+1)/(W+1), reaching lr exactly at step W.
    warmup = LinearLR(optimizer, start_factor=1.0 / (warmup_steps + 1), end_factor=1.0, total_iters=warmup_steps)
    return SequentialLR(optimizer, [warmup, cosine], milestones=[warmup_steps])


def learning_rate_at(step: int, config: Config, steps_per_epoch: int) -> float:
    """The closed form of `make_scheduler` (what tests check the scheduler against)."""
    total_steps = max(1, config.epochs * steps_per_epoch)
    warmup_steps = min(warmup_steps_for(config, steps_per_epoch), total_steps - 1)
    eta_min = min(config.min_lr, config.lr)
    if step < warmup_steps:
        return config.lr * (step + 1) / (warmup_steps + 1)
    progress = (step - warmup_steps) / max(1, total_steps - warmup_steps)
    return eta_min + (config.lr - eta_min) * (1 + math.cos(math.pi * progress)) / 2


def schedule_values(config: Config, steps_per_epoch: int) -> list[float]:
    """The learning rate of every optimizer step of a run, read from the real scheduler
    (for plotting the schedule without training)."""
    model = torch.nn.Linear(1, 1)
    optimizer = make_optimizer(model, config)
    scheduler = make_scheduler(optimizer, config, steps_per_epoch)
    values = []
    for _ in range(max(1, config.epochs * steps_per_epoch)):
        values.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    return values
