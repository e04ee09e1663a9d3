"""`workbook gpu-check`: every CUDA path of the workbook measured by one command in at most 8 minutes,
for a GPU lent for a short time. Parts, each with its own time budget: the doctor's facts, the decode
benchmark with nvJPEG, fp32 vs fp16 + GradScaler vs bf16 vs channels_last vs torch.compile on
ResNet-50 at 224 px (images/s, peak memory, MFU against the one rule's peak, `peak.mfu_peak`), the
memory bandwidth of a device-to-device copy (the roofline's other roof), the GPU speed switches
(matmul_precision, cudnn_benchmark, compile_mode), the memory estimate against the measured peak
and the real out-of-memory batch finder, the speed-run recipe's time to 97% on EuroSAT (when
present) and DDP scaling (2+ GPUs). `--cpu-dry-run` runs every part's code on the CPU at tiny sizes. A part that fails or overruns is recorded
with its error and the others still run. Results go to docs/results/<gpu>-<date>/ as JSON and a
markdown table. MFU: Chowdhery et al. 2022 (PaLM), App. B; timing: `measure.timing`.
"""
from __future__ import annotations

import dataclasses
import datetime
import functools
import json
import re
import signal
import threading
import time
import traceback
import types
from pathlib import Path
from typing import Callable

import torch

from course_lib import devices, machine, paths
from course_lib.config import make_config
from course_lib.engine.auto_precision import reduced_precision as amp_precision  # bf16 where the GPU runs it, else fp16
from course_lib.engine.step_bench import StepBench
from course_lib.instruments import peak_memory
from course_lib.measure import batch_search, bench, doctor, flops, memory, memory_probe, peak
from course_lib.measure.inventory import versions

TOTAL_BUDGET_SECONDS = 480  # the whole check: 8 minutes, so it fits a GPU lent for 15
REPORT_RESERVE_SECONDS = 15  # kept back for writing the report after the last part
RESULTS_DIR = "docs/results"
DRY_RUN_DIR = "runs/gpu-check-dry-run"  # --cpu-dry-run's results: ignored by git, never docs/results
# Seconds per part; they add up to 465 s, under TOTAL_BUDGET_SECONDS with the report. ddp is skipped
# at once on one GPU, which leaves its minute to the parts before it that overran nothing.
BUDGETS = {"doctor": 30, "decode": 30, "precision": 120, "bandwidth": 10, "switches": 70, "memory": 60,
           "speedrun": 100, "ddp": 45}
# The article's benchmark: ResNet-50 at 224 px (torchvision/timm ImageNet head of 1000 classes).
MODEL, IMAGE_SIZE, BATCH_SIZE, NUM_CLASSES = "resnet50", 224, 128, 1000
MEMORY_BATCHES = (32, 64, 128)  # estimate vs measured peak at these batch sizes
MAX_BATCH = 4096  # the out-of-memory finder doubles up to this batch, then bisects to a multiple of 8


class BudgetSpent(Exception):
    """A part ran past its time budget (raised inside the part, by the clock or by the part itself)."""


@dataclasses.dataclass
class Part:
    name: str
    run: Callable[[float], dict]  # budget seconds -> JSON-ready result (summary, rows, notes)
    budget_seconds: float
    skip_reason: Callable[[], str | None] = lambda: None  # why the part cannot run here, or None


@dataclasses.dataclass
class PartResult:
    name: str
    status: str  # ok | failed | skipped
    seconds: float
    budget_seconds: float
    result: dict = dataclasses.field(default_factory=dict)
    error: str = ""  # one line: the exception's type and first line
    traceback: str = ""


def nothing_to_check() -> str | None:
    """The one line printed without CUDA (the check is for GPUs), or None when torch sees one."""
    if torch.cuda.is_available():
        return None
    other = " (this machine's Apple-silicon GPU is used by device=auto; see the README)" \
        if devices.mps_available() else ""
    return f"gpu-check: torch sees no CUDA GPU on this machine, so there is nothing to check{other}"


# --- running parts under budgets --------------------------------------------------------------

def _alarm_available() -> bool:
    return hasattr(signal, "setitimer") and threading.current_thread() is threading.main_thread()


