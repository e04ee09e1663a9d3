"""Notebook 14's measurements: where the engine's training step spends its time and memory.

- `profile_epoch`: `torch.profiler` around one epoch of the engine's loop, grouped by the step's named regions,
  with a Chrome/Perfetto trace (https://ui.perfetto.dev) that `phase_events` reads back for a timeline.
- `memory_categories`: one step's measured peak next to notebook 01's estimate; on CUDA `cuda_memory_snapshot`
  writes a snapshot for https://pytorch.org/memory_viz.
- `checkpointing_table`: activation checkpointing (timm's `set_grad_checkpointing`; Chen et al. 2016,
  arXiv:1604.06174): memory saved against time paid.
PyTorch profiler recipe: https://pytorch.org/tutorials/recipes/recipes/profiler_recipe.html.
"""
from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path

import matplotlib.pyplot as plt
import pandas as pd
import torch
from torch.profiler import ProfilerActivity, profile

from course_lib import devices, paths
from course_lib.analysis import claims as claim_records
from course_lib.chapters.setup import ChapterSetup, sizes
from course_lib.config import Config, ConfigError, resolve_profile
from course_lib.data.datasets import config_with_data
from course_lib.engine import train
from course_lib.engine.grad_norm import GradientNormLog
from course_lib.engine.monitor import UtilisationMonitor
from course_lib.engine.step_bench import StepBench
from course_lib.instruments import peak_memory
from course_lib.measure import memory_probe
from course_lib.models import factory

PHASES = ("data wait", "forward", "backward", "optimizer")  # the engine's record_function regions
OUTPUT_DIR = "runs/checkpoints/14_profiling"


@dataclasses.dataclass
class EpochProfile:
    label: str
    trace_path: Path  # Chrome/Perfetto trace of the profiled epoch
    phases: pd.DataFrame  # one row per phase: calls, CPU seconds, (device seconds), share of the epoch
    operators: pd.DataFrame  # the top operators by self CPU time
    seconds: float  # wall seconds of the profiled epoch
    steps: int
    monitor: dict  # UtilisationMonitor.summary() over the profiled epoch
    timeline: pd.DataFrame  # the monitor's samples

    @property
    def data_wait_share(self) -> float:
        return float(self.phases.loc["data wait", "share of epoch"])


# Per profile: profiled steps of the one epoch, and timed repeats of the checkpointing comparison.
SIZES = {"smoke": {"max_steps": 4, "repeats": 2}, "cpu": {"max_steps": 10, "repeats": 5},
         "gpu": {"max_steps": 10, "repeats": 5}}


@dataclasses.dataclass(kw_only=True)
class ProfilingSetup(ChapterSetup):
    """Notebook 14's config (one epoch of a few profiled steps, into OUTPUT_DIR), data and sizes (`setup`)."""

    folder: str  # the run's folder, absolute (under the project root): traces, timelines, snapshots, checkpoints
    monitor_interval: float  # seconds between utilisation samples
    repeats: int  # timed repeats of the checkpointing comparison

    def line(self) -> str:
        config = self.config
        return (f"{config.model}, {config.image_size} px, batch {config.batch_size}, {config.max_steps} profiled steps, "
                f"device {self.device}; hardware: {self.hardware}")


def setup(profile: str, *, max_steps: int | None = None, monitor_interval: float = 0.0, repeats: int = 0,
          **given) -> ProfilingSetup:
    """The data `config_with_data` picks, one epoch of `max_steps` profiled steps, utilisation sampled every
    `monitor_interval` seconds (0: 0.1) and `repeats` timed repeats (None and 0: the profile's, `SIZES`)."""
    resolved = resolve_profile(profile)
    chosen = sizes(SIZES, resolved)
    base, data = config_with_data(profile, **{k: v for k, v in given.items() if v is not None})
    config = base.replace(epochs=1, max_steps=max_steps or chosen["max_steps"], output_dir=OUTPUT_DIR)
    return ProfilingSetup(profile=resolved, data=data, config=config, folder=str(paths.resolve_path(OUTPUT_DIR)),
                          monitor_interval=monitor_interval or 0.1, repeats=repeats or chosen["repeats"])


