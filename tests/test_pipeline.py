"""Config's data switches (decoder, storage, augmentation) as build_datasets serves them."""
import pickle

import numpy as np
import pytest
import torch
from conftest import SAMPLE_DIR
from PIL import Image
from test_transforms import cpu_steps

from course_lib.config import ConfigError, make_config
from course_lib.data import (
    cache,
    datasets,
    landcover,
    pipeline,
    shards,
    transforms,
)
from course_lib.data.device_augment import DeviceAugment
from course_lib.data.images import BadImageError, SplitClassesError
from course_lib.data.landcover import make_landcover
from course_lib.data.loaders import batches, make_loader
from course_lib.data.transforms import IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD

CPU = torch.device("cpu")


@pytest.fixture(autouse=True)
def cache_root(tmp_path, monkeypatch):
    """Caches and shards go under tmp_path/data_cache, never into the project's data_cache/."""
    for module in (cache, shards, pipeline):
        monkeypatch.setattr(module, "project_root", lambda: tmp_path)
    return tmp_path / "data_cache"


def config(**overrides):
    """The committed sample (8 classes, 32 px; 256 training images of 400) on one worker."""
    values = dict(num_workers=1, batch_size=32)
    values.update(overrides)
    return make_config("smoke", **values)


def first_batch(dataset, setting, train=True):
    return next(iter(make_loader(dataset, setting, train=train)))


TRAIN_TYPES = {"files": datasets.TransformedSubset, "cache": cache.PreDecodedDataset, "shards": shards.ShardDataset}
VAL_TYPES = {"files": datasets.ImageFolderDataset, "cache": cache.PreDecodedDataset,
             "shards": datasets.ImageFolderDataset}


@pytest.mark.timeout(120)
@pytest.mark.parametrize("augmentation", ["cpu", "device", "none"])
@pytest.mark.parametrize("storage", ["files", "cache", "shards"])
@pytest.mark.slow
def test_each_switch_builds_its_datasets_and_batch_types(storage, augmentation):
    setting = config(storage=storage, augmentation=augmentation, decoder="opencv")
    bundle = pipeline.build_datasets(setting)
    assert type(bundle.train) is TRAIN_TYPES[storage] and type(bundle.val) is VAL_TYPES[storage]
    assert bundle.pipeline.startswith(f"decoder opencv, storage {storage}")
    assert bundle.pipeline.endswith(f"augmentation {augmentation} (light)")
    images, labels = first_batch(bundle.train, setting)
    val_images, _ = first_batch(bundle.val, setting, train=False)
    expected = torch.uint8 if augmentation == "device" else torch.float32
    assert images.dtype == val_images.dtype == expected
    assert images.shape == (32, 3, 32, 32) and labels.shape == (32,)
    trained = bundle.device_stage(images, CPU, train=True)
    evaluated = bundle.device_stage(val_images, CPU, train=False)
    assert trained.dtype == evaluated.dtype == torch.float32 and trained.shape == (32, 3, 32, 32)
    if augmentation == "device":
        assert isinstance(bundle.device_stage.train_transform, DeviceAugment)
        expected_eval = (val_images.float() / 255 - torch.tensor(IMAGENET_DEFAULT_MEAN).view(1, 3, 1, 1)) \
            / torch.tensor(IMAGENET_DEFAULT_STD).view(1, 3, 1, 1)
        torch.testing.assert_close(evaluated, expected_eval)
    else:  # normalised in the workers: the device stage only copies
        assert bundle.device_stage.train_transform is None and torch.equal(trained, images)


@pytest.mark.timeout(60)
def test_device_stage_augments_uint8_to_normalised_images_of_image_size():
    bundle = pipeline.build_datasets(config(augmentation="device", image_size=24))
    images = torch.randint(0, 256, (6, 3, 40, 40), dtype=torch.uint8)  # bigger than image_size
    out = bundle.device_stage(images, CPU, train=True)
    assert out.shape == (6, 3, 24, 24) and out.dtype == torch.float32
    # Normalised ImageNet-style: pixels in [0, 1] map into [(0 - mean) / std, (1 - mean) / std].
    low = (0 - torch.tensor(IMAGENET_DEFAULT_MEAN)) / torch.tensor(IMAGENET_DEFAULT_STD)
    high = (1 - torch.tensor(IMAGENET_DEFAULT_MEAN)) / torch.tensor(IMAGENET_DEFAULT_STD)
    per_channel = out.transpose(0, 1).reshape(3, -1)
    assert (per_channel.min(1).values >= low - 1e-5).all() and (per_channel.max(1).values <= high + 1e-5).all()


