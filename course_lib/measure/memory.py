"""Training memory of a timm model: an estimate as a breakdown (parameters, gradients, optimizer
state, activations, input), the measured peak, and a largest-batch finder.

The four sources are the ones the article lists (Sec. 1.3); activations are measured on a tiny
batch and scaled linearly in the batch size. The measured peak is `torch.cuda.max_memory_allocated`
on a GPU and, on CPU, the profiler's per-allocation memory accounting (`instruments.peak_memory.cpu_peak_tracker`).
Background: Sohoni et al., "Low-Memory Neural Network Training" (2019) for the breakdown;
PyTorch docs "Understanding CUDA Memory Usage".
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, field

import torch

from course_lib.engine import auto_precision

# Precision choice, autocast and the GradScaler live in precision.py, optimizer construction in
# schedule.py, the training step in step.py (run through step_bench.py): the memory probe measures
# the step the engine runs.
from course_lib.engine.precision import (  # noqa: F401
    DTYPES,
    PRECISIONS,
    autocast,
    grad_scaler,
)
from course_lib.engine.step_bench import StepBench

# The counters themselves are the ground floor's (`instruments.peak_memory`); measure.gpu_check and
# notebook 01 read them through this module as `memory.peak_memory_kind`, `memory.release_memory`.
from course_lib.instruments.peak_memory import (  # noqa: F401
    is_out_of_memory,
    peak_bytes_during,
    peak_memory_kind,
    release_memory,
)

FP32_BYTES = 4


def parameter_count(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def parameter_bytes(model: torch.nn.Module) -> int:
    """Bytes of the parameters and buffers (BatchNorm running statistics) as stored. With AMP they
    stay fp32: autocast casts copies, the master weights do not change."""
    return sum(t.numel() * t.element_size() for t in (*model.parameters(), *model.buffers()))


def gradient_bytes(model: torch.nn.Module) -> int:
    """One gradient per trainable parameter, in the parameter's dtype (fp32 under AMP too)."""
    return sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad)


def optimizer_state_bytes(parameter_count: int, optimizer: str = "sgd", momentum: float = 0.9,
                          parameter_tensors: int = 0, bytes_per_value: int = FP32_BYTES) -> int:
    """Optimizer state for fp32 parameters, as torch.optim keeps it:
    SGD with momentum: one buffer per parameter (none when momentum is 0);
    AdamW: exp_avg and exp_avg_sq per parameter, plus a 4-byte `step` tensor per parameter tensor."""
    if optimizer == "sgd":
        return parameter_count * bytes_per_value if momentum else 0
    if optimizer == "adamw":
        return 2 * parameter_count * bytes_per_value + FP32_BYTES * parameter_tensors
    raise ValueError(f"optimizer={optimizer!r} is not one of sgd, adamw")


def measured_optimizer_state_bytes(optimizer: torch.optim.Optimizer) -> int:
    """Bytes of the tensors an optimizer actually holds (after its first step)."""
    return sum(value.numel() * value.element_size() for state in optimizer.state.values()
               for value in state.values() if torch.is_tensor(value))


def make_optimizer(model: torch.nn.Module, optimizer: str = "sgd", lr: float = 0.01,
                   momentum: float = 0.9, weight_decay: float = 0.0) -> torch.optim.Optimizer:
    """The optimizer train.fit builds (`schedule.make_optimizer`), from names instead of a Config.
    Its state, not its learning rate, is what memory depends on. Weight decay is off by default:
    it keeps no state, but during `step()` it adds a temporary the size of one parameter tensor
    (CPU, per-tensor kernels) or of all decayed parameters (GPU, foreach kernels), which the
    four-source estimate leaves out (measured: +8 MiB for ResNet-18 on CPU)."""
    from course_lib.config import make_config
    from course_lib.engine.schedule import make_optimizer as make_configured_optimizer

    config = make_config(None, optimizer=optimizer, lr=lr, momentum=momentum, weight_decay=weight_decay)
    return make_configured_optimizer(model, config)


