"""The one home of the per-image transforms: training augmentation (random resized crop and flip,
the articles' default), evaluation resizing, ImageNet normalisation (what timm's pretrained CNNs
expect), and the uint8 resize that leaves augmentation to `device_augment` on the training device.
Built from torchvision.transforms.v2.
"""
from __future__ import annotations

import torch

# ImageNet statistics: what timm's pretrained CNNs expect (timm.data.IMAGENET_DEFAULT_MEAN/STD).
from timm.data import IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD  # noqa: E402


def train_transform(image_size: int):
    """Light CPU augmentation (the articles' default): random resized crop and flip."""
    import torch
    from torchvision.transforms import v2

    return v2.Compose([
        v2.ToImage(),
        v2.RandomResizedCrop(image_size, scale=(0.6, 1.0), antialias=True),
        v2.RandomHorizontalFlip(),
        v2.ToDtype(torch.float32, scale=True),
        v2.Normalize(IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD),
    ])


def eval_transform(image_size: int):
    import torch
    from torchvision.transforms import v2

    return v2.Compose([
        v2.ToImage(),
        v2.Resize((image_size, image_size), antialias=True),
        v2.ToDtype(torch.float32, scale=True),
        v2.Normalize(IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD),
    ])


def denormalize(batch):
    """Undo Normalize for display: a float tensor in [0, 1]."""
    import torch

    mean = torch.tensor(IMAGENET_DEFAULT_MEAN, device=batch.device).view(-1, 1, 1)
    std = torch.tensor(IMAGENET_DEFAULT_STD, device=batch.device).view(-1, 1, 1)
    return (batch * std + mean).clamp(0, 1)


def sample_transform(image_size: int, augmentation: str = "cpu"):
    """The per-sample transform for a decoded image (PIL or uint8 tensor):
    "cpu": random resized crop + flip + colour jitter in the worker, normalised float out
    (the same operations DeviceAugment does per batch); "device": resize only, uint8 out, for
    DeviceAugment later; "none": resize and normalise (evaluation)."""
    from torchvision.transforms import v2

    from course_lib.config import ConfigError

    if augmentation == "cpu":
        steps = [v2.RandomResizedCrop(image_size, scale=(0.6, 1.0), antialias=True), v2.RandomHorizontalFlip(),
                 v2.ColorJitter(brightness=0.4, contrast=0.4, saturation=0.4),
                 v2.ToDtype(torch.float32, scale=True), v2.Normalize(IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD)]
    elif augmentation == "device":
        return ResizeUint8(image_size)
    elif augmentation == "none":
        steps = [v2.Resize((image_size, image_size), antialias=True), v2.ToDtype(torch.float32, scale=True),
                 v2.Normalize(IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD)]
    else:
        raise ConfigError(f"augmentation={augmentation!r} is not one of cpu, device, none")
    # ToPureTensor: plain tensors collate and pickle across workers without tv_tensors metadata.
    return v2.Compose([v2.ToImage(), *steps, v2.ToPureTensor()])


class ResizeUint8:
    """PIL image or uint8 tensor -> uint8 3 x size x size tensor; images already that size pass
    through untouched (the cheapest worker-side step: decoding stays the only real work)."""

    def __init__(self, image_size: int):
        self.image_size = image_size

    def __call__(self, image) -> torch.Tensor:
        from torchvision.transforms.v2 import functional

        if not isinstance(image, torch.Tensor):
            image = functional.pil_to_tensor(image.convert("RGB"))
        if tuple(image.shape[-2:]) != (self.image_size, self.image_size):
            image = functional.resize(image, [self.image_size, self.image_size], antialias=True)
        return image.as_subclass(torch.Tensor)
