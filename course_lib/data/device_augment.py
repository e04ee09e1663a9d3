"""Augmentation on the device, per batch: random resized crop, horizontal flip and colour jitter
as small functions that take and return N x C x H x W tensors (airbench's `batch_flip_lr` style),
each image getting its own random parameters, on whatever device the batch lives.

The article's advice: move augmentation off the CPU workers (torchvision.transforms.v2 can run on
CUDA tensors). Note that a v2 transform called on a batched tensor draws ONE set of parameters for
the whole batch; the functions here draw one per image and reproduce v2's arithmetic
(`torchvision.transforms.v2.functional.adjust_brightness/contrast/saturation`), which the tests check.
The crop uses `torchvision.ops.roi_align` (Mask R-CNN, He et al. 2017) as a batched bilinear crop-and-resize.
"""
from __future__ import annotations

import math

import torch

from course_lib.data import overhead_augment
from course_lib.data.rotation import batch_rotate
from course_lib.data.transforms import HEAVY, IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD, LIGHT, AugmentRecipe

# Colour weights of torchvision's rgb_to_grayscale (ITU-R 601-2 luma).
_GREY_WEIGHTS = (0.2989, 0.587, 0.114)


def _uniform(count: int, low: float, high: float, generator, device) -> torch.Tensor:
    return torch.rand(count, generator=generator, device=device) * (high - low) + low


def batch_flip_lr(images: torch.Tensor, generator: torch.Generator | None = None, p: float = 0.5) -> torch.Tensor:
    """Mirror each image left-right with probability `p`."""
    flip = torch.rand(len(images), generator=generator, device=images.device) < p
    return torch.where(flip.view(-1, 1, 1, 1), images.flip(-1), images)


def random_crop_boxes(count: int, height: int, width: int, scale=LIGHT.scale, ratio=LIGHT.ratio,
                      generator: torch.Generator | None = None, device=None) -> torch.Tensor:
    """`count` boxes (x1, y1, x2, y2) in pixels with area fraction in `scale` and aspect ratio in `ratio` (log-uniform),
    like v2.RandomResizedCrop; boxes too big are clamped to the image instead of v2's ten retries."""
    area = _uniform(count, *scale, generator, device) * height * width
    aspect = torch.exp(_uniform(count, math.log(ratio[0]), math.log(ratio[1]), generator, device))  # log-uniform
    box_width = torch.sqrt(area * aspect).clamp(1, width)
    box_height = torch.sqrt(area / aspect).clamp(1, height)
    x1 = torch.rand(count, generator=generator, device=device) * (width - box_width)
    y1 = torch.rand(count, generator=generator, device=device) * (height - box_height)
    return torch.stack([x1, y1, x1 + box_width, y1 + box_height], dim=1)


def batch_resized_crop(images: torch.Tensor, boxes: torch.Tensor, size: int) -> torch.Tensor:
    """Crop box i out of image i and resize it to size x size (bilinear), all in one kernel.
    Matches v2.functional.resized_crop(antialias=False) inside the box; at the box's edge it
    interpolates with the image pixels just outside, where v2 repeats the edge."""
    from torchvision.ops import roi_align

    indices = torch.arange(len(images), device=images.device, dtype=boxes.dtype).view(-1, 1)
    # aligned=True: pixel centres at +0.5, so a full-image box reproduces the image exactly;
    # sampling_ratio=0: ceil(box / output) samples per output pixel (averaging when shrinking).
    return roi_align(images, torch.cat([indices, boxes], dim=1), (size, size), spatial_scale=1.0,
                     sampling_ratio=0, aligned=True)


def _grey(images: torch.Tensor) -> torch.Tensor:
    weights = torch.tensor(_GREY_WEIGHTS, device=images.device, dtype=images.dtype).view(1, 3, 1, 1)
    return (images * weights).sum(dim=1, keepdim=True)


def adjust_brightness(images: torch.Tensor, factors: torch.Tensor) -> torch.Tensor:
    """images in [0, 1]; one factor per image (1 = unchanged)."""
    return (images * factors.view(-1, 1, 1, 1)).clamp(0, 1)


def adjust_contrast(images: torch.Tensor, factors: torch.Tensor) -> torch.Tensor:
    """Blend each image with its mean grey level."""
    mean = _grey(images).mean(dim=(1, 2, 3), keepdim=True)
    factors = factors.view(-1, 1, 1, 1)
    return (factors * images + (1 - factors) * mean).clamp(0, 1)


def adjust_saturation(images: torch.Tensor, factors: torch.Tensor) -> torch.Tensor:
    """Blend each image with its own grey version."""
    factors = factors.view(-1, 1, 1, 1)
    return (factors * images + (1 - factors) * _grey(images)).clamp(0, 1)


