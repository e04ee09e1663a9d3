"""Post-training int8 quantization for x86 CPUs, and bf16 beside it.

The maintained PyTorch flow is PT2E (export, then quantize the graph): `torch.export` captures the
model, `prepare_pt2e` inserts observers chosen by the X86 Inductor quantizer (int8 activations per
tensor, int8 weights per output channel, the scheme oneDNN's VNNI and AMX kernels run), a few
batches of training images calibrate the observers, and `convert_pt2e` writes int8 weights and
quantize/dequantize steps. In torch 2.14 the flow lives in torchao (`torchao.quantization.pt2e`;
the old `torch.ao.quantization` eager and FX flows are deprecated and the PT2E parts moved out).
See https://docs.pytorch.org/ao/stable/tutorials_source/pt2e_quant_x86_inductor.html.

Run as is, the converted graph is a *reference*: it dequantizes int8 weights to fp32 and runs fp32
convolutions, so its accuracy is int8's but its speed is not. `torch.compile` (Inductor) fuses the
quantize/dequantize pairs into oneDNN int8 convolutions; that needs a C++ compiler and takes
30-90 s on 2 cores, which is why notebook 13 compiles only outside the smoke profile. For an int8
model served without PyTorch, `deploy.export` quantizes the ONNX file with onnxruntime instead.

torchao is the project's optional `compress` extra (pyproject.toml): torchao 0.18 loads its kernels only
on torch >= 2.11, and the NGC containers keep NVIDIA's older torch build, so they leave it out
(`torchao_missing` says so in one line; onnxruntime's int8 needs no torchao).
"""
from __future__ import annotations

import copy
from typing import Iterable

import torch

from course_lib.config import ConfigError

TORCHAO_MISSING = ("torchao is not installed, so the PT2E int8 rows are left out: it is the optional 'compress' extra "
                   "(pip install -e '.[compress]', which needs torch >= 2.11; the NGC containers leave it out)")


def torchao_missing() -> str | None:
    """None when torchao's PT2E flow imports, else the one line that says what is left out and how to add it."""
    try:
        import torchao.quantization.pt2e  # noqa: F401
    except ImportError:
        return TORCHAO_MISSING
    return None


def export_model(model: torch.nn.Module, example_images: torch.Tensor) -> torch.export.ExportedProgram:
    """`torch.export` of an eval-mode model with a dynamic batch dimension. The example needs at
    least 2 images: export specialises a dimension of size 1 to a constant."""
    if example_images.shape[0] < 2:
        example_images = example_images.expand(2, *example_images.shape[1:]).contiguous()
    if not isinstance(model, torch.fx.GraphModule):  # an exported graph refuses mode changes (and is in eval)
        model = model.eval()
    batch = torch.export.Dim("batch", min=1, max=4096)
    return torch.export.export(model, (example_images,), dynamic_shapes=({0: batch},))


def quantize_int8(model: torch.nn.Module, calibration_batches: Iterable[torch.Tensor]) -> torch.fx.GraphModule:
    """The PT2E int8 reference graph of `model` (unchanged): export, X86 Inductor quantizer, calibrate on a few
    normalised batches, convert (`torch.compile` it for int8 speed). Without torchao: a one-line ConfigError."""
    if (missing := torchao_missing()) is not None:
        raise ConfigError(missing)
    import torchao.quantization.pt2e.quantizer.x86_inductor_quantizer as x86
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

    batches = iter(calibration_batches)
    first = next(batches, None)
    if first is None:
        raise ValueError("int8 calibration needs at least one batch of images")
    quantizer = x86.X86InductorQuantizer()
    quantizer.set_global(x86.get_default_x86_inductor_quantization_config())
    prepared = prepare_pt2e(export_model(model, first).module(), quantizer)
    with torch.no_grad():
        for images in [first, *batches]:
            prepared(images)  # the observers record each activation's range
    quantized = convert_pt2e(prepared)
    return drop_unused_weights(quantized)


def drop_unused_weights(graph_module: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """Remove tensors the graph no longer reads. After `convert_pt2e` the fp32 weights stay attached beside their int8
    copies, so the module (and anything exported from it) would be larger than the fp32 model."""
    used = {node.target for node in graph_module.graph.nodes if node.op == "get_attr"}
    for name in [name for name, _ in [*graph_module.named_parameters(), *graph_module.named_buffers()]
                 if name not in used]:
        owner_name, _, attribute = name.rpartition(".")
        owner = graph_module.get_submodule(owner_name) if owner_name else graph_module
        delattr(owner, attribute)
    return graph_module


class BFloat16Model(torch.nn.Module):
    """The model with bf16 weights that takes and returns fp32 tensors: the bf16 deployment.
    On x86, oneDNN runs bf16 convolutions with AVX512-BF16 or AMX-BF16 instructions when the CPU has
    them; without them bf16 is emulated and slower than fp32."""

    def __init__(self, model: torch.nn.Module):
        super().__init__()
        self.model = copy.deepcopy(model).to(torch.bfloat16).eval()

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.model(images.to(torch.bfloat16)).float()


def model_size_bytes(model: torch.nn.Module) -> int:
    """Bytes of the weights and buffers a model holds (for a graph, those it reads): int8 weights
    count 1 byte each, bf16 2, fp32 4. Pruned zeros still count: they are stored."""
    tensors = {**dict(model.named_parameters()), **dict(model.named_buffers())}
    if isinstance(model, torch.fx.GraphModule):
        used = {node.target for node in model.graph.nodes if node.op == "get_attr"}
        tensors = {name: tensor for name, tensor in tensors.items() if name in used}
    return sum(tensor.numel() * tensor.element_size() for tensor in tensors.values())
