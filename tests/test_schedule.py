"""Optimizers and the learning-rate schedules (warmup, then cosine, linear, constant, step or one-cycle):
the real schedulers against the closed forms, and each shape at known points."""
import math

import pytest
import torch

from course_lib.config import make_config
from course_lib.engine import schedule


def config_for(**overrides):
    values = dict(lr=0.1, min_lr=0.001, warmup_epochs=5.0, epochs=120, optimizer="sgd")
    values.update(overrides)
    return make_config(None, **values)


@pytest.mark.parametrize("lr_schedule", schedule.SCHEDULES)
@pytest.mark.parametrize("optimizer", ["sgd", "adamw"])
@pytest.mark.parametrize("warmup_epochs", [0.0, 2.0, 5.0])
def test_scheduler_follows_the_closed_form(optimizer, warmup_epochs, lr_schedule):
    config = config_for(optimizer=optimizer, warmup_epochs=warmup_epochs, epochs=12, lr_schedule=lr_schedule)
    values = schedule.schedule_values(config, steps_per_epoch=10)
    assert len(values) == 120
    expected = [schedule.learning_rate_at(step, config, 10) for step in range(120)]
    assert values == pytest.approx(expected, rel=1e-9, abs=1e-12)


def test_articles_recipe_at_known_points():
    # SGD lr 0.1 at batch 256, 5 warmup epochs, cosine to 0.001 over 120 epochs (10 steps per epoch here).
    config, steps = config_for(), 10
    warmup = 50
    assert schedule.learning_rate_at(0, config, steps) == pytest.approx(0.1 / 51)
    assert schedule.learning_rate_at(24, config, steps) == pytest.approx(0.1 * 25 / 51)
    assert schedule.learning_rate_at(warmup, config, steps) == pytest.approx(0.1)  # peak right after warmup
    middle = warmup + (1200 - warmup) // 2
    assert schedule.learning_rate_at(middle, config, steps) == pytest.approx((0.1 + 0.001) / 2)
    assert schedule.learning_rate_at(1200, config, steps) == pytest.approx(0.001)  # the floor at the end
    values = schedule.schedule_values(config, steps)
    assert max(values) == pytest.approx(0.1) and values.index(max(values)) == warmup
    assert values[-1] == pytest.approx(0.001 + (0.1 - 0.001) * (1 + math.cos(math.pi * 1149 / 1150)) / 2)


def test_no_warmup_starts_at_peak():
    config = config_for(warmup_epochs=0.0, epochs=2)
    assert schedule.schedule_values(config, 5)[0] == pytest.approx(0.1)


def test_optimizers_and_weight_decay_groups():
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4))
    sgd = schedule.make_optimizer(model, config_for(momentum=0.8, weight_decay=1e-4))
    assert isinstance(sgd, torch.optim.SGD) and sgd.param_groups[0]["momentum"] == 0.8
    decayed, plain = sgd.param_groups
    assert decayed["weight_decay"] == 1e-4 and len(decayed["params"]) == 1  # the conv weight only
    assert plain["weight_decay"] == 0.0 and len(plain["params"]) == 3  # conv bias, BN weight and bias
    adamw = schedule.make_optimizer(model, config_for(optimizer="adamw", lr=3e-4, min_lr=3e-6))
    assert isinstance(adamw, torch.optim.AdamW) and adamw.param_groups[0]["lr"] == 3e-4


def test_each_schedule_at_known_points():
    # 10 epochs x 10 steps, 2 warmup epochs: 20 warmup steps, 80 of decay, lr 0.1 down to 0.001.
    def values(name, **changes):
        return schedule.schedule_values(config_for(**{"epochs": 10, "warmup_epochs": 2.0, "lr_schedule": name,
                                                      **changes}), 10)

    linear = values("linear")
    assert linear[20] == pytest.approx(0.1) and linear[60] == pytest.approx((0.1 + 0.001) / 2)
    assert linear[99] == pytest.approx(0.1 + (0.001 - 0.1) * 79 / 80)  # one step short of the floor
    assert all(a > b for a, b in zip(linear[20:], linear[21:]))  # straight down, every step
    constant = values("constant")
    assert constant[:20] == linear[:20] and constant[20:] == pytest.approx([0.1] * 80)
    step = values("step")  # x0.1 at 50% and 75% of the 80 decay steps: steps 60 and 80
    assert step[59] == pytest.approx(0.1) and step[60] == pytest.approx(0.01) and step[79] == pytest.approx(0.01)
    assert step[80] == pytest.approx(0.001) and step[99] == pytest.approx(0.001)
    onecycle = values("onecycle")  # rises over the warmup's 20% of the run, from lr/25, then falls to lr/25e4
    assert onecycle[0] == pytest.approx(0.1 / 25) and max(onecycle) == pytest.approx(0.1)
    assert onecycle.index(max(onecycle)) == 19 and onecycle[-1] == pytest.approx(0.1 / 25 / 1e4)
    assert values("onecycle", warmup_epochs=0.0).index(0.1) == 29  # no warmup: torch's 30% rise


def test_onecycle_cycles_sgd_momentum_against_the_rate():
    config = config_for(epochs=4, warmup_epochs=1.0, lr_schedule="onecycle")
    optimizer = schedule.make_optimizer(torch.nn.Linear(2, 2), config)
    scheduler = schedule.make_scheduler(optimizer, config, 10)
    momenta = []
    for _ in range(40):
        momenta.append(optimizer.param_groups[0]["momentum"])
        optimizer.step()
        scheduler.step()
    assert momenta[0] == pytest.approx(0.95) and min(momenta) == pytest.approx(0.85)  # low momentum at the peak


def test_an_unknown_schedule_is_one_line_naming_the_choices():
    with pytest.raises(ValueError, match="lr_schedule.*cosine.*onecycle"):
        config_for(lr_schedule="exponential")


@pytest.mark.parametrize("values, world_size, expected", [
    ({"batch_size": 16}, 1, 6),  # 100 images, the last partial batch dropped
    ({"batch_size": 16, "accumulation_steps": 2}, 1, 3),
    ({"batch_size": 16}, 2, 3),  # each rank takes 50
    ({"batch_size": 16, "max_steps": 4}, 1, 4)])
def test_steps_per_epoch_is_the_engines_rule(values, world_size, expected):
    assert schedule.steps_per_epoch(100, make_config("smoke", **{"max_steps": 0, **values}), world_size) == expected


def test_steps_per_epoch_agrees_with_the_engines_loader(tmp_path):
    from conftest import TensorImages, tiny_config

    from course_lib.data.datasets import DataBundle
    from course_lib.engine import train

    config = tiny_config(tmp_path, batch_size=8, accumulation_steps=2)
    bundle = DataBundle(TensorImages(70), TensorImages(8, seed=1), None, ["a", "b", "c", "d"], "tensors")
    assert train.prepare(config, bundle=bundle).steps_per_epoch == schedule.steps_per_epoch(70, config) == 4
