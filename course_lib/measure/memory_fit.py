"""Whether a run fits before its first step: the memory a device has free (CUDA, or the host's RAM within the
container's memory cgroup), what `storage=device` holds all run, and `check_fits`, which refuses in one line.
"""
from __future__ import annotations

import os
from pathlib import Path

import torch

from course_lib.measure.memory import estimate_training_memory


# (limit, usage, statistics) of the memory cgroup this process runs in: v2, then v1. A container's limit, not the
# host's RAM, is where the kernel's OOM killer stops a run (killed at 1 GB with the host's 24 GB free).
CGROUP_FILES = (("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current", "/sys/fs/cgroup/memory.stat"),
                ("/sys/fs/cgroup/memory/memory.limit_in_bytes", "/sys/fs/cgroup/memory/memory.usage_in_bytes",
                 "/sys/fs/cgroup/memory/memory.stat"))
NO_CGROUP_LIMIT = 2**60  # cgroup v1 writes "no limit" as about 2^63


def cgroup_room() -> int | None:
    """Bytes the memory cgroup's limit still allows this process's container: the limit, less what it uses
    beyond the page cache it can drop (`inactive_file`, as `docker stats` counts it); None without a limit."""
    for limit_file, usage_file, stat_file in CGROUP_FILES:
        try:
            limit, usage = Path(limit_file).read_text().strip(), int(Path(usage_file).read_text())
        except (OSError, ValueError):
            continue
        if not limit.isdigit() or int(limit) >= NO_CGROUP_LIMIT:  # "max": no limit
            return None
        try:
            stats = dict(line.split() for line in Path(stat_file).read_text().splitlines() if line.count(" ") == 1)
            reclaimable = int(stats.get("inactive_file", stats.get("total_inactive_file", 0)))
        except (OSError, ValueError):
            reclaimable = 0
        return max(0, int(limit) - max(0, usage - reclaimable))
    return None


def free_bytes(device: torch.device) -> int | None:
    """Memory a run can still take on `device`: free CUDA memory, or the less of the host's available RAM and the
    memory cgroup's room (`cgroup_room`); None where it cannot be told (MPS)."""
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    if device.type == "cpu":
        import psutil

        available, room = psutil.virtual_memory().available, cgroup_room()
        return available if room is None else min(available, room)
    return None


def resident_bytes(config) -> int:
    """What `storage=device` holds all run besides one step: every training (at most `max_train_images`) and
    validation image as uint8 at `image_size`, counted from the folder's file names; else 0."""
    from course_lib.data.images import IMAGE_EXTENSIONS, split_folders

    if config.storage != "device" or not config.data_dir or not Path(config.data_dir).is_dir():
        return 0
    counts = {split: sum(name.lower().endswith(IMAGE_EXTENSIONS) for _, _, names in os.walk(folder) for name in names)
              for split, folder in split_folders(Path(config.data_dir)).items() if split in ("train", "val")}
    train = counts.get("train", 0)
    if config.max_train_images:
        train = min(train, config.max_train_images)
    return (train + counts.get("val", 0)) * 3 * config.image_size ** 2


# A suggested size leaves this share of the free memory unused: the estimate leaves out the
# allocator's slack, the DataLoader's batches in flight and the framework itself.
FIT_MARGIN = 0.8


def check_fits(config, device: torch.device | None = None, budget_bytes: int | None = None) -> None:
    """Refuse before the first step, in one ConfigError naming the largest image_size that fits, a run whose step
    (`estimate_training_memory` on meta) needs more than `device` has free; a model meta cannot run passes."""
    from course_lib.config import ConfigError
    from course_lib.devices import resolve_device

    device = device or resolve_device(config.device)
    budget = budget_bytes if budget_bytes is not None else free_bytes(device)
    if budget is None:
        return
    precision = config.precision if config.precision in ("fp16", "bf16") else "off"
    try:
        estimate = estimate_training_memory(config.model, config.batch_size, config.image_size, precision,
                                            config.optimizer, config.momentum, device="meta")
    except (RuntimeError, NotImplementedError, ValueError, TypeError):
        return
    resident = resident_bytes(config)  # storage=device: the images stay in the same memory all run
    if estimate.total_bytes + resident <= budget:
        return
    # Activations, input and resident images grow with the pixels (image_size squared); weights and their state do not.
    fixed = estimate.total_bytes - estimate.activation_bytes_per_image * config.batch_size - estimate.input_bytes
    growing = estimate.total_bytes + resident - fixed
    room = FIT_MARGIN * budget - fixed
    advice = "even the weights, gradients and optimizer state do not fit: use a smaller model"
    if room > 0:
        fitting = int(config.image_size * (room / growing) ** 0.5) // 16 * 16
        advice = (f"use image_size={fitting} or less, or a smaller batch_size" if fitting >= 8
                  else "use a smaller batch_size or model")
    held = ""
    if resident:
        held = f" and {resident / 1e9:.1f} GB of images that storage=device holds there"
        advice += ", or storage=cache (the images stay on disk, memory-mapped) or fewer max_train_images"
    raise ConfigError(f"image_size={config.image_size} at batch_size={config.batch_size} needs about "
                      f"{estimate.total_bytes / 1e9:.1f} GB for one training step of {config.model} (estimated){held}, "
                      f"more than the {budget / 1e9:.1f} GB free on {device}; {advice}")
