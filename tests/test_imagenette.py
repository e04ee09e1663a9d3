"""Issue 47 point 7, the ImageNet-style path (`analysis.imagenette`): the `imagenette` recipe under the leaderboard's
rules, benchmarks/bench_imagenette.py (its one-line skip without the data, a smoke run on generated Imagenette-shaped
images), notebook 12's section 5 per profile, and the claim `imagenette_leaderboard` decided both ways."""
import importlib
import json
import sys
import types

import pytest
from conftest import ROOT
from PIL import Image

from course_lib import paths
from course_lib.analysis import claims, imagenette
from course_lib.config import IMAGENETTE_DATA_DIR, RECIPES, make_config
from course_lib.engine import speedrun


def _bench():
    if str(ROOT / "benchmarks") not in sys.path:
        sys.path.insert(0, str(ROOT / "benchmarks"))
    return importlib.import_module("bench_imagenette")


def _imagenette_shaped(root, classes=10, per_split=(6, 2, 2)):
    """train/ valid/ test/ of `classes` class folders of small JPEGs, not square (Imagenette's 160 px release keeps
    each photo's aspect ratio), each class its own colour so that a few steps learn something."""
    for split, count in zip(("train", "valid", "test"), per_split):
        for label in range(classes):
            folder = root / split / f"class_{label}"
            folder.mkdir(parents=True)
            for index in range(count):
                colour = (25 * label, 255 - 25 * label, (40 * index) % 256)
                size = (48, 36) if index % 2 else (36, 48)
                Image.new("RGB", size, colour).save(folder / f"n{label:08d}_{index}.JPEG", quality=90)
    return root


def _races(test_top1s, config=None):
    """RaceResults as bench_imagenette's races leave them, with made-up official-val accuracies."""
    config = config or make_config("cpu", recipe="imagenette")
    return [speedrun.RaceResult("imagenette", config.replace(seed=seed), [{"seconds": 60.0, "val_top1": top1}], 5.0,
                                60.0, top1, top1, "bf16", 1000.0, 10, 946, min(1.0, top1 + 0.1), min(1.0, top1 + 0.1))
            for seed, top1 in enumerate(test_top1s)]


def test_the_recipe_keeps_the_leaderboards_rules_and_reads_imagenette_where_data_get_puts_it():
    import timm

    recipe = make_config("cpu", recipe="imagenette")
    assert imagenette.rules_broken(recipe) == []
    assert not recipe.pretrained and recipe.tta_views == 1 and recipe.epochs == imagenette.LEADERBOARD_EPOCHS
    assert recipe.image_size == 160 and recipe.max_train_images == 0 and recipe.max_steps == 0
    assert recipe.dataset == "imagefolder" and recipe.data_dir == IMAGENETTE_DATA_DIR
    assert paths.resolve_path(recipe.data_dir) == paths.project_root() / paths.CACHE_DIR / "imagenette"
    assert recipe.optimizer in ("sgd", "adamw") and recipe.lr_schedule != "constant" and recipe.label_smoothing < 0.5
    assert recipe.device == "cpu" and make_config("gpu", recipe="imagenette").device == "cuda"  # the profile's
    model = timm.create_model(recipe.model, num_classes=10)  # a ResNet timm provides, from random weights
    assert "ResNet" in type(model).__name__
    # a recipe that names its data is read as given: not replaced by whatever real data the machine has
    from course_lib.data import datasets

    config, choice = datasets.config_with_data("cpu", recipe="imagenette")
    assert config.data_dir == IMAGENETTE_DATA_DIR and choice.origin == "the data_dir parameter"
    assert datasets.config_with_data("cpu", recipe="imagenette", data_dir="elsewhere")[0].data_dir == "elsewhere"
    broken = imagenette.rules_broken(recipe.replace(tta_views=8, epochs=20, pretrained=True))
    assert len(broken) == 3 and RECIPES["imagenette"]["tta_views"] == 1


