"""Muon (engine/muon.py): the Newton-Schulz orthogonalisation against the SVD, one step against its closed form,
the parameter groups on the speed-run model, a step through the engine, and the schedule driving both groups."""
import pytest
import timm
import torch
from conftest import TensorImages, tiny_config

from course_lib.config import ConfigError, make_config
from course_lib.data.datasets import DataBundle
from course_lib.engine import schedule, train
from course_lib.engine.muon import Muon, muon_parameters, zeropower_newton_schulz


# Conv kernels' shapes (out x in*3*3) and a tall one. A square Gaussian matrix is left out: its smallest singular
# value is near 0 against its norm, and 5 steps cannot lift such a value into the band (nor does the reference).
@pytest.mark.parametrize("shape", [(32, 288), (64, 576), (128, 64), (288, 32)])
def test_newton_schulz_gives_singular_values_near_one_and_keeps_the_singular_vectors(shape):
    update = torch.randn(*shape, generator=torch.Generator().manual_seed(0))
    orthogonal = zeropower_newton_schulz(update, steps=5)
    singular_values = torch.linalg.svdvals(orthogonal)
    # The quintic trades exactness for speed: 5 steps leave every singular value in a band around 1.
    assert singular_values.min() > 0.6 and singular_values.max() < 1.25
    u, _, vh = torch.linalg.svd(update, full_matrices=False)
    cosine = torch.nn.functional.cosine_similarity(orthogonal.flatten(), (u @ vh).flatten(), dim=0)
    assert cosine.item() > 0.95
    assert orthogonal.shape == update.shape and orthogonal.dtype == update.dtype


def test_a_step_without_momentum_is_lr_times_the_orthogonalised_gradient():
    generator = torch.Generator().manual_seed(1)
    kernel = torch.nn.Parameter(torch.randn(8, 4, 3, 3, generator=generator))
    with torch.no_grad():  # already at the norm Muon holds kernels to, sqrt(out_channels): the step is all that moves
        kernel.mul_(8 ** 0.5 / kernel.norm())
    before = kernel.detach().clone()
    kernel.grad = torch.randn(8, 4, 3, 3, generator=generator)
    lr = 0.05
    Muon([{"params": [kernel], "muon": True}], lr=lr, momentum=0.0).step()
    expected = before - lr * zeropower_newton_schulz(kernel.grad.reshape(8, -1)).view(8, 4, 3, 3)
    assert kernel.detach().flatten().tolist() == pytest.approx(expected.flatten().tolist(), abs=1e-6)


def test_the_weights_are_renormalised_before_the_step():
    kernel = torch.nn.Parameter(torch.full((4, 2, 3, 3), 3.0))
    kernel.grad = torch.zeros_like(kernel)  # an orthogonalised zero is zero: only the renormalisation acts
    Muon([{"params": [kernel], "muon": True}], lr=0.1, momentum=0.9).step()
    assert kernel.norm().item() == pytest.approx(4 ** 0.5)


def test_the_other_groups_step_exactly_as_torch_sgd():
    generator = torch.Generator().manual_seed(2)
    ours, theirs = (torch.nn.Parameter(torch.randn(5, 3, generator=torch.Generator().manual_seed(3))) for _ in range(2))
    muon = Muon([{"params": [ours], "weight_decay": 0.01}], lr=0.1, momentum=0.9)
    sgd = torch.optim.SGD([{"params": [theirs], "weight_decay": 0.01}], lr=0.1, momentum=0.9)
    for _ in range(3):
        gradient = torch.randn(5, 3, generator=generator)
        ours.grad, theirs.grad = gradient.clone(), gradient.clone()
        muon.step()
        sgd.step()
    assert ours.detach().flatten().tolist() == pytest.approx(theirs.detach().flatten().tolist(), abs=1e-7)


def test_the_groups_split_the_speedrun_model_as_intended():
    model = timm.create_model("speedrun_resnet_small", num_classes=10)
    config = make_config("smoke", recipe="speedrun", optimizer="muon")
    optimizer = schedule.make_optimizer(model, config)
    decay, no_decay, kernels = optimizer.param_groups
    names = {id(p): name for name, p in model.named_parameters()}
    muon_names = {names[id(p)] for p in kernels["params"]}
    assert kernels["muon"] and kernels["lr"] == config.muon_lr and kernels["weight_decay"] == 0.0
    every_conv = {name for name, p in model.named_parameters() if p.ndim == 4}
    assert muon_names == every_conv - {"stem.0.weight"}  # the stem, which sees pixels, stays with SGD
    assert {names[id(p)] for p in decay["params"]} == {"stem.0.weight", "fc.weight"}
    assert not decay["muon"] and decay["lr"] == config.lr and decay["weight_decay"] == config.weight_decay
    assert all(p.ndim == 1 for p in no_decay["params"]) and no_decay["weight_decay"] == 0.0
    assert sum(len(g["params"]) for g in optimizer.param_groups) == len(list(model.parameters()))
    assert muon_parameters(model) == kernels["params"]


@pytest.mark.parametrize("lr_schedule", ["linear", "cosine", "onecycle"])
def test_the_schedule_drives_both_kinds_of_group(lr_schedule):
    model = timm.create_model("speedrun_resnet_small", num_classes=10)
    config = make_config("smoke", optimizer="muon", lr=0.2, muon_lr=0.02, warmup_epochs=1.0, epochs=3,
                         lr_schedule=lr_schedule)
    optimizer = schedule.make_optimizer(model, config)
    scheduler = schedule.make_scheduler(optimizer, config, steps_per_epoch=4)
    for step in range(12):
        expected = schedule.learning_rate_at(step, config, 4)
        assert optimizer.param_groups[0]["lr"] == pytest.approx(expected)
        assert optimizer.param_groups[2]["lr"] == pytest.approx(expected * 0.02 / 0.2)  # the same shape, its own peak
        optimizer.step()
        scheduler.step()


def test_one_training_step_through_fit_on_the_smoke_profile(tmp_path):
    config = tiny_config(tmp_path, model="speedrun_resnet_small", optimizer="muon", max_steps=1, image_size=32)
    bundle = DataBundle(TensorImages(16, size=32), TensorImages(8, size=32, seed=1), None, list("abcd"), "tensors")
    model = timm.create_model("speedrun_resnet_small", num_classes=4)
    start = {name: p.detach().clone() for name, p in model.named_parameters()}
    result = train.fit(config, bundle=bundle, model=model, progress=False, verbose=False)
    assert result.history[-1]["optimizer_steps"] == 1
    moved = {name for name, p in result.model.named_parameters() if not torch.equal(p.detach(), start[name])}
    assert "groups.0.widen.weight" in moved and "stem.0.weight" in moved


@pytest.mark.parametrize("values, field", [(dict(optimizer="adam"), "optimizer"), (dict(muon_lr=0.0), "muon_lr")])
def test_a_bad_value_is_refused_in_one_line_naming_the_field(values, field):
    with pytest.raises(ConfigError, match=field) as error:
        make_config("smoke", **values)
    assert "\n" not in str(error.value) and ("muon" in str(error.value) or field == "muon_lr")
