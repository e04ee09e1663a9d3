import pytest
import timm
import torch
from torch import nn

from course_lib.measure import memory


@pytest.mark.parametrize("optimizer, momentum, tensors, expected", [
    ("sgd", 0.9, 10, 4 * 1000),  # one momentum buffer
    ("sgd", 0.0, 10, 0),  # plain SGD keeps nothing
    ("adamw", 0.9, 10, 8 * 1000 + 4 * 10),  # exp_avg + exp_avg_sq, and a step scalar per tensor
])
def test_optimizer_state_closed_form(optimizer, momentum, tensors, expected):
    assert memory.optimizer_state_bytes(1000, optimizer, momentum, tensors) == expected


def test_unknown_optimizer_is_refused():
    with pytest.raises(ValueError, match="sgd, adamw"):
        memory.optimizer_state_bytes(10, "lamb")


def test_parameter_and_gradient_bytes_closed_form():
    linear = nn.Linear(10, 5)
    assert memory.parameter_bytes(linear) == (10 * 5 + 5) * 4
    assert memory.gradient_bytes(linear) == (10 * 5 + 5) * 4
    norm = nn.BatchNorm2d(8)  # 16 parameters, 16 fp32 running stats, one int64 counter
    assert memory.parameter_bytes(norm) == 16 * 4 + 16 * 4 + 8


@pytest.mark.parametrize("optimizer", ["sgd", "adamw"])
def test_optimizer_state_matches_torch_optim(optimizer):
    model = timm.create_model("test_resnet", num_classes=10)  # timm's tiny ResNet for tests
    opt = memory.make_optimizer(model, optimizer)
    model(torch.randn(2, 3, 32, 32)).sum().backward()
    opt.step()
    params = list(model.parameters())
    closed = memory.optimizer_state_bytes(sum(p.numel() for p in params), optimizer, 0.9, len(params))
    assert memory.measured_optimizer_state_bytes(opt) == closed


def test_activations_of_a_linear_layer_closed_form():
    # Linear saves its input (for the weight's gradient): 3*4*4 fp32 values per image, nothing fixed.
    model = nn.Sequential(nn.Flatten(), nn.Linear(3 * 4 * 4, 5))
    fixed, per_image = memory.measure_activations(model, image_size=4)
    assert per_image == 3 * 4 * 4 * 4
    assert fixed == 0
    estimate = memory.estimate_training_memory(model, batch_size=8, image_size=4, optimizer="adamw")
    params = 3 * 4 * 4 * 5 + 5
    assert estimate.breakdown() == {
        "parameters": params * 4, "gradients": params * 4, "optimizer_state": params * 8 + 2 * 4,
        "activations": 8 * 192, "input": 8 * 192, "total": params * 16 + 8 + 2 * 8 * 192}
    assert estimate.at_batch(16).activations_bytes == 16 * 192


def test_meta_device_estimate_halves_activations_in_half_precision():
    model = timm.create_model("test_resnet", num_classes=10)
    _, fp32_per_image = memory.measure_activations(model, 64, "off", device="meta")
    fixed16, fp16_per_image = memory.measure_activations(model, 64, "fp16", device="meta")
    # Float activations halve; max-pool's int64 indices do not, so a bit more than half remains.
    assert 0.45 < fp16_per_image / fp32_per_image < 0.6
    assert fixed16 >= 2 * memory.parameter_count(model)  # autocast's fp16 weight copies
    _, real_per_image = memory.measure_activations(model, 64, "off", device="cpu")
    assert real_per_image == pytest.approx(fp32_per_image, rel=0.02)  # shapes alone give the same bytes


def test_probe_optimizer_is_the_training_one():
    # The same weight-decay groups as schedule.make_optimizer (what train.fit uses).
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4))
    decayed, plain = memory.make_optimizer(model, "sgd", momentum=0.8, weight_decay=1e-4).param_groups
    assert decayed["momentum"] == 0.8 and len(decayed["params"]) == 1 and len(plain["params"]) == 3
    assert decayed["weight_decay"] == 1e-4 and plain["weight_decay"] == 0.0
    # Off by default: the probe then measures the estimate's four sources and no decay temporary.
    assert {group["weight_decay"] for group in memory.make_optimizer(model).param_groups} == {0.0}


def test_with_optimizer_changes_only_the_state():
    model = nn.Sequential(nn.Flatten(), nn.Linear(48, 5))
    sgd = memory.estimate_training_memory(model, batch_size=4, image_size=4, optimizer="sgd")
    adamw = sgd.with_optimizer("adamw")
    assert adamw.optimizer_state_bytes == 245 * 8 + 2 * 4
    assert adamw.total_bytes - sgd.total_bytes == adamw.optimizer_state_bytes - sgd.optimizer_state_bytes
