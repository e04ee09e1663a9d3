"""`measure.peak`: the matmul probe (warm-up, repeats, best and median), the precision it recommends,
and the one MFU rule (`mfu_peak`) with the copy-bandwidth probe."""
import functools

import pandas as pd
import pytest
import torch

from course_lib.measure import flops, gpu_check, peak


@pytest.mark.parametrize("speeds, expected", [
    ({"fp32": 20.0, "fp16": 1.0, "bf16": 9.0}, "off"),  # a CPU: reduced precision is slower
    ({"fp32": 19.5, "fp16": 250.0, "bf16": 245.0}, "bf16"),  # Ampere: bf16 as fast, no scaler needed
    ({"fp32": 15.0, "fp16": 110.0, "bf16": None}, "fp16"),  # Volta: no bf16
    ({"fp32": 30.0, "fp16": 200.0, "bf16": 100.0}, "fp16"),  # bf16 clearly slower than fp16
])
def test_recommended_precision_follows_measured_speed(monkeypatch, speeds, expected):
    monkeypatch.setattr(peak, "measure_matmul_tflops", lambda device, dtype: speeds[dtype])
    peak._recommended_precision.cache_clear()
    try:
        assert peak._recommended_precision("cuda:7") == expected
    finally:
        peak._recommended_precision.cache_clear()


def test_matmul_probe_on_cpu():
    assert peak.measure_matmul_tflops("cpu", "fp32") > 0
    assert peak.measure_matmul_tflops("cpu", "tf32") is None  # a CUDA mode
    assert peak.peak_flops("cpu", "fp32") == pytest.approx(peak.measure_matmul_tflops("cpu", "fp32") * 1e12)
    assert peak.recommended_precision("cpu") in ("off", "fp16", "bf16")
    with pytest.raises(ValueError, match="unknown dtype"):
        peak.dtype_supported("cpu", "fp8")


def test_peak_is_the_fastest_repeat_and_typical_the_median():
    # A disturbance only slows a repeat down: 1 s is the clean one, 4 s and 9 s were disturbed.
    best, typical = peak.peak_and_typical([2.0, 1.0, 9.0, 4.0, 2.5], flops_per_matmul=10.0)
    assert best == pytest.approx(10.0) and typical == pytest.approx(10.0 / 2.5)


def test_matmul_probe_warms_up_repeats_and_reports_best_and_median():
    result = peak.matmul_probe("cpu", "fp32", budget_seconds=0.1)  # own cache entry: short on purpose
    assert result["size"] >= peak.MATMUL_START_SIZE
    assert peak.MATMUL_MIN_REPEATS <= result["repeats"] <= peak.MATMUL_MAX_REPEATS
    assert result["tflops"] >= result["tflops_median"] > 0
    assert result["tflops"] == pytest.approx(2 * result["size"] ** 3 / result["seconds_per_matmul"] / 1e12)
    assert peak.matmul_budget_seconds("cpu", "fp32") > peak.matmul_budget_seconds("cpu", "bf16")


# --- the one MFU rule (peak.mfu_peak): The one MFU rule (`measure.peak.mfu_peak`): every MFU figure, the notebooks' `flops.with_mfu` and `workbook gpu-check`'s rows alike, divides by the peak it picks, on a faked A100 and H200.

def fake_gpu(monkeypatch, name, capability):
    monkeypatch.setattr(torch.cuda, "is_available", functools.lru_cache(lambda: True))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: name)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)


# (device name, compute capability, precision, matmul_precision) -> (dtype, dense datasheet TFLOP/s)
CASES = [
    ("NVIDIA A100-SXM4-80GB", (8, 0), "off", "highest", "fp32", 19.5),
    ("NVIDIA A100-SXM4-80GB", (8, 0), "off", "high", "tf32", 156.0),
    ("NVIDIA A100-SXM4-80GB", (8, 0), "bf16", "highest", "bf16", 312.0),
    ("NVIDIA H200", (9, 0), "off", "highest", "fp32", 67.0),
    ("NVIDIA H200", (9, 0), "off", "medium", "tf32", 494.7),
    ("NVIDIA H200", (9, 0), "fp16", "high", "fp16", 989.4),
    ("NVIDIA H200 NVL", (9, 0), "bf16", "high", "bf16", 835.5),
    ("Tesla V100-SXM2-16GB", (7, 0), "off", "high", "fp32", 15.7),  # no TF32 before Ampere
]


