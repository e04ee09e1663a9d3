"""The learning-rate range test (Smith 2017, "Cyclical Learning Rates for Training Neural
Networks", arXiv:1506.01186): train briefly while the learning rate grows exponentially and
watch the loss. Where the smoothed loss is lowest is the largest learning rate that still trains
stably; past it the loss turns up and then diverges.
"""
from __future__ import annotations

import dataclasses
import itertools
import math

import torch

from course_lib.config import Config


@dataclasses.dataclass
class RangeTestResult:
    learning_rates: list[float]  # one per step
    losses: list[float]  # raw loss of each step
    smoothed_losses: list[float]  # exponential moving average, bias-corrected
    largest_stable_lr: float  # the learning rate at the smoothed loss's minimum
    diverged_at: float | None  # the learning rate where the smoothed loss exceeded divergence_factor x its minimum
    optimizer: str

    def plot(self, axis=None, label: str | None = None):
        import matplotlib.pyplot as plt

        axis = axis or plt.gca()
        line, = axis.plot(self.learning_rates, self.smoothed_losses, label=label or self.optimizer)
        axis.axvline(self.largest_stable_lr, color=line.get_color(), linestyle="--", linewidth=1)
        axis.set_xscale("log")
        axis.set_xlabel("learning rate")
        axis.set_ylabel("smoothed training loss")
        return axis


def lr_range_test(config: Config, bundle=None, *, start_lr: float = 1e-5, end_lr: float = 10.0, steps: int = 100,
                  smoothing: float = 0.8, divergence_factor: float = 4.0, progress: bool = True) -> RangeTestResult:
    """Run `steps` optimizer steps with the learning rate growing from `start_lr` to `end_lr`
    (a fresh model from `config`; nothing is saved). Stops early once the loss diverges. `progress`
    shows a transient bar of the steps (a test of 100 steps takes minutes on a CPU)."""
    from course_lib.data import pipeline
    from course_lib.data.loaders import make_loader
    from course_lib.devices import resolve_device
    from course_lib.engine import auto_precision
    from course_lib.engine.label_smoothing import make_criterion
    from course_lib.engine.precision import grad_scaler
    from course_lib.engine.schedule import make_optimizer
    from course_lib.engine.step import optimizer_step, training_step
    from course_lib.engine.train import seed_everything, stage_batch
    from course_lib.instruments.progress import Progress
    from course_lib.models.factory import build_model

    device = resolve_device(config.device)
    seed_everything(config.seed)
    bundle = bundle or pipeline.build_datasets(config)
    model = build_model(config, len(bundle.classes)).to(
        device, memory_format=torch.channels_last if config.channels_last else torch.preserve_format).train()
    precision = auto_precision.resolve(config.precision, model, config.image_size, len(bundle.classes), device,
                                       batch_size=config.batch_size, channels_last=config.channels_last)
    optimizer = make_optimizer(model, config.replace(lr=start_lr, min_lr=0.0))  # no schedule here: min_lr <= lr
    scaler = grad_scaler(precision, device)
    criterion = make_criterion(config)
    loader = make_loader(bundle.train, config, train=True)
    growth = (end_lr / start_lr) ** (1 / max(1, steps - 1))  # per step

    learning_rates, losses, smoothed = [], [], []
    average, best, diverged_at = 0.0, math.inf, None
    batches = itertools.chain.from_iterable(itertools.repeat(loader))  # as many epochs as needed
    bar = Progress(steps, f"range test ({config.optimizer})", unit="steps", leave=False, enabled=progress)
    for step, (images, targets) in zip(range(steps), batches):
        bar.update()
        learning_rate = start_lr * growth ** step
        for group in optimizer.param_groups:
            group["lr"] = learning_rate
        images, targets = stage_batch(bundle, images, targets, device, train=True,
                                      channels_last=config.channels_last)
        loss, _ = training_step(model, images, targets, criterion, scaler, precision)
        optimizer_step(optimizer, scaler)
        value = loss.item()  # a sync per step: the test needs each loss to decide when to stop
        average = smoothing * average + (1 - smoothing) * value
        current = average / (1 - smoothing ** (step + 1))  # bias correction for the zero start
        learning_rates.append(learning_rate)
        losses.append(value)
        smoothed.append(current)
        best = min(best, current)
        if not math.isfinite(current) or current > divergence_factor * best:
            diverged_at = learning_rate
            break
    bar.close()
    finite = [(loss, rate) for loss, rate in zip(smoothed, learning_rates) if math.isfinite(loss)]
    largest_stable = min(finite)[1] if finite else start_lr
    return RangeTestResult(learning_rates, losses, smoothed, largest_stable, diverged_at, config.optimizer)
