"""Progressive resizing: the side of each epoch, the batch resize, and the engine switch."""
import pytest
import torch
from conftest import TensorImages, tiny_config

from course_lib.config import ConfigError, make_config
from course_lib.engine.progressive_resize import image_size_for_epoch, resize_batch


@pytest.mark.parametrize("epochs", [1, 4, 12, 24])
def test_the_side_grows_from_the_minimum_to_the_full_size_and_stays(epochs):
    sides = [image_size_for_epoch(e, epochs, 32, 64) for e in range(epochs)]
    assert sides == sorted(sides) and all(side % 8 == 0 for side in sides)
    assert sides[-1] == 64 and (epochs < 4 or sides[0] == 32)
    full = [s for s in sides if s == 64]
    assert len(full) >= max(1, epochs // 4)  # the last quarter trains at the full size


@pytest.mark.parametrize("epochs", [4, 12, 14, 21])
def test_a_ramp_of_one_trains_only_the_last_epoch_at_the_full_size(epochs):
    sides = [image_size_for_epoch(e, epochs, 32, 64, ramp=1.0) for e in range(epochs)]
    assert sides == sorted(sides) and sides[0] == 32 and sides[-1] == 64 and sides.count(64) == 1
    half = [image_size_for_epoch(e, epochs, 32, 64, ramp=0.5) for e in range(epochs)]
    assert half.count(64) == epochs - round(epochs / 2) + 1  # a shorter ramp: more epochs at the full size


def test_a_ramp_outside_zero_to_one_is_refused_in_one_line():
    for ramp in (0.0, -0.5, 1.5):
        with pytest.raises(ConfigError, match="resize_ramp"):
            make_config("smoke", resize_ramp=ramp)


def test_off_or_a_minimum_at_the_full_size_always_gives_the_full_size():
    assert {image_size_for_epoch(e, 10, 0, 64) for e in range(10)} == {64}
    assert {image_size_for_epoch(e, 10, 64, 64) for e in range(10)} == {64}


def test_resize_keeps_the_layout_and_leaves_full_size_batches_alone():
    images = torch.randn(2, 3, 64, 64).contiguous(memory_format=torch.channels_last)
    assert resize_batch(images, 64) is images
    small = resize_batch(images, 32)
    assert small.shape == (2, 3, 32, 32) and small.is_contiguous(memory_format=torch.channels_last)
    flat = torch.full((1, 3, 64, 64), 0.25)
    assert torch.allclose(resize_batch(flat, 40), torch.full((1, 3, 40, 40), 0.25))  # a constant stays constant


def test_a_minimum_outside_the_pixel_range_is_refused_in_one_line_and_one_above_the_size_does_nothing():
    with pytest.raises(ConfigError, match="min_image_size"):
        make_config("smoke", min_image_size=4)
    assert make_config("smoke", image_size=16, recipe="speedrun").min_image_size == 32  # the recipe's start: no effect
    assert image_size_for_epoch(0, 18, 32, 16) == 16


def test_the_engine_trains_the_first_epoch_at_the_minimum(tmp_path, monkeypatch):
    from course_lib.data.datasets import DataBundle
    from course_lib.engine import train

    seen = []
    original = train.training_step

    def spy(model, images, *args, **kwargs):
        seen.append(images.shape[-1])
        return original(model, images, *args, **kwargs)

    monkeypatch.setattr(train, "training_step", spy)
    bundle = DataBundle(TensorImages(32, 3, 32), TensorImages(16, 3, 32, seed=1), None, ["a", "b", "c"], "tensors")
    train.fit(tiny_config(tmp_path, image_size=32, min_image_size=16, epochs=4, batch_size=16), bundle=bundle,
              progress=False)
    assert seen[:2] == [16, 16] and seen[-1] == 32 and len(seen) == 8
    seen.clear()  # Config.resize_ramp reaches the engine: with 1, only the last epoch's two steps are at 32 px
    train.fit(tiny_config(tmp_path, image_size=32, min_image_size=16, epochs=4, batch_size=16, resize_ramp=1.0),
              bundle=bundle, progress=False)
    assert seen.count(32) == 2 and seen[-2:] == [32, 32]
