"""The one home of the per-image transforms and of the augmentation recipe they share with
`device_augment.DeviceAugment`: training augmentation (random resized crop, flip, optional colour
jitter; Szegedy et al. 2015's crop, as torchvision's RandomResizedCrop), evaluation resizing,
ImageNet normalisation (what timm's pretrained CNNs expect), and the uint8 resize that leaves
augmentation to the training device. Built from torchvision.transforms.v2.
"""
from __future__ import annotations

import dataclasses

import torch

# ImageNet statistics: what timm's pretrained CNNs expect (timm.data.IMAGENET_DEFAULT_MEAN/STD).
from timm.data import IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD  # noqa: E402

from course_lib.config import AUGMENTATION_PLACES, ConfigError
from course_lib.data.overhead_augment import batch_dihedral, batch_translate
from course_lib.data.rotation import batch_rotate


@dataclasses.dataclass(frozen=True)
class AugmentRecipe:
    """What training augmentation does, whichever side runs it: `train_transform` per image in
    the DataLoader workers (augmentation=cpu) or `DeviceAugment` per batch on the training
    device (augmentation=device). Both read these fields, so the two places cannot drift apart."""

    crop: bool = True  # random resized crop; False: the whole image, resized to the model's size
    scale: tuple = (0.6, 1.0)  # area of the random crop, as a fraction of the image
    ratio: tuple = (3 / 4, 4 / 3)  # aspect ratio (width / height) of the crop, drawn log-uniform
    flip: bool = True  # mirror left-right with probability 0.5
    dihedral: bool = False  # one of the eight symmetries of the square per image (overhead imagery)
    translate: float = 0.0  # shift by up to this fraction of the side in x and y, reflect-padded; 0 = off
    rotation: float = 0.0  # turn by an angle drawn uniformly from [-rotation, rotation] degrees, reflect-filled; 0 = off
    brightness: float = 0.0  # colour jitter: factor drawn from [max(0, 1 - s), 1 + s]; 0 = off
    contrast: float = 0.0  # same range rule as brightness
    saturation: float = 0.0  # same range rule as brightness

    @property
    def jitters(self) -> bool:
        return bool(self.brightness or self.contrast or self.saturation)

    def shift_pixels(self, image_size: int) -> int:
        return round(self.translate * image_size)


# What the engine trains with (the articles' light default): crop + flip, no colour jitter.
LIGHT = AugmentRecipe()
# Notebook 02's per-sample cost benchmark: crop + flip + colour jitter, the expensive case.
HEAVY = AugmentRecipe(brightness=0.4, contrast=0.4, saturation=0.4)
# Overhead imagery (satellite tiles have no "up"): the eight symmetries of the square and shifts of
# up to 1/16 of the side (4 px at 64 px), no crop: the speed-run recipe's choice (notebook 12).
OVERHEAD = AugmentRecipe(crop=False, flip=False, dihedral=True, translate=1 / 16)
RECIPES = {"light": LIGHT, "heavy": HEAVY, "overhead": OVERHEAD}  # Config.augment_recipe names one


def recipe_for(config) -> AugmentRecipe:
    """The recipe a config trains with: `RECIPES[config.augment_recipe]`, with `config.rotation`'s small
    rotations on top when it asks for them."""
    recipe = RECIPES[config.augment_recipe]
    return dataclasses.replace(recipe, rotation=config.rotation) if config.rotation else recipe


class PerImage:
    """A per-batch augmentation, `batch_function(images, *arguments)`, on one C x H x W image: its per-sample twin
    in the DataLoader workers (the same arithmetic), drawing from torch's generator (seeded per worker)."""

    def __init__(self, batch_function, *arguments):
        self.batch_function, self.arguments = batch_function, arguments

    def __call__(self, image: torch.Tensor) -> torch.Tensor:
        return self.batch_function(image[None], *self.arguments)[0]


class RandomRotate(PerImage):
    """Turn one float image by an angle in [-max_degrees, max_degrees] (`rotation.batch_rotate`)."""

    def __init__(self, max_degrees: float):
        super().__init__(batch_rotate, max_degrees)


def train_transform(image_size: int, recipe: AugmentRecipe = LIGHT):
    """Per-image training augmentation (PIL image or uint8 tensor in, normalised float out).
    Colour jitter runs on [0, 1] floats, as DeviceAugment's does. Two known differences from
    DeviceAugment's arithmetic: v2 retries a crop that does not fit (DeviceAugment clamps it) and
    v2's ColorJitter shuffles the order of its adjustments (DeviceAugment's is fixed)."""
    from torchvision.transforms import v2

    steps = [v2.ToImage(), v2.RandomResizedCrop(image_size, scale=recipe.scale, ratio=recipe.ratio, antialias=True)
             if recipe.crop else v2.Resize((image_size, image_size), antialias=True)]
    if recipe.flip:
        steps.append(v2.RandomHorizontalFlip())
    steps += [v2.ToDtype(torch.float32, scale=True), v2.ToPureTensor()]
    if recipe.dihedral:
        steps.append(PerImage(batch_dihedral))
    if recipe.rotation:
        steps.append(RandomRotate(recipe.rotation))
    if recipe.translate:
        steps.append(PerImage(batch_translate, recipe.shift_pixels(image_size)))
    if recipe.jitters:
        steps.append(v2.ColorJitter(brightness=recipe.brightness, contrast=recipe.contrast,
                                    saturation=recipe.saturation))
    # ToPureTensor: plain tensors collate and pickle across workers without tv_tensors metadata.
    return v2.Compose([*steps, v2.Normalize(IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD), v2.ToPureTensor()])


def eval_transform(image_size: int):
    """Resize to image_size x image_size and normalise (evaluation, and augmentation=none)."""
    from torchvision.transforms import v2

    return v2.Compose([v2.ToImage(), v2.Resize((image_size, image_size), antialias=True),
                       v2.ToDtype(torch.float32, scale=True), v2.Normalize(IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD),
                       v2.ToPureTensor()])


def denormalize(batch):
    """Undo Normalize for display: a float tensor in [0, 1]."""
    mean = torch.tensor(IMAGENET_DEFAULT_MEAN, device=batch.device).view(-1, 1, 1)
    std = torch.tensor(IMAGENET_DEFAULT_STD, device=batch.device).view(-1, 1, 1)
    return (batch * std + mean).clamp(0, 1)


def sample_transform(image_size: int, augmentation: str = "cpu", recipe: AugmentRecipe = HEAVY):
    """The per-sample transform by where augmentation runs: "cpu": `train_transform(image_size, recipe)`; "device":
    resize only, uint8 out, for DeviceAugment; "none": `eval_transform`. The default recipe HEAVY is notebook 02's."""
    if augmentation == "cpu":
        return train_transform(image_size, recipe)
    if augmentation == "device":
        return ResizeUint8(image_size)
    if augmentation == "none":
        return eval_transform(image_size)
    raise ConfigError(f"augmentation={augmentation!r} is not one of {', '.join(AUGMENTATION_PLACES)}")


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

    def __repr__(self) -> str:
        return f"ResizeUint8({self.image_size})"