def saved_activation_bytes(model: torch.nn.Module, images: torch.Tensor, precision: str = "off",
                           autocast_context=None) -> int:
    """Bytes autograd keeps from one forward pass for the backward pass, counted with
    `torch.autograd.graph.saved_tensors_hooks`: each saved tensor's storage once, parameters
    excluded (they are counted as parameters). Autocast's half-precision weight copies are saved
    tensors, so they appear here (as a batch-independent part)."""
    parameter_storages = {p.untyped_storage()._cdata for p in model.parameters()}
    saved: dict[int, int] = {}

    def pack(tensor):
        storage = tensor.untyped_storage()
        key = storage._cdata  # the C++ storage: views of one buffer count once
        if key not in parameter_storages:
            saved[key] = storage.nbytes()
        return tensor

    if autocast_context is None:
        # Meta tensors have no autocast backend: `measure_activations` emulates half precision
        # there by casting the model instead.
        autocast_context = autocast("off" if images.device.type == "meta" else precision, images.device)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor), autocast_context:
        output = model(images)
    del output
    return sum(saved.values())


def measure_activations(model: torch.nn.Module, image_size: int, precision: str = "off", device="cpu",
                        probe_batches: tuple[int, int] = (2, 4)) -> tuple[int, int]:
    """(batch-independent bytes, bytes per image) of saved activations, from two tiny batches.

    On `device="meta"` nothing is computed (shapes only), so any model and image size is instant;
    reduced precision is then emulated by casting the model to fp16/bf16 and adding autocast's
    2-byte weight copies. Use it to predict for hardware you do not have."""
    device = torch.device(device)
    # precision=auto times a few steps; any class count serves as targets for that (timm models say theirs).
    precision = auto_precision.resolve(precision, model, image_size, getattr(model, "num_classes", 2), device)
    was_training = model.training
    model.train()
    try:
        if device.type == "meta":
            import copy

            dtype = DTYPES[precision]
            probe_model = copy.deepcopy(model).to("meta").to(dtype)
            sizes = [saved_activation_bytes(probe_model, torch.empty(b, 3, image_size, image_size, device="meta",
                                                                     dtype=dtype)) for b in probe_batches]
            weight_copies = 2 * parameter_count(model) if precision != "off" else 0
        else:
            sizes = [saved_activation_bytes(model, torch.randn(b, 3, image_size, image_size, device=device),
                                            precision) for b in probe_batches]
            weight_copies = 0
    finally:
        model.train(was_training)
    small, large = probe_batches
    per_image = (sizes[1] - sizes[0]) / (large - small)
    fixed = sizes[0] - per_image * small + weight_copies
    return int(round(fixed)), int(round(per_image))


@dataclass
class MemoryEstimate:
    """Estimated training memory at one batch size, in bytes, with where it goes."""
    model: str
    batch_size: int
    image_size: int
    precision: str
    optimizer: str
    parameters_bytes: int
    gradients_bytes: int
    optimizer_state_bytes: int
    activations_bytes: int
    input_bytes: int
    activation_fixed_bytes: int = 0
    activation_bytes_per_image: int = 0
    activation_device: str = "cpu"
    parameter_count: int = 0  # trainable parameters (values), for the optimizer closed forms
    parameter_tensors: int = 0  # trainable parameter tensors

    @property
    def total_bytes(self) -> int:
        return (self.parameters_bytes + self.gradients_bytes + self.optimizer_state_bytes
                + self.activations_bytes + self.input_bytes)

    def at_batch(self, batch_size: int) -> MemoryEstimate:
        """The same estimate at another batch size (only activations and input change)."""
        return MemoryEstimate(**{**asdict(self), "batch_size": batch_size,
                                 "activations_bytes": self.activation_fixed_bytes
                                 + self.activation_bytes_per_image * batch_size,
                                 "input_bytes": 3 * self.image_size ** 2 * FP32_BYTES * batch_size})

    def with_optimizer(self, optimizer: str, momentum: float = 0.9) -> MemoryEstimate:
        """The same estimate for another optimizer (only its state changes; no re-measuring)."""
        state = optimizer_state_bytes(self.parameter_count, optimizer, momentum, self.parameter_tensors)
        return MemoryEstimate(**{**asdict(self), "optimizer": optimizer, "optimizer_state_bytes": state})

    def breakdown(self) -> dict[str, int]:
        return {"parameters": self.parameters_bytes, "gradients": self.gradients_bytes,
                "optimizer_state": self.optimizer_state_bytes, "activations": self.activations_bytes,
                "input": self.input_bytes, "total": self.total_bytes}

    def to_dict(self) -> dict:
        return {**asdict(self), "total_bytes": self.total_bytes}


