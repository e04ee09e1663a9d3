"""Notebook 07's study (`chapters.regularization_study`): the variants, the seeds, scoring raw and EMA weights, the summary with intervals and paired verdicts, the article's claims, the CIFAR-10 control."""
import dataclasses

import numpy as np
import pandas as pd
import pytest
import torch

from course_lib.analysis import calibration, statistics
from course_lib.chapters import regularization_study
from course_lib.config import ConfigError, make_config
from course_lib.data import pipeline
from course_lib.engine import train


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
    assert [r["variant"] for r in rows] == ["ema", "ema (EMA weights)"] and {r["trick"] for r in rows} == {"ema"}
    assert rows[0]["images/s"] == 100.0 and rows[0]["train s"] == 2.0 and rows[0]["seed"] == config.seed
    alone = SimpleNamespace(model=good, ema_model=None, history=history, config=config)
    assert [(r["weights"], r["kept"]) for r in regularization_study.score_run("baseline", alone, dataset)] == [("raw", True)]


def _run_variants(config, bundle, names, seeds, data="landcover-synth"):
    """Notebook 07's section 2 loop: every variant of `names` once per seed, the engine's validation off, each
    run scored once on `bundle.val`, gathered into a Study."""
    rows = []
    for seed in seeds:
        for name in names:
            result = train.fit(regularization_study.variant_config(config, name, 0.5, seed),
                               bundle=dataclasses.replace(bundle, val=None), progress=False, verbose=False)
            assert "val_top1" not in result.history[-1]  # the engine did not validate: the study scores once
            rows += regularization_study.score_run(name, result, bundle.val, bundle.device_stage)
    return regularization_study.Study.from_runs(rows, config, bundle, data, result.model, 1.0)


def test_a_variant_trains_without_the_engines_validation_and_scores_once(tmp_path):
    previous = torch.get_num_threads()
    torch.set_num_threads(1)  # a tiny model: a second thread only adds hand-off cost on a busy CPU
    try:
        _fit_and_score(tmp_path)
    finally:
        torch.set_num_threads(previous)


def _fit_and_score(tmp_path):
    config = make_config("smoke", model="test_resnet", max_steps=1, batch_size=8, output_dir=str(tmp_path))
    bundle = pipeline.build_datasets(config)
    result = train.fit(regularization_study.variant_config(config, "article_combo_ema", 0.5),
                       bundle=dataclasses.replace(bundle, val=None), progress=False, verbose=False)
    assert "val_top1" not in result.history[-1] and result.ema_model is not None
    assert (tmp_path / "07_article_combo_ema" / "last.pt").exists()
    assert result.config.mixup_alpha == 0.2 and result.config.ema_decay == 0.5
    rows = regularization_study.score_run("article_combo_ema", result, bundle.val)
    assert [r["weights"] for r in rows] == ["raw", "ema"] and sum(r["kept"] for r in rows) == 1
    assert all(0.0 <= r["val top-1"] <= 1.0 and r["ECE"] >= 0.0 for r in rows)


def _fake_study(top1: dict, data="EuroSAT", speeds=None, ece=None, ema_gain=None, seeds=(0, 1, 2)):
    """A Study from made-up results: `top1` maps a trick to its top-1 per seed (fractions);
    tricks with an EMA also get EMA rows, `ema_gain` (per seed) above the raw weights."""
    rows = []
    for trick, values in top1.items():
        for seed, value in zip(seeds, values):
            base = {"trick": trick, "seed": seed, "val loss": 1.0, "confidence": value,
                    "ECE": (ece or {}).get(trick, [0.05] * len(seeds))[seeds.index(seed)],
                    "images/s": (speeds or {}).get(trick, [100.0] * len(seeds))[seeds.index(seed)],
                    "train s": 10.0, "precision": "off"}
            rows.append({**base, "variant": trick, "weights": "raw", "kept": True, "val top-1": value})
            if "ema" in trick or trick == "everything":
                gain = (ema_gain or [0.01] * len(seeds))[seeds.index(seed)]
                rows.append({**base, "variant": trick + regularization_study.EMA_SUFFIX, "weights": "ema",
                             "kept": gain > 0, "val top-1": value + gain})
    return regularization_study.Study(pd.DataFrame(rows), make_config("smoke"), data, 1000, 500, 1e6, 1.0)


