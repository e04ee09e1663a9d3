"""The disk a folder lives on, and its cold read speed: sequential MB/s and random 4 KiB IOPS.

The first article (section 1.1) says an NVMe SSD cut an epoch's data-reading time by about 60% compared with a SATA SSD,
and that IOPS matter more than MB/s for many small images. One machine has one disk, so this module measures the disk
you have and names its type; the comparison needs two. Cold reads: the probe writes a temporary file, flushes it, and
asks the kernel to drop its pages (`posix_fadvise(POSIX_FADV_DONTNEED)`, see posix_fadvise(2)) before every pass, so the
reads reach the device instead of the page cache. Virtual disks (virtio `vd*`) may still be cached by the host.
`time_raw_reads` compares reading loose files with streaming the same bytes from tar shards.
"""
from __future__ import annotations

import os
import random
import tempfile
import time
from pathlib import Path

MiB = 2**20


def drop_from_page_cache(fd: int) -> bool:
    """Ask the kernel to forget the cached pages of an open file (advisory: clean pages on local file
    systems). True when the request was accepted."""
    if not hasattr(os, "posix_fadvise"):
        return False
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        return True
    except OSError:
        return False


def _read_text(path: Path) -> str | None:
    try:
        return path.read_text().strip() or None
    except OSError:
        return None


def describe_disk(path=".") -> dict:
    """The block device holding `path`, from /sys (Linux): {"device", "rotational", "model"} and `disk_kind`'s
    {"kind", "interface"} ("unknown" where /sys does not tell)."""
    path = Path(path)
    existing = next((p for p in (path, *path.parents) if p.exists()), Path("."))
    info = {"path": str(path), "device": None, "kind": "unknown", "rotational": None, "model": None,
            "interface": None}
    try:
        st_dev = existing.stat().st_dev
        sys_path = Path(f"/sys/dev/block/{os.major(st_dev)}:{os.minor(st_dev)}").resolve()
    except (OSError, ValueError):
        return info
    for folder in (sys_path, sys_path.parent):  # a partition's queue/ lives in its parent disk
        if (folder / "queue" / "rotational").exists():
            name = folder.name
            rotational = _read_text(folder / "queue" / "rotational")
            rotational = None if rotational is None else rotational == "1"
            info.update(device=name, rotational=rotational, model=_read_text(folder / "device" / "model"),
                        **disk_kind(name, rotational))
            return info
    return info


def disk_kind(name: str, rotational: bool | None) -> dict:
    """{"kind", "interface"} from a block device's name and rotational flag (a virtio or Xen disk's flag says nothing
    about what backs it)."""
    if name.startswith("nvme"):
        return {"kind": "nvme", "interface": "NVMe (PCIe)"}
    if name.startswith(("vd", "xvd")):
        return {"kind": "virtual", "interface": "virtio/Xen virtual disk (the host's storage is not visible)"}
    if name.startswith(("sd", "hd")):
        kind = "unknown" if rotational is None else ("hdd" if rotational else "ssd")
        return {"kind": kind, "interface": "SATA/SAS/USB (sd*)"}
    if name.startswith(("loop", "zram", "ram")):
        return {"kind": "memory or file-backed", "interface": name.rstrip("0123456789")}
    return {"kind": "unknown", "interface": None}


