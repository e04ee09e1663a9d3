"""The chapter behind notebook 09: claims from a small fake evaluation."""
import math

import pandas as pd
import pytest

from course_lib.analysis import claims
from course_lib.chapters import confusion_study

SUMMARY = {"top1": 0.8, "top5": 0.99, "top5_k": 5, "images": 500, "ece": 0.05}
CLASSES = pd.DataFrame({"recall": [0.5, 0.95, 0.9, 0.9], "support": [100, 200, 200, 100]},
                       index=["crops", "water", "forest", "road"])
PAIRS = pd.DataFrame([{"true": "crops", "predicted": "forest", "images": 40, "share_of_true": 0.4}])


@pytest.fixture(autouse=True)
def fake_hardware(monkeypatch):
    monkeypatch.setattr(claims, "_hardware", lambda: "fake machine")


def test_claims_without_designed_pairs_or_mixup():
    found = {c.key: c for c in confusion_study.claims(SUMMARY, CLASSES, PAIRS, math.nan, math.nan)}
    assert list(found) == ["top1_top5_metrics", "classes_differ", "confusion_pairs", "mixup_helps_09"]
    assert found["top1_top5_metrics"].low < 0.8 < found["top1_top5_metrics"].high
    assert found["classes_differ"].verdict == claims.HOLDS  # 50/100 vs 190/200: far apart
    assert found["confusion_pairs"].verdict == claims.HOLDS  # 40% of crops vs 17% for an even spread of its errors
    assert found["mixup_helps_09"].verdict == claims.NOT_MEASURABLE


def test_mixup_holds_only_when_its_interval_clears_zero():
    after = {**SUMMARY, "top1": 0.82}
    gain = {"top1": {"delta": 0.02, "low": 0.005, "high": 0.035}}
    noise = {"top1": {"delta": 0.02, "low": -0.01, "high": 0.05}}
    assert confusion_study.claims(SUMMARY, CLASSES, PAIRS, 0.6, 0.2, after, gain, 0.2)[-1].verdict == claims.HOLDS
    assert confusion_study.claims(SUMMARY, CLASSES, PAIRS, 0.6, 0.2, after, noise, 0.2)[-1].verdict == claims.NOT_SHOWN
    worse = {"top1": {"delta": -0.03, "low": -0.05, "high": -0.01}}
    assert confusion_study.claims(SUMMARY, CLASSES, PAIRS, 0.6, 0.2, after, worse, 0.2)[-1].verdict == claims.REFUTED


def test_close_recalls_are_not_called_different():
    close = pd.DataFrame({"recall": [0.88, 0.9], "support": [50, 50]}, index=["a", "b"])
    found = confusion_study.claims(SUMMARY, close, PAIRS.assign(true="a"), 0.6, 0.2)
    assert found[1].verdict == claims.NOT_SHOWN and found[2].verdict == claims.HOLDS  # designed share 60% > 20%


@pytest.fixture
def setup_without_datasets(monkeypatch):
    """`confusion_study.setup` with real data hidden and the datasets not built (the config is tested)."""
    from course_lib import machine, paths
    from course_lib.data import pipeline

    monkeypatch.setenv(paths.DATA_ENV, paths.NO_REAL_DATA)
    monkeypatch.setattr(pipeline, "build_datasets", lambda config: ("bundle of", config.epochs))
    monkeypatch.setattr(machine, "describe_hardware", lambda: "fake machine")
    return confusion_study.setup


def test_setup_analyses_the_speed_run_recipes_model_on_cpu_unless_told(setup_without_datasets):
    from course_lib.config import PROFILES, RECIPES

    cpu = setup_without_datasets("cpu")
    assert cpu.config.recipe == "speedrun" and cpu.config.epochs == RECIPES["speedrun"]["epochs"]
    assert cpu.config.model == RECIPES["speedrun"]["model"] and cpu.bundle == ("bundle of", RECIPES["speedrun"]["epochs"])
    assert setup_without_datasets("cpu", epochs=3).config.epochs == 3
    assert setup_without_datasets("cpu", epochs=None, image_size=48).config.image_size == 48
    smoke = setup_without_datasets("smoke")
    assert smoke.config.epochs == PROFILES["smoke"]["epochs"] and smoke.profile == "smoke"
    assert smoke.data.synthetic and smoke.line().startswith("profile smoke: ") and smoke.line().endswith("fake machine")


# --- section 9: class imbalance ---------------------------------------------------------------

def imbalance(predictions_by_correction, counts=(40, 20, 10, 5)):
    import numpy as np

    labels = np.repeat(np.arange(4), 50)
    return confusion_study.ImbalanceStudy(["a", "b", "c", "d"], np.array(counts), labels,
                                          {name: np.asarray(p) for name, p in predictions_by_correction.items()},
                                          _FakeConfig(),
                                          10.0, 1.0, "fake")


class _FakeConfig:
    model, image_size, epochs = "tiny", 32, 1


def predictions_with_recall(recalls, seed=0):
    """Predictions of 50 images per class getting `recalls[c]` of class c right (the rest as class 0 or 1)."""
    import numpy as np

    predicted = []
    for label, recall in enumerate(recalls):
        right = round(50 * recall)
        wrong = 1 if label == 0 else 0
        predicted += [label] * right + [wrong] * (50 - right)
    return np.array(predicted)


def test_recall_that_follows_the_training_counts_supports_few_samples_low_recall():
    study = imbalance({"none": predictions_with_recall([0.95, 0.8, 0.5, 0.2]),
                       "weighted_loss": predictions_with_recall([0.9, 0.85, 0.75, 0.7]),
                       "sampler": predictions_with_recall([0.95, 0.8, 0.5, 0.2])})
    found = {claim.key: claim for claim in confusion_study.imbalance_claims(study, draws=200)}
    assert found["few_samples_low_recall"].verdict == claims.HOLDS and found["few_samples_low_recall"].measured == 1.0
    assert found["imbalance_weighted_loss"].verdict == claims.HOLDS  # the tail recovers: macro-F1 up beyond noise
    # The same predictions: a change of exactly 0, within +-1 point of macro-F1, refutes "it helps" (equivalence).
    assert found["imbalance_sampler"].verdict == claims.REFUTED
    table = study.table()
    assert list(table.columns) == ["train images", "recall none", "recall weighted_loss", "recall sampler"]
    assert table.loc["d", "recall none"] == pytest.approx(0.2) and table.loc["top-1", "train images"] == 75


def test_recall_unrelated_to_the_counts_does_not_show_the_claim():
    study = imbalance({"none": predictions_with_recall([0.6, 0.9, 0.6, 0.9])})
    found = {claim.key: claim for claim in confusion_study.imbalance_claims(study, draws=200)}
    assert found["few_samples_low_recall"].verdict in (claims.NOT_SHOWN, claims.REFUTED)
    assert found["imbalance_sampler"].verdict == claims.NOT_MEASURABLE


def test_the_imbalance_study_trains_its_own_small_nets_not_the_recipe(setup_without_datasets):
    config = confusion_study.imbalance_config(setup_without_datasets("cpu"))
    assert config.recipe == "" and config.model == confusion_study.IMBALANCE_PROFILES["cpu"]["model"]
    assert config.label_smoothing == 0.0 and config.output_dir.endswith("09_imbalance")
