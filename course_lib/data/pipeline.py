"""Builds the datasets a Config names (`build_datasets`): digits, CIFAR-10, EuroSAT, landcover-synth
or any image folder, split into train / val / test, with the config's data switches for image
folders: where training images are read from (`storage`: loose files, the pre-decoded uint8 cache
of `cache.py`, or the WebDataset tar shards of `shards.py`), which library decodes them (`decoder`,
`decode.py`) and where training augmentation runs (`augmentation`: per image in the DataLoader
workers, per batch on the training device with `device_augment.DeviceAugment`, or not at all).
`DataBundle.pipeline` names every choice. The dataset classes themselves live in `datasets.py`.

Rules: `max_train_images` keeps the same seeded choice of files whatever the storage, with every class
in it (`datasets.limit_indices`); a cache or shard set is keyed by its folder, image size, decoder and
exact file list, built once under a lock and reused; validation and test are map-style (from
the cache with storage=cache, else from files); nvjpeg decodes on the GPU, which DataLoader
workers cannot use, so it serves storage=cache only (decoded once, when the cache is built).

EuroSAT: Helber et al., "EuroSAT: A Novel Dataset and Deep Learning Benchmark for Land
Use and Land Cover Classification", IEEE JSTARS 2019. CIFAR-10: Krizhevsky, 2009.
"""
from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import numpy as np

from course_lib.config import Config, ConfigError
from course_lib.data import cache, shards, transforms
from course_lib.data.datasets import (ArrayImageDataset, DataBundle, ImageFolderDataset, TransformedSubset,
                                     limit_indices, split_indices)
from course_lib.data.decode import FileDecoder, get_decoder
from course_lib.data.device_augment import DeviceAugment, DeviceStage, batch_normalize
from course_lib.data.images import BadImageError, DataFolderError, SplitClassesError, class_mismatch, split_folders
from course_lib.data.landcover import landcover_cache_dir
from course_lib.data.loaders import resolved_num_workers
from course_lib.data.resident import ResidentSplit
from course_lib.paths import CACHE_DIR, project_root, resolve_path

# Encoded samples each shard reader holds to shuffle (webdataset's default size); the shards
# were also shuffled once when written, so this only has to mix neighbours.
SHUFFLE_BUFFER = 1000
# Datasets held as decoded arrays in memory: no files for `decoder` or `storage` to act on.
IN_MEMORY_DATASETS = ("digits", "cifar10")


@dataclasses.dataclass
class SplitPlan:
    """One split: the files `indices` (ImageFolder order; None = all) of the image folder `folder`."""

    folder: Path
    indices: list | None = None

    def chosen(self, listing: ImageFolderDataset) -> list[int]:
        return list(range(len(listing))) if self.indices is None else list(self.indices)


class FolderListings:
    """Each image folder listed once per build (listing EuroSAT's 19k files takes a while), with
    the config's decoder and bad-image policy and no transform."""

    def __init__(self, config: Config):
        self.config, self._listings = config, {}

    def __call__(self, folder: Path) -> ImageFolderDataset:
        if folder not in self._listings:
            self._listings[folder] = ImageFolderDataset(folder, None, self.config.bad_images,
                                                        loader=FileDecoder(self.config.decoder))
        return self._listings[folder]


# validation_from=train: the share of each class of train/ held out to choose on, and its fixed seed
# (not the run's: every seed and every recipe is chosen on the same images).
CARVE_OUT_FRACTION, CARVE_OUT_SEED = 0.1, 0


