"""Random erasing as a batch regularizer, with timm's `RandomErasing` run on the training device:
each image, with probability `random_erasing`, gets a random box (2-33% of its area) replaced by
per-pixel normal noise (Zhong et al. 2020, "Random Erasing Data Augmentation", arXiv:1708.04896).

    eraser = make_random_erasing(config, device)
    images = eraser(images)    # in place, on the normalised batch
"""
from __future__ import annotations

import torch

from course_lib.config import Config


def make_random_erasing(config: Config, device: torch.device):
    """timm's RandomErasing for `config.random_erasing` (probability per image), or None when it is 0.
    mode="pixel": the noise is drawn on `device`, so erasing needs no host round trip; it works
    on normalised batches, which is what the engine has after the device stage."""
    if config.random_erasing <= 0:
        return None
    from timm.data.random_erasing import RandomErasing

    return RandomErasing(probability=config.random_erasing, mode="pixel", device=str(device))
