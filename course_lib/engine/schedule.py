"""Optimizers and learning-rate schedules: SGD with momentum, AdamW (Loshchilov & Hutter 2019,
"Decoupled Weight Decay Regularization", arXiv:1711.05101) or Muon on the conv kernels with SGD on the rest
(`engine/muon.py`; every group follows the schedule in proportion to its own peak), linear warmup (Goyal et al. 2017,
"Accurate, Large Minibatch SGD", arXiv:1706.02677) then `Config.lr_schedule`: cosine decay
(Loshchilov & Hutter 2017, "SGDR", arXiv:1608.03983), linear decay to the floor (airbench's
schedule, arXiv:2404.00498), a constant rate (the control), steps of x0.1 (He et al. 2016,
arXiv:1512.03385), or one-cycle (Smith & Topin 2019, "Super-Convergence", arXiv:1708.07120, as torch's
OneCycleLR). Built from torch.optim.lr_scheduler and stepped once per optimizer step;
`learning_rate_at` is each schedule's closed form, which the tests hold the schedulers to.
"""
from __future__ import annotations

import math

import torch
from torch.optim.lr_scheduler import CosineAnnealingLR, LambdaLR, LinearLR, MultiStepLR, OneCycleLR, SequentialLR

from course_lib.config import Config, ConfigError
from course_lib.engine.muon import Muon, muon_parameters

OPTIMIZERS = ("sgd", "adamw", "muon")  # Config.optimizer's values


def make_optimizer(model: torch.nn.Module, config: Config) -> torch.optim.Optimizer:
    """SGD (heavy-ball momentum, L2 weight decay), AdamW (decoupled weight decay), or Muon: the conv kernels but
    the stem orthogonalised at `muon_lr` with Nesterov momentum `momentum` and no weight decay (their norm is held
    fixed instead), everything else SGD as above (`engine.muon.Muon`). Biases and normalization weights get no
    weight decay: shrinking them only hurts. Group 0 is always the decayed group at `lr` (the engine logs its lr)."""
    orthogonalised = {id(p) for p in muon_parameters(model)} if config.optimizer == "muon" else set()
    decay, no_decay = [], []
    for parameter in model.parameters():
        if parameter.requires_grad and id(parameter) not in orthogonalised:
            (no_decay if parameter.ndim <= 1 else decay).append(parameter)
    groups = [{"params": decay, "weight_decay": config.weight_decay},
              {"params": no_decay, "weight_decay": 0.0}]
    if config.optimizer == "sgd":
        return torch.optim.SGD(groups, lr=config.lr, momentum=config.momentum)
    if config.optimizer == "adamw":
        return torch.optim.AdamW(groups, lr=config.lr)
    if config.optimizer == "muon":
        kernels = [p for p in model.parameters() if id(p) in orthogonalised]
        return Muon(groups + [{"params": kernels, "muon": True, "lr": config.muon_lr, "weight_decay": 0.0}],
                    lr=config.lr, momentum=config.momentum)
    raise ConfigError(f"optimizer={config.optimizer!r} is not one of {', '.join(OPTIMIZERS)}")


def steps_per_epoch(images: int, config: Config, world_size: int = 1) -> int:
    """Optimizer steps in an epoch of `images` training images: each of `world_size` ranks takes its
    share in batches of `config.batch_size` (the engine drops the last partial batch), `accumulation_steps`
    batches make a step, and `max_steps` caps it (0: no cap). The one rule the engine's loaders follow
    (`train.prepare`) and the chapters use to size a schedule or an EMA before training."""
    steps = images // max(1, world_size) // config.batch_size // config.accumulation_steps
    return min(steps, config.max_steps) if config.max_steps else steps


def warmup_steps_for(config: Config, steps_per_epoch: int) -> int:
    return int(round(config.warmup_epochs * steps_per_epoch))


SCHEDULES = ("cosine", "linear", "constant", "step", "onecycle")  # Config.lr_schedule's values
STEP_MILESTONES = (0.5, 0.75)  # step: fractions of the steps after warmup where the rate drops
STEP_GAMMA = 0.1  # step: the factor of each drop
# onecycle: torch's defaults (Smith & Topin): start at lr / 25, end at lr / (25 x 1e4); the rise
# takes the warmup's share of the run, or 30% when there is no warmup.
ONECYCLE_DIV, ONECYCLE_FINAL_DIV, ONECYCLE_RISE = 25.0, 1e4, 0.3