def plan_splits(root: Path, seed: int, max_train_images: int, listing: FolderListings,
                validation_from: str = "folder") -> dict:
    """train / val / test as SplitPlans (test may be None): the train/ val/ test/ subfolders (train/ alone gives up
    10% for val), else a seeded stratified 80/10/10 split of `root`; then max_train_images of train. With
    validation_from="train", val is a fixed stratified 10% of train/ and the folder's val/ becomes test when there is
    no test/ (a recipe is chosen on images the reported figure never sees). Split folders with other classes than
    train/'s are refused (SplitClassesError): each would number its own classes."""
    folders = split_folders(root)
    refuse_too_few_classes(listing(folders.get("train", root)).classes, folders.get("train", root))
    if "train" in folders:
        mismatch = class_mismatch({folder.name: listing(folder).classes for folder in folders.values()})
        if mismatch:
            raise SplitClassesError(f"{root}: {mismatch}")
        plans = {"train": SplitPlan(folders["train"]), "test": SplitPlan(folders["test"]) if "test" in folders else None}
        if "val" in folders:
            plans["val"] = SplitPlan(folders["val"])
        else:  # carve a validation split out of train
            train, val = split_indices(listing(folders["train"]).targets, (0.9, 0.1), seed,
                                       f"{folders['train']} (with no val/ beside it)")
            plans["train"], plans["val"] = SplitPlan(folders["train"], train), SplitPlan(folders["train"], val)
    else:
        train, val, test = split_indices(listing(root).targets, (0.8, 0.1, 0.1), seed, f"{root} (no train/ in it)")
        plans = {"train": SplitPlan(root, train), "val": SplitPlan(root, val), "test": SplitPlan(root, test)}
    if validation_from == "train":
        plans = _carve_validation_out_of_train(plans, listing)
    chosen = plans["train"].chosen(listing(plans["train"].folder))
    all_targets = listing(plans["train"].folder).targets
    keep = limit_indices(len(chosen), max_train_images, seed, [all_targets[index] for index in chosen])
    if keep is not None:
        plans["train"] = SplitPlan(plans["train"].folder, [chosen[k] for k in keep])
    return plans


def refuse_too_few_classes(classes: list, folder: Path) -> None:
    """A classifier needs two classes: with one, every prediction is right and nothing is learned."""
    if len(classes) < 2:
        raise DataFolderError(f"{folder} has {len(classes)} class folder(s) ({', '.join(classes)}); a classifier "
                              "needs at least 2: add a folder of images for each other class")


def _carve_validation_out_of_train(plans: dict, listing: FolderListings) -> dict:
    train = plans["train"]
    chosen = train.chosen(listing(train.folder))
    targets = [listing(train.folder).targets[i] for i in chosen]
    kept, carved = split_indices(targets, (1 - CARVE_OUT_FRACTION, CARVE_OUT_FRACTION), CARVE_OUT_SEED,
                                  f"{train.folder} (validation_from=train)",
                                  "validate on the split you have (leave validation_from=train out), or give")
    test = plans["test"] if plans["test"] is not None else plans["val"]
    return {"train": SplitPlan(train.folder, sorted(chosen[i] for i in kept)),
            "val": SplitPlan(train.folder, sorted(chosen[i] for i in carved)), "test": test}


def split_transforms(config: Config, recipe: transforms.AugmentRecipe | None = None, augment: bool = True):
    """(worker transform for training, for evaluation, DeviceStage) for the config's `augmentation`: cpu augments in
    the workers; device resizes there (uint8) and augments and normalises in the DeviceStage; none only resizes and
    normalises. augment=False (digits) trains without augmentation wherever it runs."""
    size, place = config.image_size, config.augmentation
    recipe = recipe or transforms.recipe_for(config)
    if place == "device":
        augment_batch = DeviceAugment(size, recipe) if augment else batch_normalize
        named = f"{augment_batch!r}" if augment else "normalise"
        stage = DeviceStage(augment_batch, batch_normalize,
                            description=f"training batches: {named}; evaluation batches: normalise")
        return transforms.ResizeUint8(size), transforms.ResizeUint8(size), stage
    train_place = place if augment else "none"
    return (transforms.sample_transform(size, train_place, recipe), transforms.sample_transform(size, "none"),
            DeviceStage())


def describe(config: Config, where: str = "") -> str:
    """The pipeline line the engine logs first, e.g. "decoder opencv, storage cache
    (data_cache/predecoded/train-64px-1a2b3c4d), augmentation device"."""
    return (f"decoder {config.decoder}, storage {config.storage}{f' ({where})' if where else ''}, "
            f"augmentation {config.augmentation} ({config.augment_recipe}"
            f"{f', rotation {config.rotation:g} degrees' if config.rotation else ''})")