def write_probe_file(folder, size_bytes: int = 64 * MiB) -> Path:
    """A file of random bytes (incompressible) in `folder`, flushed to the disk (fsync)."""
    handle, name = tempfile.mkstemp(prefix="disk-probe-", dir=folder)
    chunk = os.urandom(MiB)
    with os.fdopen(handle, "wb") as out:
        for _ in range(max(1, size_bytes // MiB)):
            out.write(chunk)
        out.flush()
        os.fsync(out.fileno())  # dirty pages cannot be dropped: write them out first
    return Path(name)


def cold_sequential_read(path, block_bytes: int = MiB) -> dict:
    """One pass over the whole file in `block_bytes` reads after dropping it from the page cache."""
    with open(path, "rb", buffering=0) as handle:
        dropped = drop_from_page_cache(handle.fileno())
        total, start = 0, time.perf_counter()
        while chunk := handle.read(block_bytes):
            total += len(chunk)
        seconds = time.perf_counter() - start
    return {"bytes": total, "seconds": seconds, "megabytes_per_second": total / 1e6 / seconds, "dropped": dropped}


def cold_random_reads(path, reads: int = 1000, block_bytes: int = 4096, max_seconds: float = 1.0,
                      seed: int = 0) -> dict:
    """`block_bytes` reads at random aligned offsets of the file after dropping it from the page
    cache (at most `reads`, or `max_seconds`): the IOPS a shuffled loader over small files needs."""
    rng = random.Random(seed)
    size = os.path.getsize(path)
    blocks = max(1, size // block_bytes)
    with open(path, "rb", buffering=0) as handle:
        dropped = drop_from_page_cache(handle.fileno())
        done, start = 0, time.perf_counter()
        while done < reads and time.perf_counter() - start < max_seconds:
            os.pread(handle.fileno(), block_bytes, rng.randrange(blocks) * block_bytes)
            done += 1
        seconds = time.perf_counter() - start
    return {"reads": done, "seconds": seconds, "reads_per_second": done / seconds,
            "megabytes_per_second": done * block_bytes / 1e6 / seconds, "dropped": dropped}


def measure_cold_reads(folder=None, size_bytes: int = 64 * MiB, repeats: int = 3, random_reads: int = 1000,
                       seed: int = 0) -> dict:
    """`describe_disk` of `folder` (default: the temporary one) with `repeats` cold sequential (MB/s) and random 4 KiB
    (IOPS) passes over a fresh temporary file; "cache_dropped" False: the numbers may be the page cache's."""
    folder = Path(folder or tempfile.gettempdir())
    path = write_probe_file(folder, size_bytes)
    try:
        sequential = [cold_sequential_read(path) for _ in range(repeats)]
        random_passes = [cold_random_reads(path, random_reads, seed=seed + r) for r in range(repeats)]
    finally:
        path.unlink(missing_ok=True)
    return {**describe_disk(folder), "file_bytes": size_bytes, "repeats": repeats,
            "sequential_mb_per_s": [p["megabytes_per_second"] for p in sequential],
            "random_reads_per_s": [p["reads_per_second"] for p in random_passes],
            "random_mb_per_s": [p["megabytes_per_second"] for p in random_passes],
            "cache_dropped": all(p["dropped"] for p in sequential + random_passes)}


def describe_reads(probe: dict) -> str:
    """One line: the disk's type and its median cold read speeds."""
    import statistics

    name = probe.get("device") or "unknown device"
    model = f", model {probe['model']}" if probe.get("model") else ""
    rotational = {True: "rotational=1", False: "rotational=0", None: "rotational flag unknown"}[probe.get("rotational")]
    cached = "" if probe.get("cache_dropped") else " (page cache could not be dropped: an upper bound)"
    return (f"{name}: {probe['kind']} disk ({rotational}{model}); cold reads of a {probe['file_bytes'] / MiB:.0f} MiB "
            f"file: sequential {statistics.median(probe['sequential_mb_per_s']):.0f} MB/s, random 4 KiB "
            f"{statistics.median(probe['random_reads_per_s']):,.0f} IOPS "
            f"({statistics.median(probe['random_mb_per_s']):.1f} MB/s), median of {probe['repeats']}{cached}")


def time_raw_reads(files: list, urls: list[str], repeats: int = 3, cold: bool = False) -> dict:
    """Median bytes/s and files/s of reading the encoded bytes (no decoding) of loose files against one sequential
    stream through the tar shards (`data.shards`). A warm page cache hides most of the storage cost the article
    measures: `cold=True` drops each file from it before reading, so both paths read the disk."""
    import contextlib
    import tarfile

    from course_lib.instruments.timing import time_repeats

    @contextlib.contextmanager
    def opened(path):
        with open(path, "rb") as handle:
            if cold:
                drop_from_page_cache(handle.fileno())
            yield handle

    def loose():
        total = 0
        for path in files:
            with opened(path) as handle:
                total += len(handle.read())
        return total

    def tar():
        total = 0
        for url in urls:
            with opened(url) as handle, tarfile.open(fileobj=handle, mode="r|") as archive:  # a sequential stream
                for member in archive:
                    if member.isfile() and not member.name.endswith(".cls"):
                        total += len(archive.extractfile(member).read())
        return total

    result = {"cold": cold}
    for name, read in (("loose", loose), ("shards", tar)):
        timing = time_repeats(read, repeats=repeats, warmup=1)  # warm-up: same page-cache state for both
        seconds, total, median = timing.seconds, timing.result, timing.median
        result[f"{name}_files_per_second"] = len(files) / median
        result[f"{name}_files_per_second_repeats"] = [len(files) / s for s in seconds]
        result[f"{name}_megabytes_per_second"] = total / 1e6 / median
    result["shards_speedup"] = result["shards_files_per_second"] / result["loose_files_per_second"]
    return result
