"""`precision=auto`, decided by timing the real thing: a few training steps of the run's own model,
at its image size and channel layout, in fp32, bf16 and fp16 on the run's device; the fastest
reduced precision is kept when it beats fp32 by at least 10%, else fp32.

Why not a matmul benchmark: a CPU can run bf16 matmuls fast (AMX) while bf16 convolutions and
their backward are slower than fp32, or the reverse; an AVX2-only CPU runs bf16 hundreds of times
slower. Only a measured step of the model being trained answers the question. On CUDA GPUs with
tensor cores bf16/fp16 win by a wide margin, and the probe costs a few seconds once per run.

This module is the workbook's only "which precision" rule: `supported` says what a device can run,
`resolve` / `choose_precision` decide `auto` by timing (`engine.step_bench`) once per machine (kept in
data_cache/precision_auto.json), and
`reduced_precision` names the reduced format to switch on where one must be (a case-study stage,
gpu-check's channels_last and compile rows).
"""
from __future__ import annotations

import contextlib
import json
import os
import time
from pathlib import Path

import torch
import torch.distributed as dist

from course_lib.data.build_lock import exclusive_build
from course_lib.devices import usable_cores
from course_lib.engine.precision import bf16_supported, resolve_precision
from course_lib.engine.step_bench import StepBench
from course_lib.paths import CACHE_DIR, project_root, write_atomically

CANDIDATES = ("off", "bf16", "fp16")
MARGIN = 1.10  # a reduced precision must be this much faster than fp32 to be worth autocast's casts
SLOW_FACTOR = 10.0  # a candidate whose first step takes this many fp32 steps is not timed further
PROBE_BATCH = 32  # images per probed step (at most the run's batch)
SCOUT_IMAGES = 2  # a reduced precision's first, cheap look (`_candidate_seconds`)

_cache: dict[tuple, tuple[str, dict]] = {}
# Decided once per machine (issue 49, point 14): two identical runs started together on a busy machine timed
# their steps under different loads and trained in different precisions (38.75% against 33.75% top-1). The first
# decision for a model, size, batch, layout, device, CPU and torch is kept in this file (under the project, or
# $WORKBOOK_PRECISION_DECISIONS), written under a lock so a run started beside it waits and takes the same answer;
# delete the file (or its entry) to measure again. One timed under a load over BUSY_LOAD per usable core serves runs
# as crowded and is timed again by the first quieter run: one timed at a load of 5-11 on 2 cores kept a 2-core AMD
# EPYC in fp32 where bf16 steps of the speed-run net at 64 px ran 1.78x the images/s (1,572 against 885) when quiet.
BUSY_LOAD = 1.5
DECISIONS_ENV = "WORKBOOK_PRECISION_DECISIONS"
DECISIONS_FILE = "precision_auto.json"  # in data_cache/
_decided: dict[tuple, str] = {}  # key -> when a decision read back from the file was first measured


def supported(precision: str, device) -> bool:
    """Whether `device` can run `precision` ("off", "fp16", "bf16") at all; the one such check.
    fp32 runs anywhere; bf16 where `precision.bf16_supported` says so (the one bf16 rule); fp16 on the
    CPU, and on a CUDA or MPS GPU that is there."""
    if precision not in CANDIDATES:
        raise ValueError(f"precision={precision!r} is not one of {', '.join(CANDIDATES)}")
    device = torch.device(device)
    if precision == "off":
        return True
    if precision == "bf16":
        return bf16_supported(device)
    if device.type == "cpu":
        return True
    if device.type == "cuda":
        return torch.cuda.is_available()
    if device.type == "mps":
        return torch.backends.mps.is_available()
    return False


def reduced_precision(device, seconds: dict | None = None) -> str:
    """bf16 or fp16, for a measurement that must run in a reduced precision: the faster of the two in
    `seconds` (`choose_precision`'s measurement) when given; else bf16 where the device runs it (no
    GradScaler, fp32's exponent range), fp16 otherwise."""
    if seconds:
        timed = {p: seconds[p] for p in ("bf16", "fp16") if seconds.get(p) is not None}
        if timed:
            return min(timed, key=timed.get)
    return "bf16" if supported("bf16", device) else "fp16"