def _shown(path: Path) -> str:
    try:
        return str(Path(path).relative_to(project_root()))
    except ValueError:
        return str(path)


def _refuse_left_out(skipped: list, folder: Path, bad_images: str) -> None:
    """A cache or shard set built under bad_images=skip lacks its unreadable files; under fail, say so."""
    if skipped and bad_images == "fail":
        raise BadImageError(f"{_shown(folder)} was built with bad_images=skip and leaves out {len(skipped)} "
                            f"unreadable file(s), first {skipped[0]}; set bad_images=skip, or fix the files "
                            f"and delete {_shown(folder)}")


def _file_split(plan: SplitPlan | None, transform, listing: FolderListings):
    if plan is None:
        return None
    files = listing(plan.folder)
    return files.with_transform(transform) if plan.indices is None else TransformedSubset(files, plan.indices, transform)


def _cached_splits(plans: dict, transform_of: dict, config: Config, listing: FolderListings):
    """One pre-decoded cache per image folder, holding the files every split of that folder uses."""
    by_folder: dict[Path, list[str]] = {}
    for name, plan in plans.items():
        if plan is not None:
            by_folder.setdefault(plan.folder, []).append(name)
    splits, built = {name: None for name in plans}, {}
    for folder, names in by_folder.items():
        files = listing(folder)
        wanted = sorted({index for name in names for index in plans[name].chosen(files)})
        out_dir = cache.default_cache_dir(folder, config.image_size,
                                          selection=cache.selection_key(files, wanted, config.decoder))
        info = cache.build_cache(folder, config.image_size, out_dir, decoder=config.decoder,
                                 bad_images=config.bad_images, num_workers=resolved_num_workers(config),
                                 indices=wanted)
        _refuse_left_out(info.skipped, info.folder, config.bad_images)
        left_out = set(info.skipped)
        # file index in the folder -> row of the cache (unreadable files have none)
        rows = {index: row for row, index in enumerate(i for i in wanted if files.samples[i][0] not in left_out)}
        for name in names:
            if len(names) == 1:  # the cache holds exactly this split's files
                splits[name] = cache.PreDecodedDataset(info.folder, transform_of[name])
            else:
                rows_of_split = [rows[i] for i in plans[name].chosen(files) if i in rows]
                splits[name] = TransformedSubset(cache.PreDecodedDataset(info.folder), rows_of_split,
                                                 transform_of[name])
            built[name] = info.folder
    return splits, _shown(built["train"])


def _shard_train(plan: SplitPlan, transform, config: Config, listing: FolderListings):
    """The training split as tar shards sized for this machine's ranks x workers, streamed by a
    ShardDataset that knows its length."""
    files = listing(plan.folder)
    indices = plan.chosen(files)
    rank, world_size = shards.distributed_rank()
    workers = resolved_num_workers(config)
    total_bytes = sum(os.path.getsize(files.samples[i][0]) for i in indices)
    count = shards.recommend_shard_count(world_size, workers, total_bytes)
    out_dir = shards.default_shard_dir(plan.folder, count, cache.selection_key(files, indices, config.decoder))
    shard_set = shards.write_shards(plan.folder, out_dir, count, seed=config.seed, indices=indices,
                                    decoder=config.decoder, bad_images=config.bad_images, num_workers=workers)
    _refuse_left_out(shard_set.skipped, shard_set.folder, config.bad_images)
    dataset = shards.ShardDataset(shard_set.urls, transform, config.decoder, config.bad_images, SHUFFLE_BUFFER,
                                  config.seed, list(shard_set.classes), shard_sizes=shard_set.sizes,
                                  batch_size=config.batch_size, num_workers=workers, rank=rank,
                                  world_size=world_size)
    where = f"{_shown(shard_set.folder)}, {count} shard(s) for {world_size} rank(s) x {max(1, workers)} reader(s)"
    return dataset, where


