import pytest
import torch
from torchvision.transforms.v2 import functional as F

from course_lib.data import device_augment, transforms


@pytest.fixture
def images():
    return torch.rand(4, 3, 16, 20, generator=torch.Generator().manual_seed(0))


@pytest.mark.parametrize("ours,theirs", [
    (device_augment.adjust_brightness, F.adjust_brightness),
    (device_augment.adjust_contrast, F.adjust_contrast),
    (device_augment.adjust_saturation, F.adjust_saturation)])
def test_batched_colour_adjustments_match_torchvision_per_image(images, ours, theirs):
    factors = torch.tensor([0.6, 1.0, 1.3, 0.0])
    expected = torch.stack([theirs(image, float(f)) for image, f in zip(images, factors)])
    torch.testing.assert_close(ours(images, factors), expected, atol=1e-5, rtol=0)


def test_flip_with_certainty_and_never(images):
    assert torch.equal(device_augment.batch_flip_lr(images, p=1.0), images.flip(-1))
    assert torch.equal(device_augment.batch_flip_lr(images, p=0.0), images)


def test_full_image_box_reproduces_the_image(images):
    boxes = torch.tensor([[0.0, 0.0, 20.0, 16.0]] * 4)
    out = device_augment.batch_resized_crop(images[:, :, :, :16], torch.tensor([[0.0, 0.0, 16.0, 16.0]] * 4), 16)
    torch.testing.assert_close(out, images[:, :, :, :16], atol=1e-5, rtol=0)
    assert device_augment.batch_resized_crop(images, boxes, 8).shape == (4, 3, 8, 8)


def test_upscaling_crop_matches_torchvision_bilinear(images):
    box = torch.tensor([[4.0, 2.0, 12.0, 10.0]])  # x1, y1, x2, y2: an 8 x 8 crop
    ours = device_augment.batch_resized_crop(images[:1], box, 16)
    theirs = F.resized_crop(images[:1], top=2, left=4, height=8, width=8, size=[16, 16], antialias=False)
    # Inside the crop the two agree; on its outermost pixels roi_align blends in the neighbouring
    # image pixels where v2 (which crops first) repeats the crop's edge.
    torch.testing.assert_close(ours[..., 1:-1, 1:-1], theirs[..., 1:-1, 1:-1], atol=1e-5, rtol=0)


def test_crop_boxes_respect_scale_and_stay_inside():
    boxes = device_augment.random_crop_boxes(1000, 64, 48, scale=(0.3, 0.8), generator=torch.Generator().manual_seed(1))
    width, height = boxes[:, 2] - boxes[:, 0], boxes[:, 3] - boxes[:, 1]
    assert (boxes[:, :2] >= 0).all() and (boxes[:, 2] <= 48 + 1e-4).all() and (boxes[:, 3] <= 64 + 1e-4).all()
    assert (width * height / (64 * 48) <= 0.8 + 1e-4).all()


def test_device_augment_draws_per_image_parameters_and_is_seeded():
    batch = torch.randint(0, 256, (1, 3, 32, 32), dtype=torch.uint8).repeat(6, 1, 1, 1)
    out = device_augment.DeviceAugment(24, seed=3)(batch)
    assert out.shape == (6, 3, 24, 24) and out.dtype == torch.float32 and out.device == batch.device
    assert not torch.allclose(out[0], out[1])  # same input image, different augmentation
    torch.testing.assert_close(out, device_augment.DeviceAugment(24, seed=3)(batch))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_device_augment_runs_on_cuda():
    batch = torch.randint(0, 256, (4, 3, 32, 32), dtype=torch.uint8, device="cuda")
    assert device_augment.DeviceAugment(24, seed=0)(batch).device.type == "cuda"


def test_device_augment_refuses_wrong_shapes():
    with pytest.raises(ValueError, match="N x 3 x H x W"):
        device_augment.DeviceAugment(8)(torch.zeros(3, 8, 8))


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
