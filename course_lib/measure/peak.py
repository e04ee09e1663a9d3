"""Peak arithmetic throughput per dtype: a timed square-matmul probe (best of repeats after a thrown-away
warm-up) and dense datasheet peaks for common GPUs, keyed by exact device name; the one rule that
picks the MFU denominator for a precision on a device (`mfu_peak`); a same-device copy for memory
bandwidth (the roofline's other roof); and the precision that is measured to be fastest on a device. NVIDIA, "GPU Performance Background User's Guide" (Tensor Core
dtypes); PyTorch AMP docs for fp16 vs bf16.
"""
from __future__ import annotations

import functools
import time

import torch

from course_lib import devices
from course_lib.devices import as_device
from course_lib.engine.auto_precision import decide
from course_lib.engine.precision import bf16_supported
from course_lib.instruments.timing import stopwatch, time_repeats

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
# Dense datasheet peaks in TFLOP/s, for MFU: never the 2:4-sparse figures the datasheets print
# first (those are exactly twice these). fp16/bf16 and tf32 are tensor-core numbers with fp32
# accumulation; fp32 is the plain (non-tensor-core) rate. One row per part: the SXM, PCIe and NVL
# forms of one chip differ in clocks and power, so in their peaks (NVIDIA H100 and H200 datasheets,
# 2024; A100 datasheet, 2021; L4/L40/L40S/A10 product briefs; Ada and Ampere GeForce whitepapers).
DATASHEET_TFLOPS = {
    "H200 SXM": {"fp32": 67.0, "tf32": 494.7, "fp16": 989.4, "bf16": 989.4},
    "H200 NVL": {"fp32": 60.0, "tf32": 417.5, "fp16": 835.5, "bf16": 835.5},
    "H100 SXM": {"fp32": 67.0, "tf32": 494.7, "fp16": 989.4, "bf16": 989.4},
    "H100 PCIe": {"fp32": 51.2, "tf32": 378.0, "fp16": 756.0, "bf16": 756.0},
    "H100 NVL": {"fp32": 60.0, "tf32": 417.5, "fp16": 835.5, "bf16": 835.5},
    "A100": {"fp32": 19.5, "tf32": 156.0, "fp16": 312.0, "bf16": 312.0},  # SXM4 and PCIe, 40 and 80 GB alike
    "L40S": {"fp32": 91.6, "tf32": 183.0, "fp16": 362.0, "bf16": 362.0},
    "L40": {"fp32": 90.5, "tf32": 90.5, "fp16": 181.0, "bf16": 181.0},
    "L4": {"fp32": 30.3, "tf32": 60.0, "fp16": 121.0, "bf16": 121.0},
    "A10G": {"fp32": 31.2, "tf32": 62.5, "fp16": 125.0, "bf16": 125.0},
    "A10": {"fp32": 31.2, "tf32": 62.5, "fp16": 125.0, "bf16": 125.0},
    "RTX 4090": {"fp32": 82.6, "tf32": 82.6, "fp16": 165.2, "bf16": 165.2},
    "RTX 3090": {"fp32": 35.6, "tf32": 35.6, "fp16": 71.0, "bf16": 71.0},
    "V100 SXM2": {"fp32": 15.7, "fp16": 125.0},
    "V100 PCIe": {"fp32": 14.0, "fp16": 112.0},
    "T4": {"fp32": 8.1, "fp16": 65.0},
}
# The exact names `torch.cuda.get_device_name` (and nvidia-smi) print for each part. Matched
# whole, never as substrings: "NVIDIA H200 NVL" contains "NVIDIA H200", and a substring match gave
# the NVL part the SXM part's peak. A name not listed gets the measured matmul as its peak. Per part:
_PART_NAMES = {
    "H200 SXM": ("NVIDIA H200",),  # the SXM part is named plainly
    "H200 NVL": ("NVIDIA H200 NVL",),
    "H100 SXM": ("NVIDIA H100 80GB HBM3", "NVIDIA H100 SXM5 80GB"),
    "H100 PCIe": ("NVIDIA H100 PCIe",),
    "H100 NVL": ("NVIDIA H100 NVL",),
    "A100": ("NVIDIA A100-SXM4-40GB", "NVIDIA A100-SXM4-80GB", "NVIDIA A100-PCIE-40GB", "NVIDIA A100 80GB PCIe"),
    "L40S": ("NVIDIA L40S",), "L40": ("NVIDIA L40",), "L4": ("NVIDIA L4",),
    "A10G": ("NVIDIA A10G",), "A10": ("NVIDIA A10",),
    "RTX 4090": ("NVIDIA GeForce RTX 4090",), "RTX 3090": ("NVIDIA GeForce RTX 3090",),
    "V100 SXM2": ("Tesla V100-SXM2-16GB", "Tesla V100-SXM2-32GB"),
    "V100 PCIe": ("Tesla V100-PCIE-16GB", "Tesla V100-PCIE-32GB"),
    "T4": ("Tesla T4",),
}
DEVICE_NAMES = {name: part for part, names in _PART_NAMES.items() for name in names}
# fp32 matmul precisions (torch.set_float32_matmul_precision) that let fp32 work run on TF32 tensor cores.
TF32_MATMUL_PRECISIONS = ("high", "medium")