def _model_and_name(model, num_classes: int):
    if isinstance(model, str):
        import timm

        return timm.create_model(model, num_classes=num_classes), model
    return model, type(model).__name__


def estimate_training_memory(model, batch_size: int, image_size: int, precision: str = "off",
                             optimizer: str = "sgd", momentum: float = 0.9, device="cpu", num_classes: int = 10,
                             probe_batches: tuple[int, int] = (2, 4)) -> MemoryEstimate:
    """Estimate one training step's peak memory for a timm model name (or a module):
    fp32 parameters + fp32 gradients + optimizer state (closed forms) + activations measured on
    `probe_batches` on `device` and scaled linearly to `batch_size` + the fp32 input batch."""
    module, name = _model_and_name(model, num_classes)
    if str(device) != "meta":
        module = module.to(device)
    precision = auto_precision.resolve(precision, module, image_size, num_classes, device)
    fixed, per_image = measure_activations(module, image_size, precision, device, probe_batches)
    trainable = [p for p in module.parameters() if p.requires_grad]
    return MemoryEstimate(
        model=name, batch_size=batch_size, image_size=image_size, precision=precision, optimizer=optimizer,
        parameters_bytes=parameter_bytes(module), gradients_bytes=gradient_bytes(module),
        optimizer_state_bytes=optimizer_state_bytes(sum(p.numel() for p in trainable), optimizer, momentum,
                                                    len(trainable)),
        activations_bytes=fixed + per_image * batch_size,
        input_bytes=batch_size * 3 * image_size * image_size * FP32_BYTES,
        activation_fixed_bytes=fixed, activation_bytes_per_image=per_image, activation_device=str(device),
        parameter_count=sum(p.numel() for p in trainable), parameter_tensors=len(trainable))


class TrainingStepProbe:
    """One model and optimizer on a device; `peak_bytes(batch)` runs a full training step
    (`step.training_step` then `step.optimizer_step`, as the engine does) at that batch and returns
    its measured peak:
    `torch.cuda.max_memory_allocated` on a GPU, `cpu_peak_tracker` (profiler accounting) on CPU.
    Both count the parameters, optimizer state, gradients and every temporary of the step."""

    def __init__(self, model, image_size: int, precision: str = "off", optimizer: str = "sgd",
                 momentum: float = 0.9, device="cpu", num_classes: int = 10):
        model, self.name = _model_and_name(model, num_classes)
        self.device = torch.device(device)
        # CUDA's peak counter covers the whole process: remember what other objects already hold.
        self.other_cuda_bytes = torch.cuda.memory_allocated(self.device) if self.device.type == "cuda" else 0
        self.image_size = image_size
        self.num_classes = num_classes
        self.precision = auto_precision.resolve(precision, model, image_size, num_classes, self.device)
        self.optimizer_name = optimizer
        self.momentum = momentum
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
    """Estimated vs measured peak bytes for each batch size (one model, one optimizer); a batch that
    runs out of memory gets `measured_peak_bytes=None` and the sweep goes on. `after_each(batch_size)` is
    called once each batch is measured (a progress bar's update)."""
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


@dataclass
class BatchSearch:
    """Result of `find_largest_batch`: the largest batch that fitted and every trial."""
    largest_batch: int
    trials: list[dict] = field(default_factory=list)


