"""The step harness, written once: copy the model, build its optimizer and GradScaler, draw a fixed
random batch on the device, and time the engine's training step (`engine.step`) over the one timing
helper (`instruments.timing`: syncs around the clock, warm-up thrown away, median of repeats).

Notebook 03 (`chapters.mixed_precision`), `workbook gpu-check`, the memory probe
(`measure.memory_probe.TrainingStepProbe`), the DDP probe (`engine.ddp_probe`) and `precision=auto`
(`engine.auto_precision`) all measure with it, so their numbers come from one piece of code.

    bench = StepBench(model, image_size=32, batch_size=64, device="cuda", num_classes=10)
    timing = bench.variant(precision="bf16", channels_last=True).time(repeats=5, warmup=2)
    timing.median, timing.images_per_second
"""
from __future__ import annotations

import contextlib
import copy
import dataclasses
from typing import Callable

import torch

from course_lib.engine.precision import apply_matmul_precision, grad_scaler
from course_lib.engine.step import optimizer_step, training_step
from course_lib.instruments.timing import Timing, stopwatch, time_repeats


@dataclasses.dataclass
class StepTiming:
    """Seconds per training step of each timed repeat (warm-up steps already thrown away)."""

    timing: Timing
    batch_size: int  # images per step

    @property
    def seconds(self) -> list[float]:
        return self.timing.seconds

    @property
    def median(self) -> float:
        return self.timing.median

    @property
    def best(self) -> float:
        return self.timing.best

    @property
    def images_per_second(self) -> float:
        """batch / median seconds per step."""
        return self.timing.per_second(self.batch_size)


@contextlib.contextmanager
def fp32_and_cudnn_switches(device: torch.device, matmul_precision: str | None, cudnn_benchmark: bool | None):
    """`matmul_precision` (`precision.apply_matmul_precision`) and cuDNN's autotuner set for the
    duration of a step and restored after, so variants that take turns each run with their own
    process-wide switches. None leaves a switch as it is; off CUDA both are no-ops."""
    if device.type != "cuda" or (matmul_precision is None and cudnn_benchmark is None):
        yield
        return
    saved = (torch.get_float32_matmul_precision(), torch.backends.cudnn.allow_tf32, torch.backends.cudnn.benchmark)
    try:
        if matmul_precision is not None:
            apply_matmul_precision(matmul_precision, device)
        if cudnn_benchmark is not None:
            torch.backends.cudnn.benchmark = cudnn_benchmark
        yield
    finally:
        torch.set_float32_matmul_precision(saved[0])
        torch.backends.cudnn.allow_tf32, torch.backends.cudnn.benchmark = saved[1], saved[2]


