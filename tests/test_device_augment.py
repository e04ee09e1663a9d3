"""Per-batch augmentation on the device (`data.device_augment`) against torchvision per image: colour, flip, crop boxes, seeding, shapes."""
import pytest
import torch
from torchvision.transforms.v2 import functional as F

from course_lib.data import device_augment


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


@pytest.mark.cuda
def test_device_augment_runs_on_cuda():
    batch = torch.randint(0, 256, (4, 3, 32, 32), dtype=torch.uint8, device="cuda")
    assert device_augment.DeviceAugment(24, seed=0)(batch).device.type == "cuda"


def test_device_augment_refuses_wrong_shapes():
    with pytest.raises(ValueError, match="N x 3 x H x W"):
        device_augment.DeviceAugment(8)(torch.zeros(3, 8, 8))
