"""Article 2's "small rotations" as an augmentation: each image of a batch turned by its own angle, on whatever
device the batch lives (`DeviceAugment`), and the same arithmetic on one image in the DataLoader workers
(`transforms.RandomRotate`). `Config.rotation` sets the largest angle.
"""
from __future__ import annotations

import torch


def rotate(images: torch.Tensor, degrees: torch.Tensor) -> torch.Tensor:
    """Turn image i of a float batch about its centre by `degrees[i]` (counter-clockwise, as torchvision's
    `rotate`), all in one bilinear resampling (`affine_grid` and `grid_sample`, a spatial transformer's
    sampler, Jaderberg et al. 2015). The corners a turn uncovers are filled by reflection, so no black
    wedges teach the model a border that real tiles lack."""
    angles = torch.deg2rad(degrees.to(images.device, torch.float32))
    cos, sin, zero = torch.cos(angles), torch.sin(angles), torch.zeros_like(angles)
    # Row i maps an output pixel's normalised (x, y) (y pointing down) to the input point it samples.
    theta = torch.stack([torch.stack([cos, -sin, zero], 1), torch.stack([sin, cos, zero], 1)], 1).to(images.dtype)
    grid = torch.nn.functional.affine_grid(theta, list(images.shape), align_corners=False)
    return torch.nn.functional.grid_sample(images, grid, mode="bilinear", padding_mode="reflection",
                                           align_corners=False)


def batch_rotate(images: torch.Tensor, max_degrees: float, generator: torch.Generator | None = None) -> torch.Tensor:
    """Each float image turned by its own angle, uniform in [-max_degrees, max_degrees]: article 2's
    "small rotations" (`rotate`). max_degrees 0 returns the batch untouched."""
    if max_degrees <= 0:
        return images
    draws = torch.rand(len(images), generator=generator, device=images.device)
    return rotate(images, (2 * draws - 1) * max_degrees)
