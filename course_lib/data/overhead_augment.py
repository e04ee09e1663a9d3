"""Augmentation that suits overhead imagery, per batch on the device: the eight symmetries of the
square (the dihedral group D4: four rotations, each with or without a mirror) and small
translations. A satellite tile has no "up": a field rotated by 90 degrees is still a field, so all
eight views are equally real images of the class (Helber et al. 2019 train EuroSAT with such flips
and rotations), unlike a photograph, where only the horizontal mirror is. The translation is
airbench's `batch_crop` (Keller Jordan, arXiv:2404.00498): pad by reflection, crop back at a random
offset. Small functions that take and return N x C x H x W tensors; test-time augmentation averages
the model's predictions over `dihedral_views`.
"""
from __future__ import annotations

import torch

DIHEDRAL_VIEWS = 8  # 4 rotations x (mirrored or not)


def dihedral(images: torch.Tensor, view: int) -> torch.Tensor:
    """View 0..7 of square images: rotate by 90 degrees `view % 4` times, mirrored left-right
    first when `view >= 4`. View 0 is the identity."""
    if not 0 <= view < DIHEDRAL_VIEWS:
        raise ValueError(f"dihedral view must be 0..7, got {view}")
    if images.shape[-1] != images.shape[-2]:
        raise ValueError(f"dihedral views need square images, got {tuple(images.shape[-2:])}")
    if view >= 4:
        images = images.flip(-1)
    return torch.rot90(images, view % 4, dims=(-2, -1))


def dihedral_views(images: torch.Tensor, views: int = DIHEDRAL_VIEWS) -> list[torch.Tensor]:
    """The first `views` dihedral views (2: identity and mirror; 8: all of them)."""
    order = (0, 4, 1, 5, 2, 6, 3, 7)  # identity, mirror, then the rotations: a prefix is a useful subset
    return [dihedral(images, view) for view in order[:views]]


def batch_dihedral(images: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    """Each image gets one of the eight views, drawn uniformly and independently."""
    views = torch.randint(DIHEDRAL_VIEWS, (len(images),), generator=generator, device=images.device)
    out = torch.empty_like(images)
    for view in range(DIHEDRAL_VIEWS):  # eight masked copies: one kernel each, no per-image Python loop
        chosen = views == view
        if chosen.any():
            out[chosen] = dihedral(images[chosen], view)
    return out


def batch_translate(images: torch.Tensor, max_shift: int, generator: torch.Generator | None = None) -> torch.Tensor:
    """Shift each image by up to `max_shift` pixels in x and y (uniform integers), filling the
    border by reflection, as airbench's batch_crop does."""
    if max_shift <= 0:
        return images
    count, _, height, width = images.shape
    padded = torch.nn.functional.pad(images, (max_shift,) * 4, mode="reflect")
    shifts = torch.randint(2 * max_shift + 1, (count, 2), generator=generator, device=images.device)
    # Gather rows and columns per image with index arithmetic (no Python loop over images).
    rows = (shifts[:, 0, None] + torch.arange(height, device=images.device)).view(count, 1, height, 1)
    columns = (shifts[:, 1, None] + torch.arange(width, device=images.device)).view(count, 1, 1, width)
    channels = images.shape[1]
    padded_width = width + 2 * max_shift
    flat = padded.flatten(2)  # N x C x (H+2s)(W+2s)
    index = (rows * padded_width + columns).expand(count, channels, height, width).flatten(2)
    return flat.gather(2, index).view(count, channels, height, width)
