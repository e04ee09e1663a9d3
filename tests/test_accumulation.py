"""Gradient accumulation: N scaled micro-batches equal one big batch without BatchNorm, not with it."""
import pytest
import torch


def small_net(batchnorm: bool):
    layers = [torch.nn.Conv2d(3, 8, 3, padding=1)]
    layers += [torch.nn.BatchNorm2d(8)] if batchnorm else []
    layers += [torch.nn.ReLU(), torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(8, 4)]
    return torch.nn.Sequential(*layers)


@pytest.mark.parametrize("steps", [2, 4])
def test_accumulated_gradients_equal_big_batch_without_batchnorm(steps):
    from course_lib.engine import accumulation

    torch.manual_seed(0)
    model, images, targets = small_net(False), torch.randn(16, 3, 8, 8), torch.randint(0, 4, (16,))
    loss = torch.nn.functional.cross_entropy
    big = accumulation.batch_gradients(model, loss, images, targets)
    accumulated = accumulation.accumulated_gradients(model, loss, images, targets, steps)
    assert accumulation.max_relative_difference(big, accumulated) < 1e-5
    # Forgetting the 1/steps scaling gives `steps` times the gradient: the comparison can fail.
    unscaled = {k: v * steps for k, v in accumulated.items()}
    assert accumulation.max_relative_difference(big, unscaled) > 0.5


def test_batchnorm_breaks_accumulation_equivalence():
    from course_lib.engine import accumulation

    torch.manual_seed(0)
    model, images, targets = small_net(True), torch.randn(16, 3, 8, 8), torch.randint(0, 4, (16,))
    loss = torch.nn.functional.cross_entropy
    big = accumulation.batch_gradients(model, loss, images, targets)
    accumulated = accumulation.accumulated_gradients(model, loss, images, targets, 4)
    assert accumulation.max_relative_difference(big, accumulated) > 1e-3


def test_accumulation_lowers_the_step_peak():
    # Activations dominate this net: 4 micro-batches of 4 images peak well below one batch of 16.
    from course_lib.engine import accumulation

    torch.manual_seed(0)
    model = small_net(False)
    big = accumulation.step_peak_bytes(model, micro_batch=16, accumulation_steps=1, image_size=32, num_classes=4)
    small = accumulation.step_peak_bytes(model, micro_batch=4, accumulation_steps=4, image_size=32, num_classes=4)
    assert 0 < small < 0.5 * big
