"""The machine as a measured checklist: inventory, matmul throughput per dtype, dataset-disk
read speed, GPU topology, and recommendations computed from those facts (`workbook doctor`).

Nothing here may crash on a machine without a GPU, NVML or `nvidia-smi`: every probe is
bounded in time and returns `None` (with a note) where a fact cannot be had.
Background: NVIDIA, "GPU Performance Background User's Guide" (Tensor Core dtypes);
`nvidia-smi topo -m` legend for link types; PyTorch AMP docs for fp16 vs bf16.
"""
from __future__ import annotations

import functools
import json
import os
import random
import re
import shutil
import subprocess
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from course_lib import ledger

MiB = 1024 ** 2
GiB = 1024 ** 3
DTYPE_NAMES = ("fp32", "tf32", "fp16", "bf16")
_TORCH_DTYPES = {"fp32": torch.float32, "tf32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}

# The articles' rules of thumb, used as thresholds below (not as measurements).
ARTICLE_CORES_PER_GPU = 16  # physical CPU cores per training GPU
ARTICLE_RAM_PER_GPU = 64 * GiB  # bytes of host RAM per training GPU
# Oldest Linux driver each CUDA major release runs on (CUDA minor-version compatibility,
# NVIDIA "CUDA Compatibility" guide, table 2).
MIN_DRIVER_FOR_CUDA = {11: "450.80.02", 12: "525.60.13", 13: "580.65.06"}
# Dense (no sparsity) datasheet peaks in TFLOP/s, for MFU; fp16/bf16 are tensor-core numbers with
# fp32 accumulation. Keys are matched as substrings of the device name, most specific first.
DATASHEET_TFLOPS = {
    "H200": {"fp32": 67.0, "tf32": 494.7, "fp16": 989.4, "bf16": 989.4},
    "H100 PCIe": {"fp32": 51.2, "tf32": 378.0, "fp16": 756.0, "bf16": 756.0},
    "H100": {"fp32": 67.0, "tf32": 494.7, "fp16": 989.4, "bf16": 989.4},
    "A100": {"fp32": 19.5, "tf32": 156.0, "fp16": 312.0, "bf16": 312.0},
    "L40S": {"fp32": 91.6, "tf32": 183.0, "fp16": 362.0, "bf16": 362.0},
    "L4": {"fp32": 30.3, "tf32": 60.0, "fp16": 121.0, "bf16": 121.0},
    "A10G": {"fp32": 31.2, "tf32": 62.5, "fp16": 125.0, "bf16": 125.0},
    "A10": {"fp32": 31.2, "tf32": 62.5, "fp16": 125.0, "bf16": 125.0},
    "RTX 4090": {"fp32": 82.6, "tf32": 82.6, "fp16": 165.2, "bf16": 165.2},
    "RTX 3090": {"fp32": 35.6, "tf32": 35.6, "fp16": 71.0, "bf16": 71.0},
    "V100": {"fp32": 15.7, "fp16": 125.0},
    "T4": {"fp32": 8.1, "fp16": 65.0},
}


# ---------------------------------------------------------------------------------------------
# Small helpers
# ---------------------------------------------------------------------------------------------

def _device(device) -> torch.device:
    """`"cuda"` becomes `cuda:<current>` so that caches key on one name per GPU."""
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device() if torch.cuda.is_available() else 0)
    return device


def _synchronize(device: torch.device) -> None:
    # CUDA kernels run asynchronously: read the clock only after they have finished.
    if device.type == "cuda":
        torch.cuda.synchronize(device)


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


# ---------------------------------------------------------------------------------------------
# Inventory: CPU, RAM, disk, versions, GPUs
# ---------------------------------------------------------------------------------------------

def cpu_info() -> dict:
    import psutil

    summary = ledger.hardware_summary()
    memory = psutil.virtual_memory()
    return {
        "model": summary["cpu"],
        "physical_cores": psutil.cpu_count(logical=False) or os.cpu_count() or 1,
        "logical_cores": psutil.cpu_count(logical=True) or os.cpu_count() or 1,
        "usable_cores": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "ram_bytes": int(memory.total),
        "ram_available_bytes": int(memory.available),
    }


def _block_device_kind(path: Path) -> tuple[str | None, str]:
    """(block device name, "nvme" | "ssd" | "hdd" | "unknown") of the disk holding `path`,
    read from /sys (Linux only; overlay and network filesystems give "unknown")."""
    try:
        st_dev = path.stat().st_dev
        sys_path = Path(f"/sys/dev/block/{os.major(st_dev)}:{os.minor(st_dev)}").resolve()
    except (OSError, ValueError):
        return None, "unknown"
    for folder in (sys_path, sys_path.parent):  # a partition's queue/ lives in its parent disk
        rotational = folder / "queue" / "rotational"
        if rotational.exists():
            name = folder.name
            if name.startswith("nvme"):
                return name, "nvme"
            if name.startswith(("vd", "xvd")):  # virtio/Xen disks report rotational=1 whatever backs them
                return name, "virtual"
            try:
                return name, "hdd" if rotational.read_text().strip() == "1" else "ssd"
            except OSError:
                return name, "unknown"
    return None, "unknown"


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


