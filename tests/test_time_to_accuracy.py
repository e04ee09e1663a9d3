"""Notebook 12 (`chapters.time_to_accuracy`): racers compared at the same clock, the ablation paired by seed and scored on one validation subset, the reference claims."""
import types

import pytest
from conftest import tiny_config

from course_lib.analysis import statistics
from course_lib.engine import speedrun


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
    found = {c.key: c for c in time_to_accuracy.claims([default, speed], 210.0)}
    assert found["eurosat_finetuned_reference"].verdict == claims.REFUTED  # 97.8% [97.3, 98.2] < 98.57
    assert "whole interval is below 98.57%" in found["eurosat_finetuned_reference"].reason
    assert found["eurosat_scratch_reference"].verdict == claims.HOLDS
    assert "at or above 97.23%" in found["eurosat_scratch_reference"].reason
    close = _result("speed-run recipe", [(100, 0.9), (200, 0.985)], images_per_second=800.0, val_top1=0.9857)
    near = {c.key: c for c in time_to_accuracy.claims([default, close], 210.0)}
    assert near["eurosat_finetuned_reference"].verdict == claims.NOT_SHOWN  # the interval straddles 98.57%
    assert "contains 98.57%" in near["eurosat_finetuned_reference"].reason
    assert found["speedrun_97_in_10_minutes"].verdict == claims.HOLDS and "200 s" in found[
        "speedrun_97_in_10_minutes"].reason
    assert found["airbench_pipeline"].verdict == claims.HOLDS
    short = _result("speed-run recipe", [(100, 0.9), (200, 0.95)], images_per_second=800.0)
    unreached = {c.key: c for c in time_to_accuracy.claims([default, short], 210.0)}
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


@pytest.mark.parametrize("profile, expected", [("smoke", 2), ("cpu", -1), ("gpu", 0)])
def test_the_ablations_ingredients_follow_the_profile(profile, expected):
    from course_lib.chapters import time_to_accuracy

    expected = expected if expected > 0 else len(time_to_accuracy.ABLATIONS) + expected
    race = time_to_accuracy.RaceSetup(profile=profile, default=None, budget=1.0, rivals=1.0, seeds=1, hardware="test")
    chosen = race.ingredients("auto")
    assert len(chosen) == expected - (len(time_to_accuracy.CPU_LEAVES_OUT) - 1 if profile == "cpu" else 0)
    assert profile != "cpu" or not set(chosen) & set(time_to_accuracy.CPU_LEAVES_OUT)
    assert race.ingredients("all") == list(time_to_accuracy.ABLATIONS)
    assert race.ingredients(" a, b ,") == ["a", "b"]
    assert race.ingredients("+ Lookahead (k=5, alpha=0.5); warm-up") == ["+ Lookahead (k=5, alpha=0.5)", "warm-up"]
    assert race.device == "cpu" or profile == "gpu"


def test_every_ingredient_the_speed_run_recipe_adopts_has_its_ablation():
    """Issue 23: each idea the recipe adopts is a Config value with its ablation in notebook 12. Every value the
    recipe sets apart from the cpu profile is changed back by some ingredient, except the run's length."""
    from course_lib.chapters import time_to_accuracy
    from course_lib.config import RECIPES, make_config

    lengths = {"epochs", "max_train_images"}  # how long a run is, set by the profile or the ablation's own config
    profile = make_config("cpu")
    adopted = {name for name, value in RECIPES["speedrun"].items() if getattr(profile, name) != value} - lengths
    ablated = {name for changes in time_to_accuracy.ABLATIONS.values() for name in changes}
    assert adopted - ablated == set(), "give each an entry in time_to_accuracy.ABLATIONS"
    # speedrun2's own values over speedrun's too (muon_lr acts only under optimizer=muon: the Muon row's)
    quicker = {name for name, value in RECIPES["speedrun2"].items() if RECIPES["speedrun"].get(name) != value}
    assert quicker - lengths - {"muon_lr"} - ablated == set(), "give each an entry in time_to_accuracy.ABLATIONS"
    recipe = make_config("cpu", recipe="speedrun")
    no_ops = [name for name, changes in time_to_accuracy.ABLATIONS.items() if recipe.replace(**changes) == recipe]
    assert no_ops == [], "an ingredient whose changes leave the recipe as it is measures nothing"
    assert set(time_to_accuracy.CPU_LEAVES_OUT) <= set(time_to_accuracy.ABLATIONS)


def _bench_ablation():
    import importlib
    import sys

    from conftest import ROOT

    if str(ROOT / "benchmarks") not in sys.path:
        sys.path.insert(0, str(ROOT / "benchmarks"))
    return importlib.import_module("bench_ablation")


