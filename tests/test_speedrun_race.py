"""The time-to-accuracy race: its clock, its curve and its milestones."""
import time

import pytest
from conftest import TensorImages, tiny_config

from course_lib.data.datasets import DataBundle
from course_lib.engine import speedrun


def test_the_clock_pauses_while_measuring():
    clock = speedrun.Clock()
    with clock.paused():
        time.sleep(0.2)
    assert clock.seconds() < 0.15 and clock.excluded >= 0.2


def test_a_race_records_a_curve_milestones_and_a_ledger_row(tmp_path):
    from course_lib import ledger

    bundle = DataBundle(TensorImages(64, 3, 16), TensorImages(32, 3, 16, seed=1), TensorImages(16, 3, 16, seed=2),
                        ["a", "b", "c"], "tensors")
    result = speedrun.race(tiny_config(tmp_path, epochs=3, batch_size=16, tta_views=2), bundle=bundle,
                           label="tiny", progress=False, verbose=False)
    assert [p["epoch"] for p in result.curve] == [1, 2, 3]
    assert all(b["seconds"] >= a["seconds"] for a, b in zip(result.curve, result.curve[1:]))
    assert 0 <= result.val_top1 <= 1 and result.test_top1 is not None
    first = next((p["seconds"] for p in result.curve if p["val_top1"] >= 0.0), None)
    assert result.time_to(0.0) == first and result.time_to(1.01) is None
    row = ledger.Ledger().rows(kind="speedrun")[0]
    assert row["name"] == "tiny" and len(row["metrics"]["curve"]) == 3


