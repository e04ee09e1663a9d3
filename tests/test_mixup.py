"""MixUp/CutMix: the config's alphas build timm's Mixup (or nothing), odd batches are refused,
and the mixed targets are probability vectors."""
import pytest
import torch
from conftest import tiny_config
from timm.data import Mixup

from course_lib.config import ConfigError
from course_lib.engine.mixup import make_mixup


@pytest.mark.parametrize("mixup_alpha, cutmix_alpha", [(0.2, 0.0), (0.0, 1.0), (0.2, 1.0)])
def test_builds_timms_mixup_with_the_configs_values(tmp_path, mixup_alpha, cutmix_alpha):
    config = tiny_config(tmp_path, mixup_alpha=mixup_alpha, cutmix_alpha=cutmix_alpha, label_smoothing=0.1)
    mixup = make_mixup(config, num_classes=4)
    assert isinstance(mixup, Mixup)
    assert (mixup.mixup_alpha, mixup.cutmix_alpha) == (mixup_alpha, cutmix_alpha)
    assert (mixup.label_smoothing, mixup.num_classes) == (0.1, 4)
    images, targets = mixup(torch.randn(16, 3, 16, 16), torch.arange(16) % 4)
    assert images.shape == (16, 3, 16, 16) and targets.shape == (16, 4)
    torch.testing.assert_close(targets.sum(dim=1), torch.ones(16))


def test_off_when_both_alphas_are_zero(tmp_path):
    assert make_mixup(tiny_config(tmp_path), num_classes=4) is None


def test_odd_batches_are_refused(tmp_path):
    with pytest.raises(ConfigError, match="batch_size must be even, got 15"):
        make_mixup(tiny_config(tmp_path, batch_size=15, mixup_alpha=0.2), num_classes=4)