def _drop_from_page_cache(fd: int) -> None:
    # Ask the kernel to forget cached pages of this file so the probe reads the disk, not RAM.
    # Advisory: works for clean pages on local filesystems, silently does nothing elsewhere.
    if hasattr(os, "posix_fadvise"):
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        except OSError:
            pass


def _empty_disk_probe(folder: Path, note: str = "") -> dict:
    return {"path": str(folder), "files_found": 0, "sequential_bytes": 0, "sequential_mb_per_s": None,
            "random_reads": 0, "random_mb_per_s": None, "random_reads_per_s": None, "note": note}


def measure_disk_read(folder, max_bytes: int = 64 * MiB, max_seconds: float = 2.0, block_bytes: int = 4096,
                      seed: int = 0) -> dict:
    """Sequential and random read throughput of the files under `folder`, bounded by `max_bytes`
    and `max_seconds` (half each). Sequential: whole files in path order, 1 MiB reads (how a
    packed shard is read). Random: `block_bytes` reads at random offsets of random files (how a
    shuffled DataLoader over small files hits the disk: IOPS, not MB/s)."""
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
                _drop_from_page_cache(handle.fileno())
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
                _drop_from_page_cache(handle.fileno())
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
    name, kind = _block_device_kind(existing)
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
    facts = dict(ledger.runtime_versions())
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
        })
    return gpus


# ---------------------------------------------------------------------------------------------
# Topology: `nvidia-smi topo -m`
# ---------------------------------------------------------------------------------------------

LINK_DESCRIPTIONS = {
    "X": "self",
    "NV": "NVLink (bonded set of # links)",
    "PIX": "PCIe, at most one PCIe bridge",
    "PXB": "PCIe, several PCIe bridges, no host bridge",
    "PHB": "PCIe through a host bridge (the CPU)",
    "NODE": "PCIe plus the interconnect between host bridges within a NUMA node",
    "SYS": "PCIe plus the SMP interconnect between NUMA nodes (QPI/UPI)",
    "SOC": "PCIe plus the SMP interconnect between sockets (old name of SYS)",
}
# Rough order of peer-to-peer bandwidth, best first; DDP's all-reduce runs at the worst pair's pace.
_LINK_RANK = ("NV", "PIX", "PXB", "PHB", "NODE", "SYS", "SOC")
_ANSI = re.compile(r"\x1b\[[0-9;]*m")


@dataclass
class Topology:
    """`nvidia-smi topo -m` as data: `links[i][j]` is the code between devices `devices[i]` and
    `devices[j]` (GPUs first, then NICs); affinity columns per GPU."""
    devices: list[str]
    links: list[list[str]]
    cpu_affinity: dict[str, str] = field(default_factory=dict)
    numa_affinity: dict[str, str] = field(default_factory=dict)
    legend: dict[str, str] = field(default_factory=dict)
    nic_names: dict[str, str] = field(default_factory=dict)

    @property
    def gpus(self) -> list[str]:
        return [d for d in self.devices if d.startswith("GPU")]

    def link(self, a: str, b: str) -> str:
        return self.links[self.devices.index(a)][self.devices.index(b)]

    def gpu_matrix(self) -> list[list[str]]:
        return [[self.link(a, b) for b in self.gpus] for a in self.gpus]

    def to_dict(self) -> dict:
        return {**asdict(self), "gpus": self.gpus, "gpu_matrix": self.gpu_matrix()}


def link_kind(code: str) -> str:
    """"NV12" -> "NV"; "PIX" -> "PIX"; " X " -> "X"."""
    code = code.strip().upper()
    return "NV" if re.fullmatch(r"NV\d+", code) else code


def nvlink_count(code: str) -> int:
    """Bonded NVLinks in a code: "NV12" -> 12, anything else -> 0."""
    match = re.fullmatch(r"NV(\d+)", code.strip().upper())
    return int(match.group(1)) if match else 0


def _cells(line: str) -> list[str]:
    # Columns are tab separated; some versions pad with runs of spaces instead.
    return [cell.strip() for cell in re.split(r"\t+| {2,}", line) if cell.strip()]


