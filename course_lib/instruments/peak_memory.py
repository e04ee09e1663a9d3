"""Peak-memory counters: the tensor bytes a step allocates at its peak, on CUDA (the caching
allocator's counter), MPS (the driver's growth) and CPU (torch.profiler's allocation events), and
what a measurement does when the device runs out. See
https://pytorch.org/docs/stable/torch_cuda_memory.html and
https://pytorch.org/docs/stable/profiler.html (profile_memory)."""
from __future__ import annotations

import gc
import json
import os
import tempfile
from collections.abc import Callable
from contextlib import contextmanager

import torch


@contextmanager
def quiet_stderr():
    """Silence the profiler's C++ start/stop log lines (written to file descriptor 2)."""
    try:
        saved = os.dup(2)
    except OSError:
        yield
        return
    with open(os.devnull, "w") as devnull:
        os.dup2(devnull.fileno(), 2)
        try:
            yield
        finally:
            os.dup2(saved, 2)
            os.close(saved)


@contextmanager
def cpu_peak_tracker():
    """Track the peak of CPU tensor memory allocated inside the block, above what was live before; yields a dict whose
    "peak_bytes" is set on exit. `torch.profiler(profile_memory=True)` records each CPU tensor allocation and free as
    a "[memory]" event with the running "Total Allocated": its peak minus its start is what torch allocated for
    tensors (as `torch.cuda.max_memory_allocated` counts), without the allocator slack or Python objects of RSS."""
    from torch.profiler import ProfilerActivity, profile

    result = {"peak_bytes": None}
    with quiet_stderr():
        profiler = profile(activities=[ProfilerActivity.CPU], profile_memory=True)
        profiler.__enter__()
    try:
        yield result
    finally:
        with quiet_stderr():
            profiler.__exit__(None, None, None)
            handle, path = tempfile.mkstemp(suffix=".json")
            os.close(handle)
            try:
                profiler.export_chrome_trace(path)
                with open(path) as trace_file:
                    events = json.load(trace_file)["traceEvents"]
            finally:
                os.unlink(path)
        memory = sorted((e for e in events if e.get("name") == "[memory]" and e.get("args", {}).get("Device Type") == 0),
                        key=lambda e: e["ts"])
        start = memory[0]["args"]["Total Allocated"] - memory[0]["args"]["Bytes"] if memory else 0
        result["peak_bytes"] = max((e["args"]["Total Allocated"] for e in memory), default=start) - start


def peak_bytes_during(step: Callable[[], object], device) -> int:
    """Peak tensor bytes allocated while `step()` runs, above what was live when it started.
    CUDA: the caching allocator's peak counter (synchronized, so queued kernels are counted);
    MPS: the growth of Metal's allocation across the step; CPU: `cpu_peak_tracker` (profiler accounting)."""
    device = torch.device(device)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        before = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
        step()
        torch.cuda.synchronize(device)
        return int(torch.cuda.max_memory_allocated(device) - before)
    if device.type == "mps":
        # No peak counter on MPS (devices.UNSUPPORTED["mps"]["peak_memory"]): with the cache emptied
        # first, the allocator's growth across the step keeps the freed blocks, hence the high-water mark.
        torch.mps.synchronize()
        torch.mps.empty_cache()
        before = torch.mps.driver_allocated_memory()
        step()
        torch.mps.synchronize()
        return int(max(0, torch.mps.driver_allocated_memory() - before))
    with cpu_peak_tracker() as tracked:
        step()
    return int(tracked["peak_bytes"])


def reset_peak_memory(device) -> None:
    """Start a new CUDA peak (no-op on CPU: use `cpu_peak_tracker` there)."""
    device = torch.device(device)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


def peak_memory_bytes(device) -> int:
    """CUDA: peak bytes allocated by tensors since the last reset. CPU: the process's peak resident
    set (cannot be reset; only grows), a coarse fallback where `cpu_peak_tracker` is not used."""
    device = torch.device(device)
    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device))
    import resource
    import sys

    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(peak if sys.platform == "darwin" else peak * 1024)  # Linux reports KiB, macOS bytes


def peak_memory_kind(device) -> str:
    return {"cuda": "cuda_max_allocated", "mps": "mps_driver_allocated_growth"}.get(torch.device(device).type,
                                                                                    "process_peak_rss")


def is_out_of_memory(error: BaseException) -> bool:
    """True for CUDA OOM and for the CPU allocator failing to allocate."""
    text = str(error).lower()
    return isinstance(error, (torch.OutOfMemoryError, MemoryError)) or (
        isinstance(error, RuntimeError) and ("out of memory" in text or "can't allocate" in text))


def release_memory(device=None) -> None:
    """Give freed blocks back after an OOM so the process stays usable."""
    gc.collect()
    if torch.cuda.is_available() and (device is None or torch.device(device).type == "cuda"):
        torch.cuda.empty_cache()
    elif device is not None and torch.device(device).type == "mps":
        torch.mps.empty_cache()
