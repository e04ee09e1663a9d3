"""Why a container does not see the GPU (the first article, section 2.2): the three failure modes of the
container runtime, each with its symptom, the check that tells it apart from the others, and the fix.

- The container was started without `--gpus`: no `/dev/nvidia*` inside, so `nvidia-smi` is missing or finds no
  device and `torch.cuda.is_available()` is False, though the host has a GPU.
- The host has no NVIDIA Container Toolkit: `docker run --gpus all` itself fails with
  `could not select device driver "" with capabilities: [[gpu]]` (nothing starts, so it is checked on the host).
- WSL2 without the Windows driver's GPU bridge: `nvidia-smi` says "Failed to initialize NVML: GPU access blocked
  by the operating system" (`/dev/dxg` or `/usr/lib/wsl/lib/libcuda.so` missing, or a Linux driver installed
  inside the distribution over the bridge).

`runtime_facts` reads what this machine shows (files, PATH, environment; nothing is started), and `diagnose`
turns facts into one row per failure mode, so a made-up machine shows the diagnosis a broken one would get.
"""
from __future__ import annotations

import glob
import os
import shutil
from pathlib import Path

CONTAINER_MARKERS = ("/.dockerenv", "/run/.containerenv")  # Docker's and Podman's
CGROUP_WORDS = ("docker", "containerd", "kubepods", "libpod", "lxc")
WSL_LIBCUDA = "/usr/lib/wsl/lib/libcuda.so*"

FAILURE_MODES = {
    "started without --gpus": {
        "symptom": "inside the container nvidia-smi is missing or finds no device, torch.cuda.is_available() is "
                   "False, while the host's nvidia-smi lists the GPU",
        "check": "inside: is there a /dev/nvidia0 (and is NVIDIA_VISIBLE_DEVICES set)?",
        "fix": "docker run --gpus all ... (docker compose: deploy.resources.reservations.devices; Podman with CDI: "
               "--device nvidia.com/gpu=all)"},
    "no NVIDIA Container Toolkit on the host": {
        "symptom": "docker run --gpus all fails before the container starts: could not select device driver \"\" "
                   "with capabilities: [[gpu]]",
        "check": "on the host: nvidia-ctk --version, and `docker info` lists an nvidia runtime",
        "fix": "install nvidia-container-toolkit, then sudo nvidia-ctk runtime configure --runtime=docker and "
               "sudo systemctl restart docker"},
    "WSL2 without the Windows driver's GPU bridge": {
        "symptom": "nvidia-smi: Failed to initialize NVML: GPU access blocked by the operating system",
        "check": "/proc/version names Microsoft; /dev/dxg and /usr/lib/wsl/lib/libcuda.so exist; no Linux NVIDIA "
                 "driver installed inside the distribution",
        "fix": "install or update the NVIDIA driver on Windows (it provides the GPU to WSL2), run wsl --update, and "
               "remove any Linux NVIDIA driver installed inside WSL (keep only the CUDA toolkit there)"},
}


def _read(path: str) -> str:
    try:
        return Path(path).read_text(errors="replace")
    except OSError:
        return ""


def runtime_facts() -> dict:
    """What this machine shows about its container runtime, read from files, PATH and the environment (no command
    is run)."""
    cgroup = _read("/proc/1/cgroup")
    return {
        "in_container": any(os.path.exists(marker) for marker in CONTAINER_MARKERS)
        or any(word in cgroup for word in CGROUP_WORDS),
        "wsl": "microsoft" in _read("/proc/version").lower(),
        "nvidia_devices": sorted(glob.glob("/dev/nvidia[0-9]*")),
        "dxg": os.path.exists("/dev/dxg"),
        "wsl_libcuda": bool(glob.glob(WSL_LIBCUDA)),
        "nvidia_smi": shutil.which("nvidia-smi") is not None,
        "toolkit": any(shutil.which(name) for name in ("nvidia-ctk", "nvidia-container-runtime")),
        "docker": shutil.which("docker") is not None,
        "visible_devices": os.environ.get("NVIDIA_VISIBLE_DEVICES"),
    }


