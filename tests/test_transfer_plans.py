"""Notebook 08's plans (`chapters.transfer_plans`): the source checkpoint, the label grid, time to
target, training saved, the claims."""
import pytest
from conftest import SOURCE_CLASSES, TensorImages, tiny_config

from course_lib import paths
from course_lib.chapters import transfer_plans
from course_lib.config import ConfigError
from course_lib.data.datasets import DataBundle
from course_lib.models import hub


def test_time_to_target_counts_training_seconds_until_first_reached():
    history = [{"epoch": 1, "epoch_seconds": 2.0, "val_top1": 0.5}, {"epoch": 2, "epoch_seconds": 3.0, "val_top1": 0.8},
               {"epoch": 3, "epoch_seconds": 4.0, "val_top1": 0.7}]
    assert transfer_plans.time_to_target(history, 0.8) == {"epochs": 2, "seconds": pytest.approx(5.0)}
    assert transfer_plans.time_to_target(history, 0.9) == {"epochs": None, "seconds": None}


def test_plan_without_weights_or_eurosat_pretrains_on_the_samples_other_classes(tmp_path, monkeypatch):
    monkeypatch.setattr(hub, "pretrained_available", lambda name: False)
    monkeypatch.setenv(paths.DATA_ENV, "none")  # hides every real dataset
    plan = transfer_plans.plan_transfer(tiny_config(tmp_path), source_epochs=2)
    assert (plan.source, plan.target, plan.synthetic) == ("classes", "landcover-synth", True)
    assert plan.source_config.dataset == "landcover-synth" and plan.source_config.epochs == 2
    assert plan.source_config.output_dir != plan.target_config.output_dir
    assert "synthetic" in plan.reason
    digits = transfer_plans.plan_transfer(tiny_config(tmp_path), source="digits")
    assert digits.source_config.dataset == "digits" and digits.source_config.storage == "files"
    with pytest.raises(ConfigError, match="source='landcover-synth' is not one of"):
        transfer_plans.plan_transfer(tiny_config(tmp_path), source="landcover-synth")
    with pytest.raises(FileNotFoundError, match="target=eurosat needs real EuroSAT .*workbook data get eurosat"):
        transfer_plans.plan_transfer(tiny_config(tmp_path), target="eurosat")


def test_plan_with_eurosat_is_real_data(tmp_path, eurosat_dir, monkeypatch):
    monkeypatch.setattr(hub, "pretrained_available", lambda name: False)
    plan = transfer_plans.plan_transfer(tiny_config(tmp_path))
    assert (plan.source, plan.target, plan.synthetic) == ("classes", "eurosat", False)
    assert plan.data_config.data_dir == str(eurosat_dir) and plan.data_config.max_train_images == 0


def _source_bundle():
    return DataBundle(TensorImages(32, len(SOURCE_CLASSES)), TensorImages(10, len(SOURCE_CLASSES), seed=1), None,
                      SOURCE_CLASSES, "tensors")


def test_source_checkpoint_is_reused_while_its_config_matches(tmp_path):
    config = tiny_config(tmp_path, output_dir=str(tmp_path / "source"))
    extra = {"classes": SOURCE_CLASSES}
    first = transfer_plans.source_checkpoint(config, _source_bundle(), extra=extra)
    assert not first["reused"] and f"source/{first['digest']}" in first["checkpoint"]
    again = transfer_plans.source_checkpoint(config.replace(num_workers=0), _source_bundle(), extra=extra)
    assert again["reused"] and again["checkpoint"] == first["checkpoint"] and again["digest"] == first["digest"]
    changed = transfer_plans.source_checkpoint(config.replace(epochs=2), _source_bundle(), extra=extra)
    assert not changed["reused"] and changed["digest"] != first["digest"] and changed["epochs"] == 2
    other_classes = transfer_plans.source_checkpoint(config, _source_bundle(), extra={"classes": SOURCE_CLASSES[::-1]})
    assert not other_classes["reused"]


def test_target_batch_size_leaves_two_steps_per_epoch():
    assert transfer_plans.target_batch_size(30, 128) == 15
    assert transfer_plans.target_batch_size(600, 128) == 128
    assert transfer_plans.target_batch_size(3, 64) == 1


def _rows(scratch, transferred, images=1000):
    rows = [{"labels per class": 10, "strategy": "from scratch", "seed": i, "validation images": images,
             "final val top-1": value} for i, value in enumerate(scratch)]
    return rows + [{"labels per class": 10, "strategy": "fine-tune all", "seed": i, "validation images": images,
                    "final val top-1": value} for i, value in enumerate(transferred)]


