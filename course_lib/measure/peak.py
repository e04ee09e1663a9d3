"""Peak arithmetic throughput per dtype: a timed square-matmul probe (best of repeats after a thrown-away
warm-up) and datasheet peaks for common GPUs, the denominators of MFU; and the precision that is
measured to be fastest on a device. NVIDIA, "GPU Performance Background User's Guide" (Tensor Core
dtypes); PyTorch AMP docs for fp16 vs bf16.
"""
from __future__ import annotations

import functools
import time

import torch

from course_lib import devices
from course_lib.devices import as_device
from course_lib.instruments.timing import stopwatch

# Default seconds per probe. fp32 on CPU is the MFU denominator there, so it gets the most; CPU
# fp16/bf16 are mostly emulated (10-400x slower) and only need comparing with fp32.
MATMUL_BUDGET_SECONDS = {("cpu", "fp32"): 1.5, "cpu": 0.5, "cuda": 0.5, "mps": 0.5}
# Largest square side per device type: large enough to reach the throughput plateau (on a
# 2-core Xeon, fp32 climbs from ~40-90 GFLOP/s at 512 to ~110-165 at 1024-2048), bounded by time.
MATMUL_MAX_SIZE = {"cuda": 8192, "mps": 4096, "cpu": 2048}
MATMUL_START_SIZE = 256  # smaller sides time thread wake-ups, not arithmetic (and may stop the ladder early)
MATMUL_REPEAT_SECONDS = 0.02  # a repeat runs back-to-back matmuls for about this long (amortizes the sync)
MATMUL_MAX_REPEATS = 50  # at most: many short repeats give the best one more chances to miss a disturbance
# Why the probe reports the best repeat as the peak: a matmul cannot run faster than the hardware
# allows, so every disturbance (another process on the cores, a frequency drop, a page fault, a
# GPU clock ramping up) only makes a repeat slower. The fastest repeat is therefore the closest
# estimate of what the device can reach, and far steadier than one timing: on the shared 2-core
# CPU this was written on, single small 0.4 s probes gave anything from 1.4 to 176 GFLOP/s. It is
# still a lower bound where other work keeps the cores busy for the whole probe (every repeat is
# then slow alike), so name the machine's load next to the number.
# The median is the right statistic for *typical* throughput (how fast a training step usually
# runs, as the engine and the benchmarks report), so the probe returns it too, and a wide gap
# between the two says the machine was busy during the probe.
MATMUL_MIN_REPEATS = 5  # timed repeats per probe at least, after a thrown-away warm-up
DTYPE_NAMES = ("fp32", "tf32", "fp16", "bf16")
_TORCH_DTYPES = {"fp32": torch.float32, "tf32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
# Dense (no sparsity) datasheet peaks in TFLOP/s, for MFU; fp16/bf16 are tensor-core numbers with
# fp32 accumulation. Keys are matched as substrings of the device name, most specific first.
DATASHEET_TFLOPS = {
    "H200": {"fp32": 67.0, "tf32": 494.7, "fp16": 989.4, "bf16": 989.4},
    "H100 PCIe": {"fp32": 51.2, "tf32": 378.0, "fp16": 756.0, "bf16": 756.0},
    "H100": {"fp32": 67.0, "tf32": 494.7, "fp16": 989.4, "bf16": 989.4},
    "A100": {"fp32": 19.5, "tf32": 156.0, "fp16": 312.0, "bf16": 312.0},
    "L40S": {"fp32": 91.6, "tf32": 183.0, "fp16": 362.0, "bf16": 362.0},
    "L40": {"fp32": 90.5, "tf32": 90.5, "fp16": 181.0, "bf16": 181.0},  # before "L4": "L40" contains it
    "L4": {"fp32": 30.3, "tf32": 60.0, "fp16": 121.0, "bf16": 121.0},
    "A10G": {"fp32": 31.2, "tf32": 62.5, "fp16": 125.0, "bf16": 125.0},
    "A10": {"fp32": 31.2, "tf32": 62.5, "fp16": 125.0, "bf16": 125.0},
    "RTX 4090": {"fp32": 82.6, "tf32": 82.6, "fp16": 165.2, "bf16": 165.2},
    "RTX 3090": {"fp32": 35.6, "tf32": 35.6, "fp16": 71.0, "bf16": 71.0},
    "V100": {"fp32": 15.7, "fp16": 125.0},
    "T4": {"fp32": 8.1, "fp16": 65.0},
}


def dtype_supported(device, dtype_name: str) -> bool:
    """Whether a matmul in this dtype runs on the device at all (tf32 is a CUDA Ampere+ mode)."""
    device = as_device(device)
    if dtype_name not in DTYPE_NAMES:
        raise ValueError(f"unknown dtype {dtype_name!r}; valid: {', '.join(DTYPE_NAMES)}")
    if device.type == "cpu":
        return dtype_name != "tf32"
    if device.type == "cuda" and torch.cuda.is_available():
        major = torch.cuda.get_device_capability(device)[0]
        return {"fp32": True, "fp16": major >= 6, "tf32": major >= 8, "bf16": major >= 8}[dtype_name]
    if device.type == "mps" and devices.mps_available():
        return dtype_name != "tf32"  # bf16 needs macOS 14+: the probe records the error where it is older
    return False


def _dtype_name(dtype) -> str:
    if isinstance(dtype, str):
        return dtype
    return {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16"}[dtype]


def matmul_budget_seconds(device, dtype) -> float:
    """The default time bound of `matmul_probe` for this device and dtype."""
    device_type = as_device(device).type
    return MATMUL_BUDGET_SECONDS.get((device_type, _dtype_name(dtype)),
                                     MATMUL_BUDGET_SECONDS.get(device_type, MATMUL_BUDGET_SECONDS["cpu"]))


def peak_and_typical(seconds_per_matmul: list[float], flops_per_matmul: float) -> tuple[float, float]:
    """(peak, typical) FLOP/s from timed repeats: the fastest repeat is the peak (disturbances
    only slow a repeat down), the median repeat the typical throughput."""
    ordered = sorted(seconds_per_matmul)
    return flops_per_matmul / ordered[0], flops_per_matmul / ordered[len(ordered) // 2]


def _seconds_per_matmul(a: torch.Tensor, b: torch.Tensor, calls: int, device: torch.device) -> float:
    return stopwatch(lambda: a @ b, device, calls)[0]


@functools.lru_cache(maxsize=None)
def _matmul_probe(device_name: str, dtype_name: str, budget_seconds: float) -> dict:
    device = torch.device(device_name)
    result = {"device": device_name, "dtype": dtype_name, "tflops": None, "tflops_median": None, "size": None,
              "seconds_per_matmul": None, "repeats": 0, "calls_per_repeat": 0, "probe_seconds": None,
              "supported": dtype_supported(device, dtype_name), "note": ""}
    if not result["supported"]:
        result["note"] = "not available on this device"
        return result
    dtype = _TORCH_DTYPES[dtype_name]
    max_size = MATMUL_MAX_SIZE.get(device.type, MATMUL_MAX_SIZE["cpu"])
    previous_tf32 = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = dtype_name == "tf32"
    started = time.perf_counter()
    try:
        size = MATMUL_START_SIZE
        while True:
            a = torch.randn(size, size, device=device).to(dtype)
            b = torch.randn(size, size, device=device).to(dtype)
            a @ b  # warm-up at this size (kernel selection, lazy init, first-touch pages): thrown away
            # The fastest of three single timings decides the growth, so a disturbed timing
            # does not stop the ladder at a size below the plateau.
            seconds = min(_seconds_per_matmul(a, b, 1, device) for _ in range(3))
            # Double while the minimum repeats at twice the side (8x the work) still fit the
            # budget: slow dtypes stay small, fast ones grow to the plateau.
            if size >= max_size or 8 * seconds * MATMUL_MIN_REPEATS > budget_seconds:
                break
            size *= 2
        seconds = max(seconds, 1e-7)
        calls = max(1, int(MATMUL_REPEAT_SECONDS / seconds))
        count = min(MATMUL_MAX_REPEATS, max(MATMUL_MIN_REPEATS, int(budget_seconds / (calls * seconds))))
        repeats = [_seconds_per_matmul(a, b, calls, device) for _ in range(count)]
        peak, typical = peak_and_typical(repeats, 2 * size ** 3)
        result.update(size=size, seconds_per_matmul=min(repeats), tflops=peak / 1e12, tflops_median=typical / 1e12,
                      repeats=count, calls_per_repeat=calls)
        if peak > 1.5 * typical:
            result["note"] = (f"repeats varied (best {peak / 1e9:.3g}, median {typical / 1e9:.3g} GFLOP/s): "
                              "other work was running; the best repeat is kept as the peak")
    except (RuntimeError, TypeError) as error:  # a dtype/op missing in this build
        result.update(supported=False, note=f"matmul failed: {str(error).splitlines()[0]}")
    finally:
        torch.backends.cuda.matmul.allow_tf32 = previous_tf32
    result["probe_seconds"] = time.perf_counter() - started
    return result


def matmul_probe(device, dtype, budget_seconds: float | None = None) -> dict:
    """Measured square-matmul throughput (cached per device and dtype): the side `size`, the best
    repeat as `tflops` (the achievable peak) and the median repeat as `tflops_median`.
    A thrown-away warm-up, then 5 to 50 timed repeats; bounded to about `budget_seconds`
    plus the size ladder (default `matmul_budget_seconds`: 1.5 s for fp32 on CPU, 0.5 s for other
    CPU dtypes, 0.5 s on a GPU)."""
    device = as_device(device)
    if budget_seconds is None:
        budget_seconds = matmul_budget_seconds(device, dtype)
    return _matmul_probe(str(device), _dtype_name(dtype), float(budget_seconds))


def measure_matmul_tflops(device, dtype) -> float | None:
    """Peak matmul TFLOP/s of `dtype` ("fp32" | "tf32" | "fp16" | "bf16" or a torch dtype) on
    `device` (the best of several timed repeats); None where the dtype does not run there.
    Cached: the first call per dtype costs about `matmul_budget_seconds`."""
    return matmul_probe(device, dtype)["tflops"]


def datasheet_entry(gpu_name: str) -> str | None:
    """The DATASHEET_TFLOPS key for a GPU name as torch or nvidia-smi print it
    ("NVIDIA H100 80GB HBM3" -> "H100"), the first (most specific) key the name contains; None
    for GPUs the table does not list."""
    return next((key for key in DATASHEET_TFLOPS if key in gpu_name), None)


def datasheet_tflops(gpu_name: str, dtype) -> float | None:
    """Dense datasheet TFLOP/s of a GPU, by name, in `dtype`; None when the GPU or dtype is not listed."""
    key = datasheet_entry(gpu_name)
    return DATASHEET_TFLOPS[key].get(_dtype_name(dtype)) if key else None


def _datasheet_tflops(device: torch.device, dtype_name: str) -> tuple[str, float] | None:
    """(table key, dense TFLOP/s) for a known GPU and dtype, else None."""
    if device.type == "cuda" and torch.cuda.is_available():
        gpu_name = torch.cuda.get_device_name(device)
        value = datasheet_tflops(gpu_name, dtype_name)
        if value:
            return datasheet_entry(gpu_name), value
    return None


def peak_flops_source(device, dtype) -> str:
    """Where `peak_flops` takes its number from: the datasheet entry or the measured matmul."""
    entry = _datasheet_tflops(as_device(device), _dtype_name(dtype))
    if entry:
        return f"datasheet ({entry[0]}, dense)"
    return "measured matmul, best of repeats (no datasheet entry for this device)"


def peak_flops(device, dtype) -> float | None:
    """Peak FLOP/s (not TFLOP/s) of `device` in `dtype`, the denominator of MFU: the datasheet's
    dense number for known GPUs, else the measured matmul peak (best repeat: an achievable peak)."""
    device = as_device(device)
    name = _dtype_name(dtype)
    entry = _datasheet_tflops(device, name)
    if entry:
        return entry[1] * 1e12
    measured = measure_matmul_tflops(device, name)
    return measured * 1e12 if measured else None


@functools.lru_cache(maxsize=None)
def _recommended_precision(device_name: str) -> str:
    from course_lib.engine.auto_precision import decide

    # The one rule (a reduced dtype must beat fp32 by 10%; bf16 preferred when close), applied to
    # seconds per unit of matmul work instead of seconds per training step.
    seconds = {"off" if name == "fp32" else name: (1.0 / tflops if tflops else None)
               for name, tflops in ((n, measure_matmul_tflops(device_name, n)) for n in ("fp32", "bf16", "fp16"))}
    return decide(seconds)


def recommended_precision(device) -> str:
    """"fp16" | "bf16" | "off": the doctor's advice from measured matmul throughput on `device`
    (`auto_precision.decide` on matmul times); "off" when no reduced-precision dtype is faster than
    fp32 there (e.g. most CPUs). The engine's precision=auto times training steps instead. Cached."""
    return _recommended_precision(str(as_device(device)))


def matmul_table(device_names: list | None = None, dtypes=DTYPE_NAMES) -> list[dict]:
    """Every (device, dtype) probe with its speed relative to fp32 on the same device."""
    if device_names is None:
        device_names = ["cpu"] + ([f"cuda:{i}" for i in range(torch.cuda.device_count())]
                                  if torch.cuda.is_available() else []) + (["mps"] if devices.mps_available() else [])
    rows = []
    for device in device_names:
        fp32 = measure_matmul_tflops(device, "fp32")
        for name in dtypes:
            row = dict(matmul_probe(device, name))
            row["speed_vs_fp32"] = row["tflops"] / fp32 if row["tflops"] and fp32 else None
            rows.append(row)
    return rows


def plot_matmul(rows: list[dict]):
    """GFLOP/s per dtype and device on a log axis (slow dtypes stay visible)."""
    import matplotlib.pyplot as plt

    measured = [r for r in rows if r["tflops"]]
    figure, axis = plt.subplots(figsize=(6, 3))
    axis.bar([f"{r['device']}\n{r['dtype']}" for r in measured], [r["tflops"] * 1e3 for r in measured],
             color=[f"C{DTYPE_NAMES.index(r['dtype'])}" for r in measured])
    axis.set_yscale("log")
    axis.set_ylabel("GFLOP/s (log)")
    axis.set_title("Measured square-matmul throughput")
    return figure
