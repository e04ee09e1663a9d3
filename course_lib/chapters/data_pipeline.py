"""Notebook 02's measurements turned into the articles' claims (`analysis.claims`): decoders, tar shards, the
DataLoader knee, pinned memory, the starved accelerator, DataLoader tuning, the disk and CPU cores per GPU. The
measuring lives in `measure.loader_sweep`, `data.decode`, `data.shards` and `measure.disk`; this module picks the
notebook's data, sizes and machine (`setup`) and compares what they measured with what the article says."""
from __future__ import annotations

import dataclasses
import statistics as stats

import pandas as pd
import timm
import torch

from course_lib import devices, paths
from course_lib.analysis import claims as claim_records
from course_lib.analysis import statistics
from course_lib.chapters.setup import ChapterSetup, sizes
from course_lib.config import resolve_profile
from course_lib.data import datasets, loaders
from course_lib.measure import bench, disk, flops, loader_sweep

DEFAULT_LOADER = "default DataLoader"  # num_workers=0, no pinning, no prefetch, no persistent workers


# What each profile measures beyond its sizes. smoke: a check, not a measurement (one timed epoch,
# two repeats, a few images); cpu and gpu: two timed epochs and medians over 3-5 repeats, the loader
# sweep from none to twice the cores (`sweep_workers` []).
PIPELINE_CHOICES = {
    "smoke": {"sweep_workers": [0, 1], "epochs": 1, "decode_files": 32, "decode_repeats": 2, "generated_images": 8, "decode_sizes": [256],
              "single_process_images": 64, "training_repeats": 2, "training_batches": 2, "read_repeats": 2,
              "disk_probe_mib": 8},
    "cpu": {"sweep_workers": [], "epochs": 2, "decode_files": 512, "decode_repeats": 5, "generated_images": 0, "decode_sizes": [256, 1024],
            "single_process_images": 256, "training_repeats": 3, "training_batches": 5, "read_repeats": 3,
            "disk_probe_mib": 64},
}
PIPELINE_CHOICES["gpu"] = PIPELINE_CHOICES["cpu"]


@dataclasses.dataclass(kw_only=True)
class PipelineSetup(ChapterSetup):
    """Notebook 02's data, sizes and machine (`setup`); `config` has num_workers resolved to this machine's number."""

    folder: object  # Path: the training image folder every section reads
    images: int  # images per timed epoch: max_train_images, at most what the folder holds
    cores: int = 1  # usable CPU cores of this process
    model: object = None  # the timm model section 3 trains, on `run_on`
    flops_per_image: float = 0.0  # its training FLOPs (forward + backward) per image: the MFU columns
    sweep_workers: list = dataclasses.field(default_factory=list)  # num_workers values of the loader sweep
    pins: tuple = (False,)  # pin_memory values of the sweep: True only with CUDA, where pinning can help
    cache_dir: object = None  # Path of the project's data cache: the shards and the disk probe's file
    physical_cores: int = 1  # of the machine: the knee's share of them is a claim
    epochs: int = 2  # timed epochs per measurement (after one warm-up epoch)
    decode_files: int = 512  # the dataset's own files the decoders decode
    decode_repeats: int = 5  # timed passes per decoder
    generated_images: int = 0  # generated JPEGs per size; 0: bench.images_for_size
    decode_sizes: list = dataclasses.field(default_factory=list)  # pixels: generated JPEG sizes
    single_process_images: int = 256  # images of the one-process rate (half of them with every thread)
    training_repeats: int = 3  # interleaved repeats of the default vs tuned training comparison
    training_batches: int = 5  # timed batches per training repeat
    read_repeats: int = 3  # repeats of the raw-read and cold-read disk timings
    disk_probe_mib: int = 64  # MiB: size of the disk probe's file

    @property
    def device(self):
        """The torch.device batches are copied to; None on a CPU-only machine (`devices.transfer_device`)."""
        return devices.transfer_device(self.config.device)

    @property
    def run_on(self):
        """Where section 3 trains, and whose peak FLOP/s the MFU columns use."""
        return self.device or torch.device("cpu")

    def generated_count(self, size: int) -> int:
        """Generated JPEGs to decode at `size` pixels."""
        return self.generated_images or bench.images_for_size(size)

    def line(self) -> str:
        """What the notebook prints after the data line."""
        config = self.config
        return (f"profile {self.profile}: {self.folder} at {config.image_size} px, {self.images} images per timed "
                f"epoch, batch {config.batch_size}\nmachine: {self.hardware}; {self.cores} usable cores; batches go to "
                f"{self.device or 'the CPU (no GPU)'}; {torch.get_num_threads()} torch thread(s) in this process")