def run_part(part: Part, budget_seconds: float) -> PartResult:
    """Run one part; its exception, or overrunning `budget_seconds` (a SIGALRM in the main thread
    interrupts Python code at the budget), becomes a failed result instead of stopping the check."""
    reason = part.skip_reason()
    if reason:
        return PartResult(part.name, "skipped", 0.0, budget_seconds, error=reason)

    def overrun(signum, frame):
        raise BudgetSpent(f"ran past its budget of {budget_seconds:.0f} s")

    alarm = _alarm_available()
    if alarm:
        previous = signal.signal(signal.SIGALRM, overrun)
        signal.setitimer(signal.ITIMER_REAL, budget_seconds)
    start = time.perf_counter()
    try:
        result = part.run(budget_seconds)  # before reading the clock: arguments are evaluated left to right
        return PartResult(part.name, "ok", time.perf_counter() - start, budget_seconds, result)
    except Exception as error:  # noqa: BLE001 -- any failure of one part is recorded; the rest still run
        first_line = (str(error).strip().splitlines() or [""])[0]
        return PartResult(part.name, "failed", time.perf_counter() - start, budget_seconds,
                          error=f"{type(error).__name__}: {first_line}"[:500], traceback=traceback.format_exc()[-4000:])
    finally:
        if alarm:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, previous)
        peak_memory.release_memory("cuda" if torch.cuda.is_available() else None)


def run_parts(parts: list[Part], total_budget_seconds: float = TOTAL_BUDGET_SECONDS, *,
              echo=print) -> list[PartResult]:
    """Run `parts` in order, each within its own budget and what is left of the total."""
    started = time.perf_counter()
    results = []
    for part in parts:
        left = total_budget_seconds - REPORT_RESERVE_SECONDS - (time.perf_counter() - started)
        budget = min(part.budget_seconds, left)
        if left < 1:
            results.append(PartResult(part.name, "skipped", 0.0, 0.0, error="no time left in the total budget"))
        else:
            echo(f"gpu-check: {part.name} (budget {budget:.0f} s) ...", flush=True)
            results.append(run_part(part, budget))
        last = results[-1]
        echo(f"gpu-check: {part.name} {last.status} in {last.seconds:.1f} s" + (f": {last.error}" if last.error else ""),
             flush=True)
    return results


class Deadline:
    """A part's own clock, so it can stop early and keep what it measured."""

    def __init__(self, budget_seconds: float, margin: float = 0.9):
        self.ends = time.perf_counter() + budget_seconds * margin

    def left(self) -> float:
        return self.ends - time.perf_counter()


# --- the parts ----------------------------------------------------------------------------------

def doctor_part(budget_seconds: float = BUDGETS["doctor"]) -> dict:
    """`workbook doctor --json`'s facts: inventory, matmul per dtype, topology, advice."""
    facts = doctor.collect_facts(measure=True)
    return {"summary": {"gpus": [g["name"] for g in facts["gpus"]], "problems": facts["problems"],
                        "recommended_precision": facts["recommended_precision"]}, "facts": facts}


def decode_part(budget_seconds: float = BUDGETS["decode"], sizes: str = "64,256,1024", repeats: int = 3,
                images: int | None = None) -> dict:
    """`workbook bench decode` with every decoder this machine has (nvJPEG on CUDA)."""
    args = types.SimpleNamespace(folder=None,  # what `workbook bench decode` parses
                                  decoders=None, sizes=sizes, images=images, repeats=repeats)
    result = bench.run_decode(args, make_config("cpu"))
    decoders = sorted({row["decoder"] for row in result.rows})
    notes = [] if "nvjpeg" in decoders else [devices.unsupported_on("cpu", "nvjpeg")]
    return {"summary": {"decoders": decoders, **result.summary}, "rows": result.rows, "notes": notes}


def precision_variants(device, compile_model: bool = True) -> list[dict]:
    """fp32, fp16 + GradScaler, bf16, then channels_last and torch.compile on the faster-to-set-up
    reduced precision (bf16 when supported), each one switch more than the row before."""
    amp = amp_precision(device)
    variants = [dict(label="fp32", precision="off", channels_last=False, compile=False),
                dict(label="fp16 + GradScaler", precision="fp16", channels_last=False, compile=False),
                dict(label="bf16", precision="bf16", channels_last=False, compile=False),
                dict(label=f"{amp} + channels_last", precision=amp, channels_last=True, compile=False)]
    if compile_model:
        variants.append(dict(label=f"{amp} + channels_last + compile", precision=amp, channels_last=True, compile=True))
    return variants


