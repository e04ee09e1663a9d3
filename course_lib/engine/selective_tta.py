"""Test-time augmentation for every image, or only for the least confident ones: hiverge's
cifar10-speedrun (github.com/hiverge/cifar10-speedrun, the CIFAR-10 record after airbench94_muon) first
scores every test image with one view, then runs its extra views only on the quarter whose top softmax
probability is lowest, and keeps the single view for the rest: the confident images rarely change
their answer, so most of TTA's gain stays at a fraction of its cost.

Differences from the reference, on purpose: the probabilities (not the logits) are averaged, as the
engine's full TTA does, so a fraction of 1 gives exactly full TTA; the views are the symmetries of the
square (`data.overhead_augment.dihedral_views`), not hiverge's mirrored crops; and the choice is made per
validation batch (hiverge ranks its whole 10,000-image test set at once), because the engine streams
its validation batches. Under DDP each rank ranks its own images: no communication, and the summed
scores stay a sum over disjoint images.
"""
from __future__ import annotations

import torch

from course_lib.data.overhead_augment import dihedral_views


def _softmax(model: torch.nn.Module, images: torch.Tensor) -> torch.Tensor:
    return torch.softmax(model(images).float(), dim=1)


def chosen_count(fraction: float, images: int) -> int:
    """How many of a batch of `images` get the views: floor(fraction x images), as hiverge's
    `int(n * UNCERTAIN_QUANTILE)`; a fraction of 0 or 1 means every image (selection off)."""
    return images if fraction in (0.0, 1.0) else int(fraction * images)


def tta_probabilities(model: torch.nn.Module, images: torch.Tensor, views: int, fraction: float = 0.0) -> torch.Tensor:
    """N x classes probabilities: the softmax averaged over the first `views` dihedral views of each image,
    or, with 0 < `fraction` < 1, only for the `chosen_count` images of lowest single-view top probability
    (the others keep their single view's softmax). View 0 is the image itself, so the single view's
    forward pass is reused, not repeated."""
    count = chosen_count(fraction, len(images))
    if count == len(images):
        return sum(_softmax(model, view) for view in dihedral_views(images, views)) / views
    single = _softmax(model, images)
    if count == 0 or views == 1:
        return single
    chosen = single.amax(dim=1).topk(count, largest=False).indices  # the least confident
    extra = dihedral_views(images[chosen], views)[1:]  # the identity view is `single`
    probabilities = single.clone()
    probabilities[chosen] = (single[chosen] + sum(_softmax(model, view) for view in extra)) / views
    return probabilities
