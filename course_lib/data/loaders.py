"""DataLoader factory with the articles' knobs (num_workers, pin_memory, prefetch_factor,
persistent_workers), a sweep that times each combination and finds the knee, and a timer that
turns "the GPU is starved" into a number: the fraction of each step spent waiting for data.
See https://pytorch.org/docs/stable/data.html#torch.utils.data.DataLoader.
"""
from __future__ import annotations

import dataclasses
import itertools
import re
import statistics
import time
from typing import Callable, Iterable, Iterator

import torch
from torch.utils.data import DataLoader, Subset

from course_lib.config import Config, ConfigError, WorkbookError


def local_processes() -> int:
    """Training processes on this machine: torchrun's LOCAL_WORLD_SIZE, else 1."""
    import os

    return max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1")))


def resolved_num_workers(config: Config) -> int:
    """The config's num_workers, with -1 turned into the recommended number for this machine
    (`devices.recommended_num_workers`: half the physical cores, shared by this machine's
    training processes). Every loader, and the cache and shard builders, ask here."""
    from course_lib.devices import resolve_num_workers

    return resolve_num_workers(config.num_workers, processes=local_processes())


def make_loader(dataset, config: Config, *, train: bool, sampler=None, drop_last: bool | None = None,
                batch_size: int | None = None) -> DataLoader:
    """One DataLoader built from the config's knobs (num_workers=-1: the recommended number);
    `sampler` (e.g. DistributedSampler) replaces shuffling. Knobs that only matter with workers
    are dropped at num_workers=0, where torch refuses them. A stream that splits itself across
    ranks (shards.ShardDataset) takes no sampler: the one given is not used."""
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
        dataset,
        batch_size=batch_size or config.batch_size,
        shuffle=train and sampler is None and not iterable,
        sampler=sampler,
        num_workers=workers,
        pin_memory=config.pin_memory and torch.cuda.is_available(),
        drop_last=train if drop_last is None else drop_last,
        generator=None if iterable else generator,
        **extra,
    )


def image_folder_dataset(folder, image_size: int, *, decoder: str = "pil", augmentation: str = "cpu",
                         bad_images: str = "fail", recipe=None):
    """An ImageFolder read with `decoder` (see decode.py). augmentation="cpu": per-sample
    augmentation by `recipe` in the workers (normalised float out; default transforms.HEAVY: crop,
    flip and colour jitter, what notebook 02 measures); "device": only a resize here, uint8 out,
    augmented per batch later by device_augment.DeviceAugment; "none": resize and normalise."""
    from course_lib.data import transforms
    from course_lib.data.datasets import ImageFolderDataset
    from course_lib.data.decode import FileDecoder

    transform = transforms.sample_transform(image_size, augmentation, recipe or transforms.HEAVY)
    return ImageFolderDataset(folder, transform, bad_images, loader=FileDecoder(decoder))


def default_image_folder(config: Config):
    """The training ImageFolder a config points at: data_dir's train/ (or data_dir itself), or the
    cached landcover-synth for dataset=landcover-synth without data_dir."""
    from course_lib.data.datasets import image_folder_root

    root = image_folder_root(config)
    return root / "train" if (root / "train").is_dir() else root


def first_images(dataset, count: int):
    """The first `count` items of a map-style dataset (all of it when shorter)."""
    return dataset if count >= len(dataset) else Subset(dataset, range(count))