class TimedStep:
    """One variant: its own copy of the model (in the variant's layout, compiled when asked, in
    `compile_mode`), its optimizer, GradScaler and batch, and its fp32 and cuDNN switches
    (`fp32_and_cudnn_switches`, None: as the process has them). `step()` trains one step; `time()` times steps."""

    def __init__(self, bench: StepBench, precision: str, channels_last: bool, compile: bool,
                 wrap: Callable[[torch.nn.Module], torch.nn.Module] | None, compile_mode: str = "default",
                 matmul_precision: str | None = None, cudnn_benchmark: bool | None = None):
        self.bench, self.precision, self.device = bench, precision, bench.device
        self.channels_last, self.compile, self.compile_mode = channels_last, compile, compile_mode
        self.matmul_precision, self.cudnn_benchmark = matmul_precision, cudnn_benchmark
        self.memory_format = torch.channels_last if channels_last else torch.contiguous_format
        # A copy: the caller's weights and BatchNorm statistics stay untouched by the timed steps.
        self.model = copy.deepcopy(bench.model).to(self.device, memory_format=self.memory_format).train()
        wrapped = wrap(self.model) if wrap is not None else self.model  # e.g. DistributedDataParallel
        self.trained = torch.compile(wrapped, mode=compile_mode) if compile else wrapped
        self.optimizer = bench.make_optimizer(self.model)
        self.scaler = grad_scaler(precision, self.device)  # enabled only for fp16; else a pass-through
        self.use_batch(bench.images, bench.targets)

    @property
    def batch_size(self) -> int:
        return self.images.shape[0]

    def random_batch(self, batch_size: int) -> tuple[torch.Tensor, torch.Tensor]:
        """A fresh random (images, targets) of `batch_size` on the device, in this variant's layout."""
        images, targets = self.bench.draw(batch_size)
        return images.to(self.device, memory_format=self.memory_format), targets.to(self.device)

    def use_batch(self, images: torch.Tensor, targets: torch.Tensor) -> TimedStep:
        """Train on this (images, targets) from now on, moved to the device in this variant's layout."""
        self.images = images.to(self.device, memory_format=self.memory_format)
        self.targets = targets.to(self.device)
        return self

    def redraw(self, batch_size: int) -> TimedStep:
        """Replace the stored batch by a fresh random one of `batch_size` (the DDP probe's strong and
        weak scaling time one model at two batch sizes)."""
        return self.use_batch(*self.bench.draw(batch_size))

    def step(self, images: torch.Tensor | None = None, targets: torch.Tensor | None = None, *,
             sync_gradients: bool = True) -> bool:
        """One training step (the stored batch unless one is given); True when fp16 skipped it."""
        images = self.images if images is None else images
        targets = self.targets if targets is None else targets
        with fp32_and_cudnn_switches(self.device, self.matmul_precision, self.cudnn_benchmark):
            training_step(self.trained, images, targets, self.bench.criterion, self.scaler, self.precision,
                          sync_gradients=sync_gradients)
            return optimizer_step(self.optimizer, self.scaler)

    def first_step(self) -> float:
        """Seconds of one step between two syncs: the first one pays for allocations, kernel choice and
        the compile, so it is reported apart and never part of `time()`'s repeats."""
        seconds, _ = stopwatch(self.step, self.device)
        return seconds

    def time(self, repeats: int = 5, warmup: int = 1, *, calls: int = 1, sync_gradients: bool = True) -> StepTiming:
        """`warmup` steps thrown away, then `repeats` repeats of `calls` steps each, timed between syncs."""
        timing = time_repeats(lambda: self.step(sync_gradients=sync_gradients), repeats=repeats, warmup=warmup,
                              device=self.device, calls=calls)
        return StepTiming(timing, self.batch_size)


class StepBench:
    """One model, image size, batch and device. `variant(...)` builds a `TimedStep` on its own copy
    of the model; every variant trains on the same fixed random batch (drawn from `seed`)."""

    def __init__(self, model: torch.nn.Module, image_size: int, batch_size: int, device, num_classes: int, *,
                 seed: int = 0, lr: float = 1e-3, momentum: float = 0.9,
                 optimizer: Callable[[torch.nn.Module], torch.optim.Optimizer] | None = None):
        self.model, self.image_size, self.num_classes = model, image_size, num_classes
        self.device = torch.device(device)
        self.criterion = torch.nn.CrossEntropyLoss()
        # SGD with momentum unless told otherwise: its state is one buffer per parameter, as in training.
        self.make_optimizer = optimizer or (lambda module: torch.optim.SGD(module.parameters(), lr=lr,
                                                                           momentum=momentum))
        self.generator = torch.Generator().manual_seed(seed)
        self.images, self.targets = self.draw(batch_size)

    def draw(self, batch_size: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Random (images, targets) on the CPU, from this bench's generator."""
        images = torch.randn(batch_size, 3, self.image_size, self.image_size, generator=self.generator)
        return images, torch.randint(self.num_classes, (batch_size,), generator=self.generator)

    def variant(self, precision: str = "off", channels_last: bool = False, compile: bool = False, *,
                wrap: Callable[[torch.nn.Module], torch.nn.Module] | None = None, compile_mode: str = "default",
                matmul_precision: str | None = None, cudnn_benchmark: bool | None = None) -> TimedStep:
        """A timed step of a fresh copy of the model with these switches (precision off, fp16 or bf16;
        `wrap` wraps the copy before the compile, e.g. in DistributedDataParallel; the Config's
        `compile_mode`, `matmul_precision` and `cudnn_benchmark`, the last two None for "as set")."""
        if precision not in ("off", "fp16", "bf16"):
            raise ValueError(f"precision={precision!r}: give off, fp16 or bf16 (auto is decided by timing these)")
        return TimedStep(self, precision, channels_last, compile, wrap, compile_mode, matmul_precision,
                         cudnn_benchmark)

    def time(self, precision: str = "off", channels_last: bool = False, compile: bool = False, *,
             repeats: int = 5, warmup: int = 1) -> StepTiming:
        """`variant(...).time(...)` in one call."""
        return self.variant(precision, channels_last, compile).time(repeats=repeats, warmup=warmup)