CAUSE, NOT_CAUSE, NOT_HERE = "the cause here", "not the cause here", "cannot be told here"


def _gpus_flag(facts: dict) -> tuple[str, str]:
    if not facts["in_container"]:
        return NOT_CAUSE, "not inside a container: there is no --gpus to forget"
    if facts["nvidia_devices"]:
        return NOT_CAUSE, f"inside a container with {len(facts['nvidia_devices'])} /dev/nvidia device(s) passed in"
    if facts["wsl"] and facts["dxg"]:
        return NOT_CAUSE, "inside a container on WSL2, where the GPU arrives through /dev/dxg"
    visible = facts["visible_devices"]
    return CAUSE, ("inside a container without /dev/nvidia0" + (f" (NVIDIA_VISIBLE_DEVICES={visible})" if visible
                   else ", NVIDIA_VISIBLE_DEVICES unset") + ": started without --gpus, or on a host without a GPU")


def _toolkit(facts: dict) -> tuple[str, str]:
    if facts["in_container"]:
        return NOT_HERE, "inside a container: the toolkit lives on the host (check there)"
    if not facts["docker"]:
        return NOT_CAUSE, "no docker on this machine"
    if facts["toolkit"]:
        return NOT_CAUSE, "docker and nvidia-ctk (or nvidia-container-runtime) are both installed"
    return CAUSE, "docker is installed but nvidia-ctk and nvidia-container-runtime are not: --gpus will fail"


def _wsl(facts: dict) -> tuple[str, str]:
    if not facts["wsl"]:
        return NOT_CAUSE, "not WSL"
    missing = [name for name, found in (("/dev/dxg", facts["dxg"]), ("/usr/lib/wsl/lib/libcuda.so",
                                                                      facts["wsl_libcuda"])) if not found]
    if missing:
        return CAUSE, f"WSL2 without {' and '.join(missing)}: the Windows driver does not reach this distribution"
    return NOT_CAUSE, "WSL2 with /dev/dxg and the Windows driver's libcuda"


def diagnose(facts: dict) -> list[dict]:
    """One row per failure mode (`FAILURE_MODES`): its symptom and check, what `facts` (`runtime_facts`, or a
    made-up machine) show, the verdict (CAUSE, NOT_CAUSE or NOT_HERE) and the fix."""
    rows = []
    for (failure, mode), decide in zip(FAILURE_MODES.items(), (_gpus_flag, _toolkit, _wsl)):
        verdict, found = decide(facts)
        rows.append({"failure": failure, "symptom": mode["symptom"], "check": mode["check"], "here": found,
                     "verdict": verdict, "fix": mode["fix"]})
    return rows


# Made-up machines, one per failure mode, each broken in that way only: what a reader with the problem would see.
_BARE = {"in_container": False, "wsl": False, "nvidia_devices": [], "dxg": False, "wsl_libcuda": False,
         "nvidia_smi": False, "toolkit": False, "docker": False, "visible_devices": None}
BROKEN_MACHINES = {
    "started without --gpus": {**_BARE, "in_container": True},
    "no NVIDIA Container Toolkit on the host": {**_BARE, "nvidia_devices": ["/dev/nvidia0"], "nvidia_smi": True,
                                                "docker": True},
    "WSL2 without the Windows driver's GPU bridge": {**_BARE, "wsl": True, "nvidia_smi": True},
}


def diagnoses_each_broken_machine() -> dict[str, list[str]]:
    """For each made-up broken machine (`BROKEN_MACHINES`), the failure modes `diagnose` calls the cause: the
    rule is right when each names exactly its own."""
    return {name: [row["failure"] for row in diagnose(facts) if row["verdict"] == CAUSE]
            for name, facts in BROKEN_MACHINES.items()}
