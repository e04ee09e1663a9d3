"""Training memory of a timm model, estimated as a breakdown: parameters, gradients, optimizer state,
activations and input, the four sources the article lists (Sec. 1.3) plus the batch. Activations are
measured on a tiny batch and scaled linearly in the batch size. Background: Sohoni et al., "Low-Memory
Neural Network Training" (2019). The measured peak is `measure.memory_probe`, the largest-batch finder
`measure.batch_search`, the start-up check against free memory `measure.memory_fit`.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

import torch

from course_lib.config import make_config
from course_lib.engine import auto_precision

# Precision choice and autocast live in precision.py, optimizer construction in schedule.py.
from course_lib.engine.precision import DTYPES, autocast
from course_lib.engine.schedule import make_optimizer as make_configured_optimizer

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
    """Optimizer state for fp32 parameters as torch.optim keeps it: SGD's momentum buffer, AdamW's exp_avg and
    exp_avg_sq per parameter plus a 4-byte `step` tensor per parameter tensor."""
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
    """The optimizer train.fit builds (`schedule.make_optimizer`), from names. Weight decay is off by default: it keeps
    no state, but `step()` adds a temporary of one parameter tensor (CPU) or of all decayed ones (GPU, foreach),
    which the four-source estimate leaves out (measured: +8 MiB for ResNet-18 on CPU)."""
    config = make_config(None, optimizer=optimizer, lr=lr, momentum=momentum, weight_decay=weight_decay)
    return make_configured_optimizer(model, config)


def saved_activation_bytes(model: torch.nn.Module, images: torch.Tensor, precision: str = "off",
                           autocast_context=None) -> int:
    """Bytes autograd keeps from one forward pass for backward (`saved_tensors_hooks`), each storage once, parameters
    excluded; autocast's half-precision weight copies are saved tensors, so they count here."""
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
    """(batch-independent bytes, bytes per image) of saved activations from two tiny batches; on "meta" from shapes
    alone (instant: hardware you do not have), half precision emulated by a cast model plus 2-byte weight copies."""
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


def model_and_name(model, num_classes: int):
    if isinstance(model, str):
        import timm

        return timm.create_model(model, num_classes=num_classes), model
    return model, type(model).__name__


def estimate_training_memory(model, batch_size: int, image_size: int, precision: str = "off",
                             optimizer: str = "sgd", momentum: float = 0.9, device="cpu", num_classes: int = 10,
                             probe_batches: tuple[int, int] = (2, 4)) -> MemoryEstimate:
    """One training step's peak memory for a timm model name (or a module): fp32 parameters, gradients, optimizer
    state (closed forms), activations measured at `probe_batches` and scaled linearly, and the fp32 input."""
    module, name = model_and_name(model, num_classes)
    if str(device) != "meta":
        module = module.to(device)
    precision = auto_precision.resolve(precision, module, image_size, num_classes, device)
    fixed, per_image = measure_activations(module, image_size, precision, device, probe_batches)
    trainable = [p for p in module.parameters() if p.requires_grad]
    values = sum(p.numel() for p in trainable)
    return MemoryEstimate(  # activations and input: `at_batch` fills them in from the per-image bytes
        model=name, batch_size=batch_size, image_size=image_size, precision=precision, optimizer=optimizer,
        parameters_bytes=parameter_bytes(module), gradients_bytes=gradient_bytes(module),
        optimizer_state_bytes=optimizer_state_bytes(values, optimizer, momentum, len(trainable)),
        activations_bytes=0, input_bytes=0, activation_fixed_bytes=fixed, activation_bytes_per_image=per_image,
        activation_device=str(device), parameter_count=values, parameter_tensors=len(trainable)).at_batch(batch_size)


def gib(value: float) -> float:
    """Bytes to GiB, for tables."""
    return value / 1024 ** 3


def largest_batch_within(estimate: MemoryEstimate, budget_bytes: int) -> int:
    """The largest batch whose estimated total fits `budget_bytes` (0 if none does)."""
    fixed = estimate.at_batch(0).total_bytes
    per_image = estimate.activation_bytes_per_image + 3 * estimate.image_size ** 2 * FP32_BYTES
    return max(0, int((budget_bytes - fixed) // per_image)) if per_image else 0


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
