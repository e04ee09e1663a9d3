"""Machine identity, stored with every ledger row: the git commit, the versions that decide speed, the CPU
model, a hardware summary and its one line printed beside every number (the full inventory: `measure.inventory`)."""
from __future__ import annotations

import functools
import platform
import subprocess
from pathlib import Path

from course_lib import devices
from course_lib.paths import project_root


@functools.lru_cache(maxsize=1)
def git_commit() -> str | None:
    try:
        out = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], cwd=project_root(),
                             capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() or None if out.returncode == 0 else None


@functools.lru_cache(maxsize=1)
def runtime_versions() -> dict:
    """Versions that decide speed and behaviour: python, torch and its CUDA/cuDNN, driver."""
    import torch
    import torchvision

    versions = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "torchvision": torchvision.__version__,
        "cuda_runtime": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
        "driver": None,
    }
    try:
        import timm

        versions["timm"] = timm.__version__
    except ImportError:
        versions["timm"] = None
    if torch.cuda.is_available():
        try:
            out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                 capture_output=True, text=True, timeout=10)
            versions["driver"] = out.stdout.strip().splitlines()[0] if out.returncode == 0 else None
        except (OSError, subprocess.TimeoutExpired, IndexError):
            pass
    return versions


def cpu_model() -> str:
    """The CPU's model name (/proc/cpuinfo), else what platform reports."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


@functools.lru_cache(maxsize=1)
def hardware_summary() -> dict:
    """A short description of the machine, stored with every row (the full inventory is
    `course_lib.measure.peak`)."""
    import psutil
    import torch

    gpus = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())] \
        if torch.cuda.is_available() else []
    return {
        "host": platform.node(),
        "cpu": cpu_model(),
        "physical_cores": devices.machine_cores()[0],
        "logical_cores": devices.machine_cores()[1],
        "ram_bytes": psutil.virtual_memory().total,
        "gpus": gpus,
    }


def describe_hardware(hardware: dict | None = None) -> str:
    """One line naming the machine, to print next to every absolute number."""
    hardware = hardware or hardware_summary()
    cores = f"{hardware['physical_cores']} cores"
    gpus = ", ".join(hardware["gpus"]) or "no GPU"
    return f"{hardware['cpu']} ({cores}), {gpus}"