@pytest.mark.slow
def test_the_same_training_files_whatever_the_storage():
    files = pipeline.build_datasets(config(storage="files"))
    chosen = {files.train.dataset.samples[i][0] for i in files.train.indices}
    shard_bundle = pipeline.build_datasets(config(storage="shards"))
    listing = datasets.ImageFolderDataset(SAMPLE_DIR / "train")
    packed = {listing.samples[int(key)][0] for key, _, _, _ in shards.read_samples(shard_bundle.train.urls)}
    assert packed == chosen and len(chosen) == 256
    cached = pipeline.build_datasets(config(storage="cache")).train
    assert sorted(cached.targets) == sorted(files.train.targets)


@pytest.mark.timeout(60)
@pytest.mark.slow
def test_cache_and_shards_are_reused_on_a_second_build(cache_root):
    for storage in ("cache", "shards"):
        pipeline.build_datasets(config(storage=storage))
    built = {path: path.stat().st_mtime_ns for path in cache_root.rglob("*") if path.is_file()
             and path.suffix != ".lock"}
    assert len([p for p in built if p.name == cache.META_FILE]) == 3  # train, val and test caches
    assert len([p for p in built if p.name == shards.INDEX_FILE]) == 1
    for storage in ("cache", "shards"):
        pipeline.build_datasets(config(storage=storage))
    again = {path: path.stat().st_mtime_ns for path in cache_root.rglob("*") if path.is_file()
             and path.suffix != ".lock"}
    assert again == built  # nothing rewritten, nothing added
    pipeline.build_datasets(config(storage="cache", max_train_images=128))  # another selection: a new cache
    assert len(list(cache_root.rglob(cache.META_FILE))) == 4


@pytest.fixture
def folder_with_bad_file(tmp_path):
    root = make_landcover(tmp_path / "set", image_size=32, per_class={"train": 4, "val": 1})
    (root / "train" / "road" / "road_bad.jpg").write_bytes(b"\xff\xd8\xff not a jpeg")
    return root  # 8 classes x 4 readable training images + 1 unreadable


@pytest.mark.timeout(120)
@pytest.mark.parametrize("storage", ["cache", "shards"])
@pytest.mark.slow
def test_bad_images_and_max_train_images_work_with_cache_and_shards(folder_with_bad_file, storage):
    base = dict(dataset="imagefolder", data_dir=str(folder_with_bad_file), storage=storage, batch_size=4)
    with pytest.raises(BadImageError, match="road_bad.jpg.*bad_images=skip"):
        pipeline.build_datasets(config(**base, max_train_images=0))
    bundle = pipeline.build_datasets(config(**base, max_train_images=0, bad_images="skip"))
    assert len(bundle.train) == 32  # the unreadable file is left out
    images = torch.cat([batch for batch, _ in make_loader(bundle.train, config(**base), train=True)])
    assert len(images) == 32
    # A cache or shard set built under skip lacks the file; under fail that is an error, not a silence.
    with pytest.raises(BadImageError, match="leaves out 1 unreadable"):
        pipeline.build_datasets(config(**base, max_train_images=0))
    limited = pipeline.build_datasets(config(**base, max_train_images=12, bad_images="skip"))
    files = pipeline.build_datasets(config(**{**base, "storage": "files"}, max_train_images=12, bad_images="skip"))
    assert len(files.train) == 12
    # 11 when the unreadable file is among the 12 chosen; a shard stream yields whole batches of 4: 8 of 11
    assert len(limited.train) in ((8, 12) if storage == "shards" else (11, 12))


@pytest.mark.timeout(120)
def test_shard_length_counts_the_loaders_batches_exactly(tmp_path):
    root = make_landcover(tmp_path / "set", image_size=16, per_class={"train": 13, "val": 1})
    setting = config(dataset="imagefolder", data_dir=str(root), storage="shards", batch_size=5, num_workers=2,
                     image_size=16)
    bundle = pipeline.build_datasets(setting)
    assert len(bundle.train.urls) == 2  # one shard per reader (104 small images)
    loader = make_loader(bundle.train, setting, train=True)
    # 104 images in 2 shards of 52: each worker yields 10 whole batches of 5 (2 images left over each).
    assert len(bundle.train) == 100 and len(loader) == 20
    assert sum(1 for _ in loader) == 20