def batch_color_jitter(images: torch.Tensor, brightness: float, contrast: float, saturation: float,
                       generator: torch.Generator | None = None) -> torch.Tensor:
    """v2.ColorJitter's factor ranges ([max(0, 1-s), 1+s]) drawn per image; applied in a fixed
    order (brightness, contrast, saturation) where v2 shuffles the order."""
    count, device = len(images), images.device
    for strength, adjust in ((brightness, adjust_brightness), (contrast, adjust_contrast),
                             (saturation, adjust_saturation)):
        if strength > 0:
            images = adjust(images, _uniform(count, max(0.0, 1 - strength), 1 + strength, generator, device))
    return images


def batch_normalize(images: torch.Tensor, mean=IMAGENET_DEFAULT_MEAN, std=IMAGENET_DEFAULT_STD) -> torch.Tensor:
    """uint8 (0-255) or [0, 1] float N x 3 x H x W -> float normalised with `mean` and `std`, on
    the batch's device: what the evaluation side of a uint8 pipeline needs."""
    images = images.float().div_(255) if images.dtype == torch.uint8 else images.float()
    mean = torch.tensor(mean, device=images.device, dtype=images.dtype).view(1, 3, 1, 1)
    std = torch.tensor(std, device=images.device, dtype=images.dtype).view(1, 3, 1, 1)
    return (images - mean) / std


class DeviceAugment:
    """Per-batch training augmentation on the batch's device: uint8 (or [0,1] float) N x 3 x H x W in, normalised
    float N x 3 x size x size out, as `recipe` says (the same AugmentRecipe the per-image CPU transform reads; HEAVY is
    notebook 02's, `build_datasets` passes LIGHT). seed=None draws from the device's global generator, which the
    engine seeds per (seed, epoch, rank), so a resumed run repeats the same augmentation."""

    def __init__(self, image_size: int, recipe: AugmentRecipe = HEAVY, mean=IMAGENET_DEFAULT_MEAN,
                 std=IMAGENET_DEFAULT_STD, seed: int | None = None):
        self.image_size, self.recipe = image_size, recipe
        self.mean, self.std, self.seed = tuple(mean), tuple(std), seed
        self._generators: dict[str, torch.Generator] = {}

    def _generator(self, device: torch.device) -> torch.Generator | None:
        if self.seed is None:
            return None
        key = str(device)
        if key not in self._generators:  # a generator must live on the device it draws for
            self._generators[key] = torch.Generator(device=device).manual_seed(self.seed)
        return self._generators[key]

    def __call__(self, images: torch.Tensor) -> torch.Tensor:
        if images.dim() != 4 or images.shape[1] != 3:
            raise ValueError(f"DeviceAugment expects N x 3 x H x W images, got shape {tuple(images.shape)}")
        generator, recipe = self._generator(images.device), self.recipe
        images = images.float().div_(255) if images.dtype == torch.uint8 else images.float()
        height, width = images.shape[-2:]
        if recipe.crop:
            boxes = random_crop_boxes(len(images), height, width, recipe.scale, recipe.ratio, generator, images.device)
            images = batch_resized_crop(images, boxes, self.image_size)
        elif (height, width) != (self.image_size, self.image_size):
            images = torch.nn.functional.interpolate(images, size=(self.image_size, self.image_size),
                                                     mode="bilinear", antialias=True, align_corners=False)
        if recipe.flip:
            images = batch_flip_lr(images, generator)
        if recipe.dihedral:
            images = overhead_augment.batch_dihedral(images, generator)
        if recipe.rotation:
            images = batch_rotate(images, recipe.rotation, generator)
        if recipe.translate:
            images = overhead_augment.batch_translate(images, recipe.shift_pixels(self.image_size), generator)
        images = batch_color_jitter(images, recipe.brightness, recipe.contrast, recipe.saturation, generator)
        return batch_normalize(images, self.mean, self.std)

    def __repr__(self) -> str:
        return f"DeviceAugment({self.image_size}, {self.recipe})"


class DeviceStage:
    """A batch's last data step, `bundle.device_stage(images, device, train=True)`: copy it to the training device
    (non_blocking: a copy from pinned memory overlaps compute), then apply `train_transform` or `eval_transform` (e.g.
    DeviceAugment, or normalising uint8 batches); without them it only copies (the loader gave normalised floats)."""

    def __init__(self, train_transform=None, eval_transform=None, description: str = "copy only"):
        self.train_transform, self.eval_transform, self.description = train_transform, eval_transform, description

    def __call__(self, images: torch.Tensor, device: torch.device, *, train: bool) -> torch.Tensor:
        images = images.to(device, non_blocking=True)
        transform = self.train_transform if train else self.eval_transform
        return transform(images) if transform is not None else images