def find_largest_batch(step: Callable[[int], int | None], start: int = 1, max_batch: int = 4096,
                       memory_cap_bytes: int | None = None, device=None, multiple_of: int = 1) -> BatchSearch:
    """Double the batch until a step runs out of memory (or its measured peak exceeds
    `memory_cap_bytes`, the way to bound a CPU run), then binary-search between the last batch
    that fitted and the first that did not. `step(batch)` runs one training step and returns its
    peak bytes (or None). After an OOM the memory is released, so the process stays usable.
    `multiple_of` stops the search at that resolution (8 suits tensor cores, and saves trials)."""
    trials: list[dict] = []

    def fits(batch_size: int) -> bool:
        reason, peak = "fits", None
        try:
            peak = step(batch_size)
        except (RuntimeError, MemoryError) as error:
            if not is_out_of_memory(error):
                raise
            reason = "out of memory"
        if reason != "fits":
            release_memory(device)  # after the except block: the traceback no longer pins tensors
        elif memory_cap_bytes is not None and peak is not None and peak > memory_cap_bytes:
            reason = "over memory cap"
        trials.append({"batch_size": batch_size, "fits": reason == "fits", "peak_bytes": peak, "reason": reason})
        return reason == "fits"

    good, bad = 0, None
    batch_size = max(1, start)
    while batch_size <= max_batch:
        if not fits(batch_size):
            bad = batch_size
            break
        good = batch_size
        batch_size *= 2
    if bad is None:  # max_batch reached without a failure
        bad = max_batch + 1
        if good < max_batch:
            if fits(max_batch):
                good = max_batch
            else:
                bad = max_batch
    while bad - good > multiple_of:
        middle = (good + bad) // 2 // multiple_of * multiple_of
        if middle <= good:
            break
        if fits(middle):
            good = middle
        else:
            bad = middle
    return BatchSearch(largest_batch=good, trials=trials)


def gib(value: float) -> float:
    """Bytes to GiB, for tables."""
    return value / 1024 ** 3


def run_sweep(plans: list[dict], precision: str = "off", optimizer: str = "sgd", device="cpu") -> list[dict]:
    """`compare_estimate_and_peak` for every (model, image size, batch sizes) of `plans` (`sweep_plan`), with a
    progress bar over the measured steps (a CPU profiled step at 128 px takes tens of seconds)."""
    from course_lib.instruments.progress import Progress

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