@pytest.fixture
def known_peak(monkeypatch):
    from course_lib.measure import peak

    monkeypatch.setattr(peak, "peak_flops", lambda device, dtype: 1e12)  # MFU against a known 1 TFLOP/s


ALL_TRICKS = {
    "baseline": [0.80, 0.82, 0.84],
    "label_smoothing": [0.79, 0.81, 0.83],  # exactly 1 point below: a zero-spread paired difference
    "mixup": [0.83, 0.85, 0.86],
    "ema": [0.80, 0.82, 0.84],
    "article_combo": [0.815, 0.835, 0.855],  # +1.5 points on every seed
    "everything": [0.80, 0.85, 0.81],
}


def test_study_config_uses_the_in_memory_path_and_lets_parameters_win():
    config = regularization_study.study_config("cpu")
    assert (config.model, config.storage, config.augmentation, config.num_workers) == \
        ("speedrun_resnet_small", "cache", "device", 0)
    assert config.label_smoothing == 0 and config.mixup_alpha == 0  # the baseline has no regularizer
    assert regularization_study.study_config("cpu", model="resnet18", epochs=None).model == "resnet18"
    assert regularization_study.study_config("smoke").model == "test_resnet"


def test_study_seeds_default_per_profile_and_refuse_one():
    config = make_config("smoke", seed=5)
    assert regularization_study.study_seeds(config, "smoke") == [5, 6]
    assert regularization_study.study_seeds(config, "cpu") == [5, 6, 7]
    assert regularization_study.study_seeds(config, "cpu", 4) == [5, 6, 7, 8]
    with pytest.raises(ConfigError, match="at least 2"):
        regularization_study.study_seeds(config, "cpu", 1)


def test_summarize_gives_intervals_paired_verdicts_and_mfu(known_peak):
    study = _fake_study(ALL_TRICKS, speeds={"article_combo": [90.0, 90.0, 90.0]})
    summary = regularization_study.summarize(study)
    assert summary.loc["article_combo", "delta (points)"] == pytest.approx(1.5)
    assert summary.loc["article_combo", "verdict"] == "better"
    assert summary.loc["label_smoothing", "verdict"] == "worse"
    assert summary.loc["everything", "verdict"] == "within noise"
    assert summary.loc["baseline", "verdict"] == "(baseline)"
    expected = statistics.confidence_interval([80, 82, 84])
    assert (summary.loc["baseline", "CI low"], summary.loc["baseline", "CI high"]) == \
        (pytest.approx(expected["low"]), pytest.approx(expected["high"]))
    assert summary.loc["ema (EMA weights)", "delta (points)"] == pytest.approx(1.0)
    assert summary.loc["article_combo", "time vs baseline"] == pytest.approx(100 / 90)
    assert list(summary.columns).index("MFU") == list(summary.columns).index("images/s") + 1
    assert summary.loc["baseline", "MFU"] == pytest.approx(1e6 * 100 / 1e12)


def test_ema_table_pairs_ema_with_raw_weights_of_the_same_run():
    table = regularization_study.ema_table(_fake_study(ALL_TRICKS, ema_gain=[0.01, 0.02, 0.015]))
    assert list(table.index) == ["ema", "everything"]
    assert table.loc["ema", "EMA - raw delta"] == pytest.approx(1.5)
    assert table.loc["ema", "verdict"] == "better" and table.loc["ema", "EMA kept"] == "3 of 3 seeds"


