"""Mixed precision: autocast to fp16 (with a GradScaler) or bf16 (no scaler needed), one code path.

fp16 has a narrow exponent range, so small gradients underflow to zero; GradScaler multiplies
the loss before backward and divides the gradients before the step, skipping steps whose
gradients overflowed (Micikevicius et al. 2018, "Mixed Precision Training", arXiv:1710.03740).
bf16 keeps fp32's exponent range and needs no scaler. See https://pytorch.org/docs/stable/amp.html.
Autocast and GradScaler take the device type, so the same calls serve CUDA, CPU and Apple's MPS
(fp16 and bf16 autocast on MPS). Whether a device runs bf16 is decided once, by `bf16_supported`.
"""
from __future__ import annotations

from contextlib import nullcontext

import torch

from course_lib.config import ConfigError, mps_available

PRECISIONS = ("off", "fp16", "bf16")
DTYPES = {"off": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


def bf16_supported(device) -> bool:
    """Whether `device` runs bf16 natively: the workbook's one bf16 rule (`resolve_precision`,
    `auto_precision.supported` and `measure.peak`'s matmul probe all ask it). Every CPU autocasts to
    bf16; a CUDA GPU needs compute capability 8.0 (Ampere) or newer, since older ones only emulate it,
    slowly, which `torch.cuda.is_bf16_supported()` counts as support; MPS needs macOS 14 or later."""
    device = torch.device(device)
    if device.type == "cpu":
        return True
    if device.type == "cuda":
        return torch.cuda.is_available() and torch.cuda.get_device_capability(device)[0] >= 8
    if device.type == "mps":
        return mps_available() and torch.backends.mps.is_macos_or_newer(14, 0)
    return False


def resolve_precision(requested: str, device: torch.device) -> str:
    """An explicit choice, checked: one the device cannot run at all is refused with the fix.
    `auto` is decided in one place, `auto_precision.resolve`, by timing training steps of the model;
    here, with no model, it is only answered on `meta` (shapes only, no speed: fp32)."""
    device = torch.device(device)
    if requested == "auto":
        if device.type == "meta":  # shapes only (memory estimates): no speed to measure, keep fp32
            return "off"
        raise ConfigError("precision=auto is decided by timing the model: call "
                          "course_lib.engine.auto_precision.resolve(precision, model, image_size, num_classes, device)")
    if requested not in PRECISIONS:
        raise ConfigError(f"precision={requested!r} is not one of off, fp16, bf16, auto")
    if requested == "bf16" and device.type != "meta" and not bf16_supported(device):
        name = torch.cuda.get_device_name(device) if device.type == "cuda" and torch.cuda.is_available() else (
            "this Mac (bf16 on MPS needs macOS 14 or later)" if device.type == "mps" else str(device))
        raise ConfigError(f"{name} has no bf16 support; use precision=fp16")
    return requested


def autocast(precision: str, device: torch.device):
    """The forward-pass context: autocast for fp16/bf16, a no-op for off."""
    device = torch.device(device)
    if precision == "off":
        return nullcontext()
    return torch.autocast(device_type=device.type, dtype=DTYPES[precision])


def grad_scaler(precision: str, device: torch.device) -> torch.amp.GradScaler:
    """A GradScaler that only scales for fp16; for off/bf16 its calls pass straight through,
    so the training loop has one code path."""
    return torch.amp.GradScaler(torch.device(device).type, enabled=precision == "fp16")


# fp32 matmuls and convolutions on tensor cores (TF32: fp32's range, a 10-bit mantissa), the
# PyTorch performance-tuning guide's switch: https://pytorch.org/docs/stable/notes/cuda.html#tf32-on-ampere
MATMUL_PRECISIONS = ("highest", "high", "medium")


def apply_matmul_precision(matmul_precision: str, device) -> bool:
    """Set how fp32 math runs on a CUDA device: `torch.set_float32_matmul_precision` for matmuls
    and the same answer for cuDNN's convolutions (`cudnn.allow_tf32`, on by default in torch), so
    one Config value decides whether fp32 work may use TF32 tensor cores (high, medium) or stays
    exact (highest); `measure.peak.mfu_peak` reads the same value for the MFU denominator.
    Returns False, changing nothing, off CUDA: CPUs and Apple GPUs have no TF32 to switch."""
    if matmul_precision not in MATMUL_PRECISIONS:
        raise ConfigError(f"matmul_precision={matmul_precision!r} is not one of {', '.join(MATMUL_PRECISIONS)}")
    if torch.device(device).type != "cuda":
        return False
    torch.set_float32_matmul_precision(matmul_precision)
    torch.backends.cudnn.allow_tf32 = matmul_precision != "highest"
    return True