def measure_variant(model_name: str, image_size: int, batch_size: int, device, *, precision: str = "off",
                    channels_last: bool = False, compile: bool = False, compile_mode: str = "default",
                    matmul_precision: str = "highest", cudnn_benchmark: bool = False, steps: int = 10,
                    warmup: int = 3, num_classes: int = NUM_CLASSES, flops_per_image: float | None = None) -> dict:
    """Median images/s after `warmup`, the first step's seconds (compile included), peak memory and MFU
    (`peak.mfu_peak`) of one switch setting, on random images already on the device: no input pipeline."""
    import timm

    device = devices.as_device(device)
    bench = StepBench(timm.create_model(model_name, num_classes=num_classes), image_size, batch_size, device,
                      num_classes, optimizer=lambda module: memory.make_optimizer(module, "sgd", lr=0.01))
    timed = bench.variant(precision, channels_last, compile, compile_mode=compile_mode,
                          matmul_precision=matmul_precision, cudnn_benchmark=cudnn_benchmark)
    raw_model, optimizer = timed.model, timed.optimizer
    if flops_per_image is None:
        flops_per_image = flops.training_flops_per_image(raw_model, image_size, num_classes)
    first_step_seconds = timed.first_step()  # allocations, cuDNN autotuning, compilation
    timing = timed.time(repeats=steps, warmup=warmup)
    live = torch.cuda.memory_allocated(device) if device.type == "cuda" else \
        memory.parameter_bytes(raw_model) + memory.measured_optimizer_state_bytes(optimizer)
    peak_bytes = live + peak_memory.peak_bytes_during(timed.step, device)
    images_per_second = timing.images_per_second
    utilization = flops.model_flops_utilization(flops_per_image, images_per_second, device, precision, matmul_precision)
    dtype = utilization["peak_dtype"]
    return {"precision": precision, "channels_last": channels_last, "compile": compile, "compile_mode": compile_mode,
            "matmul_precision": matmul_precision, "cudnn_benchmark": cudnn_benchmark,
            "images_per_second": images_per_second, "step_seconds": timing.median, "step_seconds_best": timing.best,
            "first_step_seconds": first_step_seconds, "peak_memory_bytes": peak_bytes,
            "peak_memory_kind": peak_memory.peak_memory_kind(device), "flops_per_image": flops_per_image,
            "achieved_tflops": utilization["achieved_flops"] / 1e12, "mfu": utilization["mfu"], "mfu_dtype": dtype,
            "peak_tflops": (utilization["peak_flops"] or 0) / 1e12, "peak_source": utilization["peak_source"]}


def measure_rows(variants: list[dict], deadline: Deadline, model_name: str, image_size: int, batch_size: int,
                 device, *, steps: int, warmup: int, num_classes: int, baseline: str) -> list[dict]:
    """One `measure_variant` row per variant (each a dict with its `label`), in order, until the
    deadline; then each row's speed and memory against the `baseline` row's ("... vs fp32")."""
    rows, flops_per_image = [], None
    for variant in variants:
        variant = dict(variant)
        label = variant.pop("label")
        if deadline.left() <= 0:
            rows.append({"variant": label, "error": "skipped: the part's budget was spent"})
            continue
        try:
            row = measure_variant(model_name, image_size, batch_size, device, steps=steps, warmup=warmup,
                                  num_classes=num_classes, flops_per_image=flops_per_image, **variant)
            flops_per_image = row["flops_per_image"]
            rows.append({"variant": label, **row})
        except (RuntimeError, TypeError, ValueError) as error:  # e.g. bf16 on a pre-Ampere GPU, no compiler
            rows.append({"variant": label, "error": f"{type(error).__name__}: {(str(error).splitlines() or [''])[0]}"})
        peak_memory.release_memory(device)
    base = next((r for r in rows if r["variant"] == baseline and "images_per_second" in r), None)
    for row in rows:
        if base and "images_per_second" in row:
            row["speedup_vs_fp32"] = row["images_per_second"] / base["images_per_second"]
            row["memory_vs_fp32"] = row["peak_memory_bytes"] / base["peak_memory_bytes"]
    return rows


def precision_part(budget_seconds: float = BUDGETS["precision"], *, model_name: str = MODEL,
                   image_size: int = IMAGE_SIZE, batch_size: int = BATCH_SIZE, device="cuda", steps: int = 10,
                   warmup: int = 3, compile_model: bool = True, num_classes: int = NUM_CLASSES) -> dict:
    """Every row of `precision_variants`, stopping (and saying so) when the budget runs out; a
    variant that fails (a GPU without bf16, compile without a compiler) is a row with its error."""
    device = devices.as_device(device)
    rows = measure_rows(precision_variants(device, compile_model), Deadline(budget_seconds), model_name, image_size,
                        batch_size, device, steps=steps, warmup=warmup, num_classes=num_classes, baseline="fp32")
    measured = [r for r in rows if "images_per_second" in r]
    best = max(measured, key=lambda r: r["images_per_second"]) if measured else None
    return {"summary": {"model": model_name, "image_size": image_size, "batch_size": batch_size,
                        "best_variant": best and best["variant"], "best_images_per_second": best and best["images_per_second"],
                        "best_mfu": best and best["mfu"]}, "rows": rows, "notes": []}


