"""The DataLoader knob sweep: time each combination of num_workers, pin_memory, prefetch_factor and persistent_workers
on one dataset (warm-up epochs thrown away, a sync before each clock read, medians over interleaved repeats), find the
knee (the cheapest setting within 5% of the fastest), and compare a loader with the one-core decode rate. The loader
itself: `data/loaders.py`. See https://pytorch.org/docs/stable/data.html#torch.utils.data.DataLoader.
"""
from __future__ import annotations

import dataclasses
import itertools
import statistics
from typing import Callable, Iterable

import torch

from course_lib.config import Config, ConfigError
from course_lib.data.loaders import DataWaitTimer, make_loader, resolved_num_workers, timed_batches
from course_lib.devices import synchronize
from course_lib.instruments.timing import stopwatch, time_repeats


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


def time_loader(loader, epochs: int = 2, warmup_epochs: int = 1, device: torch.device | str | None = None,
                batch_transform: Callable | None = None) -> dict:
    """Images/s over `epochs` passes after `warmup_epochs`, worker start-up included (what an epoch boundary costs);
    with a CUDA `device` each batch is copied there (pin_memory's work) and `batch_transform` runs on it there."""
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
    seconds, images = stopwatch(lambda: sum(consume(batch) for _ in range(epochs) for batch in loader), device)
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
    """One row per setting with the median images/s of `repeats`, interleaved (all settings, then all again) so a
    neighbour's load on a shared machine hits every setting alike."""
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
    """The cheapest row (`LoaderSetting.cost`) within `tolerance` of the fastest: more workers or prefetching than
    that buys almost nothing and costs processes and memory."""
    if not rows:
        raise ValueError("find_knee needs at least one timed setting")
    best = max(row["images_per_second"] for row in rows)
    good_enough = [row for row in rows if row["images_per_second"] >= (1 - tolerance) * best]
    return min(good_enough, key=lambda row: (setting_of(row).cost(), -row["images_per_second"]))


def single_process_rate(dataset, images: int = 256, repeats: int = 3, threads: int = 1) -> dict:
    """Median images/s of `dataset[i]` (read + decode + transform) in this process: the one-core rate N workers can
    at best multiply by N. threads=1 as in a worker; 0 leaves torch's setting (num_workers=0's)."""
    count = min(images, len(dataset))
    previous = torch.get_num_threads()
    if threads:
        torch.set_num_threads(threads)
    try:
        dataset[0]  # warm-up: imports, first-call allocations
        timing = time_repeats(lambda: [dataset[index] for index in range(count)], repeats=repeats, warmup=0)
        rates = [count / seconds for seconds in timing.seconds]
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


def measure_data_wait(loader, step: Callable, *, max_batches: int | None = None, warmup_batches: int = 1,
                      device=None) -> DataWaitTimer:
    """Run `step(batch)` over the loader and return the DataWaitTimer; the first
    `warmup_batches` (worker start-up, first-call allocations) run but are not counted."""
    device = torch.device(device) if isinstance(device, str) else device
    iterator = iter(loader)  # one iterator: warm-up and measured steps share the same workers
    for batch in itertools.islice(iterator, warmup_batches):
        step(batch)
    synchronize(device)  # the warm-up's queued work is not the first measured step's
    timer = DataWaitTimer()
    for batch in timed_batches(iterator, timer, device, max_batches):
        step(batch)
    return timer
