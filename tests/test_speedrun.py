"""The speed-run network (`models.speedrun`: registered with timm, the documented size, timm's head
interface) and the race against the clock (`engine.speedrun`, here `race`: its clock, curve, milestones,
budget and seed summary)."""
import time

import pytest
import timm
import torch
from conftest import TensorImages, tiny_config

from course_lib.config import make_config
from course_lib.data.datasets import DataBundle
from course_lib.engine import speedrun as race
from course_lib.models import factory, speedrun


@pytest.mark.slow
def test_building_by_name_registers_it_without_importing_the_module_first():
    """A fresh interpreter that only asks the factory for the model by name (as `workbook train` does)."""
    import subprocess
    import sys

    code = ("from course_lib.config import make_config; from course_lib.models import factory; "
            "print(type(factory.build_model(make_config('smoke', model='speedrun_resnet_small'), 3)).__name__)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.stdout.strip() == "SpeedrunResNet", out.stderr[-500:]


def test_registered_with_timm_with_the_documented_parameter_count():
    assert timm.is_model("speedrun_resnet") and timm.is_model("speedrun_resnet_small")
    model = timm.create_model("speedrun_resnet", num_classes=10)
    assert sum(p.numel() for p in model.parameters()) == 1_941_066  # stated in the module docstring
    assert "1,941,066" in speedrun.__doc__
    small = timm.create_model("speedrun_resnet_small", num_classes=10)
    assert sum(p.numel() for p in small.parameters()) == 486_698
    tiny = timm.create_model("speedrun_resnet_tiny", num_classes=10)
    assert sum(p.numel() for p in tiny.parameters()) == 122_394  # 0.12 M, as its docstring says


def test_forward_shapes_and_head_interface():
    model = timm.create_model("speedrun_resnet_small", num_classes=7)
    images = torch.randn(2, 3, 64, 64)
    assert model(images).shape == (2, 7)
    assert model.forward_features(images).shape == (2, 128, 4, 4)
    assert model.get_classifier() is model.fc
    model.reset_classifier(3)
    assert model(images).shape == (2, 3) and model.num_classes == 3
    assert model(torch.randn(1, 3, 32, 32)).shape == (1, 3)  # any size divisible by 16


def test_the_engine_builds_it_by_name():
    config = make_config("smoke", model="speedrun_resnet_small")
    assert factory.build_model(config, 4)(torch.randn(1, 3, 32, 32)).shape == (1, 4)


def test_the_clock_pauses_while_measuring():
    clock = race.Clock()
    with clock.paused():
        time.sleep(0.2)
    assert clock.seconds() < 0.15 and clock.excluded >= 0.2


def test_a_race_records_a_curve_milestones_and_a_ledger_row(tmp_path):
    from course_lib import ledger

    bundle = DataBundle(TensorImages(64, 3, 16), TensorImages(32, 3, 16, seed=1), TensorImages(16, 3, 16, seed=2),
                        ["a", "b", "c"], "tensors")
    result = race.race(tiny_config(tmp_path, epochs=3, batch_size=16, tta_views=2), bundle=bundle,
                           label="tiny", progress=False, verbose=False)
    assert [p["epoch"] for p in result.curve] == [1, 2, 3]
    assert all(p["val_loss"] > 0 for p in result.curve)  # notebook 12's loss gap (validation minus training)
    assert all(b["seconds"] >= a["seconds"] for a, b in zip(result.curve, result.curve[1:]))
    assert 0 <= result.val_top1 <= 1 and result.test_top1 is not None
    first = next((p["seconds"] for p in result.curve if p["val_top1"] >= 0.0), None)
    assert result.time_to(0.0) == first and result.time_to(1.01) is None
    row = ledger.Ledger().rows(kind="speedrun")[0]
    assert row["name"] == "tiny" and len(row["metrics"]["curve"]) == 3
    assert row["metrics"]["val_images"] == 32  # the count Newcombe's interval needs (`workbook compare`)


def test_a_fixed_length_run_can_validate_only_at_its_end(tmp_path):
    bundle = DataBundle(TensorImages(64, 3, 16), TensorImages(32, 3, 16, seed=1), None, ["a", "b", "c"], "tensors")
    config = tiny_config(tmp_path, epochs=3, batch_size=16)
    every = race.race(config, bundle=bundle, progress=False, verbose=False, record=False)
    last = race.race(config, bundle=bundle, progress=False, verbose=False, record=False, every_epoch=False)
    assert [p["epoch"] for p in last.curve] == [3]
    # The same seed trains the same weights: skipping the measurements changes nothing but the clock.
    assert last.curve[0]["val_top1"] == every.curve[-1]["val_top1"]
    assert last.curve[0]["val_loss"] == pytest.approx(every.curve[-1]["val_loss"])


def test_a_budget_stops_at_the_step_that_passes_it(tmp_path):
    bundle = DataBundle(TensorImages(64, 3, 16), TensorImages(32, 3, 16, seed=1), None, ["a", "b", "c"], "tensors")
    config = tiny_config(tmp_path, epochs=5, batch_size=8)
    result = race.race(config, bundle=bundle, budget_seconds=0.0, progress=False, verbose=False, record=False)
    assert len(result.curve) == 1  # a zero budget is spent after the first optimizer step...
    assert result.curve[0]["epoch"] == pytest.approx(1 / (64 // 8))  # ...one eighth of the first epoch
    assert result.row()["epochs"] == 1 and result.row()["s to 97%"] is None
    long = race.race(config, bundle=bundle, budget_seconds=None, progress=False, verbose=False, record=False)
    assert [p["epoch"] for p in long.curve] == [1, 2, 3, 4, 5]


def test_the_race_table_puts_mfu_beside_each_racers_speed(tmp_path, monkeypatch):
    from course_lib.chapters import time_to_accuracy
    from course_lib.measure import flops, peak

    bundle = DataBundle(TensorImages(64, 3, 16), TensorImages(32, 3, 16, seed=1), None, ["a", "b", "c"], "tensors")
    result = race.race(tiny_config(tmp_path, epochs=1), bundle=bundle, progress=False, verbose=False, record=False)
    assert result.num_classes == 3
    monkeypatch.setattr(peak, "peak_flops", lambda device, dtype: 1e12)  # a known peak: 1 TFLOP/s
    table = time_to_accuracy.race_table([result])
    import timm

    per_image = flops.training_flops_per_image(timm.create_model(result.config.model, num_classes=3),
                                               result.config.image_size)
    # The table rounds MFU to a hundredth of a percent (time_to_accuracy.rounded).
    assert table.loc[result.label, "MFU"] == pytest.approx(per_image * result.images_per_second / 1e12, abs=5e-5)


def test_a_point_with_a_fractional_epoch_prints_as_workbook_speedrun_shows_it():
    # A budget ends epochs early: the curve counts fractions, which once crashed both printers.
    line = race.format_point({"seconds": 12.345, "epoch": 2.125, "val_top1": 0.9712, "images_per_second": 1420.4,
                                  "data_wait_fraction": 0.01})
    assert line.split() == ["12.3", "s", "epoch", "2.12", "val", "top-1", "97.12%", "1420", "images/s", "data",
                            "wait", "1%"]


def _seeded(top1s, tta, seconds, reached):
    from course_lib.config import make_config

    results = []
    for seed, (single, with_tta, total, at) in enumerate(zip(top1s, tta, seconds, reached)):
        curve = [{"seconds": at if at is not None else total, "val_top1": 0.97 if at is not None else 0.5},
                 {"seconds": total, "val_top1": single}]
        results.append(race.RaceResult("r", make_config("smoke", seed=seed, tta_views=8), curve, 1.0, total,
                                           with_tta, None, "off", 100.0))
    return results


def test_the_seed_summary_keeps_tta_apart_and_gives_t_intervals():
    from scipy import stats

    results = _seeded([0.97, 0.96, 0.98], [0.97, 0.98, 0.99], [100.0, 110.0, 120.0], [80.0, None, 90.0])
    summary = race.seed_summary(results)
    half = stats.t.ppf(0.975, 2) * 0.01 / 3 ** 0.5  # std of (0.97, 0.96, 0.98) is 0.01
    assert summary["top1"]["mean"] == pytest.approx(0.97)
    assert summary["top1"]["low"] == pytest.approx(0.97 - half) and summary["top1"]["high"] == pytest.approx(0.97 + half)
    assert summary["top1_tta"]["mean"] == pytest.approx(0.98) and summary["top1_tta"]["high"] <= 1.0
    assert summary["reached_target"] == 2 and summary["seconds_to_target"]["mean"] == pytest.approx(85.0)
    lines = "\n".join(race.summary_lines(summary))
    assert "1 view" in lines and "8 views (TTA)" in lines and "reached by 2 of 3" in lines


def test_the_seed_summary_gives_top5_beside_top1_on_both_splits_and_a_race_keeps_it(tmp_path):
    results = _seeded([0.97, 0.96, 0.98], [0.97, 0.98, 0.99], [100.0, 110.0, 120.0], [80.0, None, 90.0])
    for result, top5 in zip(results, (0.99, 1.0, 0.995)):
        result.val_top5, result.test_top1, result.test_top5 = top5, result.val_top1 - 0.01, top5 - 0.01
    summary = race.seed_summary(results, target=0.8743)
    assert summary["top5"]["mean"] == pytest.approx(0.995) and summary["top5"]["high"] <= 1.0
    assert summary["test_top5"]["mean"] == pytest.approx(0.985) and summary["test_top5"]["runs"] == 3
    lines = "\n".join(race.summary_lines(summary))
    assert "final top-5, 8 views" in lines and "test split top-5, 8 views" in lines and "seconds to 87.43%" in lines
    assert race.seed_summary(results[:1])["top5"]["low"] is None  # one run: its value, no interval
    # a race on the committed sample (it has a test split) scores top-5 on validation and test alike
    from course_lib.config import make_config

    config = make_config("smoke", max_steps=1, output_dir=str(tmp_path / "ck"))
    result = race.race(config, progress=False, verbose=False, record=False)
    assert result.val_top1 <= result.val_top5 <= 1.0 and result.test_top1 <= result.test_top5 <= 1.0


@pytest.mark.slow
def test_the_speedrun_command_runs_to_its_summary_line(tmp_path, monkeypatch, capsys):
    from course_lib import cli

    monkeypatch.chdir(tmp_path)  # a ledger and checkpoints of its own
    code = cli.main(["speedrun", "--profile", "smoke", "--no-progress", "--seeds", "2", "-p", "epochs=2",
                     "-p", f"output_dir={tmp_path / 'ck'}"])
    lines = capsys.readouterr().out.strip().splitlines()
    assert code == 0
    assert any(line.startswith("seed 1 ") and "epoch  2.00" in line for line in lines)
    assert lines[-1].lstrip().startswith("seconds in all")


@pytest.mark.parametrize("budget", ["-1", "-0.5", "nan", "inf"])
def test_a_budget_that_is_no_number_of_seconds_is_one_line_before_any_data(tmp_path, monkeypatch, capsys,
                                                                                    budget):
    """`--budget-seconds -1` once stopped after one step and exited 0, and nan was ignored (issue 49)."""
    from course_lib import cli
    from course_lib.data import pipeline

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(pipeline, "build_datasets", lambda *a, **k: pytest.fail("data built before the check"))
    code = cli.main(["speedrun", "--profile", "smoke", "--no-progress", "--budget-seconds", budget])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "--budget-seconds must be a finite number of seconds, 0 or more" in err[0]


def _activations(model) -> set:
    return {type(module).__name__ for module in model.modules() if isinstance(module, (torch.nn.GELU, torch.nn.ReLU))}


@pytest.mark.parametrize("activation, expected", [("", {"GELU"}), ("gelu", {"GELU"}), ("relu", {"ReLU"})])
def test_the_activation_field_sets_every_activation_of_the_net(activation, expected):
    model = factory.build_model(make_config("smoke", model="speedrun_resnet_tiny", activation=activation), 3)
    assert _activations(model) == expected
    assert sum(isinstance(m, (torch.nn.GELU, torch.nn.ReLU)) for m in model.modules()) == 1 + 3 * 3  # stem, 3 groups x 3


def test_the_default_activation_is_unchanged_and_the_weights_fit_either_way():
    from course_lib.config import ACTIVATION_MODELS

    assert make_config("smoke").activation == ""
    assert all(timm.is_model(name) for name in ACTIVATION_MODELS)
    relu = factory.build_model(make_config("smoke", model="speedrun_resnet_tiny", activation="relu"), 3)
    relu.load_state_dict(timm.create_model("speedrun_resnet_tiny", num_classes=3).state_dict())  # no new weights


def test_a_model_that_builds_its_own_activation_refuses_the_field_in_one_line():
    from course_lib.config import ConfigError

    with pytest.raises(ConfigError, match=r"activation must be \"\" with model=resnet18") as error:
        make_config("smoke", model="resnet18", activation="relu")
    assert "speedrun_resnet_tiny" in str(error.value) and "\n" not in str(error.value)
    with pytest.raises(ConfigError, match="activation='swish' is not one of \"\", relu, gelu"):
        make_config("smoke", model="speedrun_resnet_tiny", activation="swish")
