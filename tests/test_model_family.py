"""Notebook 12's model-family comparison (`chapters.model_family`): the registered small ViT, the Pareto
front, the choice of models, the shared schedule, the runs (a diverged one kept), the table and the two
§5.1 claims decided from planted runs."""
from types import SimpleNamespace

import pytest
import timm
import torch
from conftest import TensorImages, tiny_config

from course_lib.analysis import claims
from course_lib.chapters import model_family
from course_lib.config import make_config
from course_lib.data.datasets import DataBundle
from course_lib.engine import speedrun
from course_lib.engine.loss_guard import NonFiniteLossError
from course_lib.models import small_vit


def test_the_small_vit_is_registered_with_the_documented_size_and_takes_any_multiple_of_8():
    model = timm.create_model("vit_tiny_patch8_64", num_classes=10)
    assert sum(p.numel() for p in model.parameters()) == 5_390_410
    assert "5,390,410" in small_vit.__doc__
    assert model(torch.randn(2, 3, 64, 64)).shape == (2, 10)
    assert model(torch.randn(1, 3, 32, 32)).shape == (1, 10)  # progressive resizing's small epochs
    with pytest.raises(ValueError, match="no pretrained weights"):
        timm.create_model("vit_tiny_patch8_64", pretrained=True)
    coarse = timm.create_model("vit_tiny_patch16_64", num_classes=10)
    assert sum(p.numel() for p in coarse.parameters()) == 5_491_786 and "5,491,786" in small_vit.__doc__
    assert coarse.patch_embed.grid_size == (4, 4) and model.patch_embed.grid_size == (8, 8)


@pytest.mark.parametrize("costs, scores, front", [
    ([1, 2, 3], [0.5, 0.6, 0.7], [True, True, True]),  # each buys accuracy with cost
    ([1, 2, 3], [0.7, 0.6, 0.8], [True, False, True]),  # the middle one is beaten by the cheaper, better first
    ([1, 1, 2], [0.5, 0.5, 0.4], [True, True, False]),  # ties dominate nobody; the last is worse and dearer
    ([2, 1], [0.9, 0.9], [False, True]),  # as accurate for less
])
def test_the_pareto_front_keeps_what_nothing_beats_on_both(costs, scores, front):
    assert model_family.pareto_front(costs, scores) == front


def test_models_per_profile_all_names_and_a_one_line_error():
    assert model_family.models_for("smoke") == list(model_family.MODELS["smoke"])
    assert "vit_tiny_patch16_64" in model_family.models_for("cpu") and "resnet18" in model_family.models_for("cpu")
    assert model_family.models_for("gpu", "all") == list(model_family.FAMILY)
    assert set(model_family.MODELS["gpu"]) == set(model_family.FAMILY)
    assert all(timm.is_model(name) for name in model_family.FAMILY)
    assert model_family.models_for("cpu", " resnet18, resnet50 ") == ["resnet18", "resnet50"]
    with pytest.raises(ValueError) as error:
        model_family.models_for("cpu", "resnet18,resnet_101")
    assert "'resnet_101' is not a timm model" in str(error.value) and "\n" not in str(error.value)
    with pytest.raises(ValueError, match="no model named"):
        model_family.models_for("cpu", " , ")


def test_every_family_trains_with_one_schedule_on_the_profiles_images():
    short = make_config("cpu", recipe="speedrun", max_train_images=2000, epochs=3, label_smoothing=0.1, tta_views=8)
    config = model_family.family_config(short, "cpu")
    assert (config.optimizer, config.lr, config.label_smoothing, config.tta_views) == ("adamw", 2e-3, 0.0, 1)
    assert (config.max_train_images, config.epochs) == (model_family.SIZES["cpu"]["images"], model_family.SIZES["cpu"]["epochs"])
    assert model_family.family_config(short, "gpu").max_train_images == 2000  # the ablation's, elsewhere
    assert model_family.family_config(short, "gpu").epochs == 3
    assert model_family.family_config(short, "cpu", epochs=6).epochs == 6
    assert model_family.family_config(short, "cpu", images=0).max_train_images == 0  # 0: all