def dtype_supported(device, dtype_name: str) -> bool:
    """Whether a matmul in this dtype runs on the device at all (tf32 is a CUDA Ampere+ mode; bf16 is
    `engine.precision.bf16_supported`, the one bf16 rule)."""
    device = as_device(device)
    if dtype_name not in DTYPE_NAMES:
        raise ValueError(f"unknown dtype {dtype_name!r}; valid: {', '.join(DTYPE_NAMES)}")
    if dtype_name == "bf16":
        return bf16_supported(device)
    if device.type == "cpu":
        return dtype_name != "tf32"
    if device.type == "cuda" and torch.cuda.is_available():
        major = torch.cuda.get_device_capability(device)[0]
        return {"fp32": True, "fp16": major >= 6, "tf32": major >= 8}[dtype_name]
    if device.type == "mps" and devices.mps_available():
        return dtype_name != "tf32"
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
            seconds = min(stopwatch(lambda: a @ b, device, 1)[0] for _ in range(3))
            # Double while the minimum repeats at twice the side (8x the work) still fit the
            # budget: slow dtypes stay small, fast ones grow to the plateau.
            if size >= max_size or 8 * seconds * MATMUL_MIN_REPEATS > budget_seconds:
                break
            size *= 2
        seconds = max(seconds, 1e-7)
        calls = max(1, int(MATMUL_REPEAT_SECONDS / seconds))
        count = min(MATMUL_MAX_REPEATS, max(MATMUL_MIN_REPEATS, int(budget_seconds / (calls * seconds))))
        repeats = [stopwatch(lambda: a @ b, device, calls)[0] for _ in range(count)]
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
    """Measured square-matmul throughput, cached per device and dtype: the best of 5 to 50 timed repeats after a
    warm-up as `tflops`, the median as `tflops_median`, in about `budget_seconds` (`matmul_budget_seconds`)."""
    device = as_device(device)
    if budget_seconds is None:
        budget_seconds = matmul_budget_seconds(device, dtype)
    return _matmul_probe(str(device), _dtype_name(dtype), float(budget_seconds))


def measure_matmul_tflops(device, dtype) -> float | None:
    """Peak matmul TFLOP/s of `dtype` (a DTYPE_NAMES name or a torch dtype) on `device`, the best repeat of
    `matmul_probe` (cached); None where the dtype does not run there."""
    return matmul_probe(device, dtype)["tflops"]


def datasheet_entry(gpu_name: str) -> str | None:
    """The DATASHEET_TFLOPS key of a GPU name as torch or nvidia-smi print it ("NVIDIA H100 80GB HBM3" -> "H100 SXM";
    case and repeated spaces ignored); None for a name `DEVICE_NAMES` does not list."""
    wanted = " ".join(gpu_name.split()).casefold()
    return next((part for name, part in DEVICE_NAMES.items() if name.casefold() == wanted), None)


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


def _precision_name(precision) -> str:
    """"off" | "fp16" | "bf16" from a training precision or a dtype ("fp32", torch.float32 -> "off")."""
    if isinstance(precision, torch.dtype):
        return {torch.float32: "off", torch.float16: "fp16", torch.bfloat16: "bf16"}[precision]
    if precision in (None, "off", "fp32", "tf32"):
        return "off"
    if precision in ("fp16", "bf16"):
        return precision
    raise ValueError(f"precision {precision!r} has no MFU peak; give off (fp32), fp16 or bf16 (for auto: the "
                     "precision the run resolved, FitResult.precision)")


