"""The machine's inventory: CPU, RAM, the dataset disk (with a bounded sequential and random read probe),
python/torch/torchvision/timm versions, CUDA, cuDNN, NCCL, each GPU (NVML when present) with its datasheet peaks, and an
Apple-silicon GPU (MPS). Nothing here may crash without a GPU, NVML or `nvidia-smi`: every probe is bounded in time and
returns `None` (with a note) where a fact cannot be had.
"""
from __future__ import annotations

import functools
import os
import random
import re
import shutil
import subprocess
import time
from pathlib import Path

import psutil
import torch

from course_lib import devices, machine
from course_lib.measure import peak
from course_lib.measure.disk import describe_disk, drop_from_page_cache

MiB = 1024 ** 2
GiB = 1024 ** 3


def _run(command: list[str], timeout: float = 10.0) -> str | None:
    """stdout of a command, or None when it is missing, fails or hangs."""
    if shutil.which(command[0]) is None:
        return None
    try:
        out = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout if out.returncode == 0 else None


def cudnn_text(version) -> str | None:
    """torch's cuDNN integer as text: 92400 -> "9.24.0" (cuDNN 9+), 8902 -> "8.9.2"."""
    if not version:
        return None
    version = int(version)
    if version >= 90000:
        return f"{version // 10000}.{version // 100 % 100}.{version % 100}"
    return f"{version // 1000}.{version // 100 % 10}.{version % 100}"


def _version_tuple(text: str | None) -> tuple[int, ...]:
    return tuple(int(part) for part in re.findall(r"\d+", text or ""))


def cpu_info() -> dict:
    memory, (physical, logical) = psutil.virtual_memory(), devices.machine_cores()
    return {
        "model": machine.hardware_summary()["cpu"],
        "physical_cores": physical,
        "logical_cores": logical,
        "usable_cores": devices.usable_cores(),
        "torch_threads": torch.get_num_threads(),
        "ram_bytes": int(memory.total),
        "ram_available_bytes": int(memory.available),
    }


# x86 instruction sets that decide what reduced precision buys on a CPU (Linux /proc/cpuinfo flags),
# with what each means for inference (oneDNN picks the kernels: https://uxlfoundation.github.io/oneDNN/).
CPU_ISA_MEANING = {
    "avx2": "8-wide fp32 FMA; int8 goes through 16-bit products (little gain over fp32)",
    "avx512f": "16-wide fp32 FMA",
    "avx512_vnni": "int8 dot products in one instruction (VPDPBUSD): int8 convolutions up to ~2-4x fp32",
    "avx512_bf16": "bf16 dot products (VDPBF16PS): bf16 at up to ~2x fp32 without AMX",
    "amx_tile": "AMX tile registers (Sapphire Rapids and later)",
    "amx_int8": "AMX int8 matrix multiply: int8 several times faster than VNNI on large matrices",
    "amx_bf16": "AMX bf16 matrix multiply: bf16 several times faster than fp32",
}