def parse_topology(text: str) -> Topology:
    """Parse the matrix, affinity columns and legend of `nvidia-smi topo -m` (every format since
    driver 4xx: with or without NIC rows, `NUMA Affinity`, `GPU NUMA ID`, ANSI underlines)."""
    lines = [_ANSI.sub("", line).rstrip() for line in text.splitlines()]
    # The header names GPU0 first; device rows also start with GPU0 but hold an "X" (self) cell.
    header_index = next((i for i, line in enumerate(lines)
                         if _cells(line)[:1] == ["GPU0"] and "X" not in _cells(line)), None)
    if header_index is None:
        raise ValueError("no `nvidia-smi topo -m` header (a line of column names starting with GPU0) found")
    columns = _cells(lines[header_index])
    device_columns = [c for c in columns if re.fullmatch(r"(GPU|NIC)\d+|mlx\d+_\d+|\w+_\d+", c)]
    extra_columns = columns[len(device_columns):]
    rows: dict[str, list[str]] = {}
    extras: dict[str, list[str]] = {}
    for line in lines[header_index + 1:]:
        cells = _cells(line)
        if not cells or cells[0] not in device_columns:
            if rows:  # the matrix ends at the first line that is not a device row
                break
            continue
        links = cells[1:1 + len(device_columns)]
        if len(links) < len(device_columns):
            raise ValueError(f"row {cells[0]} has {len(links)} link cells, expected {len(device_columns)}")
        rows[cells[0]] = links
        extras[cells[0]] = cells[1 + len(device_columns):]
    devices = [d for d in device_columns if d in rows]
    if not devices:
        raise ValueError("`nvidia-smi topo -m` output has a header but no device rows")
    index = [device_columns.index(d) for d in devices]
    links = [[rows[d][i] for i in index] for d in devices]
    topology = Topology(devices=devices, links=links)
    for device in devices:
        values = dict(zip(extra_columns, extras[device]))
        if "CPU Affinity" in values:
            topology.cpu_affinity[device] = values["CPU Affinity"]
        if "NUMA Affinity" in values:
            topology.numa_affinity[device] = values["NUMA Affinity"]
    for line in lines:
        legend = re.match(r"\s+(X|SYS|SOC|NODE|PHB|PXB|PIX|NV#|NVL?)\s+=\s+(.*)", line)
        if legend:
            topology.legend[legend.group(1)] = legend.group(2).strip()
        nic = re.match(r"\s+(NIC\d+):\s+(\S+)", line)
        if nic:
            topology.nic_names[nic.group(1)] = nic.group(2)
    return topology


def read_topology() -> tuple[Topology | None, str]:
    """(parsed `nvidia-smi topo -m`, note); (None, why) when it cannot be had."""
    text = _run(["nvidia-smi", "topo", "-m"])
    if text is None:
        return None, "nvidia-smi not found or failed"
    try:
        return parse_topology(text), "nvidia-smi topo -m"
    except ValueError as error:
        return None, f"could not parse nvidia-smi topo -m: {error}"


def assess_ddp_links(topology: Topology) -> dict:
    """The slowest GPU-to-GPU link (DDP's all-reduce moves at its pace) and what it means."""
    gpus = topology.gpus
    pairs = [(a, b, topology.link(a, b)) for i, a in enumerate(gpus) for b in gpus[i + 1:]]
    if not pairs:
        return {"worst_link": None, "nvlink_pairs": 0, "pairs": 0, "suits_ddp": True,
                "reason": "one GPU: nothing to all-reduce between GPUs"}
    def rank(code):
        kind = link_kind(code)
        return _LINK_RANK.index(kind) if kind in _LINK_RANK else len(_LINK_RANK)
    worst = max(pairs, key=lambda pair: rank(pair[2]))
    nvlink_pairs = sum(link_kind(code) == "NV" for _, _, code in pairs)
    kind = link_kind(worst[2])
    suits = kind in ("NV", "PIX", "PXB")
    reason = (f"{nvlink_pairs} of {len(pairs)} GPU pairs use NVLink; slowest link {worst[0]}-{worst[1]} is "
              f"{worst[2]} ({LINK_DESCRIPTIONS.get(kind, 'unknown link')})")
    return {"worst_link": worst[2], "nvlink_pairs": nvlink_pairs, "pairs": len(pairs), "suits_ddp": suits,
            "reason": reason}


# ---------------------------------------------------------------------------------------------
# Matmul throughput per dtype
# ---------------------------------------------------------------------------------------------

def dtype_supported(device, dtype_name: str) -> bool:
    """Whether a matmul in this dtype runs on the device at all (tf32 is a CUDA Ampere+ mode)."""
    device = _device(device)
    if dtype_name not in DTYPE_NAMES:
        raise ValueError(f"unknown dtype {dtype_name!r}; valid: {', '.join(DTYPE_NAMES)}")
    if device.type == "cpu":
        return dtype_name != "tf32"
    if device.type == "cuda" and torch.cuda.is_available():
        major = torch.cuda.get_device_capability(device)[0]
        return {"fp32": True, "fp16": major >= 6, "tf32": major >= 8, "bf16": major >= 8}[dtype_name]
    return False


