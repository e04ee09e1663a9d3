"""The generated landcover-synth dataset (`data.landcover`): deterministic, confusable pairs closer,
its layout, the committed sample."""
import numpy as np
import pytest
from conftest import SAMPLE_DIR
from PIL import Image

from course_lib.config import ConfigError, make_config
from course_lib.data import datasets, landcover, pipeline


def test_generator_is_deterministic_and_sized():
    a = landcover.landcover_image("forest", 3, size=48, seed=1)
    b = landcover.landcover_image("forest", 3, size=48, seed=1)
    c = landcover.landcover_image("forest", 4, size=48, seed=1)
    assert a.shape == (48, 48, 3) and a.dtype == np.uint8
    assert np.array_equal(a, b) and not np.array_equal(a, c)


def test_confusable_pairs_are_closer_than_other_pairs():
    """Mean colour of each class over a few images: each confusable pair is nearer than the
    average distance between classes, so a confusion matrix has structure to find."""
    means = {name: np.mean([landcover.landcover_image(name, i, 32).reshape(-1, 3).mean(0) for i in range(12)], 0)
             for name in landcover.LANDCOVER_CLASSES}
    names = list(means)
    distances = [np.linalg.norm(means[a] - means[b]) for i, a in enumerate(names) for b in names[i + 1:]]
    for a, b in landcover.LANDCOVER_CONFUSABLE:
        assert np.linalg.norm(means[a] - means[b]) < np.mean(distances)


def test_make_landcover_layout(tmp_path):
    out = landcover.make_landcover(tmp_path / "lc", image_size=40, per_class={"train": 2, "val": 1, "test": 1}, seed=3)
    for split, count in (("train", 2), ("val", 1), ("test", 1)):
        for name in landcover.LANDCOVER_CLASSES:
            files = sorted((out / split / name).glob("*.jpg"))
            assert len(files) == count
            with Image.open(files[0]) as image:
                assert image.size == (40, 40) and image.format == "JPEG"
    assert not (tmp_path / "lc.partial").exists()
    with pytest.raises(FileExistsError, match="already exists"):
        landcover.make_landcover(out, image_size=40)
    with pytest.raises(ConfigError, match="16..1024"):
        landcover.make_landcover(tmp_path / "big", image_size=2048)


def test_committed_sample_is_small_and_complete():
    files = list(SAMPLE_DIR.rglob("*.jpg"))
    assert sum(f.stat().st_size for f in files) <= 2 * 1024 * 1024
    assert {f.parent.name for f in files} == set(landcover.LANDCOVER_CLASSES)
    assert {f.parents[1].name for f in files} == set(datasets.SPLITS)


# --- issue 30 point 8: a split of 0 images gets no folder -------------------------------------------

def test_data_make_with_no_test_images_writes_no_test_folder(tmp_path):
    out = landcover.make_landcover(tmp_path / "lc", image_size=16, per_class={"train": 1, "val": 1, "test": 0})
    assert sorted(p.name for p in out.iterdir() if p.is_dir()) == ["train", "val"]
    bundle = pipeline.build_datasets(make_config("smoke", dataset="imagefolder", data_dir=str(out)))
    assert bundle.test is None and len(bundle.train) == len(landcover.LANDCOVER_CLASSES)
    with pytest.raises(ConfigError, match="train needs at least 1"):
        landcover.make_landcover(tmp_path / "none", image_size=16, per_class={"train": 0, "val": 1, "test": 1})
