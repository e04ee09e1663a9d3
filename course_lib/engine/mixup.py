"""MixUp and CutMix as batch regularizers, with timm's `Mixup`: MixUp blends each image with
another of the batch and mixes their labels by the same weight (Zhang et al. 2018, "mixup: Beyond
Empirical Risk Minimization", arXiv:1710.09412); CutMix pastes a box of the other image and mixes
the labels by the box's area (Yun et al. 2019, "CutMix", arXiv:1905.04899). timm's version also
label-smooths the mixed targets, which are soft, so the loss is `label_smoothing.make_criterion`'s
SoftTargetCrossEntropy.

    mixup = make_mixup(config, num_classes)
    images, soft_targets = mixup(images, targets)    # on the device, per batch
"""
from __future__ import annotations

from course_lib.config import Config, ConfigError


def make_mixup(config: Config, num_classes: int):
    """timm's Mixup for `mixup_alpha` / `cutmix_alpha` (Beta(alpha, alpha) mixing weights; when
    both are on, each batch uses one of them), or None when both are 0."""
    if config.mixup_alpha <= 0 and config.cutmix_alpha <= 0:
        return None
    from timm.data import Mixup

    if config.batch_size % 2:
        # timm pairs image i with image N-1-i (batch mode: mixes the batch with its flip).
        raise ConfigError(f"mixup/cutmix pair images within a batch: batch_size must be even, got {config.batch_size}")
    return Mixup(mixup_alpha=config.mixup_alpha, cutmix_alpha=config.cutmix_alpha,
                 label_smoothing=config.label_smoothing, num_classes=num_classes)
