import math

import numpy as np
import pandas as pd
import pytest
import torch

from course_lib.analysis import calibration, statistics
from course_lib.chapters import regularization_study
from course_lib.config import ConfigError, make_config
from course_lib.data import datasets


def test_select_variants_keeps_run_order_and_always_the_baseline():
    assert regularization_study.select_variants("all") == list(regularization_study.VARIANTS)
    assert regularization_study.select_variants("cutmix, mixup") == ["baseline", "mixup", "cutmix"]
    assert regularization_study.select_variants(["ema"]) == ["baseline", "ema"]


def test_select_variants_names_the_valid_ones():
    with pytest.raises(ConfigError, match="unknown variant 'mixupp'.*valid variants: all, baseline"):
        regularization_study.select_variants("mixupp")


@pytest.mark.parametrize("total_steps, expected", [(1000, 0.99), (200, 0.95), (4, 0.5), (1, 0.5)])
def test_ema_decay_averages_a_tenth_of_the_run(total_steps, expected):
    decay = regularization_study.ema_decay_for(total_steps)
    assert decay == pytest.approx(expected)
    assert 1 / (1 - decay) == pytest.approx(max(2, total_steps / 10))


def test_ema_decay_refuses_an_empty_run():
    with pytest.raises(ConfigError, match="at least 1"):
        regularization_study.ema_decay_for(0)


@pytest.mark.parametrize("name", list(regularization_study.VARIANTS))
def test_every_variant_is_a_valid_config_with_its_own_output_dir(name):
    base = make_config("smoke", output_dir="runs/checkpoints/")
    config = regularization_study.variant_config(base, name, ema_decay=0.9)
    assert config.output_dir == f"runs/checkpoints/07_{name}"
    for key, value in regularization_study.VARIANTS[name].items():
        expected = 0.9 if value == regularization_study.EMA_PLACEHOLDER else value
        assert getattr(config, key) == pytest.approx(expected)
    changed = {k for k, v in config.to_dict().items() if v != base.to_dict()[k]} - {"output_dir"}
    assert changed == set(regularization_study.VARIANTS[name])


def test_article_combo_is_the_articles_recipe():
    config = regularization_study.variant_config(make_config("smoke"), "article_combo", ema_decay=0.9)
    assert (config.label_smoothing, config.mixup_alpha, config.cutmix_alpha) == (0.1, 0.2, 0.0)
    assert 0 < config.random_erasing <= 0.5 and config.ema_decay == 0.0


@pytest.mark.parametrize("raw, ema, expected", [
    ({"top1": 0.8, "loss": 0.5}, None, "raw"),
    ({"top1": 0.8, "loss": 0.5}, {"top1": 0.9, "loss": 0.9}, "ema"),
    ({"top1": 0.8, "loss": 0.5}, {"top1": 0.7, "loss": 0.1}, "raw"),
    ({"top1": 0.8, "loss": 0.5}, {"top1": 0.8, "loss": 0.4}, "ema"),  # tie: lower loss wins
    ({"top1": 0.8, "loss": 0.5}, {"top1": 0.8, "loss": 0.5}, "raw"),
])
def test_choose_weights_keeps_the_better_on_validation(raw, ema, expected):
    assert regularization_study.choose_weights(raw, ema) == expected


def test_seed_noise_and_band_closed_forms():
    noise = statistics.seed_noise([0.70, 0.72, 0.74])
    assert noise == {"mean": pytest.approx(0.72), "std": pytest.approx(0.02), "runs": 3}
    assert statistics.noise_band(0.02, 3) == pytest.approx(2 * 0.02 * math.sqrt(4 / 3))
    with pytest.raises(ValueError, match="at least 2 runs"):
        statistics.seed_noise([0.7])


def test_binomial_std_closed_form():
    assert statistics.binomial_std(0.5, 100) == pytest.approx(0.05)
    assert statistics.binomial_std(1.0, 10) == 0.0


def test_compare_to_baseline_flags_only_deltas_outside_the_band():
    table = pd.DataFrame({"val top-1": [0.72, 0.74, 0.80, 0.60]}, index=["baseline", "small", "big", "worse"])
    compared = statistics.compare_to_baseline(table, {"val top-1": [0.71, 0.72, 0.73]}, metrics=("val top-1",))
    band = 2 * 0.01 * math.sqrt(4 / 3)
    assert compared["val top-1 noise band"].iloc[0] == pytest.approx(band)
    assert compared["val top-1 delta"].tolist() == pytest.approx([0.0, 0.02, 0.08, -0.12])
    assert compared["val top-1 beyond noise"].tolist() == ["no", "no", "yes", "yes"]


def test_compare_to_baseline_floor_stops_agreeing_seeds_from_shrinking_the_band():
    table = pd.DataFrame({"val top-1": [0.55]}, index=["variant"])
    without = statistics.compare_to_baseline(table, {"val top-1": [0.5, 0.5]}, metrics=("val top-1",))
    assert without["val top-1 beyond noise"].item() == "yes"  # std 0 from two agreeing seeds
    floored = statistics.compare_to_baseline(table, {"val top-1": [0.5, 0.5]}, metrics=("val top-1",),
                                                 floors={"val top-1": 0.05})
    assert floored["val top-1 noise band"].item() == pytest.approx(2 * 0.05 * math.sqrt(1.5))
    assert floored["val top-1 beyond noise"].item() == "no"