def test_the_ablation_benchmark_names_its_files_and_writes_its_table_in_points():
    import pandas as pd

    bench = _bench_ablation()
    assert bench.slug(["+ torch.compile (default mode)"]) == "torch-compile-default-mode"
    assert bench.slug(["ReLU (vs GELU)", "warm-up"]) == "relu-vs-gelu_warm-up"
    table = pd.DataFrame([{"without": "full recipe", "val top-1 mean": 0.9, "val top-1 std": 0.01, "seeds": 3,
                           "seconds mean": 60.0, "images/s mean": 800.0, "change vs full": 0.0,
                           "change low": None, "change high": None, "verdict": None},
                          {"without": "+ x", "val top-1 mean": 0.88, "val top-1 std": 0.02, "seeds": 3,
                           "seconds mean": 90.5, "images/s mean": 1200.4, "change vs full": -0.02,
                           "change low": -0.05, "change high": 0.01, "verdict": "within noise"}]).set_index("without")
    lines = bench.markdown_table(table)
    assert lines[0].startswith("| row | val top-1 mean |") and len(lines) == 4
    assert lines[3] == "| + x | 88.0% | 2.0% | 3 | 90.5 | 1200 | -2.0 | -5.0 | +1.0 | within noise |"
    assert "| - | - | - |" in lines[2]  # the full recipe's own change has no interval and no verdict


@pytest.mark.slow
def test_the_ablation_benchmark_races_each_seed_in_turn_and_states_the_warmup(tmp_path, isolated_ledger, capsys):
    import json

    bench = _bench_ablation()
    assert bench.main(["--profile", "smoke", "--ingredients", "ReLU (vs GELU)", "--seeds", "2", "--warmup",
                       "--out", str(tmp_path)]) == 0
    record = json.loads((tmp_path / "ablation_relu-vs-gelu.json").read_text())
    assert [(run["ingredient"], run["seed"]) for run in record["runs"]] == [
        ("full recipe", 0), ("full recipe", 1), ("ReLU (vs GELU)", 0), ("ReLU (vs GELU)", 1)]
    assert [w["ingredient"] for w in record["warmups"]] == ["ReLU (vs GELU)"]
    printed = capsys.readouterr().out
    assert printed.index("seed 0 ReLU") < printed.index("seed 1 full recipe")  # interleaved seed by seed
    markdown = (tmp_path / "ablation_relu-vs-gelu.md").read_text()
    assert "Warm-up race before the seeds" in markdown
    single = markdown[markdown.index("Single view"):].splitlines()
    relu = next(line for line in single if line.startswith("| ReLU (vs GELU) |"))
    assert relu.endswith(" of 2 |") and relu.count("|") == 9  # change paired by seed, seconds to 97%, reached
    assert printed.count("| full recipe |") >= 4  # the tables written (and printed) after each seed
    assert bench.main(["--profile", "smoke", "--ingredients", "ReLU (vs GELU)", "--seeds", "1", "--recipe-budget",
                       "--out", str(tmp_path / "budget")]) == 0
    record = json.loads((tmp_path / "budget" / "ablation_relu-vs-gelu.json").read_text())
    assert record["split"] == "carve-out of train, all validation images per class"
    assert record["config"]["validation_from"] == "train" and record["config"]["epochs"] == record["config"]["epochs"]
    assert bench.main(["--profile", "smoke", "--ingredients", "no such row", "--out", str(tmp_path)]) == 2


@pytest.mark.slow
def test_the_speedrun_benchmark_can_start_at_a_later_seed(tmp_path, isolated_ledger):
    import json

    _bench_ablation()  # puts benchmarks/ on sys.path
    import bench_speedrun

    small = ["-p", "model=speedrun_resnet_tiny", "-p", "image_size=32", "-p", "min_image_size=0", "-p", "epochs=1",
             "-p", "max_train_images=64", "-p", "batch_size=32", "-p", "tta_views=1"]
    assert bench_speedrun.main(["--profile", "smoke", "--seeds", "1", "--first-seed", "3", "--out", str(tmp_path),
                                *small]) == 0
    record = json.loads((tmp_path / "speedrun_speedrun.json").read_text())
    assert [run["seed"] for run in record["seeds"]] == [3] and record["summary"]["seeds"] == [3]


def _bench_race():
    _bench_ablation()  # puts benchmarks/ on sys.path
    import importlib

    return importlib.import_module("bench_race")


class Raced:
    """A race's result as the race benchmark reads it: its seed, seconds to 97% and final single-view top-1."""

    def __init__(self, seed, seconds=None, top1=None):
        self.config, self.seconds, self.single_view_top1 = types.SimpleNamespace(seed=seed), seconds, top1

    def time_to(self, level):
        return self.seconds