def bandwidth_part(budget_seconds: float = BUDGETS["bandwidth"], *, device="cuda", size_bytes: int | None = None,
                   matmul_precision: str = "high") -> dict:
    """Memory bandwidth from a same-device copy (`peak.copy_bandwidth`) and per precision the roofline's ridge: the
    FLOP per byte a step must reach to be bound by arithmetic rather than memory (`peak.ridge_intensity`)."""
    device = devices.as_device(device)
    copy = peak.copy_bandwidth(device, size_bytes)
    bytes_per_second = copy["gb_per_second"] * 1e9
    rows = []
    for precision in ("off", "fp16", "bf16"):
        for fp32_math in ((matmul_precision, "highest") if precision == "off" else (matmul_precision,)):
            denominator = peak.mfu_peak(precision, device, fp32_math)
            if denominator["peak_flops"] and all(r["dtype"] != denominator["dtype"] for r in rows):
                rows.append({"dtype": denominator["dtype"], "peak_tflops": denominator["peak_flops"] / 1e12,
                             "peak_source": denominator["source"],
                             "ridge_flop_per_byte": peak.ridge_intensity(denominator["peak_flops"], bytes_per_second)})
    return {"summary": {"gb_per_second": copy["gb_per_second"], "gb_per_second_median": copy["gb_per_second_median"],
                        "bytes_moved": copy["bytes_moved"], "device": str(device)}, "rows": rows}


def switch_variants(device, compile_modes=("reduce-overhead",)) -> list[dict]:
    """The PyTorch tuning guide's GPU switches one at a time: fp32 at each matmul_precision, cuDNN's autotuner off and
    on, and torch.compile's other modes over that; off CUDA only the last (`switches_part` says so)."""
    amp = amp_precision(device)
    variants = []
    if devices.as_device(device).type == "cuda":
        variants += [dict(label=f"fp32, matmul_precision={name}", precision="off", matmul_precision=name)
                     for name in ("highest", "high", "medium")]
        variants += [dict(label=f"{amp} + channels_last, cudnn_benchmark={flag}", precision=amp, channels_last=True,
                          cudnn_benchmark=flag) for flag in (False, True)]
    variants += [dict(label=f"{amp} + channels_last + compile mode={mode}", precision=amp, channels_last=True,
                      compile=True, compile_mode=mode, cudnn_benchmark=True) for mode in compile_modes]
    return variants


def switches_part(budget_seconds: float = BUDGETS["switches"], *, model_name: str = MODEL, image_size: int = IMAGE_SIZE,
                  batch_size: int = BATCH_SIZE, device="cuda", steps: int = 10, warmup: int = 3,
                  compile_modes=("reduce-overhead",), num_classes: int = NUM_CLASSES) -> dict:
    """images/s and MFU of each `switch_variants` row, against the first (fp32 at highest). The
    max-autotune mode is left out by default: its Triton autotuning of ResNet-50 takes minutes."""
    device = devices.as_device(device)
    variants = switch_variants(device, compile_modes)
    rows = measure_rows(variants, Deadline(budget_seconds), model_name, image_size, batch_size, device, steps=steps,
                        warmup=warmup, num_classes=num_classes, baseline=variants[0]["label"] if variants else "")
    notes = ["compile mode=max-autotune is not timed here: its autotuning takes minutes; "
             "`workbook train -p compile=true -p compile_mode=max-autotune` measures it"]
    if device.type != "cuda":
        notes.insert(0, f"matmul_precision and cudnn_benchmark: not measurable on {device.type} (TF32 and cuDNN are "
                        "CUDA features; the engine leaves them off here)")
    return {"summary": {"model": model_name, "image_size": image_size, "batch_size": batch_size,
                        "rows": len([r for r in rows if "images_per_second" in r])}, "rows": rows, "notes": notes}


