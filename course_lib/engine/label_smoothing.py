"""The training criterion, with label smoothing: the target puts 1 - eps on the true class and
spreads eps over all classes, which keeps the logits from growing without bound (Szegedy et al.
2016, "Rethinking the Inception Architecture", arXiv:1512.00567, Sec. 7). torch's
`CrossEntropyLoss(label_smoothing=eps)` for hard labels; with MixUp/CutMix the targets are already
soft (and smoothed by timm's Mixup), so the loss is timm's `SoftTargetCrossEntropy`.
class_balance=weighted_loss adds per-class weights (`data.class_balance.class_weights`); torch then
averages sum_i w_(y_i) loss_i / sum_i w_(y_i) over a batch.
"""
from __future__ import annotations

import torch

from course_lib.config import Config


def make_criterion(config: Config, mixing: bool = False, class_weights: torch.Tensor | None = None) -> torch.nn.Module:
    """The loss for `config.label_smoothing`; `mixing=True` when a `mixup.make_mixup` object makes
    the targets (soft probability vectors instead of class indices); `class_weights` (one per class,
    on the training device) weights each image's loss by its class (class_balance=weighted_loss,
    which the config refuses together with mixing)."""
    if mixing:
        from timm.loss import SoftTargetCrossEntropy

        return SoftTargetCrossEntropy()
    return torch.nn.CrossEntropyLoss(weight=class_weights, label_smoothing=config.label_smoothing)
