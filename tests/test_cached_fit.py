"""Train once, reuse by digest: a checkpoint is reused only while the config, classes and epochs match."""
from conftest import tiny_config

import pytest
from conftest import SAMPLE_DIR

from course_lib.config import SAMPLE_DATA_DIR
from course_lib.data.datasets import ImageFolderDataset
from course_lib.engine import cached_fit as cache

CLASSES = ImageFolderDataset(SAMPLE_DIR / "train").classes  # the committed sample's, in ImageFolder order


def test_a_matching_checkpoint_is_reused_and_any_change_trains_again(tmp_path):
    config = tiny_config(tmp_path, data_dir=SAMPLE_DATA_DIR, max_steps=2)
    folder = str(tmp_path / "cached")
    first = cache.cached_fit(config, classes=CLASSES, folder=folder, progress=False, verbose=False)
    assert not first.reused and first.how == "trained" and first.checkpoint_path.exists()
    again = cache.cached_fit(config, classes=CLASSES, folder=folder, progress=False, verbose=False)
    assert again.reused and again.how.startswith("reused") and again.history == first.history
    assert again.checkpoint_path == first.checkpoint_path and again.classes == first.classes
    # Where it is written and how it is loaded do not decide the weights: another output_dir shares the model.
    elsewhere = cache.cached_fit(config.replace(output_dir=str(tmp_path / "other"), num_workers=1), classes=CLASSES,
                                 folder=folder, progress=False, verbose=False)
    assert elsewhere.reused and elsewhere.digest == first.digest
    changed = cache.cached_fit(config.replace(lr=0.01), classes=CLASSES, folder=folder, progress=False, verbose=False)
    assert not changed.reused and changed.digest != first.digest
    # The first config's checkpoint survives the second's training: each has its own folder.
    assert cache.cached_fit(config, classes=CLASSES, folder=folder, progress=False, verbose=False).reused


def test_a_damaged_checkpoint_is_trained_again_and_the_classes_name_the_model(tmp_path):
    config = tiny_config(tmp_path, data_dir=SAMPLE_DATA_DIR, max_steps=2)
    folder = str(tmp_path / "cached")
    first = cache.cached_fit(config, classes=CLASSES, folder=folder, progress=False, verbose=False)
    first.checkpoint_path.write_bytes(b"not a checkpoint")
    assert not cache.cached_fit(config, classes=CLASSES, folder=folder, progress=False, verbose=False).reused
    other_classes = cache.cached_fit(config, classes=["a", "b"], folder=folder, progress=False, verbose=False)
    assert other_classes.digest != first.digest  # the class list is part of the name
    assert cache.digest(config, None) != cache.digest(config, None, extra={"source": "x"})


def test_the_classes_are_part_of_the_name_so_a_caller_must_give_them(tmp_path):
    """Notebook 09 called it without them and trained its own copy of notebook 13's teacher (digests differed)."""
    config = tiny_config(tmp_path, data_dir=SAMPLE_DATA_DIR, max_steps=2)
    with pytest.raises(ValueError, match="pass classes=bundle.classes"):
        cache.cached_fit(config, folder=str(tmp_path / "cached"))