@dataclasses.dataclass(frozen=True)
class LoaderSetting:
    """One combination of the DataLoader knobs the articles tune."""

    num_workers: int  # worker processes
    pin_memory: bool = False  # page-locked host buffers (only effective with CUDA)
    prefetch_factor: int = 2  # batches each worker keeps ready
    persistent_workers: bool = False  # keep workers alive between epochs

    def cost(self) -> tuple:
        """What a setting costs the machine, for ranking equally fast settings: processes first,
        then batches held in memory, then kept-alive workers, then pinned memory."""
        return (self.num_workers, self.num_workers * self.prefetch_factor, self.persistent_workers,
                self.pin_memory)

    def apply(self, config: Config) -> Config:
        return config.replace(**dataclasses.asdict(self))

    def label(self) -> str:
        if self.num_workers == 0:
            return f"workers=0 pin={int(self.pin_memory)}"
        return (f"workers={self.num_workers} pin={int(self.pin_memory)} prefetch={self.prefetch_factor} "
                f"persistent={int(self.persistent_workers)}")


def setting_grid(num_workers: Iterable[int] = (0, 1, 2), pin_memory: Iterable[bool] = (False,),
                 prefetch_factor: Iterable[int] = (2,), persistent_workers: Iterable[bool] = (False,)
                 ) -> list[LoaderSetting]:
    """Every combination, without duplicates: at num_workers=0 prefetch and persistence do nothing."""
    settings = []
    for workers, pin, prefetch, persistent in itertools.product(num_workers, pin_memory, prefetch_factor,
                                                                 persistent_workers):
        setting = LoaderSetting(workers, pin, prefetch, persistent) if workers else LoaderSetting(0, pin)
        if setting not in settings:
            settings.append(setting)
    return settings


def _to_device(batch, device: torch.device | None, non_blocking: bool):
    if device is None or device.type == "cpu":
        return batch
    if isinstance(batch, torch.Tensor):
        return batch.to(device, non_blocking=non_blocking)
    if isinstance(batch, (list, tuple)):
        return type(batch)(_to_device(item, device, non_blocking) for item in batch)
    return batch


def _synchronize(device: torch.device | None):
    if device is not None and device.type == "cuda":
        torch.cuda.synchronize(device)  # note: a CPU-GPU sync point, so the clock sees finished copies


def time_loader(loader, epochs: int = 2, warmup_epochs: int = 1, device: torch.device | str | None = None,
                batch_transform: Callable | None = None) -> dict:
    """Images/s over `epochs` full passes, after `warmup_epochs` thrown away. Each measured epoch
    includes starting workers (unless persistent): that is what an epoch boundary costs.
    With a CUDA `device` every batch is copied there, so pin_memory has something to speed up;
    `batch_transform` (e.g. device_augment.DeviceAugment) then runs on the images where they landed."""
    device = torch.device(device) if isinstance(device, str) else device
    non_blocking = bool(getattr(loader, "pin_memory", False))

    def consume(batch) -> int:
        images = _to_device(batch, device, non_blocking)
        images = images[0] if isinstance(images, (list, tuple)) else images
        if batch_transform is not None:
            batch_transform(images)
        return len(images)

    for _ in range(warmup_epochs):
        for batch in loader:
            consume(batch)
    _synchronize(device)
    images, start = 0, time.perf_counter()
    for _ in range(epochs):
        for batch in loader:
            images += consume(batch)
    _synchronize(device)
    seconds = time.perf_counter() - start
    return {"images": images, "seconds": seconds, "images_per_second": images / seconds if seconds else 0.0}


def time_dataset(dataset, config: Config, *, epochs: int = 2, warmup_epochs: int = 1, repeats: int = 1,
                 batch_transform: Callable | None = None, device=None) -> dict:
    """`time_loader` on `make_loader(dataset, config)`, median images/s of `repeats`, plus the
    config's loader knobs: one row for a comparison table."""
    timings = []
    for _ in range(repeats):
        loader = make_loader(dataset, config, train=True, drop_last=False)
        timings.append(time_loader(loader, epochs, warmup_epochs, device, batch_transform))
        del loader
    return {"images": timings[0]["images"] // max(1, epochs), "num_workers": resolved_num_workers(config),
            "batch_size": config.batch_size, "repeats": repeats,
            "images_per_second": statistics.median(t["images_per_second"] for t in timings)}


