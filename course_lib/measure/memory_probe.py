"""The measured peak memory of one training step, the engine's (`engine.step_bench`), against the estimate
of `measure.memory`: `torch.cuda.max_memory_allocated` on a GPU, on the CPU the profiler's per-allocation
accounting (`instruments.peak_memory`). PyTorch docs, "Understanding CUDA Memory Usage".
"""
from __future__ import annotations

from collections.abc import Callable

import torch

from course_lib.engine import auto_precision
from course_lib.engine.step_bench import StepBench
from course_lib.instruments.peak_memory import is_out_of_memory, peak_bytes_during, release_memory
from course_lib.instruments.progress import Progress
from course_lib.measure.memory import (MemoryEstimate, estimate_training_memory, make_optimizer,
                                       measured_optimizer_state_bytes, model_and_name, parameter_bytes)


class TrainingStepProbe:
    """One model and optimizer on a device; `peak_bytes(batch)` runs the engine's full training step at that batch and
    returns its measured peak (parameters, optimizer state, gradients and every temporary)."""

    def __init__(self, model, image_size: int, precision: str = "off", optimizer: str = "sgd",
                 momentum: float = 0.9, device="cpu", num_classes: int = 10):
        model, self.name = model_and_name(model, num_classes)
        self.device = torch.device(device)
        # CUDA's peak counter covers the whole process: remember what other objects already hold.
        self.other_cuda_bytes = torch.cuda.memory_allocated(self.device) if self.device.type == "cuda" else 0
        self.image_size, self.num_classes = image_size, num_classes
        self.optimizer_name, self.momentum = optimizer, momentum
        self.precision = auto_precision.resolve(precision, model, image_size, num_classes, self.device)
        # The step harness's copy of the model on the device, with the optimizer train.fit builds and a
        # GradScaler enabled only for fp16 (disabled it is a no-op: one code path). Batch 2: BatchNorm
        # needs more than one value per channel, and small images end in 1x1 feature maps.
        self.timed = StepBench(model, image_size, 2, self.device, num_classes,
                               optimizer=lambda module: make_optimizer(module, optimizer, momentum=momentum)
                               ).variant(self.precision)
        self.module, self.optimizer, self.scaler = self.timed.model, self.timed.optimizer, self.timed.scaler
        self.timed.images = self.timed.targets = None  # each measured step draws its own batch
        self._step(2)  # creates the optimizer state, so every measured step starts alike

    def _step(self, batch_size: int) -> None:
        try:
            self.timed.step(*self.timed.random_batch(batch_size))
        finally:
            # set_to_none frees the gradients: the next step starts from parameters + state only,
            # also after an OOM halfway through backward.
            self.optimizer.zero_grad(set_to_none=True)

    def baseline_bytes(self) -> int:
        """What is live between steps: parameters, buffers, optimizer state."""
        return parameter_bytes(self.module) + measured_optimizer_state_bytes(self.optimizer)

    def peak_bytes(self, batch_size: int) -> int:
        """The step's peak: what is live before it (this probe's tensors only) plus its own peak."""
        if self.device.type == "cuda":
            live = torch.cuda.memory_allocated(self.device) - self.other_cuda_bytes
        else:
            live = self.baseline_bytes()
        return live + peak_bytes_during(lambda: self._step(batch_size), self.device)

    def estimate(self, batch_size: int, probe_batches: tuple[int, int] = (2, 4)) -> MemoryEstimate:
        return estimate_training_memory(self.module, batch_size, self.image_size, self.precision,
                                        self.optimizer_name, self.momentum, self.device, self.num_classes,
                                        probe_batches)


