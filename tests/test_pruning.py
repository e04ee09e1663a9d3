"""Pruning: the sparsity asked for is the sparsity obtained; channel pruning really shrinks the model."""
import pytest
import timm
import torch

from course_lib.deploy import pruning


@pytest.mark.parametrize("sparsity", [0.0, 0.3, 0.7, 0.9])
def test_unstructured_pruning_reaches_the_requested_sparsity(sparsity):
    model = timm.create_model("test_resnet", num_classes=4)
    pruning.prune_unstructured(model, sparsity)
    assert pruning.weight_sparsity(model) == pytest.approx(sparsity, abs=1e-3)
    pruning.make_permanent(model)
    assert not any(name.endswith("_orig") for name, _ in model.named_parameters())
    assert pruning.weight_sparsity(model) == pytest.approx(sparsity, abs=1e-3)


@pytest.mark.parametrize("channels_last", [False, True])
def test_pruned_weights_stay_zero_through_an_optimizer_step(channels_last):
    model = timm.create_model("test_resnet", num_classes=4)
    if channels_last:  # the cpu and gpu profiles train in NHWC
        model = model.to(memory_format=torch.channels_last)
    pruning.prune_unstructured(model, 0.5)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model(torch.randn(2, 3, 16, 16)).sum().backward()
    optimizer.step()
    model(torch.randn(2, 3, 16, 16))  # the mask is applied before each forward
    assert pruning.weight_sparsity(model) == pytest.approx(0.5, abs=1e-3)


def test_channel_pruning_removes_parameters_and_keeps_the_outputs():
    model = timm.create_model("test_resnet", num_classes=4).eval()
    before = sum(p.numel() for p in model.parameters())
    images = torch.randn(2, 3, 32, 32)
    pruning.prune_channels(model, 0.5, images)
    after = sum(p.numel() for p in model.parameters())
    assert after < 0.5 * before  # half the channels in and out of most layers: about a quarter remains
    assert model(images).shape == (2, 4)
    assert pruning.weight_sparsity(model) < 0.01  # no zeros: the channels are gone, not zeroed


def test_out_of_range_amounts_are_refused():
    model = timm.create_model("test_resnet", num_classes=4)
    with pytest.raises(ValueError, match="sparsity"):
        pruning.prune_unstructured(model, 1.0)
    with pytest.raises(ValueError, match="ratio"):
        pruning.prune_channels(model, -0.1, torch.randn(2, 3, 16, 16))