def test_shard_readers_split_ranks_then_workers():
    assert shards.reader_shards(8, rank=1, world_size=2, worker=0, workers=2) == [1, 5]
    assert shards.reader_shards(8, rank=1, world_size=2, worker=1, workers=2) == [3, 7]
    every = sorted(i for rank in range(2) for worker in range(2) for i in shards.reader_shards(8, rank, 2, worker, 2))
    assert every == list(range(8))


def test_sized_shards_refuse_a_loader_with_another_worker_count(tmp_path):
    setting = config(storage="shards", num_workers=1)
    bundle = pipeline.build_datasets(setting)
    with pytest.raises(ConfigError, match="sized for 1 reader"):
        next(batches(make_loader(bundle.train, setting.replace(num_workers=2), train=True)))  # workers stop with it


def test_nvjpeg_without_cuda_is_one_line(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ConfigError, match="needs a CUDA GPU") as error:
        pipeline.build_datasets(config(decoder="nvjpeg", storage="cache"))
    assert "\n" not in str(error.value)


def test_nvjpeg_serves_only_the_cache(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # as on a GPU machine
    for storage in ("files", "shards"):
        with pytest.raises(ConfigError, match=f"nvjpeg.*storage={storage}.*opencv"):
            pipeline.build_datasets(config(decoder="nvjpeg", storage=storage))


@pytest.mark.cuda(reason="nvJPEG needs a CUDA GPU")
def test_nvjpeg_builds_a_cache():
    bundle = pipeline.build_datasets(config(decoder="nvjpeg", storage="cache", max_train_images=64))
    assert len(bundle.train) == 64 and bundle.train[0][0].device.type == "cpu"


@pytest.mark.parametrize("dataset,switch", [("digits", {"storage": "cache"}), ("digits", {"decoder": "opencv"}),
                                            ("cifar10", {"storage": "shards"})])
def test_in_memory_datasets_refuse_file_switches(dataset, switch):
    name, value = next(iter(switch.items()))
    with pytest.raises(ConfigError, match=f"{name}={value} does not apply to dataset={dataset}.*{name}="):
        pipeline.build_datasets(config(dataset=dataset, **switch))


def test_digits_with_device_augmentation_is_only_normalised_on_the_device():
    bundle = pipeline.build_datasets(config(dataset="digits", augmentation="device", max_train_images=0))
    image, _ = bundle.train[0]
    assert image.dtype == torch.uint8 and image.shape == (3, 32, 32)
    batch = image.unsqueeze(0).repeat(4, 1, 1, 1)
    out = bundle.device_stage(batch, CPU, train=True)
    torch.testing.assert_close(out, bundle.device_stage(batch, CPU, train=False))  # no random crop or flip


@pytest.mark.slow
def test_build_datasets_trains_with_the_light_recipe_on_either_side():
    from torchvision.transforms import v2

    on_cpu = pipeline.build_datasets(config(augmentation="cpu"))
    crop = cpu_steps(on_cpu.train.transform)[v2.RandomResizedCrop]
    assert tuple(crop.scale) == (0.6, 1.0) and v2.ColorJitter not in cpu_steps(on_cpu.train.transform)
    on_device = pipeline.build_datasets(config(augmentation="device"))
    assert on_device.device_stage.train_transform.recipe == transforms.LIGHT == transforms.AugmentRecipe()


@pytest.mark.timeout(300)
@pytest.mark.slow
def test_real_eurosat_cache_holds_max_train_images(eurosat_dir, cache_root):
    setting = make_config("smoke", dataset="imagefolder", data_dir=str(eurosat_dir), storage="cache",
                          max_train_images=200, image_size=32, num_workers=1)
    bundle = pipeline.build_datasets(setting)
    train_cache = next(p.parent for p in cache_root.rglob(cache.META_FILE) if p.parent.name.startswith("train-"))
    info = cache.PreDecodedDataset(train_cache).info
    assert info.images == len(bundle.train) == 200 and info.image_size == 32 and len(info.classes) == 10
    assert len(bundle.val) == 4050 and str(train_cache.relative_to(cache_root.parent)) in bundle.pipeline
    image, _ = bundle.train[0]
    assert image.shape == (3, 32, 32) and image.dtype == torch.float32


def test_imagefolder_files_without_splits_keep_their_split(tmp_path):
    root = tmp_path / "images"
    for name in ("a", "b"):
        (root / name).mkdir(parents=True)
        for i in range(10):
            Image.fromarray(np.full((8, 8, 3), i * 20, np.uint8)).save(root / name / f"{i}.png")
    by_storage = {storage: pipeline.build_datasets(config(dataset="imagefolder", data_dir=str(root),
                                                          storage=storage, max_train_images=0, batch_size=2))
                  for storage in ("files", "cache")}
    for split in ("train", "val", "test"):
        files, cached = getattr(by_storage["files"], split), getattr(by_storage["cache"], split)
        assert len(files) == len(cached) and sorted(files.targets) == sorted(cached.targets)


@pytest.mark.parametrize("place", ["cpu", "device"])
def test_the_overhead_recipe_applies_the_symmetries_of_the_square_on_either_side(place):
    """augment_recipe=overhead: no crop; every training image is one of the eight symmetries of its
    source (then shifted), whichever side runs the augmentation."""
    config = make_config("smoke", augmentation=place, augment_recipe="overhead", image_size=32)
    bundle = pipeline.build_datasets(config)
    assert bundle.pipeline.endswith(f"augmentation {place} (overhead)")
    recipe = transforms.RECIPES["overhead"]
    assert recipe.dihedral and not recipe.crop and recipe.shift_pixels(64) == 4
    torch.manual_seed(0)
    image, _ = bundle.train[0]
    batch = bundle.device_stage(image[None], torch.device("cpu"), train=True)
    assert batch.shape == (1, 3, 32, 32) and batch.dtype == torch.float32


def test_smoke_bundle_from_sample():
    bundle = pipeline.build_datasets(make_config("smoke"))
    image, label = bundle.train[0]
    assert image.shape == (3, 32, 32) and image.dtype == torch.float32
    assert bundle.classes == list(landcover.LANDCOVER_CLASSES)
    assert len(bundle.train) == 256 and len(bundle.val) == 80 and len(bundle.test) == 80


def test_digits_bundle_is_stratified():
    bundle = pipeline.build_datasets(make_config("smoke", dataset="digits", max_train_images=0))
    assert len(bundle.train) + len(bundle.val) + len(bundle.test) == 1797
    assert bundle.classes == [str(d) for d in range(10)]
    assert set(bundle.val.targets) == set(range(10))
    assert bundle.train[0][0].shape == (3, 32, 32)


def test_digits_are_transformed_once_and_kept_unless_too_large(monkeypatch):
    """No augmentation: the second epoch reads the first one's tensors (the same objects), equal to a fresh
    transform; past DIGITS_MEMO_BYTES nothing is kept."""
    bundle = pipeline.build_datasets(make_config("smoke", dataset="digits", max_train_images=0))
    first, again = bundle.val[3], bundle.val[3]
    assert again[0] is first[0] and again[1] == first[1] and len(bundle.val.memo) == 1
    fresh = pipeline.TransformedSubset(bundle.val.dataset, bundle.val.indices, bundle.val.transform)
    assert torch.equal(fresh[3][0], first[0]) and fresh[3][1] == first[1]
    assert torch.equal(bundle.train[0][0], bundle.train[0][0]) and len(bundle.train.memo) == 1
    monkeypatch.setattr(pipeline, "DIGITS_MEMO_BYTES", 1797 * 3 * 32 * 32 * 4 - 1)
    large = pipeline.build_datasets(make_config("smoke", dataset="digits", max_train_images=0))
    assert large.val.memo is None and large.val[3][0] is not large.val[3][0]


def test_imagefolder_needs_data_dir():
    with pytest.raises(ConfigError, match="data_dir"):
        pipeline.build_datasets(make_config("smoke", dataset="imagefolder", data_dir=""))


def test_missing_folder_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        pipeline.build_datasets(make_config("smoke", dataset="imagefolder", data_dir=str(tmp_path / "nope")))


def test_imagefolder_without_splits_is_split(tmp_path):
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
        for i in range(10):
            Image.fromarray(np.full((8, 8, 3), i * 20, np.uint8)).save(tmp_path / name / f"{i}.png")
    bundle = pipeline.build_datasets(make_config("smoke", dataset="imagefolder", data_dir=str(tmp_path),
                                             max_train_images=0))
    assert (len(bundle.train), len(bundle.val), len(bundle.test)) == (16, 2, 2)
    assert bundle.classes == ["a", "b"]


def _fake_eurosat(root, per_class=3):
    folder = root / "eurosat" / "2750"
    for name in ("AnnualCrop", "Forest", "River"):
        (folder / name).mkdir(parents=True)
        for i in range(per_class * 4):
            Image.fromarray(np.full((64, 64, 3), i, np.uint8)).save(folder / name / f"{name}_{i}.jpg")


def test_torchvision_eurosat_on_a_fake_copy(tmp_path):
    _fake_eurosat(tmp_path)
    bundle = pipeline.build_datasets(make_config("smoke", dataset="eurosat", data_dir=str(tmp_path), max_train_images=0))
    assert bundle.classes == ["AnnualCrop", "Forest", "River"]
    assert len(bundle.train) + len(bundle.val) + len(bundle.test) == 36
    assert bundle.train[0][0].shape == (3, 32, 32)


def test_torchvision_eurosat_missing_says_how_to_fix(tmp_path):
    with pytest.raises(FileNotFoundError, match="download=true"):
        pipeline.build_datasets(make_config("smoke", dataset="eurosat", data_dir=str(tmp_path)))


def test_torchvision_cifar10_on_a_fake_copy(tmp_path, monkeypatch):
    import torchvision.datasets.cifar as cifar

    folder = tmp_path / "cifar-10-batches-py"
    folder.mkdir()
    rng = np.random.default_rng(0)

    def batch(count):
        return {"data": rng.integers(0, 255, (count, 3072), dtype=np.uint8), "labels": [i % 10 for i in range(count)]}

    for name in [f"data_batch_{i}" for i in range(1, 6)]:
        pickle.dump(batch(20), open(folder / name, "wb"))
    pickle.dump(batch(20), open(folder / "test_batch", "wb"))
    pickle.dump({"label_names": [f"class{i}" for i in range(10)]}, open(folder / "batches.meta", "wb"))
    # The fake files cannot match CIFAR-10's published md5 sums; everything else is torchvision's code.
    monkeypatch.setattr(cifar, "check_integrity", lambda path, md5=None: True)
    bundle = pipeline.build_datasets(make_config("smoke", dataset="cifar10", data_dir=str(tmp_path), max_train_images=0))
    assert len(bundle.train) == 90 and len(bundle.val) == 10 and len(bundle.test) == 20
    assert bundle.classes[0] == "class0"
    assert bundle.train[0][0].shape == (3, 32, 32)


def test_real_eurosat_folder_loads(eurosat_dir):
    bundle = pipeline.build_datasets(make_config("smoke", dataset="imagefolder", data_dir=str(eurosat_dir)))
    assert bundle.num_classes == 10 and len(bundle.val) == 4050
    image, label = bundle.val[0]
    assert image.shape == (3, 32, 32) and label == 0


# --- issue 30 point 1: every split holds train/'s classes -------------------------------------------

@pytest.fixture
def small_landcover(tmp_path):
    return landcover.make_landcover(tmp_path / "lc", image_size=16, per_class={"train": 2, "val": 1, "test": 1})


@pytest.mark.parametrize("change, expected", [
    ("remove", r"val/ lacks forest\b"),  # every later class would shift by one in val/
    ("add", r"test/ has zzz-extra, which train/ lacks"),  # an index train's model has no output for
])
def test_splits_with_other_classes_are_refused_before_training(small_landcover, change, expected):
    import shutil

    if change == "remove":
        shutil.rmtree(small_landcover / "val" / "forest")
    else:
        shutil.copytree(small_landcover / "test" / "forest", small_landcover / "test" / "zzz-extra")
    config = make_config("smoke", dataset="imagefolder", data_dir=str(small_landcover))
    with pytest.raises(SplitClassesError, match=expected):
        pipeline.build_datasets(config)


def test_workbook_train_refuses_mismatched_splits_in_one_line_and_records_nothing(small_landcover, tmp_path, capsys):
    import shutil

    from course_lib import cli, ledger

    shutil.rmtree(small_landcover / "val" / "forest")
    code = cli.main(["train", "--profile", "smoke", "--no-progress", "-p", "dataset=imagefolder",
                     "-p", f"data_dir={small_landcover}", "-p", f"output_dir={tmp_path / 'out'}"])
    errors = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert code == 2 and len(errors) == 1 and "val/ lacks forest" in errors[0], errors
    rows = ledger.Ledger().rows(kind="train")  # a failed row naming the cause, and no checkpoint
    assert [row["status"] for row in rows] == ["failed"] and "SplitClassesError" in rows[0]["metrics"]["error"]
    assert not (tmp_path / "out" / "last.pt").exists()