def sweep_loader(dataset, config: Config, settings: list[LoaderSetting], *, epochs: int = 2,
                 warmup_epochs: int = 1, repeats: int = 1, device=None,
                 on_result: Callable[[dict], None] | None = None) -> list[dict]:
    """Time every setting on the same dataset; one row per setting with the median images/s of
    `repeats`. Repeats are interleaved (all settings, then all again) so a neighbour's load on a
    shared machine hits every setting alike."""
    if not settings:
        raise ConfigError("sweep_loader needs at least one LoaderSetting")
    if len(dataset) == 0:
        raise ConfigError("sweep_loader got an empty dataset; check the folder")
    timings: dict[LoaderSetting, list[dict]] = {s: [] for s in settings}
    for _ in range(repeats):
        for setting in settings:
            # drop_last=False: every image counts, even when fewer than a batch remain
            loader = make_loader(dataset, setting.apply(config), train=True, drop_last=False)
            timings[setting].append(time_loader(loader, epochs, warmup_epochs, device))
            del loader  # ends persistent workers before the next setting starts its own
    rows = []
    for setting in settings:
        rates = [t["images_per_second"] for t in timings[setting]]
        row = {**dataclasses.asdict(setting), "setting": setting.label(), "batch_size": config.batch_size,
               "images": timings[setting][0]["images"], "repeats": repeats,
               "images_per_second": statistics.median(rates), "images_per_second_repeats": rates,
               "pin_memory_effective": setting.pin_memory and torch.cuda.is_available()}
        rows.append(row)
        if on_result:
            on_result(row)
    return rows


def find_knee(rows: list[dict], tolerance: float = 0.05) -> dict:
    """The cheapest setting within `tolerance` (0.05 = 5%) of the fastest: more workers or more
    prefetching than that buys almost nothing and costs processes and memory.
    `rows` need `images_per_second` and the LoaderSetting fields."""
    if not rows:
        raise ValueError("find_knee needs at least one timed setting")
    best = max(row["images_per_second"] for row in rows)
    good_enough = [row for row in rows if row["images_per_second"] >= (1 - tolerance) * best]
    fields = [f.name for f in dataclasses.fields(LoaderSetting)]
    defaults = dataclasses.asdict(LoaderSetting(0))
    return min(good_enough, key=lambda row: (LoaderSetting(**{k: row.get(k, defaults[k]) for k in fields}).cost(),
                                             -row["images_per_second"]))


def single_process_rate(dataset, images: int = 256, repeats: int = 3, threads: int = 1) -> dict:
    """Images/s of `dataset[i]` (read + decode + transform) in this process alone: the
    one-core rate that N workers can at best multiply by N. Median of `repeats` passes.
    threads=1 as in a DataLoader worker (torch sets 1 intra-op thread there); 0 = leave torch's
    setting, which is what num_workers=0 runs with."""
    count = min(images, len(dataset))
    previous = torch.get_num_threads()
    if threads:
        torch.set_num_threads(threads)
    try:
        dataset[0]  # warm-up: imports, first-call allocations
        rates = []
        for _ in range(repeats):
            start = time.perf_counter()
            for index in range(count):
                dataset[index]
            rates.append(count / (time.perf_counter() - start))
    finally:
        torch.set_num_threads(previous)
    return {"images": count, "repeats": repeats, "images_per_second": statistics.median(rates)}


def setting_of(row: dict, min_workers: int = 0) -> LoaderSetting:
    """The LoaderSetting of a sweep row (e.g. `find_knee`'s), with at least `min_workers` workers."""
    fields = {f.name: row[f.name] for f in dataclasses.fields(LoaderSetting) if f.name in row}
    fields["num_workers"] = max(min_workers, int(fields.get("num_workers", 0)))
    return LoaderSetting(**fields)


def cores_used(num_workers: int, cores: int) -> int:
    """Cores a loader decodes on: its workers (at most the cores there are), or the main process."""
    return max(1, min(num_workers, cores))