def test_ema_claim_shows_the_run_that_refutes_it(known_peak):
    from course_lib.analysis import claims

    study = _fake_study(ALL_TRICKS, ema_gain=[0.01, 0.02, 0.015])
    rows = study.runs
    everything_ema = rows["variant"] == "everything" + regularization_study.EMA_SUFFIX
    raw = rows[(rows["variant"] == "everything") & (rows["weights"] == "raw")].set_index("seed")["val top-1"]
    rows.loc[everything_ema, "val top-1"] = rows.loc[everything_ema, "seed"].map(raw) - 0.01  # 1 point worse, every seed
    rows.loc[everything_ema, "kept"] = False
    claim = {c.key: c for c in regularization_study.claims(study, "absent", remote_sensing=True)}["ema_steady_gain"]
    assert claim.verdict == claims.REFUTED
    assert claim.measured == pytest.approx(-1.0)  # the refuting run's figure, not the EMA-only variant's +1.5
    assert claim.high < 0


def _verdicts(claim_list):
    return {claim.key: claim.verdict for claim in claim_list}


def test_claims_with_a_control_measure_every_claim(known_peak):
    from course_lib.analysis import claims

    study = _fake_study(ALL_TRICKS, ema_gain=[0.01, 0.02, 0.015], ece={"label_smoothing": [0.02, 0.03, 0.025]})
    control = _fake_study({"baseline": [0.60, 0.62, 0.64], "mixup": [0.61, 0.63, 0.65],
                           "article_combo": [0.608, 0.628, 0.648]}, data="CIFAR-10")
    result = regularization_study.claims(study, control, remote_sensing=True)
    by_key = {claim.key: claim for claim in result}
    assert list(by_key) == ["regularization_remote_sensing", "regularization_cifar10", "mixup_remote_sensing",
                            "ema_steady_gain", "combo_training_time", "too_many_tricks", "label_smoothing_alone",
                            "label_smoothing_calibration"]
    assert by_key["regularization_remote_sensing"].measured == pytest.approx(1.5)
    assert "better than the baseline beyond noise" in by_key["regularization_remote_sensing"].reason
    assert by_key["regularization_cifar10"].measured == pytest.approx(0.8)
    mixup_gains = np.array([3, 3, 2]) - np.array([1, 1, 1])  # points on EuroSAT minus points on CIFAR-10
    assert by_key["mixup_remote_sensing"].measured == pytest.approx(mixup_gains.mean())
    assert _verdicts(result) == {
        "regularization_remote_sensing": claims.HOLDS, "regularization_cifar10": claims.HOLDS,
        "mixup_remote_sensing": claims.HOLDS, "ema_steady_gain": claims.HOLDS, "combo_training_time": claims.HOLDS,
        "too_many_tricks": claims.NOT_SHOWN, "label_smoothing_alone": claims.REFUTED,
        "label_smoothing_calibration": claims.HOLDS}
    assert all(claims.article_claim(claim.key).notebook == "07" for claim in result)
    # "everything" -1.5, +1.5 and -4.5 points from the combination: not better beyond noise, which the old rule
    # called "holds" (it held on no effect); the claim is that the extra tricks cost accuracy.
    assert "rule: holds below 0 reaching -0.5 points" in by_key["too_many_tricks"].reason


@pytest.mark.parametrize("everything, verdict", [([0.805, 0.825, 0.845], "holds"),  # 1 point below, every seed
                                                 ([0.815, 0.836, 0.854], "refuted"),  # the combination, to 0.1 point
                                                 ([0.83, 0.85, 0.87], "refuted")])  # better on every seed
def test_too_many_tricks_holds_only_when_the_extra_tricks_cost_accuracy(known_peak, everything, verdict):
    study = _fake_study({**ALL_TRICKS, "everything": everything})
    claim = {c.key: c for c in regularization_study.claims(study, "absent", True)}["too_many_tricks"]
    assert claim.verdict == verdict


def test_claims_without_control_or_remote_sensing_say_why(known_peak):
    from course_lib.analysis import claims

    study = _fake_study(ALL_TRICKS, data="landcover-synth")
    result = regularization_study.claims(study, "CIFAR-10 is not on this machine", remote_sensing=False)
    by_key = {claim.key: claim for claim in result}
    for key in ("regularization_remote_sensing", "regularization_cifar10", "mixup_remote_sensing"):
        assert by_key[key].verdict == claims.NOT_MEASURABLE
    assert "not remote-sensing" in by_key["regularization_remote_sensing"].reason
    assert "+1.50 points" in by_key["regularization_remote_sensing"].reason  # the number, for context
    assert "not on this machine" in by_key["regularization_cifar10"].reason
    on_eurosat = regularization_study.claims(_fake_study(ALL_TRICKS), "no CIFAR-10", remote_sensing=True)
    mixup = {claim.key: claim for claim in on_eurosat}["mixup_remote_sensing"]
    assert mixup.verdict == claims.NOT_MEASURABLE and "no non-remote-sensing control" in mixup.reason