def image_folder_bundle(root: Path, config: Config, source: str | None = None) -> DataBundle:
    """The splits of the image folder `root` as the config's decoder, storage and augmentation say."""
    get_decoder(config.decoder)  # nvjpeg without CUDA: one line here, not a traceback from a worker
    if config.decoder == "nvjpeg" and config.storage != "cache":
        raise ConfigError(f"decoder=nvjpeg decodes on the GPU, which DataLoader workers cannot use, so it serves "
                          f"storage=cache (decoded once, when the cache is built); with storage={config.storage} "
                          "use decoder=opencv, torchvision or pil")
    if config.storage == "device" and config.augmentation != "device":
        raise ConfigError(f"storage=device batches uint8 images on the training device, where only augmentation=device "
                          f"can augment and normalise them; with augmentation={config.augmentation} use storage=cache")
    listing = FolderListings(config)
    plans = plan_splits(Path(root), config.seed, config.max_train_images, listing, config.validation_from)
    train_tf, eval_tf, stage = split_transforms(config)
    transform_of = {"train": train_tf, "val": eval_tf, "test": eval_tf}
    where, classes = "", list(listing(plans["train"].folder).classes)
    if config.storage in ("cache", "device"):
        splits, where = _cached_splits(plans, transform_of, config, listing)
        if config.storage == "device":  # one uint8 tensor per split, moved to the device by the engine
            splits = {name: ResidentSplit.from_dataset(split, classes) if split is not None else None
                      for name, split in splits.items()}
            where += f"; resident, {sum(s.nbytes for s in splits.values() if s is not None) / 1e6:.0f} MB"
    else:
        splits = {name: _file_split(plan, transform_of[name], listing) for name, plan in plans.items()}
        if config.storage == "shards":
            splits["train"], where = _shard_train(plans["train"], train_tf, config, listing)
            where += "; evaluation from files"
    return DataBundle(splits["train"], splits["val"], splits["test"], classes, source or str(root), stage,
                      describe(config, where))


def _limit(dataset, max_images: int, seed: int):
    keep = limit_indices(len(dataset), max_images, seed, getattr(dataset, "targets", None))
    return dataset if keep is None else _Subset(dataset, keep)


class _Subset(TransformedSubset):
    """A subset keeping the parent's transform."""

    def __getitem__(self, index):
        return self.dataset[self.indices[index]]


def _refuse_file_switches(config: Config) -> None:
    """digits and CIFAR-10 are decoded arrays in memory: decoder and storage have nothing to act on,
    and their validation split is carved by their own rule (validation_from=train is for folders)."""
    for name, default in (("decoder", "pil"), ("storage", "files"), ("validation_from", "folder")):
        value = getattr(config, name)
        if value != default:
            raise ConfigError(f"{name}={value} does not apply to dataset={config.dataset}: its images are decoded "
                              f"arrays in memory; use {name}={default} (decoder and storage act on image folders: "
                              "landcover-synth, imagefolder, eurosat)")


DIGITS_MEMO_BYTES = 256 * 2**20  # digits' transformed tensors kept in memory up to this size (112 px)


def digits_bundle(config: Config) -> DataBundle:
    """scikit-learn's handwritten digits (1,797 real 8x8 scans), upscaled and split 70/15/15.
    Flips and crops would turn digits into other symbols: training is not augmented, wherever
    augmentation runs (with augmentation=device the device stage only normalises)."""
    from sklearn.datasets import load_digits

    digits = load_digits()
    pixels = (digits.images * (255.0 / 16.0)).astype(np.uint8)  # 0..16 grey levels -> 0..255
    images = np.repeat(pixels[..., None], 3, axis=-1)
    classes = [str(d) for d in digits.target_names]
    whole = ArrayImageDataset(images, digits.target, classes)
    tr, va, te = split_indices(digits.target, (0.7, 0.15, 0.15), config.seed)
    train_tf, eval_tf, stage = split_transforms(config, augment=False)
    # No augmentation, so each image's tensor is the same every epoch: transformed once and kept, up to
    # DIGITS_MEMO_BYTES (22 MB of float32 at 32 px). A 25-epoch fit of 100 images at 16 px took 6.7 s (profiled), 4
    # of them transforming the validation images again, and 2.7 s with the tensors kept.
    kept = len(images) * 3 * config.image_size ** 2 * 4 <= DIGITS_MEMO_BYTES
    train, val, test = (TransformedSubset(whole, indices, transform, memo={} if kept else None)
                        for indices, transform in ((tr, train_tf), (va, eval_tf), (te, eval_tf)))
    return DataBundle(train, val, test, classes, "sklearn.datasets.load_digits", stage)