def test_a_budget_stops_at_the_step_that_passes_it(tmp_path):
    bundle = DataBundle(TensorImages(64, 3, 16), TensorImages(32, 3, 16, seed=1), None, ["a", "b", "c"], "tensors")
    config = tiny_config(tmp_path, epochs=5, batch_size=8)
    result = speedrun.race(config, bundle=bundle, budget_seconds=0.0, progress=False, verbose=False, record=False)
    assert len(result.curve) == 1  # a zero budget is spent after the first optimizer step...
    assert result.curve[0]["epoch"] == pytest.approx(1 / (64 // 8))  # ...one eighth of the first epoch
    assert result.row()["epochs"] == 1 and result.row()["s to 97%"] is None
    long = speedrun.race(config, bundle=bundle, budget_seconds=None, progress=False, verbose=False, record=False)
    assert [p["epoch"] for p in long.curve] == [1, 2, 3, 4, 5]


def test_the_race_table_puts_mfu_beside_each_racers_speed(tmp_path, monkeypatch):
    from course_lib.chapters import time_to_accuracy
    from course_lib.measure import flops, peak

    bundle = DataBundle(TensorImages(64, 3, 16), TensorImages(32, 3, 16, seed=1), None, ["a", "b", "c"], "tensors")
    result = speedrun.race(tiny_config(tmp_path, epochs=1), bundle=bundle, progress=False, verbose=False, record=False)
    assert result.num_classes == 3
    monkeypatch.setattr(peak, "peak_flops", lambda device, dtype: 1e12)  # a known peak: 1 TFLOP/s
    table = time_to_accuracy.race_table([result])
    import timm

    per_image = flops.training_flops_per_image(timm.create_model(result.config.model, num_classes=3),
                                               result.config.image_size)
    assert table.loc[result.label, "MFU"] == pytest.approx(per_image * result.images_per_second / 1e12)


def _result(label, curve, images_per_second=100.0, val_top1=None, val_images=4050):
    from course_lib.config import make_config

    return speedrun.RaceResult(label, make_config("smoke"), [{"seconds": s, "val_top1": a} for s, a in curve], 0.0,
                               curve[-1][0], val_top1 if val_top1 is not None else curve[-1][1], None, "off",
                               images_per_second, 10, val_images)


def test_racers_are_compared_at_the_same_clock():
    from course_lib.chapters import time_to_accuracy

    fast = _result("fast", [(20, 0.5), (40, 0.8), (80, 0.9), (160, 0.96)])
    slow = _result("slow", [(40, 0.2), (76, 0.3)])  # passed its 75 s budget by the step in flight
    assert time_to_accuracy.top1_at(fast, 75) == 0.8 and time_to_accuracy.top1_at(slow, 75) == 0.3
    assert time_to_accuracy.top1_at(fast, 10) is None


def test_ablation_changes_are_paired_by_seed():
    from course_lib.chapters import time_to_accuracy

    def runs(accuracies):
        return [_result("r", [(1, a)]) for a in accuracies]

    table = time_to_accuracy.ablation_table([
        time_to_accuracy.Ablation("full recipe", {}, runs([0.80, 0.70, 0.75])),
        # the same seeds' luck, 5 points lower each: beyond noise when paired, not by the spread alone
        time_to_accuracy.Ablation("label smoothing", {"label_smoothing": 0.0}, runs([0.75, 0.65, 0.70])),
        time_to_accuracy.Ablation("warm-up", {"warmup_epochs": 0.0}, runs([0.82, 0.68, 0.76]))])
    assert table.loc["label smoothing", "change vs full"] == pytest.approx(-0.05)
    assert table.loc["label smoothing", "verdict"] == "worse" and table.loc["label smoothing", "beyond noise"]
    assert table.loc["warm-up", "verdict"] == "within noise" and not table.loc["warm-up", "beyond noise"]
    assert table.loc["full recipe", "change vs full"] == 0.0
    assert list(table.columns).index("MFU") == list(table.columns).index("images/s mean") + 1
    assert table["MFU"].gt(0).all()


def test_the_reference_claims_from_a_race(monkeypatch):
    from course_lib.analysis import claims
    from course_lib.chapters import time_to_accuracy

    monkeypatch.setattr(claims, "_hardware", lambda: "test machine")
    default = _result("workbook default", [(75, 0.4)], images_per_second=20.0)
    speed = _result("speed-run recipe", [(100, 0.9), (200, 0.975)], images_per_second=800.0, val_top1=0.978)
    found = {c.key: c for c in time_to_accuracy.claims_table([default, speed], 210.0)}
    assert found["eurosat_finetuned_reference"].verdict == claims.REFUTED  # 97.8% [97.3, 98.2] < 98.57
    assert "whole interval is below 98.57%" in found["eurosat_finetuned_reference"].reason
    assert found["eurosat_scratch_reference"].verdict == claims.HOLDS
    assert "at or above 97.23%" in found["eurosat_scratch_reference"].reason
    close = _result("speed-run recipe", [(100, 0.9), (200, 0.985)], images_per_second=800.0, val_top1=0.9857)
    near = {c.key: c for c in time_to_accuracy.claims_table([default, close], 210.0)}
    assert near["eurosat_finetuned_reference"].verdict == claims.NOT_SHOWN  # the interval straddles 98.57%
    assert "contains 98.57%" in near["eurosat_finetuned_reference"].reason
    assert found["speedrun_97_in_10_minutes"].verdict == claims.HOLDS and "200 s" in found[
        "speedrun_97_in_10_minutes"].reason
    assert found["airbench_pipeline"].verdict == claims.HOLDS
    short = _result("speed-run recipe", [(100, 0.9), (200, 0.95)], images_per_second=800.0)
    unreached = {c.key: c for c in time_to_accuracy.claims_table([default, short], 210.0)}
    assert unreached["speedrun_97_in_10_minutes"].verdict == claims.NOT_MEASURABLE
    assert "bench_speedrun" in unreached["speedrun_97_in_10_minutes"].reason


def test_the_ablation_scores_every_run_on_the_same_validation_subset(tmp_path):
    from course_lib.chapters import time_to_accuracy
    from course_lib.config import SAMPLE_DATA_DIR

    config = tiny_config(tmp_path, data_dir=SAMPLE_DATA_DIR, max_train_images=32, max_steps=1)
    ablations = time_to_accuracy.ablate(config, [0], ["label smoothing", "pre-decoded cache"],
                                        validation_per_class=2)
    assert [a.ingredient for a in ablations] == ["full recipe", "label smoothing", "pre-decoded cache"]
    classes = ablations[0].results[0].num_classes
    assert {a.results[0].val_images for a in ablations} == {2 * classes}


def test_a_point_with_a_fractional_epoch_prints_as_workbook_speedrun_shows_it():
    # A budget ends epochs early: the curve counts fractions, which once crashed both printers.
    line = speedrun.format_point({"seconds": 12.345, "epoch": 2.125, "val_top1": 0.9712, "images_per_second": 1420.4,
                                  "data_wait_fraction": 0.01})
    assert line.split() == ["12.3", "s", "epoch", "2.12", "val", "top-1", "97.12%", "1420", "images/s", "data",
                            "wait", "1%"]


def _seeded(top1s, tta, seconds, reached):
    from course_lib.config import make_config

    results = []
    for seed, (single, with_tta, total, at) in enumerate(zip(top1s, tta, seconds, reached)):
        curve = [{"seconds": at if at is not None else total, "val_top1": 0.97 if at is not None else 0.5},
                 {"seconds": total, "val_top1": single}]
        results.append(speedrun.RaceResult("r", make_config("smoke", seed=seed, tta_views=8), curve, 1.0, total,
                                           with_tta, None, "off", 100.0))
    return results


def test_the_seed_summary_keeps_tta_apart_and_gives_t_intervals():
    from scipy import stats

    results = _seeded([0.97, 0.96, 0.98], [0.97, 0.98, 0.99], [100.0, 110.0, 120.0], [80.0, None, 90.0])
    summary = speedrun.seed_summary(results)
    half = stats.t.ppf(0.975, 2) * 0.01 / 3 ** 0.5  # std of (0.97, 0.96, 0.98) is 0.01
    assert summary["top1"]["mean"] == pytest.approx(0.97)
    assert summary["top1"]["low"] == pytest.approx(0.97 - half) and summary["top1"]["high"] == pytest.approx(0.97 + half)
    assert summary["top1_tta"]["mean"] == pytest.approx(0.98) and summary["top1_tta"]["high"] <= 1.0
    assert summary["reached_target"] == 2 and summary["seconds_to_target"]["mean"] == pytest.approx(85.0)
    lines = "\n".join(speedrun.summary_lines(summary))
    assert "1 view" in lines and "8 views (TTA)" in lines and "reached by 2 of 3" in lines


def test_the_speedrun_command_runs_to_its_summary_line(tmp_path, monkeypatch, capsys):
    from course_lib import cli

    monkeypatch.chdir(tmp_path)  # a ledger and checkpoints of its own
    code = cli.main(["speedrun", "--profile", "smoke", "--no-progress", "--seeds", "2", "-p", "epochs=2",
                     "-p", f"output_dir={tmp_path / 'ck'}"])
    lines = capsys.readouterr().out.strip().splitlines()
    assert code == 0
    assert any(line.startswith("seed 1 ") and "epoch  2.00" in line for line in lines)
    assert lines[-1].lstrip().startswith("seconds in all")