def test_runs_share_the_data_and_a_diverged_model_is_kept_not_fatal(tmp_path, monkeypatch):
    bundle = DataBundle(TensorImages(48, 3, 16), TensorImages(24, 3, 16, seed=1), None, ["a", "b", "c"], "tensors")
    real_race = speedrun.race
    seen = []

    def race(config, **kwargs):
        seen.append(kwargs["bundle"])
        if config.model == "speedrun_resnet_tiny" and config.seed == 1:
            raise NonFiniteLossError("loss became nan at epoch 1, step 2\nlikely causes: ...")
        return real_race(config, **kwargs)

    monkeypatch.setattr(speedrun, "race", race)
    config = tiny_config(tmp_path, epochs=2, batch_size=16)
    runs = model_family.run_family(config, ["test_resnet", "speedrun_resnet_tiny"], [0, 1], bundle=bundle,
                                   progress=False)
    assert [(r.model, r.seed) for r in runs] == [("test_resnet", 0), ("test_resnet", 1),
                                                  ("speedrun_resnet_tiny", 0), ("speedrun_resnet_tiny", 1)]
    assert all(b is bundle for b in seen)
    assert runs[3].result is None and runs[3].reason == "loss became nan at epoch 1, step 2"
    row = runs[0].row()
    assert row["val loss"] > 0 and row["train loss"] > 0 and 0 <= row["val top-1"] <= 1
    assert row["parameters"] == sum(p.numel() for p in timm.create_model("test_resnet", num_classes=3).parameters())
    table = model_family.family_table(runs)
    assert table.loc["speedrun_resnet_tiny", "seeds"] == 1 and table.loc["speedrun_resnet_tiny", "diverged"] == 1
    assert table.loc["test_resnet", "seeds"] == 2
    assert table["front (seconds)"].any() and table["front (parameters)"].any()
    assert table.loc["test_resnet", "MFU"] > 0  # speed tables carry the model-FLOPs utilization


def _run(model, seed, top1, seconds=1.0, parameters=1_000_000, val_loss=1.0, train_loss=1.0):
    curve = [{"val_loss": val_loss, "train_loss": train_loss}]
    result = SimpleNamespace(val_top1=top1, curve=curve, seconds=seconds, images_per_second=100.0)
    return model_family.FamilyRun(model, seed, result, parameters)


def _pairs(gains, small="resnet18", big="resnet50"):
    """Runs of `small` and `big` over seeds, `big` ahead by gains[seed]."""
    base = [0.80, 0.82, 0.81, 0.79]
    return [run for seed, gain in enumerate(gains) for run in (
        _run(small, seed, base[seed], seconds=10.0, parameters=11_000_000),
        _run(big, seed, base[seed] + gain, seconds=30.0, parameters=23_000_000))]


def _verdict(runs, key):
    return next(c for c in model_family.claims(runs, hardware="test machine") if c.key == key)


@pytest.mark.parametrize("gains, verdict", [
    ([0.001, 0.002, 0.0, 0.001], claims.HOLDS),  # a tenth of a point, tightly: not much better
    ([0.05, 0.051, 0.049, 0.05], claims.REFUTED),  # five points, tightly: much better
    ([0.0, 0.06, -0.03, 0.04], claims.NOT_SHOWN),  # the interval straddles one point
])
def test_bigger_model_verdict_follows_the_paired_gain_against_one_point(gains, verdict):
    found = _verdict(_pairs(gains), "bigger_model_not_better")
    assert found.verdict == verdict
    assert "resnet50 vs resnet18" in found.reason and "3.0x the seconds" in found.reason


def test_model_family_claims_not_measurable_without_their_models():
    runs = [_run("speedrun_resnet_tiny", seed, 0.5) for seed in range(3)]
    assert _verdict(runs, "bigger_model_not_better").verdict == claims.NOT_MEASURABLE
    assert _verdict(runs, "vit_overfits_small_data").verdict == claims.NOT_MEASURABLE


@pytest.mark.parametrize("vit_gap, verdict", [([0.5, 0.6, 0.55], claims.HOLDS), ([-0.3, -0.35, -0.32], claims.REFUTED),
                                              ([0.2, -0.2, 0.05], claims.NOT_SHOWN)])
def test_the_vit_overfits_when_its_loss_gap_exceeds_the_convnets(vit_gap, verdict):
    runs = []
    for seed, gap in enumerate(vit_gap):
        runs.append(_run("resnet18", seed, 0.8, val_loss=0.6, train_loss=0.5))  # a gap of 0.1
        runs.append(_run("vit_tiny_patch8_64", seed, 0.7, val_loss=0.6 + gap, train_loss=0.5))
    found = _verdict(runs, "vit_overfits_small_data")
    assert found.verdict == verdict
    assert found.measured == pytest.approx(sum(vit_gap) / 3)
    assert "val top-1 70.0% against 80.0%" in found.reason


def test_both_claims_are_accuracy_claims_of_notebook_12():
    assert {"bigger_model_not_better", "vit_overfits_small_data"} <= set(claims.ACCURACY_CLAIMS["12"])
    assert claims.article_claim("bigger_model_not_better").notebook == "12"