# After `workbook data get NAME`, the images are an ImageFolder with train/ valid/ test/.
_USE_THE_LAYOUT = ", then train with -p dataset=imagefolder -p data_dir=data_cache/{}"


def eurosat_folder(root: Path, download: bool) -> Path:
    """torchvision.datasets.EuroSAT's image folder (root/eurosat/2750/<class>/*.jpg), downloaded
    when allowed; the workbook then reads it as an image folder, so every data switch applies."""
    from torchvision.datasets import EuroSAT

    from course_lib.data import download as downloads

    try:
        EuroSAT(str(root), download=download)  # checks the files (and downloads them when allowed)
    except downloads.NETWORK_ERRORS as error:  # offline: one line naming the URL and `workbook data get --from`
        raise downloads.unreachable("eurosat", downloads.EUROSAT_URL, error,
                                    _USE_THE_LAYOUT.format("eurosat")) from None
    except RuntimeError as error:
        raise FileNotFoundError(f"EuroSAT not found under {root} ({error}); set download=true when online, "
                                "or point dataset=imagefolder data_dir=... at an extracted copy") from None
    return Path(root) / "eurosat" / "2750"  # where torchvision.datasets.EuroSAT keeps the images


def cifar10_bundle(root: Path, config: Config) -> DataBundle:
    """torchvision.datasets.CIFAR10: its train set split 90/10 into train/val, its test set as test."""
    from torchvision.datasets import CIFAR10

    from course_lib.data import download as downloads

    train_tf, eval_tf, stage = split_transforms(config)
    try:
        train_whole = CIFAR10(str(root), train=True, download=config.download)
        test = CIFAR10(str(root), train=False, download=config.download, transform=eval_tf)
    except downloads.NETWORK_ERRORS as error:
        raise downloads.unreachable("cifar10", CIFAR10.url, error, _USE_THE_LAYOUT.format("cifar10")) from None
    except RuntimeError as error:
        raise FileNotFoundError(f"CIFAR-10 not found under {root} ({error}); set download=true when online") from None
    tr, va = split_indices(train_whole.targets, (0.9, 0.1), config.seed)
    return DataBundle(TransformedSubset(train_whole, tr, train_tf), TransformedSubset(train_whole, va, eval_tf),
                      test, list(train_whole.classes), str(root), stage)


def build_datasets(config: Config) -> DataBundle:
    """The train/val/test datasets `config.dataset` and `config.data_dir` name, stored, decoded and augmented as the
    config says; `bundle.pipeline` names the choices, `bundle.device_stage` finishes each batch on the device."""
    name = config.dataset
    if name in IN_MEMORY_DATASETS:
        _refuse_file_switches(config)
    if name == "landcover-synth":
        root = resolve_path(config.data_dir) if config.data_dir else landcover_cache_dir(seed=0)
        return image_folder_bundle(root, config)
    if name == "imagefolder":
        if not config.data_dir:
            raise ConfigError("dataset=imagefolder needs data_dir=<folder with train/ and val/ subfolders>")
        return image_folder_bundle(resolve_path(config.data_dir), config)
    if name == "eurosat":
        root = resolve_path(config.data_dir or str(CACHE_DIR / "torchvision"))
        return image_folder_bundle(eurosat_folder(root, config.download), config, source=str(root))
    if name == "digits":
        bundle = digits_bundle(config)
    elif name == "cifar10":
        bundle = cifar10_bundle(resolve_path(config.data_dir or str(CACHE_DIR / "torchvision")), config)
    else:  # make_config already refuses other names
        raise ConfigError(f"unknown dataset {name!r}")
    bundle.train = _limit(bundle.train, config.max_train_images, config.seed)
    bundle.pipeline = describe(config)
    return bundle

