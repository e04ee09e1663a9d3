"""Progressive resizing: train the first epochs on smaller images and grow them to the full size
(fast.ai's DAWNBench ImageNet entry, Howard et al. 2018; FFCV's ResNet recipes, Leclerc et al. 2023,
arXiv:2306.12517). A convolution's arithmetic grows with the square of the side, so an epoch at half
the side costs about a quarter, while the early epochs learn coarse features that small images
still show. Validation always sees the full size, the one the model is scored at.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from course_lib.config import Config

SIZE_MULTIPLE = 8  # sides are rounded down to a multiple of this (pooling stages halve the side three times)


def image_size_for_epoch(epoch: int, epochs: int, min_size: int, full_size: int, ramp=Config.resize_ramp) -> int:
    """The side (pixels) of epoch `epoch` (0-based) of `epochs`: `min_size` first, growing linearly to `full_size`
    by the end of the ramp (`ramp` of the epochs; 1: the last epoch), then `full_size`. `min_size` 0 (off) or
    >= full_size: always full."""
    if not min_size or min_size >= full_size:
        return full_size
    ramp_epochs = round(ramp * epochs) - 1  # the epoch that first trains at the full size
    if ramp_epochs < 1:  # a run of one epoch trains at the size it is scored at
        return full_size
    progress = min(1.0, epoch / ramp_epochs)
    side = min_size + (full_size - min_size) * progress
    return max(min_size, min(full_size, int(side) // SIZE_MULTIPLE * SIZE_MULTIPLE))


def resize_batch(images: torch.Tensor, size: int) -> torch.Tensor:
    """A normalised batch (N, C, H, W) at `size` x `size` (antialiased bilinear, keeps its memory
    format); unchanged when it already has that size."""
    if images.shape[-1] == size and images.shape[-2] == size:
        return images
    channels_last = images.is_contiguous(memory_format=torch.channels_last) and not images.is_contiguous()
    resized = F.interpolate(images, size=(size, size), mode="bilinear", antialias=True, align_corners=False)
    return resized.contiguous(memory_format=torch.channels_last) if channels_last else resized