@pytest.mark.parametrize("name, capability, precision, matmul_precision, dtype, tflops", CASES)
def test_one_rule_picks_the_denominator(monkeypatch, name, capability, precision, matmul_precision, dtype, tflops):
    fake_gpu(monkeypatch, name, capability)
    chosen = peak.mfu_peak(precision, "cuda:0", matmul_precision)
    assert chosen["dtype"] == dtype and chosen["peak_flops"] == pytest.approx(tflops * 1e12)
    assert chosen["source"].startswith("datasheet (")


@pytest.mark.parametrize("name, capability", [("NVIDIA A100-SXM4-80GB", (8, 0)), ("NVIDIA H200", (9, 0))])
def test_notebooks_and_gpu_check_give_the_same_mfu(monkeypatch, name, capability):
    """The bug this rule fixed: gpu-check divided fp32 by the TF32 peak and with_mfu by the fp32 peak
    (494.7 against 67.0 TFLOP/s on an H200, a 7.4x difference for the same step)."""
    fake_gpu(monkeypatch, name, capability)
    per_image, speed = 24.6e9, 1000.0  # about ResNet-50 at 224 px, training
    table = pd.DataFrame({"precision": ["off", "off", "bf16"], "images/s": [speed] * 3})
    for matmul_precision in ("highest", "high"):
        notebook = flops.with_mfu(table, None, 224, "cuda:0", "precision", flops_per_image=per_image,
                                  matmul_precision=matmul_precision)["MFU"]
        for row, precision in zip(notebook, table["precision"]):
            check = flops.model_flops_utilization(per_image, speed, "cuda:0", precision, matmul_precision)
            expected = per_image * speed / peak.mfu_peak(precision, "cuda:0", matmul_precision)["peak_flops"]
            assert row == pytest.approx(expected) == pytest.approx(check["mfu"])
    fp32_exact = flops.model_flops_utilization(per_image, speed, "cuda:0", torch.float32, "highest")
    fp32_tf32 = flops.model_flops_utilization(per_image, speed, "cuda:0", "fp32", "high")
    assert fp32_exact["peak_dtype"] == "fp32" and fp32_tf32["peak_dtype"] == "tf32"
    assert fp32_exact["mfu"] / fp32_tf32["mfu"] == pytest.approx(peak.datasheet_tflops(name, "tf32") /
                                                                 peak.datasheet_tflops(name, "fp32"))


def test_without_a_given_matmul_precision_the_process_settings_decide(monkeypatch):
    fake_gpu(monkeypatch, "NVIDIA H200", (9, 0))
    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", False)
    monkeypatch.setattr(torch, "get_float32_matmul_precision", lambda: "highest")
    assert peak.mfu_dtype("off", "cuda:0") == "fp32"
    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", True)  # torch's default: cuDNN convolutions in TF32
    assert peak.mfu_dtype("off", "cuda:0") == "tf32"


def test_on_cpu_fp32_is_always_the_measured_fp32_peak():
    assert peak.mfu_dtype("off", "cpu", "high") == "fp32"
    with pytest.raises(ValueError, match="give off"):
        peak.mfu_peak("int8", "cpu")


def test_gpu_check_rows_use_the_rule(monkeypatch):
    """measure_variant's MFU comes from model_flops_utilization, i.e. from mfu_peak (here on the CPU)."""
    seen = []
    monkeypatch.setattr(peak, "peak_flops", lambda device, dtype: 1e9)  # no CPU matmul probe: a known peak
    real = peak.mfu_peak
    monkeypatch.setattr(peak, "mfu_peak", lambda *args: seen.append(args) or real(*args))
    row = gpu_check.measure_variant("test_resnet", 32, 2, "cpu", steps=1, warmup=0, num_classes=10,
                                    matmul_precision="high")
    assert seen == [("off", torch.device("cpu"), "high")]
    assert row["mfu_dtype"] == "fp32" and row["mfu"] == pytest.approx(row["achieved_tflops"] * 1e12 / 1e9)


def test_copy_bandwidth_and_the_ridge():
    copy = peak.copy_bandwidth("cpu", size_bytes=16 * 2**20, repeats=3)
    assert copy["bytes_moved"] == 2 * 16 * 2**20 and copy["gb_per_second"] >= copy["gb_per_second_median"] > 0
    assert peak.ridge_intensity(989.4e12, 4.8e12) == pytest.approx(206, abs=1)  # H200 bf16 over 4.8 TB/s
