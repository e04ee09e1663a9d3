"""Which device a run uses, how to wait for it, and how many CPU cores it may use: one answer for every module (the
engine, the probes, the loaders, the doctor).

Device names follow torch: "cpu", "cuda", "cuda:N", "mps" (Apple silicon, through Metal); "auto" is CUDA when
available, else MPS, else the CPU. MPS lacks what only CUDA has (NCCL, nvJPEG, pinned-memory copies, most of
torch.compile's GPU backend): `unsupported_on` names what a device cannot run, so callers skip it with a reason
instead of failing (https://pytorch.org/docs/stable/notes/mps.html). The worker rule is the articles' starting point:
half the physical cores, shared by the training processes (the other half computes, or feeds the GPU).
"""
from __future__ import annotations

import os

import torch

from course_lib.config import ConfigError, mps_available  # noqa: F401 (re-exported)


def accelerator() -> str:
    """The device type `auto` picks: "cuda", then "mps", then "cpu"."""
    if torch.cuda.is_available():
        return "cuda"
    return "mps" if mps_available() else "cpu"


def resolve_device(name: str = "auto", local_rank: int = 0) -> torch.device:
    """`auto` is CUDA, else MPS (Apple silicon), else the CPU; under torchrun each process takes cuda:LOCAL_RANK."""
    resolved = name
    if resolved == "auto":
        resolved = accelerator()
    if resolved.startswith("cuda") and not torch.cuda.is_available():
        raise ConfigError(f"device={name} but this torch sees no CUDA GPU; use device=cpu (or profile=cpu)")
    if resolved == "mps" and not mps_available():
        raise ConfigError(f"device={name} but this torch sees no Apple-silicon GPU (torch.backends.mps."
                          "is_available() is False); use device=cpu or device=auto")
    if resolved == "cuda":
        resolved = f"cuda:{local_rank}"
    return torch.device(resolved)


def as_device(device=None) -> torch.device:
    """A torch.device from a device, a name or None (the CPU); "auto" is resolved, and a bare "cuda" becomes
    cuda:<current>, so that caches key on one name per GPU."""
    if device is None:
        return torch.device("cpu")
    if isinstance(device, str) and device == "auto":
        return resolve_device(device)
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device() if torch.cuda.is_available() else 0)
    return device


def transfer_device(name: str) -> torch.device | None:
    """The GPU (CUDA or MPS) batches are copied to in timings, or None when `name` names no GPU this machine has."""
    wanted = accelerator() if name == "auto" else name.split(":")[0]
    if wanted == "cuda" and torch.cuda.is_available() or wanted == "mps" and mps_available():
        return resolve_device(name)
    return None


def pin_memory_helps(device=None) -> bool:
    """Page-locked host buffers speed copies to a CUDA GPU only; MPS shares memory with the CPU (unified memory),
    and torch's DataLoader warns and ignores pin_memory there."""
    device = as_device(device) if device is not None else torch.device(accelerator())
    return device.type == "cuda" and torch.cuda.is_available()


# What torch cannot do on a device type, with the reason a notebook prints when it skips it.
UNSUPPORTED = {
    "mps": {
        "ddp": "torch has no NCCL for Apple GPUs and gloo needs CPU tensors: DDP workers train on the CPU",
        "nvjpeg": "nvJPEG is an NVIDIA library: JPEG decoding stays on the CPU",
        "compile": "torch.compile's MPS backend is a prototype: compile is measured on CUDA and CPU only",
        "pin_memory": "pinned memory only speeds copies to a CUDA GPU; MPS uses the CPU's memory",
        "peak_memory": "torch.mps keeps no peak counter: the peak is the growth of Metal's allocation "
                       "(torch.mps.driver_allocated_memory) across the step after emptying the cache, "
                       "rounded up to the allocator's blocks",
    },
    "cpu": {
        "nvjpeg": "nvJPEG needs a CUDA GPU",
        "pin_memory": "pinned memory only speeds copies to a CUDA GPU",
        "cudnn_benchmark": "cuDNN is CUDA's convolution library",
        "matmul_precision": "TF32 is a mode of NVIDIA tensor cores",
        "compile_mode": "reduce-overhead replays CUDA graphs",
    },
}
UNSUPPORTED["mps"] |= {key: UNSUPPORTED["cpu"][key] for key in ("cudnn_benchmark", "matmul_precision", "compile_mode")}


def skipped_switches(config, device) -> list[str]:
    """"switch=value: reason" for each switch `config` turns on that only acts on a CUDA GPU and so does nothing on
    `device` (pin_memory, cudnn_benchmark, matmul_precision other than highest, compile_mode=reduce-overhead,
    decoder=nvjpeg); empty on CUDA. The engine logs these, and `workbook run --profile rehearsal` prints them, so a
    CPU rehearsal of the gpu profile names every call it skips."""
    device = as_device(device)
    if device.type == "cuda":
        return []
    wanted = {"pin_memory": config.pin_memory, "cudnn_benchmark": config.cudnn_benchmark,
              "matmul_precision": config.matmul_precision != "highest",
              "compile_mode": config.compile and config.compile_mode == "reduce-overhead",
              "nvjpeg": config.decoder == "nvjpeg"}
    def setting(name: str) -> str:
        return "decoder=nvjpeg" if name == "nvjpeg" else f"{name}={getattr(config, name)}"

    return [f"{setting(name)}: {unsupported_on(device, name)}" for name, on in wanted.items()
            if on and unsupported_on(device, name)]


def unsupported_on(device, feature: str) -> str | None:
    """Why `feature` (ddp, nvjpeg, compile, pin_memory, peak_memory) is skipped on `device`, or None where it runs."""
    return UNSUPPORTED.get(as_device(device).type, {}).get(feature)


def synchronize(device=None) -> None:
    """Wait for queued GPU work before reading a clock (a no-op on the CPU, where work is synchronous). MPS, like
    CUDA, queues kernels asynchronously: torch.mps.synchronize() waits for them."""
    device = as_device(device) if device is not None else None
    if device is not None and device.type == "cuda":
        torch.cuda.synchronize(device)
    elif device is not None and device.type == "mps":
        torch.mps.synchronize()


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
    """The one rule for DataLoader workers: half the physical cores, shared by `processes` training processes (one
    per GPU), at least 1. Tune from there with notebook 02's sweep."""
    cores = physical_cores() if cores is None else cores
    return max(1, cores // 2 // max(1, processes))


def resolve_num_workers(num_workers: int, processes: int = 1) -> int:
    """Config's num_workers: -1 means "the recommended number" for this machine."""
    return recommended_num_workers(processes) if num_workers < 0 else num_workers


def worker_batches(loader):
    """The loader's batches; an error stops its worker processes at once. Left to the error's reference cycle, the
    collector closed their queues first and each worker took 5 s to be killed, in whichever later step collected it."""
    iterator = iter(loader)
    try:
        yield from iterator
    except (Exception, KeyboardInterrupt):
        if hasattr(iterator, "_shutdown_workers") and not getattr(loader, "persistent_workers", False):
            iterator._shutdown_workers()  # torch's multi-process iterator; a persistent one is the loader's to keep
        raise
