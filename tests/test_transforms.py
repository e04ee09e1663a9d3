"""Per-image transforms (`data.transforms`): the promised type and size, and one AugmentRecipe read by the CPU transform and DeviceAugment alike."""
import pytest
import torch

from course_lib.data import device_augment, transforms


@pytest.mark.parametrize("place,dtype", [("cpu", torch.float32), ("device", torch.uint8), ("none", torch.float32)])
def test_sample_transforms_give_the_promised_type_and_size(place, dtype):
    image = torch.randint(0, 256, (3, 40, 30), dtype=torch.uint8)
    out = transforms.sample_transform(20, place)(image)
    assert type(out) is torch.Tensor and out.dtype == dtype and out.shape == (3, 20, 20)


def cpu_steps(transform):
    """The steps of a v2.Compose by type."""
    from torchvision.transforms import v2

    return {type(step): step for step in transform.transforms if not isinstance(step, v2.Compose)}


@pytest.mark.parametrize("recipe", [transforms.LIGHT, transforms.HEAVY])
def test_cpu_transform_and_device_augment_read_one_recipe(recipe):
    from torchvision.transforms import v2

    steps = cpu_steps(transforms.sample_transform(32, "cpu", recipe))
    crop = steps[v2.RandomResizedCrop]
    assert tuple(crop.scale) == recipe.scale and tuple(crop.ratio) == recipe.ratio
    assert (v2.RandomHorizontalFlip in steps) == recipe.flip
    if recipe.jitters:
        jitter = steps[v2.ColorJitter]
        assert jitter.brightness == (1 - recipe.brightness, 1 + recipe.brightness)
        assert jitter.saturation == (1 - recipe.saturation, 1 + recipe.saturation)
    else:
        assert v2.ColorJitter not in steps
    assert device_augment.DeviceAugment(32, recipe).recipe is recipe


def test_sample_transform_keeps_the_heavy_default_for_two_argument_callers():
    from torchvision.transforms import v2

    assert v2.ColorJitter in cpu_steps(transforms.sample_transform(32, "cpu"))
    assert device_augment.DeviceAugment(32).recipe == transforms.HEAVY


@pytest.mark.parametrize("flip_seed", range(3))
def test_cpu_and_device_paths_do_the_same_operations(flip_seed):
    """A crop of the whole image (scale 1, ratio 1) plus a flip: both sides can only give back the
    normalised image or its mirror, so their outputs must be one of those two."""
    recipe = transforms.AugmentRecipe(scale=(1.0, 1.0), ratio=(1.0, 1.0), flip=True)
    image = torch.randint(0, 256, (3, 16, 16), dtype=torch.uint8, generator=torch.Generator().manual_seed(0))
    normalised = transforms.eval_transform(16)(image)
    allowed = (normalised, normalised.flip(-1))
    torch.manual_seed(flip_seed)
    on_cpu = transforms.sample_transform(16, "cpu", recipe)(image)
    on_device = device_augment.DeviceAugment(16, recipe, seed=flip_seed)(image.unsqueeze(0))[0]
    for output in (on_cpu, on_device):
        assert any(torch.allclose(output, option, atol=1e-5) for option in allowed)