def step_seconds(model: torch.nn.Module, images: torch.Tensor, targets: torch.Tensor, precision: str,
                 *, repeats: int = 3, give_up_after: float | None = None) -> float | None:
    """Median seconds of one training step (forward, backward, SGD update) of a copy of `model`
    in `precision` (`StepBench`), after a thrown-away first step. None when the first step alone took
    longer than `give_up_after` seconds (the candidate is hopeless; no need to wait for more)."""
    channels_last = images.is_contiguous(memory_format=torch.channels_last) and not images.is_contiguous()
    bench = StepBench(model, images.shape[-1], images.shape[0], images.device, 1, lr=0.0)
    timed = bench.variant(precision, channels_last)  # the run's own weights and BatchNorm statistics stay untouched
    timed.use_batch(images, targets)  # the batch chosen by the caller
    first = timed.first_step()  # first call: allocations, kernel choice (thrown away)
    if give_up_after is not None and first > give_up_after:
        return None
    return timed.time(repeats=repeats, warmup=0).median


def _candidate_seconds(model, images, targets, precision: str, give_up_after: float) -> float | None:
    """A reduced precision's step time, or None where it is hopeless or the device lacks a kernel for it (MPS raises
    for bf16 before macOS 14, and for ops without a half-precision kernel). Hopeless shows on SCOUT_IMAGES first: fp16's
    convolution backward on a Xeon with AVX512-FP16 took 130x fp32's step (32 s for 32 images at 80 px), 4 s so."""
    try:
        scout = images[:SCOUT_IMAGES], targets[:SCOUT_IMAGES]
        if step_seconds(model, *scout, precision, repeats=1) > SLOW_FACTOR * step_seconds(model, *scout, "off"):
            return None
        return step_seconds(model, images, targets, precision, give_up_after=give_up_after)
    except (RuntimeError, TypeError):
        if images.device.type != "mps":
            raise  # on CUDA and CPU the candidates are known to run: a failure is a real error
        return None


def decisions_path():
    """The file that keeps this machine's decisions (`DECISIONS_ENV`, else data_cache/precision_auto.json)."""
    return Path(os.environ.get(DECISIONS_ENV) or project_root() / CACHE_DIR / DECISIONS_FILE)


def busy_load() -> float | None:
    """The 1-minute load average where over BUSY_LOAD per usable core (other work shares the cores), else None."""
    try:
        load = os.getloadavg()[0]
    except (AttributeError, OSError):
        return None
    return load if load > BUSY_LOAD * usable_cores() else None


def probe_batch(batch_size: int) -> int:
    """The batch a decision probes with: the training batch, at most PROBE_BATCH, at least 2."""
    return max(2, min(batch_size, PROBE_BATCH))


def _key(model: torch.nn.Module, image_size: int, device, batch_size: int, channels_last: bool) -> tuple:
    return (str(torch.device(device)), type(model).__name__, sum(p.numel() for p in model.parameters()), image_size,
            probe_batch(batch_size), channels_last)


def _machine_key(key: tuple) -> str:
    """`key` with what makes a decision this machine's: the CPU or GPU model and torch's version."""
    from course_lib.machine import cpu_model

    device = torch.device(key[0])
    hardware = torch.cuda.get_device_name(device) if device.type == "cuda" else cpu_model()
    return "|".join(map(str, (*key, hardware, torch.__version__)))


def choose_precision(model: torch.nn.Module, image_size: int, num_classes: int, device: torch.device, *,
                     batch_size: int = PROBE_BATCH, channels_last: bool = False) -> tuple[str, dict]:
    """("off" | "bf16" | "fp16", {precision: seconds per step or None}) for training `model` on
    `device`: measured once per machine, device, model class and size, image size, batch and layout, then
    read back from `decisions_path()` (and this process's memory)."""
    device = torch.device(device)
    key = _key(model, image_size, device, batch_size, channels_last)
    batch = probe_batch(batch_size)
    if key in _cache:
        return _cache[key]
    path, name = decisions_path(), _machine_key(key)
    with contextlib.ExitStack() as held:
        try:  # a run started beside this one waits here, then reads this decision
            held.enter_context(exclusive_build(path))
        except OSError:
            pass  # no lock where nothing can be written (a read-only checkout): decided for this process
        try:
            kept = json.loads(path.read_text())
            kept = kept if isinstance(kept, dict) else {}
        except (OSError, ValueError):
            kept = {}
        found, busy = kept.get(name), busy_load()
        if isinstance(found, dict) and found.get("choice") in CANDIDATES and isinstance(found.get("seconds"), dict) \
                and not (found.get("busy_load") and busy is None):  # one timed under load is timed again when quiet
            _cache[key] = (found["choice"], found["seconds"])
            load = f" under a load average of {found['busy_load']:.1f}" if found.get("busy_load") else ""
            _decided[key] = str(found.get("decided") or "earlier") + load
            return _cache[key]
        choice, seconds = _measure(model, image_size, num_classes, device, batch, channels_last)
        _decided.pop(key, None)
        kept[name] = {"choice": choice, "seconds": seconds, "decided": time.strftime("%Y-%m-%d %H:%M"),
                      "busy_load": busy}
        try:
            write_atomically(path, json.dumps(kept, indent=1, sort_keys=True) + "\n")
        except OSError:
            pass  # a read-only checkout or a full disk: decided for this process only
    _cache[key] = (choice, seconds)
    return choice, seconds