def _phases(config: Config, steps_per_epoch: int) -> tuple[int, int]:
    """(total optimizer steps, warmup steps), the warmup leaving at least one step of decay."""
    total_steps = max(1, config.epochs * steps_per_epoch)
    return total_steps, min(warmup_steps_for(config, steps_per_epoch), total_steps - 1)


def _step_milestones(decay_steps: int) -> list[int]:
    return [max(1, round(fraction * decay_steps)) for fraction in STEP_MILESTONES]


def _onecycle_rise(config: Config, total_steps: int, warmup_steps: int) -> float:
    return warmup_steps / total_steps if warmup_steps > 0 else ONECYCLE_RISE


def make_scheduler(optimizer: torch.optim.Optimizer, config: Config, steps_per_epoch: int):
    """Linear warmup over `warmup_epochs`, then `config.lr_schedule` to the last step (onecycle:
    torch's OneCycleLR, whose rise replaces the warmup). Call `.step()` after every optimizer
    step (not every epoch)."""
    total_steps, warmup_steps = _phases(config, steps_per_epoch)
    if config.lr_schedule == "onecycle":
        # OneCycleLR sets every group's rate from max_lr: Muon's kernels peak at their own muon_lr.
        peaks = [config.muon_lr if group.get("muon") else config.lr for group in optimizer.param_groups]
        return OneCycleLR(optimizer, max_lr=peaks, total_steps=total_steps,
                          pct_start=_onecycle_rise(config, total_steps, warmup_steps), anneal_strategy="cos",
                          div_factor=ONECYCLE_DIV, final_div_factor=ONECYCLE_FINAL_DIV)
    decay_steps = max(1, total_steps - warmup_steps)
    eta_min = min(config.min_lr, config.lr)
    if config.lr_schedule == "cosine":
        decay = CosineAnnealingLR(optimizer, T_max=decay_steps, eta_min=eta_min)
    elif config.lr_schedule == "linear":
        decay = LinearLR(optimizer, start_factor=1.0, end_factor=eta_min / config.lr if config.lr else 0.0,
                         total_iters=decay_steps)
    elif config.lr_schedule == "step":
        decay = MultiStepLR(optimizer, milestones=_step_milestones(decay_steps), gamma=STEP_GAMMA)
    elif config.lr_schedule == "constant":
        decay = LambdaLR(optimizer, lambda step: 1.0)
    else:
        raise ConfigError(f"lr_schedule={config.lr_schedule!r} is not one of {', '.join(SCHEDULES)}")
    if warmup_steps <= 0:
        return decay
    # start_factor 1/(W+1): step i of warmup uses lr * (i+1)/(W+1), reaching lr exactly at step W.
    warmup = LinearLR(optimizer, start_factor=1.0 / (warmup_steps + 1), end_factor=1.0, total_iters=warmup_steps)
    return SequentialLR(optimizer, [warmup, decay], milestones=[warmup_steps])


def _annealed(start: float, end: float, fraction: float) -> float:
    """Cosine from `start` (fraction 0) to `end` (fraction 1)."""
    return end + (start - end) * (1 + math.cos(math.pi * fraction)) / 2


def learning_rate_at(step: int, config: Config, steps_per_epoch: int) -> float:
    """The closed form of `make_scheduler` (what tests check the schedulers against)."""
    total_steps, warmup_steps = _phases(config, steps_per_epoch)
    if config.lr_schedule == "onecycle":  # OneCycleLR's two phases, as its documentation writes them
        start = config.lr / ONECYCLE_DIV
        peak_step = float(_onecycle_rise(config, total_steps, warmup_steps) * total_steps) - 1
        if step <= peak_step:
            return _annealed(start, config.lr, step / peak_step)
        return _annealed(config.lr, start / ONECYCLE_FINAL_DIV, (step - peak_step) / (total_steps - 1 - peak_step))
    eta_min = min(config.min_lr, config.lr)
    if step < warmup_steps:
        return config.lr * (step + 1) / (warmup_steps + 1)
    decay_steps = max(1, total_steps - warmup_steps)
    progress = (step - warmup_steps) / decay_steps
    if config.lr_schedule == "linear":
        return config.lr + (eta_min - config.lr) * progress
    if config.lr_schedule == "step":
        drops = sum(step - warmup_steps >= milestone for milestone in _step_milestones(decay_steps))
        return config.lr * STEP_GAMMA ** drops
    if config.lr_schedule == "constant":
        return config.lr
    return _annealed(config.lr, eta_min, progress)


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