def test_claims_when_variants_were_left_out(known_peak):
    from course_lib.analysis import claims

    study = _fake_study({"baseline": ALL_TRICKS["baseline"], "mixup": ALL_TRICKS["mixup"]})
    verdicts = _verdicts(regularization_study.claims(study, "absent", remote_sensing=True))
    assert verdicts["regularization_remote_sensing"] == claims.NOT_MEASURABLE
    assert verdicts["ema_steady_gain"] == claims.NOT_MEASURABLE
    assert verdicts["combo_training_time"] == claims.NOT_MEASURABLE


def test_combo_training_time_fails_when_the_combo_is_much_slower(known_peak):
    slow = _fake_study(ALL_TRICKS, speeds={"baseline": [100.0, 101.0, 99.0], "article_combo": [50.0, 51.0, 49.0]})
    claim = {c.key: c for c in regularization_study.claims(slow, "absent", True)}["combo_training_time"]
    assert claim.verdict == "refuted" and claim.measured == pytest.approx(100.0)


def test_combo_training_time_is_not_shown_when_its_interval_straddles_the_allowance(known_peak):
    """A longer notebook 07 run of 2026-12-04 (not the reference): +16.6% [+5.8, +27.3] was called "holds" (its low
    end under +10%)."""
    from course_lib.analysis import claims

    noisy = _fake_study(ALL_TRICKS, speeds={"baseline": [100.0, 100.0, 100.0], "article_combo": [96.0, 86.0, 78.0]})
    claim = {c.key: c for c in regularization_study.claims(noisy, "absent", True)}["combo_training_time"]
    assert claim.low < regularization_study.EXTRA_TIME_ALLOWED < claim.high
    assert claim.verdict == claims.NOT_SHOWN


def test_plot_comparison_draws_both_panels(known_peak):
    import matplotlib

    matplotlib.use("Agg")
    figure = regularization_study.plot_comparison(regularization_study.summarize(_fake_study(ALL_TRICKS)), "title")
    assert len(figure.axes) == 2


@pytest.mark.parametrize("source, choice, expected", [
    ("/work/shared/datasets/eurosat_rgb", "auto", True), ("data_samples/landcover-synth", "auto", False),
    ("data_samples/landcover-synth", "true", True), ("/data/EuroSAT", False, False), ("/x", True, True)])
def test_is_remote_sensing(source, choice, expected):
    assert regularization_study.is_remote_sensing(choice, source) is expected


def test_data_name():
    assert regularization_study.data_name("/work/shared/datasets/eurosat_rgb") == "EuroSAT"
    assert regularization_study.data_name("data_samples/landcover-synth/") == "landcover-synth"


def test_cifar10_control_without_the_data_gives_the_reason(tmp_path):
    reason = regularization_study.cifar10_control(make_config("smoke"), folder=str(tmp_path))
    assert isinstance(reason, str) and "not on this machine" in reason and "download" in reason
    assert regularization_study.find_cifar10(str(tmp_path)) is None


def _fake_cifar10(root, images_per_batch=20):
    """A tiny folder in torchvision's CIFAR-10 format (pickled batches of 32x32x3 uint8 rows), and
    the md5 sums torchvision checks, for monkeypatching its file lists."""
    import hashlib
    import pickle

    folder = root / regularization_study.CIFAR10_FOLDER
    folder.mkdir(parents=True)
    rng = np.random.default_rng(0)
    sums = {}
    names = [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]
    for name in names:
        labels = [i % 10 for i in range(images_per_batch)]
        data = rng.integers(0, 256, (images_per_batch, 3072), dtype=np.uint8)
        (folder / name).write_bytes(pickle.dumps({"data": data, "labels": labels}))
    (folder / "batches.meta").write_bytes(pickle.dumps({"label_names": [f"class{i}" for i in range(10)]}))
    for path in folder.iterdir():
        sums[path.name] = hashlib.md5(path.read_bytes()).hexdigest()
    return sums