def _measure(model, image_size: int, num_classes: int, device, batch: int, channels_last: bool) -> tuple[str, dict]:
    """Time one training step in each candidate precision and apply the rule (`decide`)."""
    bench = StepBench(model, image_size, batch, device, num_classes, seed=0)  # its fixed random batch
    memory_format = torch.channels_last if channels_last else torch.contiguous_format
    images, targets = bench.images.to(device, memory_format=memory_format), bench.targets.to(device)
    seconds = {"off": step_seconds(model, images, targets, "off")}
    for precision in CANDIDATES[1:]:
        seconds[precision] = _candidate_seconds(model, images, targets, precision, SLOW_FACTOR * seconds["off"]) \
            if supported(precision, device) else None
    # fp32 again, last: the first measurement also paid for one-time set-up (thread pools, kernel
    # caches), and a shared machine's slow moment should not decide the contest by itself.
    seconds["off"] = min(seconds["off"], step_seconds(model, images, targets, "off"))
    return decide(seconds), seconds


def decide(seconds: dict) -> str:
    """The rule, on measured seconds per step: the fastest of bf16/fp16 when it beats fp32 by
    MARGIN; bf16 preferred over fp16 when within 10% of it (no GradScaler, no overflow)."""
    fp32 = seconds.get("off")
    faster = {p: s for p, s in seconds.items() if p != "off" and s is not None and fp32 and s * MARGIN < fp32}
    if not faster:
        return "off"
    best = min(faster.values())
    if "bf16" in faster and faster["bf16"] <= best * 1.1:
        return "bf16"
    return min(faster, key=faster.get)


def describe(choice: str, seconds: dict, decided: str | None = None) -> str:
    """One line for the log: what was measured and what was kept, and when it was measured when the decision
    was read back from this machine's earlier one (`decided`)."""
    timed = ", ".join(f"{'fp32' if p == 'off' else p} {s * 1000:.0f} ms" if s is not None else
                      f"{'fp32' if p == 'off' else p} too slow or unavailable" for p, s in seconds.items())
    earlier = (f"; decided on this machine {decided}, kept in {decisions_path()}: delete it to measure again"
               if decided else "")
    return f"precision auto: {'fp32' if choice == 'off' else choice} (one training step: {timed}{earlier})"


def resolve(requested: str, model: torch.nn.Module, image_size: int, num_classes: int, device, *,
            batch_size: int = PROBE_BATCH, channels_last: bool = False, log=None) -> str:
    """The precision to train `model` in: an explicit choice checked (`precision.resolve_precision`),
    or `auto` measured here. Under torch.distributed, rank 0 measures and every rank takes its
    answer, so all ranks train alike. `log` receives the one-line account of the measurement."""
    device = torch.device(device)
    if requested != "auto" or device.type == "meta":
        return resolve_precision(requested, device)
    distributed = dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1
    choice = [None]
    if not distributed or dist.get_rank() == 0:
        choice[0], seconds = choose_precision(model, image_size, num_classes, device, batch_size=batch_size,
                                              channels_last=channels_last)
        if log is not None:
            log(describe(choice[0], seconds, _decided.get(_key(model, image_size, device, batch_size, channels_last))))
    if distributed:
        dist.broadcast_object_list(choice, src=0)
    return choice[0]
