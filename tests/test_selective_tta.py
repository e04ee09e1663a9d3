"""Issue 48: selective test-time augmentation (hiverge's cifar10-speedrun, `engine/selective_tta.py`): only the
least confident fraction of a batch gets the extra views. Checked on a model whose confidence the images set."""
import pytest
import torch

from course_lib.config import ConfigError, make_config
from course_lib.data.overhead_augment import dihedral_views
from course_lib.engine import selective_tta


class TopLeftRow(torch.nn.Module):
    """Two logits: the first row of a 2x2 image. Image i = [[c_i, 0], [0, 0]] has logits (c_i, 0), so its
    confidence grows with c_i; its mirror has logits (0, c_i), so the views change every prediction."""

    def forward(self, images):
        return images[:, 0, 0, :]


def _images(count=16):
    images = torch.zeros(count, 1, 2, 2)
    images[:, 0, 0, 0] = torch.arange(1, count + 1, dtype=torch.float32)  # image 0 is the least confident
    return images


def _full(images, views):
    return sum(torch.softmax(TopLeftRow()(view), dim=1) for view in dihedral_views(images, views)) / views


@pytest.mark.parametrize("views", [2, 8])
def test_a_fraction_of_one_or_zero_is_full_tta(views):
    images = _images()
    full = _full(images, views)
    assert torch.equal(selective_tta.tta_probabilities(TopLeftRow(), images, views, 1.0), full)
    assert torch.equal(selective_tta.tta_probabilities(TopLeftRow(), images, views, 0.0), full)


def test_one_view_is_the_single_views_softmax_whatever_the_fraction():
    images = _images()
    single = torch.softmax(TopLeftRow()(images), dim=1)
    for fraction in (0.0, 0.25, 1.0):
        assert torch.allclose(selective_tta.tta_probabilities(TopLeftRow(), images, 1, fraction), single)


@pytest.mark.parametrize("count, chosen", [(16, 4), (17, 4), (3, 0), (4, 1)])
def test_a_quarter_rounded_down_of_the_batch_gets_the_views_the_least_confident(count, chosen):
    images = _images(count)
    out = selective_tta.tta_probabilities(TopLeftRow(), images, 2, 0.25)
    single = torch.softmax(TopLeftRow()(images), dim=1)
    assert selective_tta.chosen_count(0.25, count) == chosen
    assert torch.allclose(out[:chosen], _full(images[:chosen], 2))  # images 0..chosen-1: the lowest confidence
    assert torch.equal(out[chosen:], single[chosen:])
    # Closed form for the mirror: the mean of softmax(c, 0) and softmax(0, c) is (1/2, 1/2).
    assert out[:chosen].flatten().tolist() == pytest.approx([0.5] * 2 * chosen)


def test_the_fraction_is_checked_in_one_line():
    assert make_config("smoke", tta_views=8, tta_selective=0.25).tta_selective == 0.25
    for bad in (-0.1, 1.5):
        with pytest.raises(ConfigError, match="tta_selective must be a fraction from 0 to 1"):
            make_config("smoke", tta_selective=bad)


def test_validate_scores_with_the_selection():
    """The engine's validate: a fraction of 1 is full TTA, one view ignores the fraction, and a quarter is
    neither the single view nor full TTA (an untrained net: the views change its predictions)."""
    from course_lib.engine import train

    config = make_config("smoke", model="speedrun_resnet_tiny", max_steps=1, tta_views=2)
    state = train.prepare(config, verbose=False)
    model = state.raw_model
    # An untrained net's logits are nearly uniform: a flip moved its mean loss by 3e-6 (Intel Xeon), below what a
    # quarter of the images changes in float32. A sharper head makes the views disagree measurably.
    head = [module for module in model.modules() if isinstance(module, torch.nn.Linear)][-1]
    with torch.no_grad():
        head.weight.mul_(100)
    single, full = train.validate(model, state), train.validate(model, state, views=2)
    assert train.validate(model, state, views=2, selective=1.0) == full
    assert train.validate(model, state, views=1, selective=0.25) == single
    quarter = train.validate(model, state, views=2, selective=0.25)
    assert quarter["images"] == single["images"]
    assert quarter["loss"] not in (single["loss"], full["loss"])