def profile_epoch(config: Config, folder: str | Path, label: str = "baseline", *,
                  monitor_interval: float = 0.1) -> EpochProfile:
    """Profile one epoch (max_steps optimizer steps) of the engine's loop after a warm-up step, with the
    utilisation monitor sampling alongside; the trace goes to `folder/trace_<label>.json`."""
    folder = paths.resolve_path(folder)  # relative to the project root, as every output folder
    folder.mkdir(parents=True, exist_ok=True)
    state = train.prepare(config, verbose=False)
    steps, state.steps_per_epoch = state.steps_per_epoch, 1  # warm-up: one step pays first-call allocations and
    train.train_one_epoch(state, 0, progress=False)          # lazy initialisation, and is thrown away
    state.steps_per_epoch = steps
    device = state.device
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with peak_memory.quiet_stderr(), profile(activities=activities) as profiler, \
            UtilisationMonitor(monitor_interval, device) as monitor:
        started = time.perf_counter()
        row = train.train_one_epoch(state, 0, progress=False)
        if device.type == "cuda":
            torch.cuda.synchronize(device)  # queued kernels belong to this epoch
        seconds = time.perf_counter() - started
    trace_path = folder / f"trace_{label.replace(' ', '_')}.json"
    profiler.export_chrome_trace(str(trace_path))
    averages = profiler.key_averages()
    return EpochProfile(label, trace_path, phase_table(averages, seconds, device.type == "cuda"),
                        operator_table(averages), seconds, row["optimizer_steps"], monitor.summary(),
                        pd.DataFrame(monitor.samples))


def phase_table(averages, seconds: float, with_device: bool = False) -> pd.DataFrame:
    """The step's named regions from `key_averages()`: calls, CPU seconds (and device seconds on CUDA, where the CPU
    only launches kernels), each a share of the epoch's wall time; "other" is the rest (device stage, metrics)."""
    found = {event.key: event for event in averages if event.key in PHASES}
    rows = {}
    for name in PHASES:
        event = found.get(name)
        # the profiler counts microseconds
        rows[name] = {"calls": event.count if event else 0, "CPU s": (event.cpu_time_total if event else 0) / 1e6,
                      **({"device s": (event.device_time_total if event else 0) / 1e6} if with_device else {})}
    table = pd.DataFrame.from_dict(rows, orient="index")
    table.loc["other"] = {"calls": 0, "CPU s": max(0.0, seconds - table["CPU s"].sum()),
                          **({"device s": float("nan")} if with_device else {})}
    table["share of epoch"] = table["CPU s"] / seconds
    return table


def operator_table(averages, top: int = 10) -> pd.DataFrame:
    """The operators that took the most self CPU time (regions left out: they hold operators)."""
    rows = [{"operator": event.key, "calls": event.count, "self CPU ms": event.self_cpu_time_total / 1e3,
             "CPU total ms": event.cpu_time_total / 1e3} for event in averages
            if event.key not in PHASES and not event.key.startswith("ProfilerStep")]
    return pd.DataFrame(rows).sort_values("self CPU ms", ascending=False).head(top).reset_index(drop=True)


def phase_events(trace_path: str | Path) -> pd.DataFrame:
    """The named regions of a Chrome trace as (phase, start ms, duration ms) from the first one."""
    events = json.loads(Path(trace_path).read_text())["traceEvents"]
    spans = [e for e in events if e.get("ph") == "X" and e.get("name") in PHASES]
    if not spans:
        raise ValueError(f"{trace_path} holds none of the regions {', '.join(PHASES)}: not a trace of the engine's step")
    origin = min(e["ts"] for e in spans)
    return pd.DataFrame([{"phase": e["name"], "start ms": (e["ts"] - origin) / 1e3, "duration ms": e["dur"] / 1e3}
                         for e in spans]).sort_values("start ms", ignore_index=True)