def _dtype_name(dtype) -> str:
    if isinstance(dtype, str):
        return dtype
    return {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16"}[dtype]


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
MATMUL_MAX_REPEATS = 50  # at most: many short repeats give the best one more chances to miss a disturbance
MATMUL_REPEAT_SECONDS = 0.02  # a repeat runs back-to-back matmuls for about this long (amortizes the sync)
MATMUL_START_SIZE = 256  # smaller sides time thread wake-ups, not arithmetic (and may stop the ladder early)
# Largest square side per device type: large enough to reach the throughput plateau (on a
# 2-core Xeon, fp32 climbs from ~40-90 GFLOP/s at 512 to ~110-165 at 1024-2048), bounded by time.
MATMUL_MAX_SIZE = {"cuda": 8192, "cpu": 2048}
# Default seconds per probe. fp32 on CPU is the MFU denominator there, so it gets the most; CPU
# fp16/bf16 are mostly emulated (10-400x slower) and only need comparing with fp32.
MATMUL_BUDGET_SECONDS = {("cpu", "fp32"): 1.5, "cpu": 0.5, "cuda": 0.5}


def matmul_budget_seconds(device, dtype) -> float:
    """The default time bound of `matmul_probe` for this device and dtype."""
    device_type = _device(device).type
    return MATMUL_BUDGET_SECONDS.get((device_type, _dtype_name(dtype)),
                                     MATMUL_BUDGET_SECONDS.get(device_type, MATMUL_BUDGET_SECONDS["cpu"]))


def peak_and_typical(seconds_per_matmul: list[float], flops_per_matmul: float) -> tuple[float, float]:
    """(peak, typical) FLOP/s from timed repeats: the fastest repeat is the peak (disturbances
    only slow a repeat down), the median repeat the typical throughput."""
    ordered = sorted(seconds_per_matmul)
    return flops_per_matmul / ordered[0], flops_per_matmul / ordered[len(ordered) // 2]


def _seconds_per_matmul(a: torch.Tensor, b: torch.Tensor, calls: int, device: torch.device) -> float:
    _synchronize(device)  # start from an idle device, so earlier queued work is not timed
    start = time.perf_counter()
    for _ in range(calls):
        a @ b
    _synchronize(device)  # CUDA matmuls are asynchronous: wait for them before reading the clock
    return (time.perf_counter() - start) / calls


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
            seconds = min(_seconds_per_matmul(a, b, 1, device) for _ in range(3))
            # Double while the minimum repeats at twice the side (8x the work) still fit the
            # budget: slow dtypes stay small, fast ones grow to the plateau.
            if size >= max_size or 8 * seconds * MATMUL_MIN_REPEATS > budget_seconds:
                break
            size *= 2
        seconds = max(seconds, 1e-7)
        calls = max(1, int(MATMUL_REPEAT_SECONDS / seconds))
        count = min(MATMUL_MAX_REPEATS, max(MATMUL_MIN_REPEATS, int(budget_seconds / (calls * seconds))))
        repeats = [_seconds_per_matmul(a, b, calls, device) for _ in range(count)]
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
    """Measured square-matmul throughput (cached per device and dtype): the side `size`, the best
    repeat as `tflops` (the achievable peak) and the median repeat as `tflops_median`.
    A thrown-away warm-up, then 5 to 50 timed repeats; bounded to about `budget_seconds`
    plus the size ladder (default `matmul_budget_seconds`: 1.5 s for fp32 on CPU, 0.5 s for other
    CPU dtypes, 0.5 s on a GPU)."""
    device = _device(device)
    if budget_seconds is None:
        budget_seconds = matmul_budget_seconds(device, dtype)
    return _matmul_probe(str(device), _dtype_name(dtype), float(budget_seconds))


def measure_matmul_tflops(device, dtype) -> float | None:
    """Peak matmul TFLOP/s of `dtype` ("fp32" | "tf32" | "fp16" | "bf16" or a torch dtype) on
    `device` (the best of several timed repeats); None where the dtype does not run there.
    Cached: the first call per dtype costs about `matmul_budget_seconds`."""
    return matmul_probe(device, dtype)["tflops"]


def _datasheet_tflops(device: torch.device, dtype_name: str) -> tuple[str, float] | None:
    """(table key, dense TFLOP/s) for a known GPU and dtype, else None."""
    if device.type == "cuda" and torch.cuda.is_available():
        gpu_name = torch.cuda.get_device_name(device)
        for key, table in DATASHEET_TFLOPS.items():
            if key in gpu_name and dtype_name in table:
                return key, table[dtype_name]
    return None


def peak_flops_source(device, dtype) -> str:
    """Where `peak_flops` takes its number from: the datasheet entry or the measured matmul."""
    entry = _datasheet_tflops(_device(device), _dtype_name(dtype))
    if entry:
        return f"datasheet ({entry[0]}, dense)"
    return "measured matmul, best of repeats (no datasheet entry for this device)"


def peak_flops(device, dtype) -> float | None:
    """Peak FLOP/s (not TFLOP/s) of `device` in `dtype`, the denominator of MFU: the datasheet's
    dense number for known GPUs, else the measured matmul peak (best repeat: an achievable peak)."""
    device = _device(device)
    name = _dtype_name(dtype)
    entry = _datasheet_tflops(device, name)
    if entry:
        return entry[1] * 1e12
    measured = measure_matmul_tflops(device, name)
    return measured * 1e12 if measured else None


@functools.lru_cache(maxsize=None)
def _recommended_precision(device_name: str) -> str:
    fp32 = measure_matmul_tflops(device_name, "fp32")
    speeds = {name: measure_matmul_tflops(device_name, name) for name in ("bf16", "fp16")}
    # A reduced dtype must beat fp32 clearly (10 %) to be worth autocast's casts.
    faster = {name: tflops for name, tflops in speeds.items() if tflops and fp32 and tflops > 1.1 * fp32}
    if not faster:
        return "off"
    # bf16 has fp32's exponent range (no GradScaler, no overflow): prefer it unless fp16 is
    # clearly faster.
    if "bf16" in faster and faster["bf16"] >= 0.9 * max(faster.values()):
        return "bf16"
    return "fp16" if "fp16" in faster else "bf16"


def recommended_precision(device) -> str:
    """"fp16" | "bf16" | "off" for `precision="auto"`, from measured matmul throughput on `device`:
    "off" when no reduced-precision dtype is faster than fp32 there (e.g. most CPUs). Cached."""
    return _recommended_precision(str(_device(device)))


def matmul_table(devices: list | None = None, dtypes=DTYPE_NAMES) -> list[dict]:
    """Every (device, dtype) probe with its speed relative to fp32 on the same device."""
    if devices is None:
        devices = ["cpu"] + [f"cuda:{i}" for i in range(torch.cuda.device_count())] \
            if torch.cuda.is_available() else ["cpu"]
    rows = []
    for device in devices:
        fp32 = measure_matmul_tflops(device, "fp32")
        for name in dtypes:
            row = dict(matmul_probe(device, name))
            row["speed_vs_fp32"] = row["tflops"] / fp32 if row["tflops"] and fp32 else None
            rows.append(row)
    return rows


# ---------------------------------------------------------------------------------------------
# Facts and recommendations
# ---------------------------------------------------------------------------------------------

def default_data_folder() -> Path:
    """The folder the disk probe reads: the real EuroSAT when present, else the committed sample."""
    from course_lib.data import SAMPLE_DIR, eurosat_shared_dir

    return eurosat_shared_dir() or ledger.project_root() / SAMPLE_DIR


def collect_facts(data_dir=None, measure: bool = True) -> dict:
    """Everything `workbook doctor` knows, as JSON-ready plain values. `measure=False` skips the
    matmul and disk probes (inventory only, well under a second)."""
    start = time.perf_counter()
    folder = Path(data_dir) if data_dir else default_data_folder()
    facts = {
        "cpu": cpu_info(),
        "disk": disk_info(folder, probe=measure),
        "versions": versions(),
        "torch_cuda_available": torch.cuda.is_available(),
        "torch_arch_list": torch.cuda.get_arch_list() if torch.cuda.is_available() else [],
        "gpus": gpu_info(),
        "nvml_gpus": _nvml()["gpus"],
        "topology": None,
        "topology_note": "",
        "matmul": matmul_table() if measure else [],
        "recommended_precision": {},
    }
    topology, note = read_topology()
    facts["topology"] = topology.to_dict() if topology else None
    facts["topology_note"] = note
    facts["ddp_links"] = assess_ddp_links(topology) if topology else None
    if measure:
        for row in facts["matmul"]:
            facts["recommended_precision"].setdefault(row["device"], recommended_precision(row["device"]))
    facts["recommendations"] = recommendations(facts)
    facts["problems"] = [r["advice"] for r in facts["recommendations"] if r["severity"] == "problem"]
    facts["hardware"] = ledger.describe_hardware()
    facts["seconds"] = time.perf_counter() - start
    return facts


def _advice(topic: str, severity: str, advice: str, reason: str) -> dict:
    return {"topic": topic, "severity": severity, "advice": advice, "reason": reason}


def recommend_num_workers(physical_cores: int, gpus: int) -> int:
    """The article's starting point: half the physical cores, shared by the GPUs' processes."""
    return max(1, physical_cores // 2 // max(1, gpus))


def _best_cuda_for_driver(driver: str | None) -> int | None:
    version = _version_tuple(driver)
    fitting = [major for major, oldest in MIN_DRIVER_FOR_CUDA.items() if version >= _version_tuple(oldest)]
    return max(fitting) if fitting else None


def recommendations(facts: dict) -> list[dict]:
    """Advice computed from the facts: each item says what to do and the measured reason."""
    cpu, disk, gpus = facts["cpu"], facts["disk"], facts["gpus"]
    items = []
    gpu_count = len(gpus)
    per_gpu = max(1, gpu_count)
    cores = cpu["physical_cores"]
    workers = recommend_num_workers(cores, gpu_count)
    items.append(_advice("num_workers", "ok", f"start with num_workers={workers}",
                         f"{cores} physical cores / 2 / {per_gpu} process(es); then raise it while the "
                         "GPU waits for data and images/s still grows"))
    if gpu_count:
        cores_per_gpu, ram_per_gpu = cores / gpu_count, cpu["ram_bytes"] / gpu_count
        items.append(_advice(
            "cpu", "ok" if cores_per_gpu >= ARTICLE_CORES_PER_GPU else "warn",
            f"{cores_per_gpu:.0f} physical cores per GPU" + ("" if cores_per_gpu >= ARTICLE_CORES_PER_GPU else
                                                            ": JPEG decoding may starve the GPU; measure"),
            f"the article asks for >= {ARTICLE_CORES_PER_GPU} per GPU"))
        items.append(_advice(
            "ram", "ok" if ram_per_gpu >= ARTICLE_RAM_PER_GPU else "warn",
            f"{ram_per_gpu / GiB:.0f} GiB RAM per GPU",
            f"the article asks for >= {ARTICLE_RAM_PER_GPU / GiB:.0f} GiB per GPU"))

    # AMP: from measured speeds, per device.
    for device, choice in facts.get("recommended_precision", {}).items():
        rows = {r["dtype"]: r for r in facts["matmul"] if r["device"] == device}
        fp32 = rows.get("fp32", {}).get("tflops")
        ratios = ", ".join(f"{name} {rows[name]['speed_vs_fp32']:.3g}x" for name in ("fp16", "bf16", "tf32")
                           if name in rows and rows[name].get("speed_vs_fp32"))
        reason = f"matmul on {device}: fp32 {fp32 * 1e3:.3g} GFLOP/s; relative to fp32: {ratios or 'n/a'}" \
            if fp32 else f"fp32 matmul not measured on {device}"
        advice = "keep precision=off: no reduced-precision dtype is faster than fp32 here" if choice == "off" \
            else f"use precision={choice} (autocast)" + (" with GradScaler" if choice == "fp16" else "")
        items.append(_advice(f"amp {device}", "ok", advice, reason))
        if device.startswith("cuda") and "tf32" in rows and rows["tf32"].get("speed_vs_fp32", 0) and \
                rows["tf32"]["speed_vs_fp32"] > 1.1:
            items.append(_advice(f"tf32 {device}", "ok", "allow TF32 for fp32 matmuls "
                                 "(torch.backends.cuda.matmul.allow_tf32 = True)",
                                 f"tf32 matmul measured {rows['tf32']['speed_vs_fp32']:.1f}x fp32"))

    items.append(_advice("pin_memory", "ok", "pin_memory=True" if gpu_count else "leave pin_memory=False",
                         "page-locked buffers speed host-to-GPU copies" if gpu_count else
                         "pinned memory only speeds copies to a GPU; this machine has none torch can use"))

    ddp = facts.get("ddp_links")
    if gpu_count >= 2 and ddp:
        items.append(_advice("ddp", "ok" if ddp["suits_ddp"] else "warn",
                             "GPU links suit DDP" if ddp["suits_ddp"] else
                             "slow GPU links: use larger batches or gradient accumulation to all-reduce less "
                             "often; check NCCL_P2P_LEVEL", ddp["reason"]))
    elif gpu_count >= 2:
        items.append(_advice("ddp", "warn", "GPU links unknown", facts.get("topology_note") or "no topology"))
    else:
        items.append(_advice("ddp", "ok", "DDP not needed", f"{gpu_count} GPU(s) visible to torch"))

    # torch build vs driver.
    build = facts["versions"].get("cuda_runtime")
    driver = facts["versions"].get("driver")
    if build:
        needed = MIN_DRIVER_FOR_CUDA.get(_version_tuple(build)[0])
        if driver and needed and _version_tuple(driver) < _version_tuple(needed):
            best = _best_cuda_for_driver(driver)
            items.append(_advice("torch build", "problem",
                                 f"driver {driver} is too old for this torch (CUDA {build}, needs >= {needed}): "
                                 + (f"install a torch wheel built for CUDA {best}.x "
                                    f"(pip install torch --index-url https://download.pytorch.org/whl/cu{best}X)"
                                    if best else "upgrade the NVIDIA driver"),
                                 "CUDA minor-version compatibility table"))
        elif driver:
            items.append(_advice("torch build", "ok", f"torch CUDA {build} runs on driver {driver}",
                                 f"CUDA {build} needs driver >= {needed}"))
        else:
            items.append(_advice("torch build", "ok", f"torch is built for CUDA {build}; no NVIDIA driver found",
                                 f"to use a GPU with it, the driver must be >= {needed}"))
    elif facts.get("nvml_gpus"):
        items.append(_advice("torch build", "problem", "NVIDIA GPUs present but torch is a CPU-only build: "
                             "install a CUDA wheel from https://download.pytorch.org/whl/", "torch.version.cuda is None"))
    if facts.get("nvml_gpus") and not facts["torch_cuda_available"]:
        items.append(_advice("cuda", "problem", "NVML lists GPUs but torch.cuda.is_available() is False",
                             "driver/torch mismatch or CUDA_VISIBLE_DEVICES hides them"))
    for gpu in gpus:
        if not gpu["arch_covered"]:
            items.append(_advice(f"gpu{gpu['index']}", "problem",
                                 f"{gpu['name']} (sm_{gpu['compute_capability'].replace('.', '')}) is not in this "
                                 f"torch's architectures {facts['torch_arch_list']}: install a build that has it",
                                 "kernels would be missing or JIT-compiled"))

    # Disk: IOPS matter for many small files (the article's NVMe vs SATA point).
    random_mb = disk.get("read_random_mb_per_s")
    sequential_mb = disk.get("read_sequential_mb_per_s")
    if random_mb is not None and sequential_mb:
        slow = disk.get("read_random_reads_per_s", 0) < 2000
        items.append(_advice("storage", "warn" if slow else "ok",
                             ("many small random reads are slow here: pack images into shards (WebDataset) or "
                              "cache decoded arrays, or move the data to NVMe") if slow else
                             "storage keeps up with random small reads",
                             f"{disk['kind']} disk: sequential {sequential_mb:.0f} MiB/s, random 4 KiB reads "
                             f"{disk['read_random_reads_per_s']:.0f}/s ({random_mb:.1f} MiB/s)"))
    if disk["free_bytes"] < 10 * GiB:
        items.append(_advice("disk space", "problem", f"only {disk['free_bytes'] / GiB:.1f} GiB free under "
                             f"{disk['path']}: checkpoints and caches will fail", "< 10 GiB free"))
    if disk["kind"] == "hdd":
        items.append(_advice("storage", "warn", "the dataset is on a spinning disk: move it to an SSD",
                             "rotational=1 in /sys/block"))
    return items


# ---------------------------------------------------------------------------------------------
# Report and CLI
# ---------------------------------------------------------------------------------------------

_MARK = {"ok": "  ", "warn": "! ", "problem": "X "}


def _gib(value) -> str:
    return "?" if value is None else f"{value / GiB:.1f} GiB"


def format_report(facts: dict) -> str:
    """The human-readable `workbook doctor` report; problems marked `X`, warnings `!`."""
    cpu, disk, v = facts["cpu"], facts["disk"], facts["versions"]
    lines = [f"Machine: {facts['hardware']}", "",
             "CPU and memory",
             f"  {cpu['model']}: {cpu['physical_cores']} physical / {cpu['logical_cores']} logical cores "
             f"({cpu['usable_cores']} usable, torch uses {cpu['torch_threads']} threads)",
             f"  RAM {_gib(cpu['ram_bytes'])} ({_gib(cpu['ram_available_bytes'])} available)",
             "", "Dataset disk",
             f"  {disk['path']}: {disk['kind']} ({disk['block_device'] or 'device unknown'}), "
             f"{_gib(disk['free_bytes'])} free of {_gib(disk['total_bytes'])}"]
    if disk.get("read_sequential_mb_per_s"):
        lines.append(f"  sequential read {disk['read_sequential_mb_per_s']:.0f} MiB/s "
                     f"({disk['read_sequential_bytes'] / MiB:.1f} MiB from {disk['read_files_found']} files)")
    if disk.get("read_random_mb_per_s"):
        lines.append(f"  random 4 KiB reads {disk['read_random_reads_per_s']:.0f}/s "
                     f"= {disk['read_random_mb_per_s']:.1f} MiB/s")
    lines += ["", "Software",
              "  " + ", ".join(f"{k} {v.get(k)}" for k in ("python", "torch", "torchvision", "timm")),
              f"  torch built for CUDA {v.get('cuda_runtime')}, cuDNN {v.get('cudnn')}, NCCL {v.get('nccl')}; "
              f"driver {v.get('driver') or 'none'}; NVML {'yes' if v.get('nvml') else 'no'}",
              "", "GPUs"]
    if not facts["gpus"]:
        lines.append("  none visible to torch (torch.cuda.is_available() is False)")
    for gpu in facts["gpus"]:
        dtypes = ", ".join(name for name in ("fp16", "bf16", "tf32") if gpu[name])
        lines.append(f"  cuda:{gpu['index']} {gpu['name']}: {_gib(gpu['memory_bytes'])}, compute "
                     f"{gpu['compute_capability']}, arch {'covered' if gpu['arch_covered'] else 'NOT covered'} "
                     f"by torch, fast dtypes: {dtypes or 'none'}")
    topology = facts.get("topology")
    if topology:
        gpus = topology["gpus"]
        lines += ["", "GPU topology (nvidia-smi topo -m)", "        " + "".join(f"{g:>7}" for g in gpus)]
        for name, row in zip(gpus, topology["gpu_matrix"]):
            lines.append(f"  {name:>6}" + "".join(f"{cell:>7}" for cell in row))
    else:
        lines += ["", f"GPU topology: not available ({facts.get('topology_note')})"]
    if facts["matmul"]:
        lines += ["", "Matmul throughput (square matrices; best of 5-50 timed repeats after a warm-up, "
                      "median in brackets)"]
        for row in facts["matmul"]:
            if row["tflops"]:
                lines.append(f"  {row['device']:<7} {row['dtype']:<5} {row['tflops'] * 1e3:>10.1f} GFLOP/s  "
                             f"(median {row['tflops_median'] * 1e3:.1f}; {row['speed_vs_fp32']:.3g}x fp32, "
                             f"n={row['size']})")
            else:
                lines.append(f"  {row['device']:<7} {row['dtype']:<5} {'-':>10}          ({row['note']})")
    lines += ["", "Recommendations  (X = problem, ! = warning)"]
    for item in facts["recommendations"]:
        lines.append(f"{_MARK[item['severity']]}{item['topic']}: {item['advice']}  [{item['reason']}]")
    lines.append("")
    lines.append(f"{len(facts['problems'])} problem(s); doctor took {facts['seconds']:.1f} s")
    return "\n".join(lines)


def add_cli(subparsers) -> None:
    parser = subparsers.add_parser("doctor", help="check this machine: inventory, measured speeds, advice")
    parser.add_argument("--json", action="store_true", help="print the facts as JSON instead of a report")
    parser.add_argument("--data-dir", help="dataset folder for the disk probe (default: EuroSAT if present, "
                                           "else the committed sample)")
    parser.add_argument("--no-measure", action="store_true", help="skip the matmul and disk probes")
    parser.set_defaults(func=_cli)


def _cli(args) -> int:
    if args.data_dir and not Path(args.data_dir).is_dir():
        raise NotADirectoryError(f"--data-dir {args.data_dir} is not a folder; give the dataset folder")
    facts = collect_facts(args.data_dir, measure=not args.no_measure)
    print(json.dumps(facts, indent=2, default=str) if args.json else format_report(facts))
    # Non-zero only for problems (a missing GPU is not one), so scripts can gate on it.
    return 1 if facts["problems"] else 0



# ---------------------------------------------------------------------------------------------
# Tables and plots for notebook 01
# ---------------------------------------------------------------------------------------------

def inventory_rows(facts: dict) -> list[dict]:
    """The inventory as (item, value) rows for a table."""
    cpu, disk, v = facts["cpu"], facts["disk"], facts["versions"]
    rows = [("CPU", cpu["model"]), ("physical / logical cores", f"{cpu['physical_cores']} / {cpu['logical_cores']}"),
            ("RAM", _gib(cpu["ram_bytes"])), ("dataset folder", disk["path"]),
            ("disk kind", f"{disk['kind']} ({disk['block_device'] or '?'})"), ("disk free", _gib(disk["free_bytes"]))]
    rows += [(name, v.get(name)) for name in ("python", "torch", "torchvision", "timm", "cuda_runtime", "cudnn",
                                              "nccl", "driver")]
    rows.append(("GPUs visible to torch", len(facts["gpus"])))
    for gpu in facts["gpus"]:
        rows.append((f"cuda:{gpu['index']}", f"{gpu['name']}, {_gib(gpu['memory_bytes'])}, cc "
                     f"{gpu['compute_capability']}, arch covered: {gpu['arch_covered']}, fp16 {gpu['fp16']}, "
                     f"bf16 {gpu['bf16']}, tf32 {gpu['tf32']}"))
    return [{"item": item, "value": value} for item, value in rows]


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


def plot_topology(topology: Topology, title: str = ""):
    """The GPU-to-GPU link matrix as a coloured grid (NVLink green, PCIe kinds warmer)."""
    import matplotlib.pyplot as plt
    import numpy as np

    matrix = topology.gpu_matrix()
    order = ("X", *_LINK_RANK)
    codes = np.array([[order.index(link_kind(c)) if link_kind(c) in order else len(order) for c in row]
                      for row in matrix])
    figure, axis = plt.subplots(figsize=(1 + 0.6 * len(matrix), 0.6 + 0.6 * len(matrix)))
    axis.imshow(codes, cmap="RdYlGn_r", vmin=0, vmax=len(order))
    for i, row in enumerate(matrix):
        for j, cell in enumerate(row):
            axis.text(j, i, cell, ha="center", va="center", fontsize=8)
    axis.set_xticks(range(len(matrix)), topology.gpus, fontsize=8)
    axis.set_yticks(range(len(matrix)), topology.gpus, fontsize=8)
    axis.set_title(title or "GPU-to-GPU links")
    return figure