def memory_part(budget_seconds: float = BUDGETS["memory"], *, model_name: str = MODEL, image_size: int = IMAGE_SIZE,
                batch_sizes=MEMORY_BATCHES, precision: str | None = None, device="cuda", max_batch: int = MAX_BATCH,
                memory_cap_bytes: int | None = None, num_classes: int = NUM_CLASSES) -> dict:
    """The memory estimate against the measured peak per batch size, then the largest batch by a real out-of-memory
    search (or up to `memory_cap_bytes`, on a CPU), stopped at the budget with the largest that fitted so far."""
    deadline = Deadline(budget_seconds)
    device = devices.as_device(device)
    precision = precision or amp_precision(device)
    rows = memory_probe.compare_estimate_and_peak(model_name, image_size, list(batch_sizes), precision, "sgd", device,
                                            num_classes)
    probe = memory_probe.TrainingStepProbe(model_name, image_size, precision, device=device, num_classes=num_classes)
    estimate = probe.estimate(batch_sizes[0])
    trials = []

    def step(batch: int) -> int:
        if deadline.left() <= 0:
            raise BudgetSpent("the out-of-memory search ran out of its budget")
        trials.append(batch)
        return probe.peak_bytes(batch)

    search_note = ""
    try:
        search = batch_search.find_largest_batch(step, start=batch_sizes[-1], max_batch=max_batch,
                                           memory_cap_bytes=memory_cap_bytes, device=device, multiple_of=8)
        largest, search_trials = search.largest_batch, search.trials
    except BudgetSpent as stop:
        largest, search_trials, search_note = None, [{"batch_size": b} for b in trials], str(stop)
    total = torch.cuda.get_device_properties(device).total_memory if device.type == "cuda" else None
    predicted = memory.largest_batch_within(estimate, total) if total else None
    summary = {"model": model_name, "image_size": image_size, "precision": probe.precision,
               "largest_batch": largest, "largest_batch_estimated": predicted, "device_memory_bytes": total,
               "max_batch_tried": max(trials) if trials else None, "search_note": search_note,
               "estimate_over_measured": [r["estimate_over_measured"] for r in rows]}
    return {"summary": summary, "rows": rows, "trials": search_trials}


def speedrun_skip_reason() -> str | None:
    return None if paths.eurosat_dir() else (f"EuroSAT is not here ({paths.DATA_ENV}, data_cache/eurosat/ or "
                                             f"../shared/datasets/eurosat_rgb; `{paths.GET_REAL_DATA}` fetches it)")


def speedrun_part(budget_seconds: float = BUDGETS["speedrun"], *, profile: str = "gpu", **overrides) -> dict:
    """The speed-run recipe raced on EuroSAT (`engine.speedrun.race`), its clock stopped at 70% of
    the budget so the final test-time-augmented prediction fits: time to 90/95/97% validation top-1."""
    from course_lib.engine import speedrun

    folder = paths.eurosat_dir()  # speedrun_skip_reason: it is here
    eurosat = {"dataset": "imagefolder", "data_dir": str(folder)}
    config = make_config(profile, **{**eurosat, "recipe": "speedrun", **overrides})
    result = speedrun.race(config, budget_seconds=0.7 * budget_seconds, progress=False, verbose=False)
    subset = folder / "SUBSET.json"  # written by scripts/pack_eurosat_subset.py: which images were carried
    return {"summary": {**dict(result.row().items()), "recipe": "speedrun", "data": config.data_dir,
                        "data_subset": json.loads(subset.read_text()) if subset.is_file() else "the whole folder"},
            "rows": result.curve}


def ddp_skip_reason() -> str | None:
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    return None if count >= 2 else f"DDP scaling needs 2 or more GPUs; torch sees {count}"


def ddp_part(budget_seconds: float = BUDGETS["ddp"], *, nproc: int | None = None, profile: str = "gpu",
             params: dict | None = None, epoch_images: int = 50_000) -> dict:
    """`ddp.measure_scaling` over every visible GPU: strong and weak scaling efficiency and the
    all-reduce share, on random images (epoch time for `epoch_images` images)."""
    from course_lib.engine import ddp

    nproc = nproc or torch.cuda.device_count()
    report = ddp.measure_scaling(nproc, params or {"model": MODEL, "image_size": IMAGE_SIZE}, profile, steps=5,
                                 warmup=2, epoch_images=epoch_images, timeout=0.9 * budget_seconds, echo=lambda *a: None)
    return {"summary": {"workers": nproc, "strong_efficiency": report.efficiency("strong"),
                        "weak_efficiency": report.efficiency("weak"), "communication": report.communication,
                        "precision": report.precision},
            "rows": report.table.to_dict(orient="records")}