def test_imagenette_is_found_only_where_data_get_lays_it_out(tmp_path, monkeypatch):
    monkeypatch.setattr(paths, "project_root", lambda: tmp_path)
    monkeypatch.delenv(paths.DATA_ENV, raising=False)
    assert paths.imagenette_dir() is None
    (tmp_path / "data_cache" / "imagenette" / "train").mkdir(parents=True)
    assert paths.imagenette_dir() is None  # no test/: no official val to score on
    (tmp_path / "data_cache" / "imagenette" / "test").mkdir()
    assert paths.imagenette_dir() == tmp_path / "data_cache" / "imagenette"
    monkeypatch.setenv(paths.DATA_ENV, paths.NO_REAL_DATA)
    assert paths.imagenette_dir() is None


def test_without_imagenette_the_benchmark_says_in_one_line_how_to_get_it_and_exits_0(tmp_path, monkeypatch, capsys):
    bench = _bench()
    monkeypatch.setattr(paths, "project_root", lambda: tmp_path)  # no data_cache/imagenette here
    monkeypatch.delenv(paths.DATA_ENV, raising=False)
    assert bench.main(["--profile", "cpu", "--out", str(tmp_path / "out")]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("skipped: no Imagenette in data_cache/imagenette/")
    assert "`workbook data get imagenette`" in lines[0]
    assert not (tmp_path / "out").exists()


def test_the_benchmark_runs_end_to_end_on_generated_imagenette_shaped_images(tmp_path, capsys):
    data = _imagenette_shaped(tmp_path / "nette")
    out = tmp_path / "out"
    assert _bench().main(["--profile", "smoke", "--seeds", "2", "-p", f"data_dir={data}", "--out", str(out)]) == 0
    record = json.loads((out / "imagenette.json").read_text())
    summary = record["summary"]
    for key in ("test_top1", "test_top5", "top1", "top5"):  # official val and valid, mean with its t interval
        assert summary[key]["runs"] == 2 and summary[key]["low"] <= summary[key]["mean"] <= summary[key]["high"]
    assert all(seed["test top-1"] <= seed["test top-5"] for seed in record["seeds"])
    assert record["gap"]["points"] == pytest.approx((summary["test_top1"]["mean"] - 0.8743) * 100)
    assert record["on_imagenette"] is False and record["config"]["model"] == "test_resnet"
    page = (out / "imagenette.md").read_text()
    assert "official val top-5" in page and "gap to the leaderboard's 87.43%" in page
    assert capsys.readouterr().out.rstrip().splitlines()[-1].startswith("| 1 | ")
    # the claim is in `workbook claims`, as a smoke run apart (no evidence): two steps break the 5-epoch rule
    (item,) = [item for item in claims.scoreboard() if item["key"] == imagenette.CLAIM]
    assert item["profile"] == "smoke" and not item["evidence"]
    assert item["verdict_as_measured"] == claims.NOT_MEASURABLE and "leaderboard's rules" in item["reason"]


@pytest.mark.parametrize("test_top1s, verdict", [
    ([0.90, 0.91, 0.89, 0.905, 0.895], claims.HOLDS),  # [89.0, 91.0]: wholly above 87.43%
    ([0.85, 0.86, 0.84, 0.855, 0.845], claims.REFUTED),  # [84.0, 86.0]: wholly below
    ([0.87, 0.89, 0.86, 0.88, 0.875], claims.NOT_SHOWN),  # [86.1, 88.9]: contains it
])
def test_the_claim_is_decided_both_ways_from_the_runs_t_interval(test_top1s, verdict):
    races = _races(test_top1s)
    summary = speedrun.seed_summary(races)
    found = imagenette.claim(summary, races[0].config, "a machine")
    assert found.verdict == verdict and found.key == imagenette.CLAIM and found.notebook == "12"
    mean = sum(test_top1s) / len(test_top1s)
    assert found.measured == pytest.approx((mean - 0.8743) * 100) and found.unit == "points"
    assert found.low < found.measured < found.high and "official val" in found.reason and "160 px" in found.reason


def test_no_verdict_without_runs_on_imagenette_under_the_rules():
    recipe = make_config("cpu", recipe="imagenette")
    absent = imagenette.claim(None, recipe, "a machine", why_not="no Imagenette in data_cache/imagenette/")
    assert absent.verdict == claims.NOT_MEASURABLE and "no Imagenette" in absent.reason
    one = imagenette.claim(speedrun.seed_summary(_races([0.95])), recipe, "a machine")
    assert one.verdict == claims.NOT_MEASURABLE and "one run" in one.reason
    with_tta = make_config("cpu", recipe="imagenette", tta_views=8)
    rules = imagenette.claim(speedrun.seed_summary(_races([0.95, 0.96], with_tta)), with_tta, "a machine")
    assert rules.verdict == claims.NOT_MEASURABLE and "test-time augmentation" in rules.reason


@pytest.mark.slow
def test_notebook_12s_section_5_per_profile(tmp_path, monkeypatch):
    from course_lib.chapters import time_to_accuracy

    monkeypatch.setattr(paths, "project_root", lambda: tmp_path)
    monkeypatch.delenv(paths.DATA_ENV, raising=False)
    smoke = time_to_accuracy.imagenette_plan(types.SimpleNamespace(profile="smoke"))
    assert smoke.config.model == "test_resnet" and smoke.seeds == [0] and not smoke.on_imagenette
    cpu = time_to_accuracy.imagenette_plan(types.SimpleNamespace(profile="cpu"))
    assert cpu.config is None and cpu.line.startswith("not run here: 5 runs of resnet50d")
    gpu = time_to_accuracy.imagenette_plan(types.SimpleNamespace(profile="gpu"))
    assert gpu.config is None and "`workbook data get imagenette`" in gpu.line
    claim = time_to_accuracy.imagenette_claim(gpu, [], "a machine")
    assert claim.verdict == claims.NOT_MEASURABLE and claim.reason.startswith("no Imagenette in")
    _imagenette_shaped(tmp_path / "data_cache" / "imagenette", classes=2, per_split=(1, 1, 1))
    gpu = time_to_accuracy.imagenette_plan(types.SimpleNamespace(profile="gpu"))
    assert gpu.on_imagenette and gpu.seeds == [0, 1, 2, 3, 4] and gpu.config.model == RECIPES["imagenette"]["model"]
    assert gpu.config.data_dir == str(tmp_path / "data_cache" / "imagenette")
    asked = time_to_accuracy.imagenette_plan(types.SimpleNamespace(profile="cpu"), runs=5)  # imagenette_seeds=5
    assert asked.on_imagenette and asked.config.device == "cpu" and len(asked.seeds) == 5
    races = _races([0.90, 0.91, 0.89, 0.905, 0.895], gpu.config)
    assert time_to_accuracy.imagenette_claim(gpu, races, "a machine").verdict == claims.HOLDS
    table = time_to_accuracy.imagenette_table(races)
    assert list(table.index)[-3:] == ["mean", "95% low", "95% high"] and "MFU" in table.columns
    assert "gap to the leaderboard's 87.43%" in time_to_accuracy.imagenette_line(gpu, races, "a machine")


def test_without_runs_the_notebook_reads_the_benchmarks_result_on_imagenette(tmp_path, monkeypatch):
    from course_lib.chapters import time_to_accuracy

    monkeypatch.setattr(paths, "project_root", lambda: tmp_path)
    results = tmp_path / "benchmarks" / "results"
    results.mkdir(parents=True)
    recipe = make_config("gpu", recipe="imagenette")
    record = {"on_imagenette": False, "summary": speedrun.seed_summary(_races([0.85, 0.86, 0.84, 0.855, 0.845])),
              "config": recipe.to_dict(), "hardware": "NVIDIA H100", "started": "2026-12-07 10:00"}
    (results / "imagenette.json").write_text(json.dumps(record))
    assert imagenette.saved_claim() is None  # the smoke check on the committed sample is no measurement
    (results / "imagenette.json").write_text(json.dumps({**record, "on_imagenette": True}))
    plan = time_to_accuracy.imagenette_plan(types.SimpleNamespace(profile="cpu"))
    found = time_to_accuracy.imagenette_claim(plan, [], "this machine")
    assert found.verdict == claims.REFUTED and found.hardware == "NVIDIA H100"
    assert "benchmarks/results/imagenette.json, measured 2026-12-07 10:00" in found.reason
