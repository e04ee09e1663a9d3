"""The training criterion, with label smoothing: the target puts 1 - eps on the true class and
spreads eps over all classes, which keeps the logits from growing without bound (Szegedy et al.
2016, "Rethinking the Inception Architecture", arXiv:1512.00567, Sec. 7). torch's
`CrossEntropyLoss(label_smoothing=eps)` for hard labels; with MixUp/CutMix the targets are already
soft (and smoothed by timm's Mixup), so the loss is timm's `SoftTargetCrossEntropy`.
"""
from __future__ import annotations

import torch

from course_lib.config import Config


def make_criterion(config: Config, mixing: bool = False) -> torch.nn.Module:
    """The loss for `config.label_smoothing`; `mixing=True` when a `mixup.make_mixup` object makes
    the targets (soft probability vectors instead of class indices)."""
    if mixing:
        from timm.loss import SoftTargetCrossEntropy

        return SoftTargetCrossEntropy()
    return torch.nn.CrossEntropyLoss(label_smoothing=config.label_smoothing)