def default_parts(sizes: dict[str, dict] | None = None) -> list[Part]:
    """Every part in the report's order with its budget; `sizes` holds keyword arguments per part's name."""
    runs = {"doctor": doctor_part, "decode": decode_part, "precision": precision_part, "bandwidth": bandwidth_part,
            "switches": switches_part, "memory": memory_part, "speedrun": speedrun_part, "ddp": ddp_part}
    skips = {"speedrun": speedrun_skip_reason, "ddp": ddp_skip_reason}
    return [Part(name, functools.partial(run, **(sizes or {}).get(name, {})), BUDGETS[name],
                 skips.get(name, lambda: None)) for name, run in runs.items()]


# The CPU dry run: every part's code on the CPU at tiny sizes (timm's test_resnet at 32 px), so a
# slot's check has run once before the slot starts. No compile (its first CPU compile takes
# minutes); ddp keeps its skip reason (it needs 2 GPUs).
DRY_RUN = dict(model_name="test_resnet", image_size=32, num_classes=10, device="cpu")
DRY_RUN_SPEEDRUN = dict(model="test_resnet", image_size=32, min_image_size=0, max_train_images=200, epochs=1,
                        batch_size=16, tta_views=1, device="cpu", precision="off", compile=False)


def dry_run_parts() -> list[Part]:
    """`default_parts` at tiny sizes on the CPU (`workbook gpu-check --cpu-dry-run`)."""
    return default_parts({"decode": dict(sizes="32", repeats=1, images=8),
                          "precision": dict(batch_size=4, steps=1, warmup=0, compile_model=False, **DRY_RUN),
                          "bandwidth": dict(device="cpu", size_bytes=32 * 2**20),
                          "switches": dict(batch_size=4, steps=1, warmup=0, compile_modes=(), **DRY_RUN),
                          "memory": dict(batch_sizes=(2, 4), precision="off", max_batch=8, **DRY_RUN),
                          "speedrun": dict(profile="smoke", **DRY_RUN_SPEEDRUN)})


# --- the report ---------------------------------------------------------------------------------

def slug(text: str) -> str:
    """A folder-safe name: "NVIDIA H100 80GB HBM3" -> "nvidia-h100-80gb-hbm3"."""
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-") or "unknown-gpu"


def results_folder(gpu_name: str, when: datetime.date, root: Path | None = None) -> Path:
    """docs/results/<gpu>-<date>/, with -2, -3 ... when that day's folder already exists."""
    root = root or paths.project_root() / RESULTS_DIR
    base = root / f"{slug(gpu_name)}-{when.isoformat()}"
    folder, number = base, 2
    while folder.exists():
        folder, number = Path(f"{base}-{number}"), number + 1
    return folder


def _number(value, fmt: str = ".4g") -> str:
    if value is None:
        return "-"
    return format(value, fmt) if isinstance(value, (int, float)) and not isinstance(value, bool) else str(value)


def _gib(value) -> str:
    return "-" if value is None else f"{value / 2 ** 30:.2f}"


def _percent(value) -> str:
    return "-" if value is None else f"{value:.1%}"


def headline(result: PartResult) -> str:
    """One cell per part for the overview table."""
    if result.status != "ok":
        return result.error
    summary = result.result.get("summary", {})
    if result.name == "precision" and summary.get("best_variant"):
        return (f"best {summary['best_variant']}: {summary['best_images_per_second']:.0f} images/s, "
                f"MFU {_percent(summary['best_mfu'])}")
    if result.name == "bandwidth":
        return f"device-to-device copy {summary['gb_per_second']:.0f} GB/s (read + written)"
    if result.name == "switches":
        return f"{summary.get('rows', 0)} switch setting(s) timed"
    if result.name == "memory":
        return f"largest batch {_number(summary.get('largest_batch'))} (estimate {_number(summary.get('largest_batch_estimated'))})"
    if result.name == "speedrun":
        return f"97% after {_number(summary.get('s to 97%'), '.0f')} s; final val top-1 {_percent(summary.get('val top-1'))}"
    if result.name == "ddp":
        return f"{summary['workers']} GPUs: strong {_percent(summary['strong_efficiency'])}, weak {_percent(summary['weak_efficiency'])}"
    if result.name == "decode":
        return "decoders: " + ", ".join(summary.get("decoders", []))
    if result.name == "doctor":
        return f"{len(summary.get('problems', []))} problem(s); precision {summary.get('recommended_precision')}"
    return ""