def setup(profile: str, data_dir: str | None = None, *, sweep_workers: list | None = None,
          decode_sizes: list | None = None, torch_threads: int = 1, **params) -> PipelineSetup:
    """The data `datasets.config_with_data` picks, the config with `params` (None: the profile's), the images per
    timed epoch, the model section 3 trains and the profile's sizes (`PIPELINE_CHOICES`; `sweep_workers` [] off
    smoke: 0, 1, 2, half, all and twice the cores). `torch_threads` (0: torch's default) sets this process's
    intra-op threads: num_workers=0 and DeviceAugment on the CPU run in this process, so keep it to one core."""
    config, data = datasets.config_with_data(profile, data_dir=data_dir, **params)
    # num_workers=-1 (the profile's "recommended") becomes this machine's number: the comparisons print it
    config = config.replace(num_workers=devices.resolve_num_workers(config.num_workers))
    folder = loaders.default_image_folder(config)
    whole = datasets.ImageFolderDataset(folder)
    cores = devices.usable_cores()
    choices = dict(sizes(PIPELINE_CHOICES, profile))
    choices["decode_sizes"] = list(decode_sizes or choices["decode_sizes"])
    profile_workers = choices.pop("sweep_workers")  # []: from none to twice the cores
    sweep_workers = list(sweep_workers or profile_workers or sorted({0, 1, 2, max(1, cores // 2), cores, 2 * cores}))
    if torch_threads:
        torch.set_num_threads(torch_threads)
    device = devices.transfer_device(config.device)
    model = timm.create_model(config.model, num_classes=len(whole.classes)).to(device or torch.device("cpu"))
    return PipelineSetup(profile=resolve_profile(profile), data=data, config=config, folder=folder,
                         images=min(config.max_train_images or len(whole), len(whole)), cores=cores, model=model,
                         flops_per_image=flops.training_flops_per_image(model, config.image_size),
                         sweep_workers=sweep_workers, pins=(False, True) if torch.cuda.is_available() else (False,),
                         cache_dir=paths.project_root() / paths.CACHE_DIR, physical_cores=devices.physical_cores(),
                         **choices)


def pin_memory_rows(dataset, config, setting: loader_sweep.LoaderSetting, epochs: int, device, repeats: int = 3):
    """On CUDA: the sweep of `setting` without and with pin_memory (batches copied to the GPU),
    `repeats` interleaved timings each. None without CUDA, where pinning has nothing to speed up."""
    if device is None or torch.device(device).type != "cuda":
        return None
    pair = [dataclasses.replace(setting, pin_memory=pin) for pin in (False, True)]
    return loader_sweep.sweep_loader(dataset, config, pair, epochs=epochs, repeats=repeats, device=device)


def _rates(rows, key: str = "images_per_second", **match) -> list:
    """`key` of every row whose values match `match`."""
    return [r[key] for r in rows if all(r.get(k) == v for k, v in match.items())]


def decoder_claim(decode_rows: list[dict]):
    """opencv_decode: OpenCV / PIL images/s on the first input set (the dataset's own files)."""
    inputs = decode_rows[0]["inputs"]
    by_name = {r["decoder"]: r for r in decode_rows if r["inputs"] == inputs}
    if "opencv" not in by_name:
        return claim_records.not_measurable("opencv_decode", "OpenCV (cv2) is not installed here")
    opencv, pil = by_name["opencv"], by_name["pil"]
    ratio = statistics.ratio_interval(opencv["images_per_second_repeats"], pil["images_per_second_repeats"])
    others = ", ".join(f"{r['speedup_vs_pil']:.2f}x at {r['image_size']} px" for r in decode_rows
                       if r["decoder"] == "opencv" and r["inputs"] != inputs)
    return claim_records.measured(
        "opencv_decode", ratio["ratio"], (ratio["low"], ratio["high"]),
        f"{opencv['images_per_second']:.0f} vs {pil['images_per_second']:.0f} images/s decoding {pil['images']} "
        f"{inputs} ({pil['image_size']} px) in memory, {pil['repeats']} repeats, bootstrap 95% interval"
        + (f"; generated JPEGs: {others}" if others else ""))


def shards_claim(raw: dict):
    """tar_shards: files/s streaming tar shards over files/s opening loose files (bytes only)."""
    ratio = statistics.ratio_interval(raw["shards_files_per_second_repeats"], raw["loose_files_per_second_repeats"])
    cache = "page cache dropped before each read" if raw.get("cold") else "warm page cache"
    return claim_records.measured(
        "tar_shards", ratio["ratio"], (ratio["low"], ratio["high"]),
        f"reading the encoded bytes: loose {raw['loose_files_per_second']:,.0f} -> shards "
        f"{raw['shards_files_per_second']:,.0f} files/s ({cache}, "
        f"{len(raw['loose_files_per_second_repeats'])} repeats)")


def knee_claim(knee: dict, physical_cores: int, best_share: float):
    """num_workers_knee: the knee's workers as a share of the physical cores."""
    return claim_records.measured(
        "num_workers_knee", knee["num_workers"] / physical_cores,
        reason=f"knee {knee['setting']} on {physical_cores} physical cores (cheapest setting within 5% of the best); "
               f"best = {best_share:.0%} of one process x the cores")


def pin_memory_claim(pin_rows: list[dict] | None):
    """pin_memory: loader-to-GPU images/s with pinning over without, in %."""
    if not pin_rows:
        return claim_records.not_measurable(
            "pin_memory", "no CUDA device: pinned (page-locked) buffers only speed up host-to-GPU copies, and "
            "make_loader leaves pinning off without one; run this notebook on a GPU")
    pinned, unpinned = (_rates(pin_rows, "images_per_second_repeats", pin_memory=pin)[0] for pin in (True, False))
    ratio = statistics.ratio_interval(pinned, unpinned)
    return claim_records.measured(
        "pin_memory", (ratio["ratio"] - 1) * 100, ((ratio["low"] - 1) * 100, (ratio["high"] - 1) * 100),
        f"{pin_rows[0]['setting']} with batches copied to the GPU, {pin_rows[0]['repeats']} interleaved repeats")


def training_rate_table(training_rows: list[dict]):
    """Median per loader of the training rows (images/s, data wait, compute-only images/s)."""
    frame = pd.DataFrame(training_rows)
    table = frame.groupby("loader", sort=False)[["images_per_second", "data_wait_fraction",
                                                 "compute_images_per_second"]].median()
    table.insert(0, "num_workers", frame.groupby("loader", sort=False).num_workers.first())
    table.insert(1, "repeats", frame.groupby("loader", sort=False).size())
    return table


def starved_claim(training_rows: list[dict], model: str, device_name: str):
    """gpu_starved_utilisation: the share of a step the model computes behind the default loader."""
    busy = [100 * (1 - r["data_wait_fraction"]) for r in training_rows if r["loader"] == DEFAULT_LOADER]
    interval = statistics.confidence_interval(busy)
    return claim_records.measured(
        "gpu_starved_utilisation", interval["mean"], (max(0.0, interval["low"]), min(100.0, interval["high"])),
        f"1 - data-wait fraction of {model} training on {device_name} fed by num_workers=0 "
        f"({len(busy)} repeats, 95% t interval)")


def tuning_claim(training_rows: list[dict]):
    """dataloader_tuning: training images/s with the tuned loader over the default one."""
    tuned_name = next(r["loader"] for r in training_rows if r["loader"] != DEFAULT_LOADER)
    ratio = statistics.ratio_interval(_rates(training_rows, loader=tuned_name), _rates(training_rows, loader=DEFAULT_LOADER))
    return claim_records.measured(
        "dataloader_tuning", ratio["ratio"], (ratio["low"], ratio["high"]),
        f"training images/s, same model and loop: {tuned_name} vs the default (num_workers=0, no pinning, "
        f"prefetch or persistent workers), interleaved repeats, bootstrap 95% interval")


def cores_claim(training_rows: list[dict], images_per_second_per_core: float, cuda: bool, pipeline: str):
    """cpu_cores_per_gpu: the GPU's compute-only training images/s over one core's loader images/s."""
    tuned = [r["compute_images_per_second"] for r in training_rows if r["loader"] != DEFAULT_LOADER]
    if not cuda:
        examples = ", ".join(f"{rate:,} images/s -> {loader_sweep.cores_per_accelerator(rate, images_per_second_per_core):.1f}"
                             for rate in (1000, 3000))
        return claim_records.not_measurable(
            "cpu_cores_per_gpu", f"no GPU: one core delivers {images_per_second_per_core:.0f} images/s of this pipeline "
            f"({pipeline}); a GPU training at N images/s needs N / {images_per_second_per_core:.0f} cores ({examples} "
            "cores); the CPU's own training rate here is no GPU's")
    needed = [loader_sweep.cores_per_accelerator(rate, images_per_second_per_core) for rate in tuned]
    interval = statistics.confidence_interval(needed) if len(needed) > 1 else None
    return claim_records.measured(
        "cpu_cores_per_gpu", stats.mean(needed), None if interval is None else
        (min(interval["low"], stats.mean(needed)), max(interval["high"], stats.mean(needed))),
        f"the GPU trains at {stats.median(tuned):,.0f} images/s (compute only); one core delivers "
        f"{images_per_second_per_core:.0f} images/s of {pipeline}")


def disk_claim(probe: dict):
    """nvme_vs_sata: one disk cannot be compared with another; say what it is and how fast it reads."""
    return claim_records.not_measurable(
        "nvme_vs_sata", "the claim compares an NVMe with a SATA SSD and this machine has one disk: "
        + disk.describe_reads(probe))


def cache_claim(cache_speedup: float, disk_ratio: float):
    return claim_records.checked(
        "predecoded_cache", cache_speedup > 1 and disk_ratio > 1, value=cache_speedup,
        reason=f"loader {cache_speedup:.1f}x faster from the uint8 memmap (each path at its best workers), "
               f"for {disk_ratio:.1f}x the disk of the JPEGs")


def augmentation_claim(augment_speedup: float, where: str):
    return claim_records.checked(
        "device_augmentation", augment_speedup > 1, value=augment_speedup,
        reason=f"{augment_speedup:.2f}x the loader images/s of per-sample augmentation in CPU workers "
               f"(DeviceAugment on {where}; on a CPU-only machine the 'device' is the main process's cores)")


def claims(decode_rows, raw, knee, physical_cores, best_share, training_rows, images_per_second_per_core,
           disk_probe, pin_rows=None, model="", device_name="cpu", pipeline="read + decode + augment",
           cache=None, augment_speedup=None):
    """Every claim notebook 02 measures: the numeric ones in the registry's order, then the pixel
    cache (`cache`: (speed-up, disk ratio)) and device augmentation when given."""
    cuda = str(device_name).startswith("cuda")
    return [starved_claim(training_rows, model, device_name),
            cores_claim(training_rows, images_per_second_per_core, cuda, pipeline),
            disk_claim(disk_probe), tuning_claim(training_rows), knee_claim(knee, physical_cores, best_share),
            pin_memory_claim(pin_rows), decoder_claim(decode_rows), shards_claim(raw),
            *([cache_claim(*cache)] if cache else []),
            *([augmentation_claim(augment_speedup, device_name)] if augment_speedup is not None else [])]


def with_ceilings(table, model, image_size: int, device, flops_per_image: float, decode_per_core: float, cores: int):
    """A speed table with MFU (the model's training FLOPs at that rate over the device's fp32 peak: for a
    loader, the ceiling it puts on training) and, when it has num_workers, the share of the decode limit."""
    table = flops.with_mfu(table, model, image_size, device, images_per_second="images_per_second",
                           flops_per_image=flops_per_image)
    if "num_workers" in table.columns:
        table = loader_sweep.with_decode_share(table, decode_per_core, cores)
    return table