def test_cifar10_control_reads_a_cifar10_folder_without_downloading(tmp_path, monkeypatch):
    from torchvision.datasets import CIFAR10

    sums = _fake_cifar10(tmp_path / "cifar")
    monkeypatch.setattr(CIFAR10, "train_list", [[f"data_batch_{i}", sums[f"data_batch_{i}"]] for i in range(1, 6)])
    monkeypatch.setattr(CIFAR10, "test_list", [["test_batch", sums["test_batch"]]])
    monkeypatch.setattr(CIFAR10, "meta", {**CIFAR10.meta, "md5": sums["batches.meta"]})
    monkeypatch.setattr(CIFAR10, "download", lambda self: pytest.fail("must not download"))
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        config = make_config("smoke", max_steps=1, batch_size=8, max_train_images=32, output_dir=str(tmp_path / "out"))
        found = regularization_study.cifar10_control(config, folder=str(tmp_path / "cifar"))
        assert isinstance(found, tuple), found
        control = _run_variants(*found, regularization_study.CONTROL_VARIANTS, [0, 1], data="CIFAR-10")
    finally:
        torch.set_num_threads(previous)
    assert control.data == "CIFAR-10" and control.config.image_size == 32 and control.config.dataset == "cifar10"
    assert sorted(set(control.runs["trick"])) == sorted(regularization_study.CONTROL_VARIANTS)
    assert control.seeds == [0, 1] and control.val_images == 10  # 10% of the 100 training images


def test_cifar10_control_reads_the_folder_that_data_get_writes(tmp_path, monkeypatch):
    from PIL import Image

    rng = np.random.default_rng(0)
    for split, count in (("train", 4), ("valid", 1), ("test", 1)):
        for label in range(10):
            folder = tmp_path / "data_cache" / "cifar10" / split / f"class{label}"
            folder.mkdir(parents=True)
            for index in range(count):
                Image.fromarray(rng.integers(0, 256, (32, 32, 3), dtype=np.uint8)).save(folder / f"{index}.png")
    monkeypatch.setattr(regularization_study.paths, "CACHE_DIR", tmp_path / "data_cache")
    assert regularization_study.find_cifar10() == (tmp_path / "data_cache" / "cifar10", "imagefolder")
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        config = regularization_study.study_config("smoke", max_steps=1, batch_size=8,
                                                   output_dir=str(tmp_path / "out"))
        found = regularization_study.cifar10_control(config)
        assert isinstance(found, tuple), found
        control = _run_variants(*found, regularization_study.CONTROL_VARIANTS, [0, 1], data="CIFAR-10")
    finally:
        torch.set_num_threads(previous)
    assert control.config.dataset == "imagefolder" and control.config.storage == "cache"  # the study's own path
    assert control.val_images == 10  # valid/, the fixed carve-out, not a split drawn from train


def test_cifar10_control_with_corrupted_files_gives_the_reason(tmp_path):
    _fake_cifar10(tmp_path)  # torchvision's real md5 sums do not match these files
    reason = regularization_study.cifar10_control(make_config("smoke"), folder=str(tmp_path))
    assert isinstance(reason, str) and "CIFAR-10 not found" in reason


def test_the_reference_trains_the_cpu_study_longer_over_five_seeds():
    """Issue 51: the reference is the cpu study's model, data and tiles, 60 epochs instead of 4, 5 seeds instead of 3."""
    reference, cpu = regularization_study.study_config("reference"), regularization_study.study_config("cpu")
    assert (reference.epochs, cpu.epochs) == (60, 4)
    assert reference.replace(epochs=cpu.epochs) == cpu
    assert regularization_study.study_seeds(reference, "reference") == [0, 1, 2, 3, 4]
    assert regularization_study.study_seeds(cpu, "cpu") == [0, 1, 2] and regularization_study.study_seeds(cpu, "smoke") == [0, 1]