def plot_timeline(events: pd.DataFrame, title: str = "", axis=None):
    """One lane per phase, one bar per region: the trace as Perfetto would draw its top rows."""
    axis = axis or plt.subplots(figsize=(10, 2.2))[1]
    colours = dict(zip(PHASES, ("#cf222e", "#0969da", "#8250df", "#1a7f37")))
    for lane, name in enumerate(PHASES):
        part = events[events["phase"] == name]
        axis.broken_barh(list(zip(part["start ms"], part["duration ms"])), (lane - 0.4, 0.8), color=colours[name])
    axis.set_yticks(range(len(PHASES)), PHASES)
    axis.set_xlabel("ms since the first region")
    axis.set_title(title)
    return axis


def before_after(profiles: list[EpochProfile]) -> pd.DataFrame:
    """One row per profiled variant: epoch seconds, step ms, data wait share and monitor figures."""
    rows = {}
    for item in profiles:
        rows[item.label] = {"steps": item.steps, "epoch s": item.seconds, "step ms": 1e3 * item.seconds / item.steps,
                            "data wait share": item.data_wait_share,
                            "CPU % mean": item.monitor.get("monitor_cpu_percent_mean"),
                            "GPU utilisation % mean": item.monitor.get("monitor_gpu_utilisation_mean"),
                            "GPU utilisation % p5": item.monitor.get("monitor_gpu_utilisation_p5")}
    return pd.DataFrame.from_dict(rows, orient="index")


# --- memory -----------------------------------------------------------------------------------

def _probe(config: Config, num_classes: int, device, checkpointing: bool = False):
    """The model with checkpointing switched, and a `TrainingStepProbe` of one step of it."""
    module = factory.build_model(config, num_classes)
    if not hasattr(module, "set_grad_checkpointing"):
        raise ConfigError(f"model {config.model!r} has no set_grad_checkpointing (timm's switch for activation "
                          "checkpointing); use a timm model such as resnet18 or test_resnet")
    module.set_grad_checkpointing(checkpointing)
    precision = "off" if config.precision == "auto" else config.precision  # the same format for both variants
    return module, memory_probe.TrainingStepProbe(module, config.image_size, precision, config.optimizer,
                                                  config.momentum, device=device, num_classes=num_classes)


def memory_categories(config: Config, num_classes: int, device) -> pd.DataFrame:
    """One training step at `config.batch_size`: notebook 01's estimate by category, and the measured
    peak (`TrainingStepProbe`: CUDA's peak counter, the profiler's tensor accounting on a CPU)."""
    _, probe = _probe(config, num_classes, device)
    estimate = probe.estimate(config.batch_size)
    rows = {name: {"estimate MiB": value / 2**20} for name, value in estimate.breakdown().items()}
    rows["total"] = {"estimate MiB": estimate.total_bytes / 2**20}
    table = pd.DataFrame.from_dict(rows, orient="index")
    table["measured MiB"] = float("nan")
    table.loc["total", "measured MiB"] = probe.peak_bytes(config.batch_size) / 2**20
    return table


def cuda_memory_snapshot(config: Config, path: str | Path, steps: int = 3) -> Path | None:
    """CUDA only: record every allocation of a few engine steps and dump the snapshot that
    https://pytorch.org/memory_viz draws (None elsewhere: the allocator history is CUDA's)."""
    if devices.resolve_device(config.device).type != "cuda":
        return None
    state = train.prepare(config.replace(max_steps=steps), verbose=False)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.cuda.memory._record_memory_history(max_entries=100_000)
    try:
        train.train_one_epoch(state, 0, progress=False)
        torch.cuda.memory._dump_snapshot(str(path))
    finally:
        torch.cuda.memory._record_memory_history(enabled=None)
    return path