def markdown_report(report: dict) -> str:
    """The report as markdown: an overview table of the parts, then one table per measured part."""
    lines = [f"# gpu-check on {report['gpu']}", "",
             f"Hardware: **{report['hardware']}**; torch {report['versions'].get('torch')}, CUDA "
             f"{report['versions'].get('cuda_runtime')}, driver {report['versions'].get('driver')}; "
             f"measured {report['started']}; {report['seconds']:.0f} s of a {report['total_budget_seconds']} s budget.",
             "", "| part | status | seconds | budget s | result |", "|---|---|---|---|---|"]
    for part in report["parts"]:
        result = PartResult(**part)
        cell = headline(result).replace("|", "/")
        lines.append(f"| {part['name']} | {part['status']} | {part['seconds']:.1f} | {part['budget_seconds']:.0f} | {cell} |")
    parts = {p["name"]: p for p in report["parts"] if p["status"] == "ok"}
    for name, section in _SECTIONS.items():
        if name in parts:
            lines += section(parts[name])
    failed = [p for p in report["parts"] if p["status"] == "failed"]
    if failed:
        lines += ["", "## Failed parts", ""] + [f"- **{p['name']}**: {p['error']}" for p in failed]
    return "\n".join(lines) + "\n"


def _section(title: str, columns: str, rows: list[dict], cells, after=()) -> list[str]:
    """One part's section: its title, a table of `columns` ("a | b") with `cells(row)` per row, then `after`."""
    count = columns.count("|") + 1
    return ["", f"## {title}", "", f"| {columns} |", "|" + "---|" * count, *_table_rows(rows, count, cells), *after]


def _table_rows(rows: list[dict], columns: int, cells) -> list[str]:
    """Markdown table rows of a variant part: `cells(row)` for a measured row; a failed row's error, padded
    with empty cells to `columns`."""
    return [f"| {row['variant']} | {row['error']} |" + " |" * (columns - 2) if "error" in row
            else "| " + " | ".join(map(str, cells(row))) + " |" for row in rows]


def _precision_section(part: dict) -> list[str]:
    """The precision part: one training step per variant on random images already on the GPU."""
    s = part["result"]["summary"]
    return _section(f"{s['model']} at {s['image_size']} px, batch {s['batch_size']}: one training step on random "
                    "images already on the GPU",
                    "variant | images/s | vs fp32 | step ms | first step s | peak GiB | vs fp32 | MFU | of peak",
                    part["result"]["rows"], lambda row: [
        row["variant"], f"{row['images_per_second']:.1f}", f"{_number(row.get('speedup_vs_fp32'), '.2f')}x",
        f"{row['step_seconds'] * 1e3:.1f}", f"{row['first_step_seconds']:.1f}", _gib(row["peak_memory_bytes"]),
        f"{_number(row.get('memory_vs_fp32'), '.2f')}x", _percent(row["mfu"]),
        f"{row['mfu_dtype']} {row['peak_tflops']:.4g} TFLOP/s ({row['peak_source']})"])


def _bandwidth_section(part: dict) -> list[str]:
    """The roofline part: memory bandwidth and each dtype's ridge point."""
    b = part["result"]
    return _section(f"Roofline: memory bandwidth {b['summary']['gb_per_second']:.0f} GB/s (same-device copy, bytes "
                    "read + written, best of repeats)", "dtype | peak TFLOP/s | from | ridge FLOP/byte", b["rows"],
                    lambda row: [row["dtype"], f"{row['peak_tflops']:.4g}", row["peak_source"],
                                 f"{row['ridge_flop_per_byte']:.0f}"],
                    ["", "A step whose FLOP per byte of memory traffic is below a dtype's ridge is bound by memory "
                         "bandwidth in that dtype, above it by arithmetic."])


def _switches_section(part: dict) -> list[str]:
    """The GPU speed switches part (matmul_precision, cudnn_benchmark)."""
    w = part["result"]
    return _section(f"GPU speed switches: {w['summary']['model']} at {w['summary']['image_size']} px, batch "
                    f"{w['summary']['batch_size']}", "setting | images/s | vs first row | first step s | MFU | of peak",
                    w["rows"], lambda row: [
        row["variant"], f"{row['images_per_second']:.1f}", f"{_number(row.get('speedup_vs_fp32'), '.2f')}x",
        f"{row['first_step_seconds']:.1f}", _percent(row["mfu"]), f"{row['mfu_dtype']} {row['peak_tflops']:.4g} TFLOP/s"],
                    [""] + [f"- {note}" for note in w.get("notes", [])])


