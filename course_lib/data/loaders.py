"""DataLoader factory with the articles' knobs (num_workers, pin_memory, prefetch_factor, persistent_workers), and a
timer that turns "the GPU is starved" into a number: the fraction of each step spent waiting for data. The sweep over
the knobs, its knee and `measure_data_wait` (a loader's data wait under a given step): `measure/loader_sweep.py`.
See https://pytorch.org/docs/stable/data.html#torch.utils.data.DataLoader."""
from __future__ import annotations

import dataclasses
import os
import re
from typing import Iterable, Iterator

import torch
from torch.utils.data import DataLoader, Subset

from course_lib.config import Config, ConfigError, WorkbookError
from course_lib.devices import resolve_num_workers, worker_batches
from course_lib.instruments.timing import now


def local_processes() -> int:
    """Training processes on this machine: torchrun's LOCAL_WORLD_SIZE, else 1."""
    return max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1")))


def resolved_num_workers(config: Config) -> int:
    """The config's num_workers, with -1 turned into the recommended number for this machine
    (`devices.recommended_num_workers`: half the physical cores, shared by this machine's training processes).
    Every loader, and the cache and shard builders, ask here."""
    return resolve_num_workers(config.num_workers, processes=local_processes())


def make_loader(dataset, config: Config, *, train: bool, sampler=None, drop_last: bool | None = None,
                batch_size: int | None = None) -> DataLoader:
    """One DataLoader built from the config's knobs; `sampler` (e.g. DistributedSampler) replaces shuffling, except
    for a stream that splits itself across ranks (shards.ShardDataset). Worker-only knobs go at num_workers=0."""
    workers = resolved_num_workers(config)
    generator = torch.Generator().manual_seed(config.seed)
    extra = {}
    if workers > 0:
        extra = dict(prefetch_factor=config.prefetch_factor, persistent_workers=config.persistent_workers)
    iterable = isinstance(dataset, torch.utils.data.IterableDataset)  # shards: order comes from the stream
    if iterable and sampler is not None:
        if not getattr(dataset, "splits_by_rank", False):
            raise ConfigError(f"{type(dataset).__name__} is a stream: a DataLoader cannot take a sampler for it, "
                              "and it does not split itself across ranks; use a map-style dataset")
        sampler = None  # the stream already reads only this rank's shards
    return DataLoader(
        dataset, batch_size=batch_size or config.batch_size, shuffle=train and sampler is None and not iterable,
        sampler=sampler, num_workers=workers,
        pin_memory=config.pin_memory and torch.cuda.is_available(),
        drop_last=train if drop_last is None else drop_last,
        generator=None if iterable else generator,
        **extra,
    )


def image_folder_dataset(folder, image_size: int, *, decoder: str = "pil", augmentation: str = "cpu",
                         bad_images: str = "fail", recipe=None):
    """An ImageFolder read with `decoder`, each image through `transforms.sample_transform(image_size, augmentation,
    recipe)` (default recipe transforms.HEAVY: crop, flip and colour jitter, what notebook 02 measures)."""
    from course_lib.data import transforms
    from course_lib.data.datasets import ImageFolderDataset
    from course_lib.data.decode import FileDecoder

    transform = transforms.sample_transform(image_size, augmentation, recipe or transforms.HEAVY)
    return ImageFolderDataset(folder, transform, bad_images, loader=FileDecoder(decoder))


def default_image_folder(config: Config):
    """The training ImageFolder a config points at: data_dir's train/ (or data_dir itself), or the cached
    landcover-synth for dataset=landcover-synth without data_dir."""
    from course_lib.data.datasets import image_folder_root

    root = image_folder_root(config)
    return root / "train" if (root / "train").is_dir() else root


def first_images(dataset, count: int):
    """The first `count` items of a map-style dataset (all of it when shorter)."""
    return dataset if count >= len(dataset) else Subset(dataset, range(count))


@dataclasses.dataclass
class DataWaitTimer:
    """Seconds spent waiting for the next batch and seconds of whole steps (wait + compute), over training steps.
    `data_wait_fraction` near 0: the loader keeps up; near 1: the accelerator is starved (the articles' 30-50%)."""

    wait_seconds: float = 0.0  # blocked in next(loader)
    total_seconds: float = 0.0  # from asking for a batch to asking for the next one
    batches: int = 0

    @property
    def data_wait_fraction(self) -> float:
        return self.wait_seconds / self.total_seconds if self.total_seconds else 0.0

    @property
    def compute_seconds(self) -> float:
        return self.total_seconds - self.wait_seconds

    def reset(self) -> None:
        self.wait_seconds = self.total_seconds = 0.0
        self.batches = 0

    def summary(self) -> dict:
        return {"batches": self.batches, "data_wait_seconds": self.wait_seconds,
                "step_seconds": self.total_seconds, "data_wait_fraction": self.data_wait_fraction}

    def speeds(self, batch_size: int) -> dict:
        """Images/s of whole steps, and of the compute alone (what the model could do if never fed late)."""
        images = self.batches * batch_size
        return {"images_per_second": images / self.total_seconds if self.total_seconds else 0.0,
                "compute_images_per_second": images / self.compute_seconds if self.compute_seconds > 0 else 0.0}


# torch's ExceptionWrapper.reraise builds the main process's copy of a worker's exception from
# "Caught X in DataLoader worker process N.\nOriginal Traceback (most recent call last): ...".
_WORKER_TRACEBACK = re.compile(r"^Caught \w+ in DataLoader worker process \d+\.\nOriginal Traceback")


def without_worker_traceback(error: WorkbookError) -> WorkbookError:
    """A workbook error re-raised from a DataLoader worker as the one line the worker raised (the
    same type, its own message: the file name and the fix); any other error unchanged."""
    text = str(error)
    if not _WORKER_TRACEBACK.match(text):
        return error
    # The traceback's last line is "module.Type: the original message".
    found = list(re.finditer(rf"^(?:[\w.]+\.)?{re.escape(type(error).__name__)}: ", text, re.MULTILINE))
    return type(error)(text[found[-1].end():].strip()) if found else error


def batches(loader: Iterable) -> Iterator:
    """The loader's batches (`devices.worker_batches`: an error stops the workers), a worker's workbook error as its
    own one line (`timed_batches` without the timing: for validation and evaluation loops)."""
    try:
        yield from worker_batches(loader)
    except WorkbookError as error:
        original = without_worker_traceback(error)
        if original is error:
            raise
        raise original from None


def timed_batches(loader: Iterable, timer: DataWaitTimer | None = None, device=None,
                  max_batches: int | None = None) -> Iterator:
    """Yield the loader's batches (`batches`) while `timer` records the data wait of each step. With a CUDA or MPS
    `device` it is synchronised when the step hands control back, so queued kernels count as compute, not as the
    next batch's wait (one sync per step, a small cost)."""
    timer = timer if timer is not None else DataWaitTimer()
    device = torch.device(device) if isinstance(device, str) else device
    iterator = batches(loader)
    while max_batches is None or timer.batches < max_batches:
        start = now()
        try:
            batch = next(iterator)
        except StopIteration:
            return
        timer.wait_seconds += now() - start
        yield batch
        timer.total_seconds += now(device) - start  # the step's queued work counts as compute
        timer.batches += 1
