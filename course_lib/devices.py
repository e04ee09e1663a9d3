"""Which device a run uses, how to wait for it, and how many CPU cores it may use: one answer
for every module (the engine, the probes, the loaders, the doctor).

Device names follow torch: "cpu", "cuda", "cuda:N"; "auto" is CUDA when available. The
worker rule is the articles' starting point: half the physical cores, shared by the training
processes (the other half computes, or feeds the GPU).
"""
from __future__ import annotations

import os

import torch

from course_lib.config import ConfigError


def resolve_device(name: str = "auto", local_rank: int = 0) -> torch.device:
    """`auto` is CUDA when available, else CPU; under torchrun each process takes cuda:LOCAL_RANK."""
    resolved = name
    if resolved == "auto":
        resolved = "cuda" if torch.cuda.is_available() else "cpu"
    if resolved.startswith("cuda") and not torch.cuda.is_available():
        raise ConfigError(f"device={name} but this torch sees no CUDA GPU; use device=cpu (or profile=cpu)")
    if resolved == "cuda":
        resolved = f"cuda:{local_rank}"
    return torch.device(resolved)


def as_device(device=None) -> torch.device:
    """A torch.device from a device, a name or None (the CPU); "auto" is resolved, and a bare
    "cuda" becomes cuda:<current>, so that caches key on one name per GPU."""
    if device is None:
        return torch.device("cpu")
    if isinstance(device, str) and device == "auto":
        return resolve_device(device)
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device() if torch.cuda.is_available() else 0)
    return device


def transfer_device(name: str) -> torch.device | None:
    """The CUDA device batches are copied to in timings, or None on a CPU-only run."""
    if name == "cpu" or not torch.cuda.is_available():
        return None
    return resolve_device(name)


def synchronize(device=None) -> None:
    """Wait for queued GPU work before reading a clock (a no-op on the CPU, where work is synchronous)."""
    device = as_device(device) if device is not None else None
    if device is not None and device.type == "cuda":
        torch.cuda.synchronize(device)


def usable_cores() -> int:
    """CPU cores this process may run on (respects taskset/cgroup affinity, unlike os.cpu_count)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # macOS, Windows
        return os.cpu_count() or 1


def machine_cores() -> tuple[int, int]:
    """(physical, logical) cores of the whole machine, hyper-threads counted in the second only."""
    import psutil

    logical = psutil.cpu_count(logical=True) or os.cpu_count() or 1
    return psutil.cpu_count(logical=False) or logical, logical


def physical_cores() -> int:
    """Physical cores this process may use: hyper-threads counted once, affinity respected."""
    return max(1, min(machine_cores()[0], usable_cores()))


def recommended_num_workers(processes: int = 1, cores: int | None = None) -> int:
    """The one rule for DataLoader workers: half the physical cores, shared by `processes`
    training processes (one per GPU), at least 1. Tune from there with notebook 02's sweep."""
    cores = physical_cores() if cores is None else cores
    return max(1, cores // 2 // max(1, processes))


def resolve_num_workers(num_workers: int, processes: int = 1) -> int:
    """Config's num_workers: -1 means "the recommended number" for this machine."""
    return recommended_num_workers(processes) if num_workers < 0 else num_workers