def test_training_speed_drops_the_warm_up_epoch():
    history = [{"images_per_second": 10.0, "epoch_seconds": 10.0},
               {"images_per_second": 50.0, "epoch_seconds": 2.0},
               {"images_per_second": 25.0, "epoch_seconds": 4.0}]
    speed = regularization_study.training_speed(history)
    assert speed["images_per_second"] == pytest.approx((100 + 100) / 6)
    assert speed["train_seconds"] == pytest.approx(16.0)
    assert regularization_study.training_speed(history[:1])["images_per_second"] == 10.0


def test_score_matches_hand_computed_accuracy_loss_and_ece():
    # The "model" returns each image's three pixel values as its logits.
    logits = torch.tensor([[3.0, 0.0, 0.0], [0.0, 2.0, 0.0], [1.0, 0.0, 0.0], [0.0, 0.0, 4.0], [0.5, 0.0, 0.0]])
    labels = [0, 1, 2, 2, 1]
    dataset = [(row.view(3, 1, 1), label) for row, label in zip(logits, labels)]
    config = make_config("smoke", batch_size=2)
    result = regularization_study.score(torch.nn.Flatten(), dataset, config)
    target = torch.tensor(labels)
    probabilities = torch.softmax(logits, dim=1).numpy()
    assert result["top1"] == pytest.approx(3 / 5)
    assert result["loss"] == pytest.approx(torch.nn.functional.cross_entropy(logits, target).item(), rel=1e-5)
    assert result["ece"] == pytest.approx(calibration.expected_calibration_error(probabilities, np.array(labels)), rel=1e-5)
    assert result["confidence"] == pytest.approx(probabilities.max(axis=1).mean(), rel=1e-5)
    assert result["images"] == 5


def test_variant_config_with_a_seed_gets_its_own_folder():
    config = regularization_study.variant_config(make_config("smoke"), "baseline", ema_decay=0.9, seed=3)
    assert config.seed == 3 and config.output_dir.endswith("07_baseline_seed3")


def test_score_run_gives_raw_and_ema_rows_and_marks_the_kept_weights():
    from types import SimpleNamespace

    good = torch.nn.Flatten()  # logits are the pixels: every image below is classified right
    logits = torch.eye(3) * 4.0
    dataset = [(row.view(3, 1, 1), label) for label, row in enumerate(logits)]

    class Wrong(torch.nn.Module):
        def forward(self, images):
            return images.flatten(1).roll(1, dims=1)  # always the next class

    history = [{"images_per_second": 100.0, "epoch_seconds": 2.0}]
    config = make_config("smoke", batch_size=2)
    both = SimpleNamespace(model=Wrong(), ema_model=good, history=history, config=config)
    rows = regularization_study.score_run("ema", both, dataset)
    assert [(r["weights"], r["kept"], r["val top-1"]) for r in rows] == [("raw", False, 0.0), ("ema", True, 1.0)]
    assert rows[0]["images/s"] == 100.0 and rows[0]["train s"] == 2.0
    alone = SimpleNamespace(model=good, ema_model=None, history=history, config=config)
    assert [(r["weights"], r["kept"]) for r in regularization_study.score_run("baseline", alone, dataset)] == [("raw", True)]


def test_fit_variant_trains_without_the_engines_validation_and_scores_once(tmp_path):
    previous = torch.get_num_threads()
    torch.set_num_threads(1)  # a tiny model: a second thread only adds hand-off cost on a busy CPU
    try:
        _fit_and_score(tmp_path)
    finally:
        torch.set_num_threads(previous)


def _fit_and_score(tmp_path):
    config = make_config("smoke", model="test_resnet", max_steps=1, batch_size=8, output_dir=str(tmp_path))
    bundle = datasets.build_datasets(config)
    result = regularization_study.fit_variant(config, "article_combo_ema", 0.5, bundle)
    assert "val_top1" not in result.history[-1] and result.ema_model is not None
    assert (tmp_path / "07_article_combo_ema" / "last.pt").exists()
    assert result.config.mixup_alpha == 0.2 and result.config.ema_decay == 0.5
    rows = regularization_study.score_run("article_combo_ema", result, bundle.val)
    assert [r["weights"] for r in rows] == ["raw", "ema"] and sum(r["kept"] for r in rows) == 1
    assert all(0.0 <= r["val top-1"] <= 1.0 and r["ECE"] >= 0.0 for r in rows)


def test_validation_noise_bootstrap_matches_the_binomial_closed_form():
    rng = np.random.default_rng(1)
    labels = rng.integers(0, 4, 400)
    probabilities = np.full((400, 4), 0.1)
    right = rng.random(400) < 0.7  # 70% of the images get their true class on top
    probabilities[np.arange(400), np.where(right, labels, (labels + 1) % 4)] = 0.7
    noise = statistics.validation_noise(labels, probabilities, draws=400)
    accuracy = float(right.mean())
    assert noise["val top-1"] == pytest.approx(statistics.binomial_std(accuracy, 400), rel=0.15)
    assert noise["ECE"] > 0 and noise["val loss"] > 0
    assert statistics.validation_noise(labels, probabilities, draws=50) == \
        statistics.validation_noise(labels, probabilities, draws=50)  # seeded: repeatable


def test_validation_noise_is_zero_when_every_resample_scores_the_same():
    labels = np.array([0, 1, 2, 0])
    probabilities = np.eye(3)[labels] * 0.97 + 0.01
    noise = statistics.validation_noise(labels, probabilities, draws=20)
    assert noise["val top-1"] == 0.0 and noise["ECE"] == pytest.approx(0.0, abs=1e-12)