def test_the_race_speedup_pairs_the_seeds_where_both_recipes_reached_97():
    bench = _bench_race()
    results = {"a": [Raced(0, 100.0), Raced(1, 120.0), Raced(2, None), Raced(3, 110.0)],
               "b": [Raced(0, 50.0), Raced(1, 60.0), Raced(2, 40.0), Raced(3, None)]}
    ratio = bench.speedup(results, "a", "b")
    assert ratio["pairs"] == 2 and ratio["ratio"] == pytest.approx(2.0)  # seeds 2 and 3 lack one side
    assert ratio["low"] <= 2.0 <= ratio["high"]
    assert bench.speedup({"a": results["a"][:2], "b": [Raced(0, None), Raced(1, 60.0)]}, "a", "b") is None
    # matched by seed, not by position: b's seed 1 is missing (a race stopped between its recipes)
    shifted = bench.speedup({"a": results["a"], "b": [Raced(0, 50.0), Raced(3, 55.0), Raced(4, 10.0)]}, "a", "b")
    assert shifted["pairs"] == 2 and shifted["ratio"] == pytest.approx((100 / 50 * 110 / 55) ** 0.5)


def test_the_race_pairs_the_final_single_view_top1_by_seed_in_points():
    bench = _bench_race()
    change = bench.top1_change({"a": [Raced(0, top1=0.970), Raced(1, top1=0.972), Raced(2, top1=0.968)],
                                "b": [Raced(0, top1=0.975), Raced(1, top1=0.976), Raced(2, top1=0.974)]}, "a", "b")
    assert change["delta"] == pytest.approx(0.5) and change["beyond"] == 1 and change["runs"] == 3
    worse = bench.top1_change({"a": [Raced(0, top1=0.975), Raced(1, top1=0.976)],  # b's seeds in another order
                               "b": [Raced(1, top1=0.972), Raced(0, top1=0.970)]}, "a", "b")
    assert worse["delta"] == pytest.approx(-0.45) and worse["high"] > worse["delta"] > worse["low"]
    by_seed = statistics.paired_difference([97.0, 97.2], [97.5, 97.6])  # seed 0's pair, then seed 1's
    assert (worse["low"], worse["high"]) == pytest.approx((by_seed["low"], by_seed["high"]))
    assert bench.top1_change({"a": [Raced(0, top1=0.97)], "b": [Raced(0, top1=0.98)]}, "a", "b") is None  # one seed


@pytest.mark.slow
def test_the_race_benchmark_interleaves_two_recipes_and_states_their_ceilings(tmp_path, isolated_ledger, capsys):
    import json

    bench = _bench_race()
    small = ["-p", "model=speedrun_resnet_small", "-p", "image_size=32", "-p", "min_image_size=0", "-p", "epochs=1",
             "-p", "max_train_images=64", "-p", "batch_size=32", "-p", "tta_views=2"]
    assert bench.main(["--profile", "smoke", "--recipes", "speedrun,best", "--seeds", "2", "--out", str(tmp_path),
                       *small]) == 0
    record = json.loads((tmp_path / "race_speedrun_vs_best.json").read_text())
    assert [(run["recipe"], run["seed"]) for run in record["seeds"]] == [
        ("speedrun", 0), ("speedrun", 1), ("best", 0), ("best", 1)]
    printed = capsys.readouterr().out
    # seed 0: speedrun then best; seed 1: best first, so neither recipe always races on a fresh machine
    assert printed.index("seed 0 speedrun") < printed.index("seed 0 best") < printed.index("seed 1 best") \
        < printed.index("seed 1 speedrun")
    assert all(len(values) == 2 and min(values) > 0 for values in record["ceilings"].values())
    markdown = (tmp_path / "race_speedrun_vs_best.md").read_text()
    assert "Compute-only ceiling (after its first race, after the last seed)" in markdown
    assert ("Speed-up to 97% single view" in markdown) == (record["speedup"] is not None)
    assert "Final top-1, single view, `best` minus `speedrun`" in markdown and record["top1_change"]["runs"] == 2
    # written again from its json: the same report, word for word, and the same record
    assert bench.main(["--report-from", str(tmp_path / "race_speedrun_vs_best.json")]) == 0
    assert (tmp_path / "race_speedrun_vs_best.md").read_text() == markdown
    assert json.loads((tmp_path / "race_speedrun_vs_best.json").read_text()) == record
    assert bench.main(["--profile", "smoke", "--recipes", "speedrun", "--out", str(tmp_path)]) == 2