def largest_batch_within(estimate: MemoryEstimate, budget_bytes: int) -> int:
    """The largest batch whose estimated total fits `budget_bytes` (0 if none does)."""
    fixed = estimate.at_batch(0).total_bytes
    per_image = estimate.activation_bytes_per_image + 3 * estimate.image_size ** 2 * FP32_BYTES
    return max(0, int((budget_bytes - fixed) // per_image)) if per_image else 0


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


def plot_breakdown(estimates: list[MemoryEstimate], labels: list[str] | None = None):
    """Stacked bars of where the memory goes, in GiB, one bar per estimate."""
    import matplotlib.pyplot as plt

    parts = ("parameters", "gradients", "optimizer_state", "activations", "input")
    labels = labels or [f"{e.model}\n{e.image_size}px b{e.batch_size} {e.precision} {e.optimizer}" for e in estimates]
    figure, axis = plt.subplots(figsize=(7, 4))
    bottom = [0.0] * len(estimates)
    for part in parts:
        values = [gib(e.breakdown()[part]) for e in estimates]
        axis.bar(labels, values, bottom=bottom, label=part)
        bottom = [b + v for b, v in zip(bottom, values)]
    axis.set_ylabel("GiB")
    axis.set_title("Estimated training memory by source")
    axis.legend(fontsize=8)
    return figure


# (limit, usage, statistics) of the memory cgroup this process runs in: v2, then v1. A container's limit, not the
# host's RAM, is where the kernel's OOM killer stops a run (killed at 1 GB with the host's 24 GB free).
CGROUP_FILES = (("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current", "/sys/fs/cgroup/memory.stat"),
                ("/sys/fs/cgroup/memory/memory.limit_in_bytes", "/sys/fs/cgroup/memory/memory.usage_in_bytes",
                 "/sys/fs/cgroup/memory/memory.stat"))
NO_CGROUP_LIMIT = 2**60  # cgroup v1 writes "no limit" as about 2^63


def cgroup_room() -> int | None:
    """Bytes the memory cgroup's limit still allows this process's container: the limit, less what it uses
    beyond the page cache it can drop (`inactive_file`, as `docker stats` counts it); None without a limit."""
    from pathlib import Path

    for limit_file, usage_file, stat_file in CGROUP_FILES:
        try:
            limit, usage = Path(limit_file).read_text().strip(), int(Path(usage_file).read_text())
        except (OSError, ValueError):
            continue
        if not limit.isdigit() or int(limit) >= NO_CGROUP_LIMIT:  # "max": no limit
            return None
        try:
            stats = dict(line.split() for line in Path(stat_file).read_text().splitlines() if line.count(" ") == 1)
            reclaimable = int(stats.get("inactive_file", stats.get("total_inactive_file", 0)))
        except (OSError, ValueError):
            reclaimable = 0
        return max(0, int(limit) - max(0, usage - reclaimable))
    return None


def free_bytes(device: torch.device) -> int | None:
    """Memory a training run can still take on `device`: free CUDA memory, or for the CPU the host's available
    RAM or the container's memory cgroup room (`cgroup_room`), whichever is less; None where it cannot be told
    (MPS)."""
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    if device.type == "cpu":
        import psutil

        available, room = psutil.virtual_memory().available, cgroup_room()
        return available if room is None else min(available, room)
    return None


def resident_bytes(config) -> int:
    """What `storage=device` holds for the whole run besides one step: every training image (at most
    `max_train_images`) and every validation image, as uint8 at `image_size` (`data.resident`), counted from the
    data folder's file names; 0 for another storage, or data that is not an image folder on disk."""
    import os
    from pathlib import Path

    from course_lib.data.images import IMAGE_EXTENSIONS, split_folders

    if config.storage != "device" or not config.data_dir or not Path(config.data_dir).is_dir():
        return 0
    counts = {split: sum(name.lower().endswith(IMAGE_EXTENSIONS) for _, _, names in os.walk(folder) for name in names)
              for split, folder in split_folders(Path(config.data_dir)).items() if split in ("train", "val")}
    train = counts.get("train", 0)
    if config.max_train_images:
        train = min(train, config.max_train_images)
    return (train + counts.get("val", 0)) * 3 * config.image_size ** 2


# A suggested size leaves this share of the free memory unused: the estimate leaves out the
# allocator's slack, the DataLoader's batches in flight and the framework itself.
FIT_MARGIN = 0.8


def check_fits(config, device: torch.device | None = None, budget_bytes: int | None = None) -> None:
    """Refuse, before the first step, a run whose estimated training step (`estimate_training_memory`
    on the meta device: shapes only, fp32 unless a half precision is set) needs more memory than
    `device` has free, in one ConfigError naming the largest image_size that fits. Models the meta
    device cannot run are let through (the run then says what is wrong)."""
    from course_lib.config import ConfigError
    from course_lib.devices import resolve_device

    device = device or resolve_device(config.device)
    budget = budget_bytes if budget_bytes is not None else free_bytes(device)
    if budget is None:
        return
    precision = config.precision if config.precision in ("fp16", "bf16") else "off"
    try:
        estimate = estimate_training_memory(config.model, config.batch_size, config.image_size, precision,
                                            config.optimizer, config.momentum, device="meta")
    except (RuntimeError, NotImplementedError, ValueError, TypeError):
        return
    resident = resident_bytes(config)  # storage=device: the images stay in the same memory all run
    if estimate.total_bytes + resident <= budget:
        return
    # Activations, input and resident images grow with the pixels (image_size squared); weights and their state do not.
    fixed = estimate.total_bytes - estimate.activation_bytes_per_image * config.batch_size - estimate.input_bytes
    growing = estimate.total_bytes + resident - fixed
    room = FIT_MARGIN * budget - fixed
    advice = "even the weights, gradients and optimizer state do not fit: use a smaller model"
    if room > 0:
        fitting = int(config.image_size * (room / growing) ** 0.5) // 16 * 16
        advice = (f"use image_size={fitting} or less, or a smaller batch_size" if fitting >= 8
                  else "use a smaller batch_size or model")
    held = ""
    if resident:
        held = f" and {resident / 1e9:.1f} GB of images that storage=device holds there"
        advice += ", or storage=cache (the images stay on disk, memory-mapped) or fewer max_train_images"
    raise ConfigError(f"image_size={config.image_size} at batch_size={config.batch_size} needs about "
                      f"{estimate.total_bytes / 1e9:.1f} GB for one training step of {config.model} (estimated){held}, "
                      f"more than the {budget / 1e9:.1f} GB free on {device}; {advice}")