def test_verdict_beats_only_beyond_seed_noise():
    clear = transfer_plans.transfer_verdict(_rows([0.60, 0.62, 0.61], [0.80, 0.81, 0.79]))
    assert clear.loc[(10, "fine-tune all"), "verdict"] == "beats from scratch beyond seed noise"
    assert clear.loc[(10, "fine-tune all"), "delta vs scratch"] == pytest.approx(0.19)
    noisy = transfer_plans.transfer_verdict(_rows([0.50, 0.70, 0.60], [0.55, 0.75, 0.68]))
    assert noisy.loc[(10, "fine-tune all"), "verdict"] == "within seed noise"
    worse = transfer_plans.transfer_verdict(_rows([0.80, 0.81, 0.79], [0.60, 0.62, 0.61]))
    assert worse.loc[(10, "fine-tune all"), "verdict"] == "worse than from scratch beyond seed noise"
    # Seeds that happen to agree: the binomial floor (30 validation images) keeps a 3-point gap within noise.
    agreeing = transfer_plans.transfer_verdict(_rows([0.60, 0.60, 0.60], [0.63, 0.63, 0.63], images=30))
    assert agreeing.loc[(10, "fine-tune all"), "verdict"] == "within seed noise"


@pytest.mark.slow
def test_label_grid_trains_every_strategy_label_count_and_seed(tmp_path):
    whole = DataBundle(TensorImages(60, 5), TensorImages(20, 5, seed=1), None, SOURCE_CLASSES, "tensors")
    whole.train.classes = whole.val.classes = SOURCE_CLASSES
    config = tiny_config(tmp_path, epochs=2, optimizer="adamw", lr=1e-3)
    strategies = {"from scratch": config, "fine-tune all": config.replace(lr=1e-4)}
    rows, results = transfer_plans.label_grid(strategies, whole, SOURCE_CLASSES[:2], [2, 4], [0, 1], echo=None)
    assert len(rows) == len(results) == 8
    assert {(r["labels per class"], r["training images"], r["batch"]) for r in rows} == {(2, 4, 2), (4, 8, 4)}
    assert all(r["validation images"] == 8 for r in rows)  # 20 images of 5 classes: 4 each, 2 classes
    curves = transfer_plans.mean_curves(results, 4)
    assert set(curves) == set(strategies) and curves["from scratch"]["epoch"] == [1, 2]
    table = transfer_plans.curve_table(curves, 0.0)
    assert (table["epochs to target"] == 1).all()
    verdict = transfer_plans.transfer_verdict(rows)
    assert list(verdict.index.get_level_values(0).unique()) == [2, 4]


class _Fit:
    """A stand-in for train.fit's result: a history of (val top-1, epoch seconds)."""

    def __init__(self, accuracies, seconds=1.0):
        self.history = [{"epoch": i + 1, "val_top1": a, "epoch_seconds": seconds} for i, a in enumerate(accuracies)]
        self.final = self.history[-1]


def _grid(fine_tune_curve, frozen_curve, scratch_curve=(0.3, 0.5, 0.6, 0.7, 0.8, 0.85, 0.88, 0.88, 0.89, 0.9),
          seeds=3):
    results, rows = {}, []
    for seed in range(seeds):
        for name, curve in (("from scratch", scratch_curve), ("fine-tune all", fine_tune_curve),
                            ("freeze, then unfreeze", frozen_curve)):
            shifted = [min(1.0, a + 0.01 * seed) for a in curve]
            results[(200, name, seed)] = _Fit(shifted)
            rows.append({"labels per class": 200, "strategy": name, "seed": seed, "validation images": 300,
                         "final val top-1": shifted[-1]})
    return results, transfer_plans.transfer_verdict(rows)


def test_training_saved_is_per_seed_against_the_same_seeds_scratch_run():
    results, _ = _grid((0.85, 0.9, 0.93, 0.94, 0.95, 0.95, 0.95, 0.95, 0.95, 0.95), [0.5] * 10)
    saved = transfer_plans.training_saved(results, 200, "fine-tune all")
    assert [s["epochs"] for s in saved] == [2, 2, 2] and saved[0]["epochs saved"] == pytest.approx(0.8)
    never = transfer_plans.training_saved(results, 200, "freeze, then unfreeze")
    assert not any(s["reached"] for s in never) and all(s["epochs saved"] == 0 for s in never)


def test_transfer_claims_measure_the_share_saved_with_an_interval(monkeypatch):
    from course_lib.analysis import claims

    monkeypatch.setattr(claims, "_hardware", lambda: "test machine")
    results, verdict = _grid((0.85, 0.9, 0.93, 0.94, 0.95, 0.95, 0.95, 0.95, 0.95, 0.95),
                             (0.6, 0.7, 0.8, 0.85, 0.86, 0.87, 0.88, 0.89, 0.9, 0.9))
    found = transfer_plans.claims(results, verdict, source_seconds=30.0, setting="a test")
    assert [c.key for c in found] == ["transfer_learning", "transfer_beats_scratch", "transfer_freeze_recipe"]
    share = found[0]
    assert share.measured == pytest.approx(80.0) and share.low <= 80.0 <= share.high
    assert share.verdict == claims.HOLDS and "fine-tune all" in share.reason and "30 s of source" in share.reason
    assert found[1].verdict == claims.HOLDS  # 0.95 vs 0.90 on every seed
    assert found[2].verdict == claims.REFUTED  # 5 points worse than fine-tune all on every seed
    # Fine-tuning that learns as slowly as from scratch saves nothing: the claim is refuted.
    slow, verdict = _grid((0.3, 0.5, 0.6, 0.7, 0.8, 0.85, 0.88, 0.88, 0.89, 0.9), [0.2] * 10)
    assert transfer_plans.claims(slow, verdict)[0].verdict == claims.REFUTED