def checkpointing_table(config: Config, num_classes: int, device, *, repeats: int = 3) -> pd.DataFrame:
    """Activation checkpointing off and on, same model, batch and precision: the step's measured peak and median
    time (one warm-up step thrown away), each as a ratio to "off", beside notebook 01's estimate."""
    rows = {}
    for label, enabled in (("off", False), ("on", True)):
        module, probe = _probe(config, num_classes, device, checkpointing=enabled)
        peak = probe.peak_bytes(config.batch_size)
        bench = StepBench(module, config.image_size, config.batch_size, device, num_classes)
        timing = bench.variant(probe.precision).time(repeats=repeats, warmup=1)
        rows[label] = {"step peak MiB": peak / 2**20, "step ms": 1e3 * timing.median}
        if not enabled:
            rows[label]["estimate MiB (notebook 01)"] = probe.estimate(config.batch_size).total_bytes / 2**20
    table = pd.DataFrame.from_dict(rows, orient="index")
    table["peak vs off"] = table["step peak MiB"] / table.loc["off", "step peak MiB"]
    table["time vs off"] = table["step ms"] / table.loc["off", "step ms"]
    return table


# --- claims -----------------------------------------------------------------------------------

def claims(comparison: pd.DataFrame, monitored: train.FitResult, device) -> list:
    """The chapter's claims from the before/after table (first row: before) and a run trained with
    grad_norm_log (its detectors replayed over its log, with the run's thresholds)."""
    device = torch.device(device)
    before, after = comparison.iloc[0], comparison.iloc[-1]
    records = []
    if device.type == "cuda" and pd.notna(before["GPU utilisation % mean"]):
        for key, label, (low, high) in (("untuned_utilisation", comparison.index[0], (30, 50)),
                                        ("tuned_utilisation", comparison.index[-1], (75, 95))):
            value = float(comparison.loc[label, "GPU utilisation % mean"])
            records.append(claim_records.checked(key, low <= value <= high, f"NVML SM utilisation, mean over the "
                                                 f"profiled epoch of {label} (claimed {low}-{high}%)", value=value))
    else:
        reason = (f"GPU utilisation needs an NVIDIA GPU (NVML); this run trains on {device.type}. The stand-in is the "
                  "share of the epoch spent waiting for data (next claim)")
        records += [claim_records.not_measurable("untuned_utilisation", reason),
                    claim_records.not_measurable("tuned_utilisation", reason)]
    drop = before["data wait share"] - after["data wait share"]
    records.append(claim_records.checked(
        "data_wait_stand_in", bool(drop > 0) if abs(drop) > 0.01 else None,
        f"data wait share of the epoch {before['data wait share']:.1%} ({comparison.index[0]}) -> "
        f"{after['data wait share']:.1%} ({comparison.index[-1]}); on a CPU the cores that decode also compute the "
        "model, so the time the step waits for data is what a starved GPU's idle time would be", value=100 * drop))
    grad_norm_rows = monitored.grad_norms
    replay = GradientNormLog.from_config(monitored.config)
    for row in grad_norm_rows:
        replay.add(torch.tensor(row["grad_norm"]))
    grad_findings = replay.check(0, len(grad_norm_rows), len(grad_norm_rows))
    finite = [row["grad_norm"] for row in grad_norm_rows if row["grad_norm"] == row["grad_norm"]]
    records.append(claim_records.checked(
        "watch_gradient_norms", (None if grad_findings else True) if finite else False,
        f"{len(grad_norm_rows)} steps logged, {len(grad_findings)} detector finding(s) "
        f"{'(a run that was not healthy cannot show the detectors staying quiet)' if grad_findings else 'on a healthy run'}"
        " (value: median norm)", value=float(pd.Series(finite).median()) if finite else None))
    return records