def decode_limit_share(images_per_second: float, decode_images_per_second: float, num_workers: int,
                       cores: int) -> float:
    """Loader images/s over the decode limit: one core's decode rate x the cores the loader uses.
    Near 1: decoding bounds the loader; above 1: the loader skips decoding (a pixel cache)."""
    if decode_images_per_second <= 0:
        raise ValueError("the single-core decode rate must be positive")
    return images_per_second / (decode_images_per_second * cores_used(num_workers, cores))


def with_decode_share(table, decode_images_per_second: float, cores: int, images_per_second: str = "images_per_second",
                      num_workers: str = "num_workers", column: str = "share of decode limit"):
    """`table` with a column after its speed (and MFU) columns: `decode_limit_share` of each row."""
    table = table.copy()
    shares = [decode_limit_share(speed, decode_images_per_second, int(workers), cores)
              for speed, workers in zip(table[images_per_second], table[num_workers])]
    after = "MFU" if "MFU" in table.columns else images_per_second
    table.insert(list(table.columns).index(after) + 1, column, shares)
    return table


def cores_per_accelerator(training_images_per_second: float, images_per_second_per_core: float) -> float:
    """CPU cores whose loaders keep up with an accelerator that trains at `training_images_per_second`
    when one core delivers `images_per_second_per_core` of the same pipeline (decode + augment)."""
    if images_per_second_per_core <= 0:
        raise ValueError("images per second per core must be positive")
    return training_images_per_second / images_per_second_per_core


@dataclasses.dataclass
class DataWaitTimer:
    """Accumulates, over training steps, seconds spent waiting for the next batch and seconds of
    whole steps (wait + compute). `data_wait_fraction` near 0: the loader keeps up; near 1: the
    accelerator is starved (the articles' 30-50% GPU utilisation)."""

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
    """The loader's batches, with a worker's workbook error as its own one line (`timed_batches`
    without the timing: for validation and evaluation loops)."""
    try:
        yield from loader
    except WorkbookError as error:
        original = without_worker_traceback(error)
        if original is error:
            raise
        raise original from None


def timed_batches(loader: Iterable, timer: DataWaitTimer | None = None, device=None,
                  max_batches: int | None = None) -> Iterator:
    """Yield the loader's batches while `timer` records the data wait of each step.

        timer = DataWaitTimer()
        for images, labels in timed_batches(loader, timer, device=device):
            ...train step...
        print(timer.data_wait_fraction)

    With a CUDA `device` the GPU is synchronised when the step hands control back, so queued
    kernels count as compute, not as the next batch's wait (one sync per step, a small cost)."""
    timer = timer if timer is not None else DataWaitTimer()
    device = torch.device(device) if isinstance(device, str) else device
    iterator = iter(loader)
    while max_batches is None or timer.batches < max_batches:
        start = time.perf_counter()
        try:
            batch = next(iterator)
        except StopIteration:
            return
        except WorkbookError as error:
            original = without_worker_traceback(error)
            if original is error:
                raise
            raise original from None
        timer.wait_seconds += time.perf_counter() - start
        yield batch
        _synchronize(device)
        timer.total_seconds += time.perf_counter() - start
        timer.batches += 1


def measure_data_wait(loader, step: Callable, *, max_batches: int | None = None, warmup_batches: int = 1,
                      device=None) -> DataWaitTimer:
    """Run `step(batch)` over the loader and return the DataWaitTimer; the first
    `warmup_batches` (worker start-up, first-call allocations) run but are not counted."""
    device = torch.device(device) if isinstance(device, str) else device
    iterator = iter(loader)  # one iterator: warm-up and measured steps share the same workers
    for batch in itertools.islice(iterator, warmup_batches):
        step(batch)
    _synchronize(device)
    timer = DataWaitTimer()
    for batch in timed_batches(iterator, timer, device, max_batches):
        step(batch)
    return timer
