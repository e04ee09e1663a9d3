"""`workbook doctor`: the machine as a measured checklist. It collects the inventory, the matmul and
disk probes and the GPU topology, and computes recommendations from those facts (workers, AMP
dtype, pinned memory, DDP links, the torch build that fits the driver).
"""
from __future__ import annotations

import time
from pathlib import Path

import torch

from course_lib import devices, machine, paths
from course_lib.engine import allreduce
from course_lib.measure.inventory import (GiB, MiB, _nvml, _version_tuple, cpu_info, disk_info, gpu_info, mps_info,
                                          versions)
from course_lib.measure.peak import matmul_table, recommended_precision
from course_lib.measure.topology import assess_ddp_links, read_topology

_MARK = {"ok": "  ", "warn": "! ", "problem": "X "}
# The articles' rules of thumb, used as thresholds below (not as measurements).
ARTICLE_CORES_PER_GPU = 16  # physical CPU cores per training GPU
ARTICLE_RAM_PER_GPU = 64 * GiB  # bytes of host RAM per training GPU
# Oldest Linux driver each CUDA major release runs on (CUDA minor-version compatibility,
# NVIDIA "CUDA Compatibility" guide, table 2).
MIN_DRIVER_FOR_CUDA = {11: "450.80.02", 12: "525.60.13", 13: "580.65.06"}


def default_data_folder() -> Path:
    """The folder the disk probe reads: the real data every run finds (`paths.find_real_data`), else
    the committed sample."""
    found = paths.find_real_data()
    return found.folder if found is not None else paths.project_root() / paths.SAMPLE_DIR


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
        "mps": mps_info(),
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
    facts["allreduce"] = allreduce_fact()
    facts["recommendations"] = recommendations(facts)
    facts["problems"] = [r["advice"] for r in facts["recommendations"] if r["severity"] == "problem"]
    facts["hardware"] = machine.describe_hardware()
    facts["seconds"] = time.perf_counter() - start
    return facts


def allreduce_fact(book=None) -> dict | None:
    """The newest all-reduce sweep measured on this machine (notebook 05, `workbook ddp --bandwidth`; read from
    the ledger, not measured here: a sweep launches processes), as plain values; None when there is none."""
    report = allreduce.newest(book)
    if report is None:
        return None
    return {"peak_bus_gb_per_s": report.peak, "half_peak_from_bytes": report.knee(), "backend": report.backend,
            "world_size": report.world_size, "device": report.device, "measured_at": report.measured_at,
            "run_id": report.run_id}


def _allreduce_line(facts: dict) -> str:
    found = facts.get("allreduce")
    if not found:
        return "  not measured on this machine yet: `workbook ddp --bandwidth` (about 20 s on 2 CPU cores)"
    knee = allreduce.human_bytes(found["half_peak_from_bytes"])
    return (f"  bus bandwidth up to {found['peak_bus_gb_per_s']:.2f} GB/s over {found['world_size']} {found['backend']} "
            f"processes on {found['device']}, half of it from {knee} messages on "
            f"(measured {found['measured_at'][:16]}, run {found['run_id']})")


def _advice(topic: str, severity: str, advice: str, reason: str) -> dict:
    return {"topic": topic, "severity": severity, "advice": advice, "reason": reason}


def _best_cuda_for_driver(driver: str | None) -> int | None:
    version = _version_tuple(driver)
    fitting = [major for major, oldest in MIN_DRIVER_FOR_CUDA.items() if version >= _version_tuple(oldest)]
    return max(fitting) if fitting else None


def recommendations(facts: dict) -> list[dict]:
    """Advice computed from the facts: each item says what to do and the measured reason."""
    return (_cpu_advice(facts) + _precision_advice(facts) + _link_advice(facts) + _build_advice(facts)
            + _disk_advice(facts))


def _cpu_advice(facts: dict) -> list[dict]:
    """num_workers, and the article's cores and RAM per GPU."""
    cpu, gpu_count = facts["cpu"], len(facts["gpus"])
    items, per_gpu, cores = [], max(1, gpu_count), cpu["physical_cores"]
    workers = devices.recommended_num_workers(per_gpu, cores)
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
    return items


def _precision_advice(facts: dict) -> list[dict]:
    """AMP and TF32, from the measured matmul speeds, per device."""
    items = []
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
    return items


