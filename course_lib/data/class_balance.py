"""Correcting class imbalance, the two classic ways (`class_balance`): weight the loss, or resample.

- weighted_loss: cross-entropy with per-class weights w_c = N / (C x n_c), the inverse class frequency
  scaled so that the weights average 1 over the training images (King & Zeng 2001, "Logistic
  Regression in Rare Events Data"; scikit-learn's `compute_class_weight("balanced")`). Cui et al.'s
  "effective number" weights (CVPR 2019, arXiv:1901.05555) are the same with n_c replaced by
  (1 - beta^n_c) / (1 - beta); at beta -> 1 they are these. A class absent from the split gets weight 0.
- sampler: every training image drawn with probability proportional to 1 / n_y, with replacement, so
  each class is drawn equally often in expectation: torch's `WeightedRandomSampler` draw
  (`torch.multinomial`), made a sampler of the engine's kind (`ClassBalancedSampler`: a draw from
  (seed, epoch), this rank's share of it, `set_epoch`). storage=device draws with the same
  `balanced_order` inside `resident.ResidentBatches`.
An epoch stays `len(split)` images: the head classes are seen less often, the tail classes repeatedly.
"""
from __future__ import annotations

import numpy as np
import torch
from torch.utils.data import WeightedRandomSampler

from course_lib.config import ConfigError


def training_targets(dataset) -> np.ndarray:
    """The class index of every training image, read from the dataset's `targets` (every map-style
    split the pipeline builds has them); a dataset without them is refused in one line."""
    targets = getattr(dataset, "targets", None)
    if targets is None:
        raise ConfigError(f"class_balance needs the training labels up front, and {type(dataset).__name__} has no "
                          "`targets`; use class_balance=none or storage=cache or files")
    return np.asarray(torch.as_tensor(targets).cpu(), dtype=np.int64)


def class_counts(targets, num_classes: int) -> np.ndarray:
    """Images per class, (num_classes,) int64; a label outside 0..num_classes-1 is an error."""
    targets = np.asarray(targets, dtype=np.int64)
    if len(targets) and (targets.min() < 0 or targets.max() >= num_classes):
        raise ValueError(f"labels must be 0 to {num_classes - 1}, got {targets.min()} to {targets.max()}")
    return np.bincount(targets, minlength=num_classes)


def class_weights(counts) -> torch.Tensor:
    """Inverse-frequency loss weights w_c = N / (C x n_c), float32, over the C classes present (n_c > 0);
    0 for an absent class. Sum over images of w_y is then N: the loss keeps its scale."""
    counts = np.asarray(counts, dtype=np.float64)
    present = counts > 0
    if not present.any():
        raise ValueError("no training images: nothing to weight")
    weights = np.zeros_like(counts)
    weights[present] = counts.sum() / (present.sum() * counts[present])
    return torch.tensor(weights, dtype=torch.float32)


def sample_weights(targets, num_classes: int) -> torch.Tensor:
    """Per-image drawing weights 1 / n_y (float64): every class carries the same total weight."""
    targets = np.asarray(targets, dtype=np.int64)
    counts = class_counts(targets, num_classes)
    return torch.tensor(1.0 / counts[targets], dtype=torch.float64)


def balanced_order(weights: torch.Tensor, count: int, seed: int, epoch: int) -> torch.Tensor:
    """`count` image indices drawn with replacement, index i with probability weights[i] / sum, from a
    generator seeded by (seed, epoch) on the CPU, so every rank and device draws the same order."""
    generator = torch.Generator().manual_seed(int(np.random.SeedSequence([seed, epoch]).generate_state(1)[0]))
    return torch.multinomial(weights, count, replacement=True, generator=generator)


class ClassBalancedSampler(WeightedRandomSampler):
    """A `WeightedRandomSampler` over a training split with weights 1 / n_y that, like
    `DistributedSampler`, draws one order per epoch from (seed, epoch) (`set_epoch`) and yields this
    rank's every `num_replicas`-th share of it; `len` is this rank's images per epoch."""

    def __init__(self, targets, num_classes: int, *, num_replicas: int = 1, rank: int = 0, seed: int = 0):
        total = len(targets) // num_replicas * num_replicas  # every rank the same number of images
        super().__init__(sample_weights(targets, num_classes), num_samples=total // num_replicas, replacement=True)
        self.num_replicas, self.rank, self.seed, self.epoch = num_replicas, rank, seed, 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __iter__(self):
        order = balanced_order(self.weights, self.num_samples * self.num_replicas, self.seed, self.epoch)
        return iter(order[self.rank::self.num_replicas].tolist())
