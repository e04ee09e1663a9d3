"""Precision switches: one code path (autocast or a no-op, a scaler that is enabled only for fp16), and
one answer to "does this device run bf16"."""
import functools

import pytest
import torch

from course_lib.config import ConfigError
from course_lib.engine import auto_precision, precision
from course_lib.measure import peak


@pytest.mark.parametrize("name, dtype", [("fp16", torch.float16), ("bf16", torch.bfloat16)])
def test_autocast_runs_matmuls_in_the_reduced_dtype(name, dtype):
    a, b = torch.randn(4, 4), torch.randn(4, 4)
    with precision.autocast(name, "cpu"):
        assert (a @ b).dtype == dtype
    with precision.autocast("off", "cpu"):
        assert (a @ b).dtype == torch.float32


@pytest.mark.parametrize("name, enabled", [("off", False), ("bf16", False), ("fp16", True)])
def test_grad_scaler_only_for_fp16(name, enabled):
    assert precision.grad_scaler(name, "cpu").is_enabled() is enabled


def test_explicit_choices_pass_and_unknown_is_refused():
    assert precision.resolve_precision("bf16", torch.device("cpu")) == "bf16"
    with pytest.raises(ConfigError, match="not one of"):
        precision.resolve_precision("fp8", torch.device("cpu"))


def test_auto_without_a_model_points_to_the_one_rule(monkeypatch):
    def fail(device):
        raise AssertionError("no matmul fallback: auto is decided by timing the model")

    monkeypatch.setattr(peak, "recommended_precision", fail)
    with pytest.raises(ConfigError, match="auto_precision.resolve"):
        precision.resolve_precision("auto", torch.device("cpu"))


def test_auto_on_meta_keeps_fp32_without_measuring(monkeypatch):
    def fail(device):
        raise AssertionError("a meta device has no speed to measure")

    monkeypatch.setattr(peak, "recommended_precision", fail)
    assert precision.resolve_precision("auto", torch.device("meta")) == "off"


def test_matmul_precision_sets_matmuls_and_convolutions_on_cuda_only(monkeypatch):
    from course_lib.engine.precision import apply_matmul_precision

    calls = []
    monkeypatch.setattr(torch, "set_float32_matmul_precision", calls.append)
    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", True)
    assert apply_matmul_precision("high", "cpu") is False and calls == []  # no TF32 to switch on a CPU
    assert apply_matmul_precision("highest", "cuda:0") is True
    assert calls == ["highest"] and torch.backends.cudnn.allow_tf32 is False  # exact fp32 convolutions too
    assert apply_matmul_precision("medium", "cuda") is True
    assert calls[-1] == "medium" and torch.backends.cudnn.allow_tf32 is True
    with pytest.raises(ConfigError, match="matmul_precision='low' is not one of highest, high, medium"):
        apply_matmul_precision("low", "cuda")


def test_matmul_precision_is_a_checked_config_value():
    from course_lib.config import make_config

    assert make_config("gpu").matmul_precision == "high" and make_config("cpu").matmul_precision == "highest"
    with pytest.raises(ConfigError, match="matmul_precision='fast' is not one of highest, high, medium"):
        make_config("cpu", matmul_precision="fast")


@pytest.mark.parametrize("device, capability, macos_14, expected", [
    ("cuda", (7, 0), None, False),  # V100: torch.cuda.is_bf16_supported() says True, counting emulation
    ("cuda", (7, 5), None, False),  # T4
    ("cuda", (8, 0), None, True),  # A100
    ("mps", None, False, False),  # macOS 13: the probe and the precision check used to accept it
    ("mps", None, True, True),
    ("cpu", None, None, True),
])
def test_every_bf16_question_gets_the_one_answer(monkeypatch, device, capability, macos_14, expected):
    """The three places that ask (resolve_precision, auto_precision.supported, the matmul probe) disagreed
    on pre-Ampere CUDA and older macOS; they now all ask `precision.bf16_supported`."""
    # lru_cache: torch._dynamo (imported by timm) reads __wrapped__ of torch's own is_available.
    monkeypatch.setattr(torch.cuda, "is_available", functools.lru_cache(lambda: capability is not None))
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda including_emulation=True: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "Tesla V100-SXM2-16GB")
    monkeypatch.setattr(torch.backends.mps, "is_available", functools.lru_cache(lambda: macos_14 is not None))
    monkeypatch.setattr(torch.backends.mps, "is_macos_or_newer", lambda major, minor: bool(macos_14))
    answers = {precision.bf16_supported(device), auto_precision.supported("bf16", device),
               peak.dtype_supported(device, "bf16")}
    assert answers == {expected}
    assert auto_precision.reduced_precision(device) == ("bf16" if expected else "fp16")
    if expected:
        assert precision.resolve_precision("bf16", torch.device(device)) == "bf16"
    else:
        with pytest.raises(ConfigError, match="no bf16 support; use precision=fp16"):
            precision.resolve_precision("bf16", torch.device(device))
