"""Random erasing: the config's probability builds timm's RandomErasing on the device (or nothing)."""
import torch
from conftest import tiny_config
from timm.data.random_erasing import RandomErasing

from course_lib.engine.random_erasing import make_random_erasing


def test_builds_timms_random_erasing_with_the_configs_probability(tmp_path):
    eraser = make_random_erasing(tiny_config(tmp_path, random_erasing=0.25), torch.device("cpu"))
    assert isinstance(eraser, RandomErasing)
    assert eraser.probability == 0.25 and eraser.per_pixel and eraser.device == "cpu"


def test_probability_one_erases_a_box_of_every_image(tmp_path):
    eraser = make_random_erasing(tiny_config(tmp_path, random_erasing=1.0), torch.device("cpu"))
    images = torch.zeros(4, 3, 16, 16)
    erased = eraser(images.clone())
    changed = (erased != images).flatten(1).float().mean(dim=1)  # fraction of each image replaced
    assert ((changed >= 0.02 * 0.9) & (changed <= 1 / 3 + 0.05)).all(), changed  # 2-33% of the area


def test_off_when_the_probability_is_zero(tmp_path):
    assert make_random_erasing(tiny_config(tmp_path), torch.device("cpu")) is None