def tf32_allowed(matmul_precision: str | None = None) -> bool:
    """Whether fp32 work may run on TF32 tensor cores: the Config's `matmul_precision` high or medium (matmuls and
    cuDNN alike); None reads this process's settings, where either lets it (cuDNN's allow_tf32 is on by default)."""
    if matmul_precision is not None:
        return matmul_precision in TF32_MATMUL_PRECISIONS
    return torch.get_float32_matmul_precision() in TF32_MATMUL_PRECISIONS or bool(torch.backends.cudnn.allow_tf32)


def mfu_dtype(precision, device, matmul_precision: str | None = None) -> str:
    """The dtype whose peak is the MFU denominator of a step in `precision` on `device`: fp16/bf16 as trained; fp32
    against TF32 only on a GPU with TF32 tensor cores whose fp32 work may use them (`tf32_allowed`)."""
    name = _precision_name(precision)
    if name != "off":
        return name
    device = as_device(device)
    if tf32_allowed(matmul_precision) and dtype_supported(device, "tf32"):
        return "tf32"
    return "fp32"


def mfu_peak(precision, device, matmul_precision: str | None = None) -> dict:
    """The one MFU rule, by which every MFU of the workbook divides: {"dtype" (`mfu_dtype`), "peak_flops" (FLOP/s;
    None when nothing can be measured), "source"} for a step trained in `precision` on `device`."""
    dtype = mfu_dtype(precision, device, matmul_precision)
    return {"dtype": dtype, "peak_flops": peak_flops(device, dtype), "source": peak_flops_source(device, dtype)}


# --- memory bandwidth ---------------------------------------------------------------------------

COPY_BYTES = {"cuda": 2 * 2**30, "mps": 2**30, "cpu": 256 * 2**20}  # source buffer: several times any cache
COPY_REPEATS = 10  # timed copies after one thrown-away warm-up; the best one is the peak


@functools.lru_cache(maxsize=None)
def _copy_probe(device_name: str, size_bytes: int, repeats: int) -> dict:
    device = torch.device(device_name)
    source = torch.empty(size_bytes // 4, dtype=torch.float32, device=device).fill_(1.0)
    target = torch.empty_like(source)
    # One thrown-away warm-up (first-touch pages, lazy init), then the timed copies between syncs.
    timing = time_repeats(lambda: target.copy_(source), repeats=repeats, warmup=1, device=device)
    moved = 2 * source.numel() * source.element_size()  # bytes read plus bytes written
    best, median = timing.best, timing.median
    return {"device": device_name, "bytes_copied": moved // 2, "bytes_moved": moved, "seconds": best,
            "gb_per_second": moved / best / 1e9, "gb_per_second_median": moved / median / 1e9, "repeats": repeats}


def copy_bandwidth(device, size_bytes: int | None = None, repeats: int = COPY_REPEATS) -> dict:
    """Memory bandwidth of `device` (the roof of memory-bound work) from copying a buffer several times the caches,
    bytes read plus written as STREAM's copy counts them: best repeat `gb_per_second`, and the median. Cached."""
    device = as_device(device)
    size = int(size_bytes or COPY_BYTES.get(device.type, COPY_BYTES["cpu"]))
    return _copy_probe(str(device), size, int(repeats))


def ridge_intensity(peak_flops_per_second: float, bytes_per_second: float) -> float:
    """FLOP per byte at which a roofline's two roofs meet: below it work is bound by memory
    bandwidth, above it by arithmetic (Williams et al. 2009, "Roofline", CACM 52(4))."""
    return peak_flops_per_second / bytes_per_second


@functools.lru_cache(maxsize=None)
def _recommended_precision(device_name: str) -> str:
    # The one rule (a reduced dtype must beat fp32 by 10%; bf16 preferred when close), applied to
    # seconds per unit of matmul work instead of seconds per training step.
    seconds = {"off" if name == "fp32" else name: (1.0 / tflops if tflops else None)
               for name, tflops in ((n, measure_matmul_tflops(device_name, n)) for n in ("fp32", "bf16", "fp16"))}
    return decide(seconds)


def recommended_precision(device) -> str:
    """"fp16" | "bf16" | "off": the doctor's advice, `auto_precision.decide` on matmul times on `device` (the
    engine's precision=auto times training steps instead); "off" where none beats fp32 (most CPUs). Cached."""
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