def _link_advice(facts: dict) -> list[dict]:
    """pin_memory, the Apple-silicon device, and whether the GPU links suit DDP."""
    gpu_count = len(facts["gpus"])
    items = []
    mps = (facts.get("mps") or {}).get("available")
    items.append(_advice("pin_memory", "ok", "pin_memory=True" if gpu_count else "leave pin_memory=False",
                         "page-locked buffers speed host-to-GPU copies" if gpu_count else
                         devices.UNSUPPORTED["mps"]["pin_memory"] if mps else
                         "pinned memory only speeds copies to a GPU; this machine has none torch can use"))
    if mps and not gpu_count:
        items.append(_advice("device", "ok", "device=auto trains on the Apple-silicon GPU (mps)",
                             "torch.backends.mps.is_available(); DDP, nvJPEG and torch.compile are skipped there"))
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
    return items


def _build_advice(facts: dict) -> list[dict]:
    """The torch build against the driver, a CPU-only build on a GPU machine, and missing GPU architectures."""
    items = []
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
    for gpu in facts["gpus"]:
        if not gpu["arch_covered"]:
            items.append(_advice(f"gpu{gpu['index']}", "problem",
                                 f"{gpu['name']} (sm_{gpu['compute_capability'].replace('.', '')}) is not in this "
                                 f"torch's architectures {facts['torch_arch_list']}: install a build that has it",
                                 "kernels would be missing or JIT-compiled"))
    return items


def _disk_advice(facts: dict) -> list[dict]:
    """Storage: IOPS matter for many small files (the article's NVMe against SATA point), free space, spinning disks."""
    disk = facts["disk"]
    items = []
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
    mps = facts.get("mps") or {}
    if not facts["gpus"] and mps.get("available"):
        lines.append(f"  no CUDA GPU; Apple-silicon GPU through MPS (torch may allocate "
                     f"{_gib(mps.get('recommended_max_memory_bytes'))})")
    elif not facts["gpus"]:
        lines.append("  none visible to torch (torch.cuda.is_available() is False)")
    for gpu in facts["gpus"]:
        dtypes = ", ".join(name for name in ("fp16", "bf16", "tf32") if gpu[name])
        sheet = gpu.get("datasheet_tflops") or {}
        peaks = (f"; datasheet ({gpu['datasheet']}, dense) " + ", ".join(f"{k} {v:g}" for k, v in sheet.items())
                 + " TFLOP/s") if sheet else "; no datasheet entry (MFU uses the measured matmul)"
        lines.append(f"  cuda:{gpu['index']} {gpu['name']}: {_gib(gpu['memory_bytes'])}, compute "
                     f"{gpu['compute_capability']}, arch {'covered' if gpu['arch_covered'] else 'NOT covered'} "
                     f"by torch, fast dtypes: {dtypes or 'none'}{peaks}")
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
    lines += ["", "All-reduce (notebook 05's sweep)", _allreduce_line(facts), "",
              "Recommendations  (X = problem, ! = warning)"]
    for item in facts["recommendations"]:
        lines.append(f"{_MARK[item['severity']]}{item['topic']}: {item['advice']}  [{item['reason']}]")
    lines += ["", f"{len(facts['problems'])} problem(s); doctor took {facts['seconds']:.1f} s"]
    return "\n".join(lines)


def inventory_rows(facts: dict) -> list[dict]:
    """The inventory as (item, value) rows for a table."""
    cpu, disk, v = facts["cpu"], facts["disk"], facts["versions"]
    rows = [("CPU", cpu["model"]), ("physical / logical cores", f"{cpu['physical_cores']} / {cpu['logical_cores']}"),
            ("RAM", _gib(cpu["ram_bytes"])), ("dataset folder", disk["path"]),
            ("disk kind", f"{disk['kind']} ({disk['block_device'] or '?'})"), ("disk free", _gib(disk["free_bytes"]))]
    rows += [(name, v.get(name)) for name in ("python", "torch", "torchvision", "timm", "cuda_runtime", "cudnn",
                                              "nccl", "driver")]
    rows.append(("GPUs visible to torch", len(facts["gpus"])))
    rows.append(("all-reduce (newest sweep here)", _allreduce_line(facts).strip()))
    for gpu in facts["gpus"]:
        rows.append((f"cuda:{gpu['index']}", f"{gpu['name']}, {_gib(gpu['memory_bytes'])}, cc "
                     f"{gpu['compute_capability']}, arch covered: {gpu['arch_covered']}, fp16 {gpu['fp16']}, "
                     f"bf16 {gpu['bf16']}, tf32 {gpu['tf32']}"))
    return [{"item": item, "value": value} for item, value in rows]