def cpu_isa(cpuinfo: str | None = None) -> dict[str, bool]:
    """Which of CPU_ISA_MEANING's instruction sets this CPU reports (all False where /proc/cpuinfo
    is missing, e.g. macOS)."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            cpuinfo = ""
    flags = next((set(line.split(":", 1)[1].split()) for line in cpuinfo.splitlines() if line.startswith("flags")),
                 set())
    return {name: name in flags for name in CPU_ISA_MEANING}


def _list_files(folder: Path, limit: int = 5000) -> list[Path]:
    """Up to `limit` regular files under `folder`, in a stable order (bounded walk)."""
    files: list[Path] = []
    for root, dirs, names in os.walk(folder):
        dirs.sort()
        for name in sorted(names):
            files.append(Path(root) / name)
            if len(files) >= limit:
                return files
    return files


def _empty_disk_probe(folder: Path, note: str = "") -> dict:
    return {"path": str(folder), "files_found": 0, "sequential_bytes": 0, "sequential_mb_per_s": None,
            "random_reads": 0, "random_mb_per_s": None, "random_reads_per_s": None, "note": note}


def measure_disk_read(folder, max_bytes: int = 64 * MiB, max_seconds: float = 2.0, block_bytes: int = 4096,
                      seed: int = 0) -> dict:
    """Read throughput of the files under `folder` within `max_bytes` and `max_seconds`, half each: whole files in 1 MiB
    reads (a packed shard), and `block_bytes` at random offsets of random files (a shuffled loader: IOPS)."""
    folder = Path(folder)
    result = _empty_disk_probe(folder)
    if not folder.is_dir():
        result["note"] = f"{folder} is not a folder; no disk probe"
        return result
    files = [f for f in _list_files(folder) if f.is_file()]
    result["files_found"] = len(files)
    if not files:
        result["note"] = "no files to read"
        return result
    half_bytes, half_seconds = max_bytes // 2, max_seconds / 2

    read_bytes, start = 0, time.perf_counter()
    for path in files:
        if read_bytes >= half_bytes or time.perf_counter() - start > half_seconds:
            break
        try:
            with open(path, "rb", buffering=0) as handle:
                drop_from_page_cache(handle.fileno())
                while chunk := handle.read(MiB):
                    read_bytes += len(chunk)
        except OSError:
            continue
    seconds = time.perf_counter() - start
    result["sequential_bytes"] = read_bytes
    result["sequential_mb_per_s"] = read_bytes / MiB / seconds if read_bytes and seconds > 0 else None

    rng = random.Random(seed)
    reads, read_bytes, start = 0, 0, time.perf_counter()
    while read_bytes < half_bytes and time.perf_counter() - start < half_seconds:
        path = files[rng.randrange(len(files))]
        try:
            with open(path, "rb", buffering=0) as handle:
                size = os.fstat(handle.fileno()).st_size
                drop_from_page_cache(handle.fileno())
                offset = rng.randrange(max(1, size // block_bytes)) * block_bytes
                handle.seek(offset)
                read_bytes += len(handle.read(block_bytes))
                reads += 1
        except OSError:
            continue
    seconds = time.perf_counter() - start
    result["random_reads"] = reads
    if reads and seconds > 0:
        result["random_mb_per_s"] = read_bytes / MiB / seconds
        result["random_reads_per_s"] = reads / seconds
    result["note"] = "page cache eviction requested with posix_fadvise; numbers are an upper bound if it failed"
    return result


def disk_info(folder, probe: bool = True) -> dict:
    folder = Path(folder)
    existing = next((p for p in (folder, *folder.parents) if p.exists()), Path("."))
    usage = shutil.disk_usage(existing)
    described = describe_disk(existing)
    name, kind = described["device"], described["kind"]
    info = {"path": str(folder), "free_bytes": int(usage.free), "total_bytes": int(usage.total),
            "block_device": name, "kind": kind}
    info.update({f"read_{k}" if k != "path" else "probe_path": v
                 for k, v in (measure_disk_read(folder) if probe else _empty_disk_probe(folder, "not probed")).items()})
    return info


def _nvml() -> dict:
    """Driver version and GPU names from NVML (nvidia-ml-py) when it and a driver are present."""
    facts = {"available": False, "driver": None, "gpus": [], "note": ""}
    try:
        import pynvml
    except ImportError:
        facts["note"] = "nvidia-ml-py not installed"
        return facts
    try:
        pynvml.nvmlInit()
    except Exception as error:  # NVMLError_LibraryNotFound, DriverNotLoaded, ... on machines without a GPU
        facts["note"] = f"NVML unavailable: {error}"
        return facts
    try:
        facts["available"] = True
        driver = pynvml.nvmlSystemGetDriverVersion()
        facts["driver"] = driver.decode() if isinstance(driver, bytes) else driver
        for index in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            name = pynvml.nvmlDeviceGetName(handle)
            facts["gpus"].append({"index": index, "name": name.decode() if isinstance(name, bytes) else name,
                                  "memory_bytes": int(pynvml.nvmlDeviceGetMemoryInfo(handle).total)})
    except Exception as error:
        facts["note"] = f"NVML query failed: {error}"
    finally:
        try:
            pynvml.nvmlShutdown()
        except Exception:
            pass
    return facts


@functools.lru_cache(maxsize=1)
def versions() -> dict:
    """python, torch, torchvision, timm, the CUDA runtime torch was built with, driver, cuDNN, NCCL."""
    facts = dict(machine.runtime_versions())
    facts["cudnn"] = cudnn_text(facts.get("cudnn"))
    try:
        nccl = torch.cuda.nccl.version() if hasattr(torch.cuda, "nccl") else None
        facts["nccl"] = ".".join(map(str, nccl)) if isinstance(nccl, tuple) else (str(nccl) if nccl else None)
    except Exception:  # torch built without NCCL (CPU wheels, macOS)
        facts["nccl"] = None
    nvml = _nvml()
    facts["nvml"] = nvml["available"]
    if not facts.get("driver"):
        smi = _run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"])
        facts["driver"] = nvml["driver"] or (smi.strip().splitlines()[0] if smi and smi.strip() else None)
    return facts


def _arch_covered(major: int, minor: int, arch_list: list[str]) -> bool:
    """Whether torch carries code for compute capability major.minor: a matching `sm_XY` binary,
    or `compute_XY` PTX with XY at or below it (the driver JIT-compiles PTX forward)."""
    capability = major * 10 + minor
    for arch in arch_list:
        kind, _, number = arch.partition("_")
        digits = int(re.sub(r"\D", "", number) or 0)
        if kind == "sm" and digits // 10 == major and digits <= capability:
            return True  # sm_80 binaries run on 8.6 (same major, lower minor)
        if kind == "compute" and digits <= capability:
            return True
    return False


def gpu_info() -> list[dict]:
    """One entry per CUDA device torch can see: name, memory, capability, dtypes it is fast in."""
    if not torch.cuda.is_available():
        return []
    arch_list = torch.cuda.get_arch_list()
    gpus = []
    for index in range(torch.cuda.device_count()):
        props = torch.cuda.get_device_properties(index)
        major, minor = props.major, props.minor
        gpus.append({
            "index": index,
            "name": props.name,
            "memory_bytes": int(props.total_memory),
            "compute_capability": f"{major}.{minor}",
            "multiprocessors": props.multi_processor_count,
            "arch_covered": _arch_covered(major, minor, arch_list),
            # Tensor cores: fp16 from Volta (7.0), bf16 and tf32 from Ampere (8.0).
            "fp16": major >= 7,
            "bf16": major >= 8,
            "tf32": major >= 8,
            **datasheet_facts(props.name),
        })
    return gpus


def datasheet_facts(gpu_name: str) -> dict:
    """The GPU's dense datasheet peaks (TFLOP/s per dtype, `peak.DATASHEET_TFLOPS`), the MFU
    denominators; empty values for GPUs the table does not list."""
    key = peak.datasheet_entry(gpu_name)
    return {"datasheet": key, "datasheet_tflops": dict(peak.DATASHEET_TFLOPS[key]) if key else {}}


def mps_info() -> dict:
    """Apple-silicon GPU through Metal: whether this torch was built with MPS and can use it, and
    the memory torch may allocate there (torch.mps.recommended_max_memory, where torch has it)."""
    backend = getattr(torch.backends, "mps", None)
    facts = {"built": bool(backend is not None and backend.is_built()), "available": devices.mps_available(),
             "recommended_max_memory_bytes": None}
    if facts["available"] and hasattr(torch.mps, "recommended_max_memory"):
        facts["recommended_max_memory_bytes"] = int(torch.mps.recommended_max_memory())
    return facts