def compare_estimate_and_peak(model, image_size: int, batch_sizes, precision: str = "off", optimizer: str = "sgd",
                              device="cpu", num_classes: int = 10,
                              after_each: Callable[[int], None] | None = None) -> list[dict]:
    """Estimated vs measured peak bytes per batch size (None: out of memory, and the sweep goes on);
    `after_each(batch_size)` follows each (a progress bar's update)."""
    probe = TrainingStepProbe(model, image_size, precision, optimizer, device=device, num_classes=num_classes)
    estimate = probe.estimate(batch_sizes[0])
    rows = []
    for batch_size in batch_sizes:
        at = estimate.at_batch(batch_size)
        try:
            measured = probe.peak_bytes(batch_size)
        except (RuntimeError, MemoryError) as error:
            if not is_out_of_memory(error):
                raise
            measured = None
        if measured is None:
            release_memory(device)
        rows.append({"model": probe.name, "image_size": image_size, "precision": probe.precision,
                     "optimizer": optimizer, "batch_size": batch_size, "estimated_bytes": at.total_bytes,
                     "measured_peak_bytes": measured,  # None: out of memory
                     "estimate_over_measured": at.total_bytes / measured if measured else None,
                     **{f"estimated_{k}_bytes": v for k, v in at.breakdown().items() if k != "total"}})
        if after_each is not None:
            after_each(batch_size)
    return rows


def run_sweep(plans: list[dict], precision: str = "off", optimizer: str = "sgd", device="cpu") -> list[dict]:
    """`compare_estimate_and_peak` for every (model, image size, batch sizes) of `plans` (`sweep_plan`), with a
    progress bar over the measured steps (a CPU profiled step at 128 px takes tens of seconds)."""
    rows = []
    with Progress(sum(len(plan["batch_sizes"]) for plan in plans), "memory sweep", unit="steps") as bar:
        for plan in plans:
            bar.set_postfix_str(f"{plan['model']} at {plan['image_size']} px")
            rows += compare_estimate_and_peak(plan["model"], plan["image_size"], plan["batch_sizes"],
                                              precision=precision, optimizer=optimizer, device=device,
                                              after_each=lambda _: bar.update())
    return rows


def sweep_plan(profile: str, config) -> list[dict]:
    """The (model, image size, batch sizes) sweeps a profile measures: tiny in smoke (seconds),
    ResNet-18 and ResNet-50 at 64 px on CPU, the article's ResNet-50 at 224 px on a GPU."""
    if profile == "smoke":
        return [dict(model=config.model, image_size=config.image_size, batch_sizes=[2, 4, 8])]
    if profile == "cpu":
        # 128 px only on request: ResNet-50's profiled CPU steps there cost the notebook minutes, ResNet-18's about
        # half of the sweep's 4 minutes (issue 51's 45-minute budget); a sweep of two models at 64 px keeps the lesson
        return [dict(model=name, image_size=size, batch_sizes=[4, 16, 32])
                for name, size in (("resnet18", 64), ("resnet50", 64))]
    if profile == "gpu":
        return [dict(model=config.model, image_size=config.image_size, batch_sizes=[32, 64, 128, 256]),
                dict(model="resnet50", image_size=224, batch_sizes=[32, 64, 128, 256, 512])]
    raise ValueError(f"profile={profile!r} is not one of smoke, cpu, gpu")


def plot_estimate_vs_measured(rows: list[dict], title: str = ""):
    """Estimated (dashed) and measured (solid) peak MiB against batch size, one colour per sweep."""
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots(figsize=(7, 4))
    groups: dict[str, list[dict]] = {}
    for row in rows:
        groups.setdefault(f"{row['model']} {row['image_size']}px {row['precision']}", []).append(row)
    for index, (label, group) in enumerate(groups.items()):
        colour = f"C{index}"
        batches = [r["batch_size"] for r in group]
        axis.plot(batches, [r["measured_peak_bytes"] / 2 ** 20 for r in group], "o-", color=colour,
                  label=f"{label} measured")
        axis.plot(batches, [r["estimated_bytes"] / 2 ** 20 for r in group], "x--", color=colour,
                  label=f"{label} estimated")
    axis.set_xlabel("batch size (images)")
    axis.set_ylabel("peak memory (MiB)")
    axis.set_title(title or "Training-step peak memory: estimate vs measured")
    axis.legend(fontsize=7)
    return figure