def _memory_section(part: dict) -> list[str]:
    """The training-memory part: estimated against measured peaks, and the largest batch."""
    s = part["result"]["summary"]
    return _section(f"Training memory: {s['model']} at {s['image_size']} px, precision {s['precision']}",
                    "batch | estimated GiB | measured peak GiB | estimate / measured", part["result"]["rows"],
                    lambda row: [row["batch_size"], _gib(row["estimated_bytes"]), _gib(row["measured_peak_bytes"]),
                                 _number(row["estimate_over_measured"], ".3f")],
                    ["", f"Largest batch that trains (real out-of-memory search, multiples of 8, up to {MAX_BATCH}): "
                         f"**{_number(s['largest_batch'])}**; the estimate predicts "
                         f"{_number(s['largest_batch_estimated'])} for {_gib(s['device_memory_bytes'])} GiB. "
                         f"{s['search_note']}".rstrip()])


def _decode_section(part: dict) -> list[str]:
    """The JPEG decoding part."""
    return _section("JPEG decoding (one core per decoder; nvJPEG on the GPU)",
                    "inputs | decoder | px | images/s | MB/s | vs PIL", part["result"]["rows"],
                    lambda row: [row["inputs"], row["decoder"], row["image_size"], f"{row['images_per_second']:.0f}",
                                 f"{row['megabytes_per_second']:.1f}", _number(row.get("speedup_vs_pil"), ".2f")])


def _speedrun_section(part: dict) -> list[str]:
    """The speed-run part on EuroSAT."""
    s = part["result"]["summary"]
    subset = s.get("data_subset")
    carried = (f"{subset.get('train_images')} training images ({subset.get('rule')})"
               if isinstance(subset, dict) else subset or "the whole folder")
    return _section(f"Speed-run recipe on EuroSAT ({s.get('data')}: {carried})",
                    "val top-1 | s to 90% | s to 95% | s to 97% | seconds | epochs | images/s | precision", [s],
                    lambda s: [_percent(s["val top-1"]), *(_number(s[f"s to {p}%"], ".0f") for p in (90, 95, 97)),
                               f"{s['seconds']:.0f}", s["epochs"], f"{s['images/s']:.0f}", s["precision"]])


def _ddp_section(part: dict) -> list[str]:
    """The DDP scaling part."""
    return _section("DDP scaling", "mode | workers | global batch | images/s | speed-up | efficiency",
                    part["result"]["rows"], lambda row: [row["mode"], row["workers"], row["global_batch"],
                    f"{row['images_per_second']:.0f}", f"{row['speedup']:.2f}", _percent(row["efficiency"])])


_SECTIONS = {"precision": _precision_section, "bandwidth": _bandwidth_section,  # in the report's order
             "switches": _switches_section, "memory": _memory_section, "decode": _decode_section,
             "speedrun": _speedrun_section, "ddp": _ddp_section}


def write_report(results: list[PartResult], folder: Path, *, gpu: str, started: str, seconds: float,
                 total_budget_seconds: float = TOTAL_BUDGET_SECONDS) -> dict:
    """gpu_check.json (everything, tracebacks included) and README.md (the tables) in `folder`."""
    report = {"gpu": gpu, "hardware": machine.describe_hardware(), "versions": versions(), "started": started,
              "seconds": seconds, "total_budget_seconds": total_budget_seconds,
              "parts": [dataclasses.asdict(r) for r in results]}
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "gpu_check.json").write_text(json.dumps(report, indent=2, default=str) + "\n")
    (folder / "README.md").write_text(markdown_report(json.loads(json.dumps(report, default=str))))
    return report


def run_check(parts: list[Part] | None = None, *, out_root: Path | None = None,
              total_budget_seconds: float = TOTAL_BUDGET_SECONDS, echo=print, gpu: str | None = None) -> Path:
    """Run every part on this machine's first GPU (or on what `gpu` names: "cpu dry run") and write
    the report; returns its folder."""
    started = datetime.datetime.now()
    gpu = gpu or torch.cuda.get_device_name(0)
    start = time.perf_counter()
    results = run_parts(parts if parts is not None else default_parts(), total_budget_seconds, echo=echo)
    folder = results_folder(gpu, started.date(), out_root)
    write_report(results, folder, gpu=gpu, started=started.strftime("%Y-%m-%d %H:%M"),
                 seconds=time.perf_counter() - start, total_budget_seconds=total_budget_seconds)
    return folder
