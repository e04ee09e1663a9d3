"""Whitening initialisation of the first convolution (Keller Jordan, "94% on CIFAR-10 in 3.29 seconds on a
single GPU", arXiv:2404.00498, section 3.2; from David Page's and tysam-code's CIFAR-10 speed-runs): the
stem's filters are the eigenvectors of the covariance of the training images' patches (patch size = the
stem's kernel), each divided by the square root of its eigenvalue plus a small epsilon, so that the stem's
outputs over those patches have identity covariance. Following airbench94_muon.py's `init_whiten`
(github.com/KellerJordan/cifar10-airbench): the second moment about zero of every stride-1 patch of
already-normalised images (their mean is near zero), eps = 5e-4, each eigenvector used as +v and as -v
(the activation after it keeps only one sign), and the weights then frozen (airbench sets
`requires_grad = False`; it also trains the whitening layer's bias for the first 3 epochs only, which the
workbook's bias-free stem, followed by BatchNorm, has no use for).

Fitting a stem that is not 2 x d filters wide (d = channels x kernel height x kernel width, 12 for the
speed-run nets' 2x2 stem): the filters are taken in the order +v then -v, each by decreasing eigenvalue
(the directions of most variance first), as many as the conv has; a wider conv keeps its initial weights
in the filters past 2 x d. Small functions that take and return tensors; `whiten_first_conv` applies them
to a model's first convolution (timm's `pretrained_cfg["first_conv"]`).
"""
from __future__ import annotations

from collections.abc import Iterable

import torch
import torch.nn.functional as F
from torch import nn

from course_lib.config import ConfigError

EPSILON = 5e-4  # added to each eigenvalue before the square root, as airbench94_muon.py does (normalised images)


def patch_vectors(images: torch.Tensor, kernel_size: tuple[int, int]) -> torch.Tensor:
    """Every kernel_size patch of N x C x H x W `images` at stride 1, one row each, flattened channel by
    channel then row by row, the order of a conv weight's (C, kh, kw): (N x patches per image, C x kh x kw)."""
    columns = F.unfold(images, kernel_size)  # N x (C kh kw) x L
    return columns.transpose(1, 2).reshape(-1, columns.shape[1])


def patch_covariance(images: torch.Tensor, kernel_size: tuple[int, int]) -> torch.Tensor:
    """The (C kh kw) x (C kh kw) second moment of `images`' patches about zero, in float64 (airbench's
    `est_patch_covariance`: the images are normalised, so it is their covariance up to their small mean)."""
    vectors = patch_vectors(images.double(), kernel_size)
    return vectors.T @ vectors / len(vectors)


def whitening_filters(covariance: torch.Tensor, kernel_size: tuple[int, int], channels: int,
                      eps: float = EPSILON) -> torch.Tensor:
    """(2 d, C, kh, kw) filters from a d x d patch covariance: its eigenvectors v by decreasing eigenvalue
    lambda, each scaled by 1 / sqrt(lambda + eps), first as +v then as -v. The +v half maps the patches to
    outputs of covariance diag(lambda / (lambda + eps)), the identity up to eps."""
    eigenvalues, eigenvectors = torch.linalg.eigh(covariance)  # ascending; columns are the eigenvectors
    eigenvalues, eigenvectors = eigenvalues.flip(0), eigenvectors.flip(1)
    scaled = eigenvectors.T / torch.sqrt(eigenvalues.clamp(min=0) + eps)[:, None]  # one filter per row
    return torch.cat((scaled, -scaled)).reshape(-1, channels, *kernel_size)


def patch_whitening_weights(images: torch.Tensor, kernel_size: int | tuple[int, int],
                            eps: float = EPSILON) -> torch.Tensor:
    """The whitening filters (2 d, C, kh, kw) of N x C x H x W `images` (`whitening_filters` of their
    `patch_covariance`)."""
    kernel_size = _pair(kernel_size)
    return whitening_filters(patch_covariance(images, kernel_size), kernel_size, images.shape[1], eps)


def first_conv(model: nn.Module) -> tuple[str, nn.Conv2d]:
    """(name, module) of the convolution that sees the image: timm's `pretrained_cfg["first_conv"]`. Refuses,
    in one line, a model that names none or whose first layer is not a plain Conv2d (groups 1, dilation 1)."""
    config = getattr(model, "pretrained_cfg", None) or {}
    name = config.get("first_conv")
    name = name[0] if isinstance(name, (list, tuple)) and name else name
    module = model.get_submodule(name) if isinstance(name, str) and name else None
    model_name = config.get("architecture", type(model).__name__)
    if not isinstance(module, nn.Conv2d) or module.groups != 1 or module.dilation != (1, 1):
        found = f"its first layer {name!r} is a {type(module).__name__}" if module is not None else \
            "timm names no first conv for it"
        raise ConfigError(f"whiten_stem needs a model whose first layer is a plain Conv2d, and {model_name} does not "
                          f"fit ({found}); use a speedrun_resnet model or set whiten_stem=false")
    return name, module


@torch.no_grad()
def whiten_first_conv(model: nn.Module, images: torch.Tensor | Iterable[torch.Tensor], eps: float = EPSILON) -> dict:
    """Set `model`'s first convolution from the patch covariance of `images` (one N x C x H x W tensor, or
    batches of one size, normalised as the model sees them) and freeze its weights, as airbench does.
    Returns {"layer", "filters" (whitened), "images"}."""
    name, conv = first_conv(model)
    kernel_size = _pair(conv.kernel_size)
    total, count = None, 0
    for batch in [images] if isinstance(images, torch.Tensor) else images:
        if batch.shape[1] != conv.in_channels:
            raise ConfigError(f"whiten_stem: {name} takes {conv.in_channels} channels, the images have {batch.shape[1]}")
        moment = patch_covariance(batch, kernel_size) * len(batch)  # every image has as many patches
        total, count = (moment if total is None else total + moment), count + len(batch)
    if not count:
        raise ConfigError("whiten_stem: no training images to whiten the first convolution with")
    filters = whitening_filters(total / count, kernel_size, conv.in_channels, eps)
    used = min(len(filters), conv.out_channels)
    conv.weight[:used] = filters[:used].to(conv.weight.dtype)
    conv.weight.requires_grad_(False)  # frozen before the optimizer is built: it never holds them
    return {"layer": name, "filters": used, "images": count}


def _pair(size) -> tuple[int, int]:
    return (size, size) if isinstance(size, int) else tuple(size)
