"""`measure.peak`: the matmul probe (warm-up, repeats, best and median) and the precision it recommends."""
import pytest

from course_lib.measure import peak


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
