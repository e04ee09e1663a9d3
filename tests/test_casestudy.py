from types import SimpleNamespace

import pytest
import torch

from course_lib import ledger
from course_lib.analysis import claims, statistics
from course_lib.chapters import casestudy
from course_lib.config import RECIPES, ConfigError, make_config
from course_lib.data import pipeline
from course_lib.engine import train


@pytest.fixture
def config(tmp_path):
    return make_config("smoke", model="test_resnet", batch_size=8, max_steps=1, output_dir=str(tmp_path / "ckpt"))


def test_baseline_config_turns_every_switch_off():
    tuned = make_config("gpu", mixup_alpha=0.3, label_smoothing=0.1, optimizer="adamw", compile=True)
    base = casestudy.baseline_config(tuned)
    assert (base.num_workers, base.pin_memory, base.persistent_workers, base.prefetch_factor) == (0, False, False, 2)
    assert (base.precision, base.channels_last, base.compile, base.optimizer) == ("off", False, False, "sgd")
    assert base.mixup_alpha == base.label_smoothing == base.warmup_epochs == 0
    assert base.model == tuned.model and base.batch_size == tuned.batch_size


def test_stage_changes(config):
    loader = casestudy.stage_changes("data_loader", config, device="cpu")
    assert 1 <= loader["num_workers"] <= casestudy.ARTICLE_WORKERS
    assert loader["pin_memory"] and loader["persistent_workers"] and loader["prefetch_factor"] == 8
    recipe = casestudy.stage_changes("optimizer", config.replace(epochs=20), device="cpu")
    assert recipe["optimizer"] == "adamw" and recipe["lr"] == pytest.approx(2e-4)
    assert recipe["warmup_epochs"] == pytest.approx(1.0)  # 5 of 100 epochs -> 1 of 20
    regularization = casestudy.stage_changes("regularization", config, device="cpu", pretrained=False)
    assert regularization == {"label_smoothing": 0.1, "mixup_alpha": 0.3, "pretrained": False}
    assert casestudy.stage_changes("amp", config, device="cpu")["precision"] in ("bf16", "fp16")
    config.replace(**recipe)  # every change is a valid Config field
    with pytest.raises(ConfigError, match="unknown stage"):
        casestudy.stage_changes("turbo", config, device="cpu")


def test_ddp_world_size_by_profile_and_gpu_count(monkeypatch):
    assert casestudy.ddp_world_size("smoke", "cuda")[0] == 0  # smoke never launches, whatever the machine
    processes, reason = casestudy.ddp_world_size("cpu", "cpu")
    assert processes == 2 and "gloo" in reason
    assert casestudy.ddp_world_size("gpu", "cpu") == (0, "skipped in the gpu profile")
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 4)  # what a 4-GPU machine reports
    assert casestudy.ddp_world_size("gpu", "cuda") == (4, "4 GPUs, NCCL")
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    processes, reason = casestudy.ddp_world_size("gpu", "cuda")
    assert processes == 0 and "1 GPU visible" in reason


def test_pretrained_weights_check_reads_only_the_local_cache(tmp_path, monkeypatch):
    """An empty cache says how to fetch the weights; a cache holding the file finds it; a model
    without pretrained weights says so. No network: the cache is a folder of the test's own."""
    from huggingface_hub import constants

    import course_lib.models.speedrun  # noqa: F401  (registers speedrun_resnet, which has no weights)

    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path))
    available, reason = casestudy.pretrained_weights_cached("test_resnet")
    assert not available and "timm/test_resnet.r160_in1k is not in the Hugging Face cache" in reason
    snapshot = tmp_path / "models--timm--test_resnet.r160_in1k" / "snapshots" / "abc123"
    snapshot.mkdir(parents=True)
    (snapshot / "model.safetensors").write_bytes(b"weights")
    (tmp_path / "models--timm--test_resnet.r160_in1k" / "refs").mkdir()
    (tmp_path / "models--timm--test_resnet.r160_in1k" / "refs" / "main").write_text("abc123")
    assert casestudy.pretrained_weights_cached("test_resnet") == (
        True, f"timm/test_resnet.r160_in1k cached at {snapshot / 'model.safetensors'}")
    assert casestudy.pretrained_weights_cached("speedrun_resnet") == (
        False, "timm has no pretrained weights for speedrun_resnet")


def _row(stage, rate, kept=True, rates=None):
    return {"stage": stage, "images_per_second": rate, "kept": kept, "note": "", "epoch_rates": rates}


def test_speed_stages_are_kept_only_when_faster_beyond_timing_noise(config):
    study = casestudy.CaseStudy(config, profile="smoke")
    study.rows = [{**_row("baseline", 100.0, rates=[99.0, 100.0, 101.0]), "speedup_vs_baseline": 1.0}]
    slower = _row("data_loader", 80.0, rates=[79.0, 80.0, 81.0])
    study._decide(slower)
    assert slower["speedup_vs_baseline"] == pytest.approx(0.8) and not slower["kept"]
    assert "not kept: 0.80x" in slower["note"]
    study.rows.append(slower)
    # 3% faster, but epochs vary by about 10%: inside the noise, so not kept although the ratio is above 1.
    noisy = _row("amp", 103.0, rates=[93.0, 103.0, 113.0])
    study._decide(noisy)
    assert noisy["speedup_vs_previous"] == pytest.approx(1.03) and not noisy["kept"]
    assert noisy["rate_noise_band"] > 3.0 and "noise band" in noisy["note"]
    study.rows.append(noisy)
    faster = _row("ddp", 250.0, rates=[250.0])  # one timing (DDP): judged against the previous stage's noise
    study._decide(faster)  # compared with the last kept stage (the baseline), not the dropped ones
    assert faster["kept"] and faster["speedup_vs_previous"] == pytest.approx(2.5)
    study.rows.append(faster)
    recipe = _row("optimizer", 200.0, rates=[200.0, 200.0])
    study._decide(recipe)
    assert recipe["kept"] and recipe["speedup_vs_previous"] == pytest.approx(0.8)  # recipe stages always kept
    lone = _row("amp", 500.0, rates=[500.0])
    study.rows = [{**_row("baseline", 100.0, rates=[100.0]), "speedup_vs_baseline": 1.0}]
    study._decide(lone)
    assert not lone["kept"] and "no noise estimate" in lone["note"]


def test_fastest_recipe_stage_brings_the_speedrun_ingredients(config):
    changes = casestudy.stage_changes("fastest_recipe", config, device="cpu")
    assert changes["storage"] == RECIPES["speedrun"]["storage"] and changes["augmentation"] == "device"
    assert changes["tta_views"] == 1
    # its own budget, the one stage trained to convergence: the recipe's epochs over the whole split
    assert changes["epochs"] == RECIPES["speedrun"]["epochs"] and changes["max_train_images"] == 0
    assert "model" not in changes and "image_size" not in changes
    config.replace(**changes)


def test_the_overall_accuracy_claim_compares_only_runs_of_one_budget(monkeypatch):
    """The fastest recipe trains to convergence (21 epochs of the whole split) while the baseline trains the
    study's 2 epochs of 4,500 images: their top-1s differ by the budget, not the stages, so the overall
    claim is not decided from them; at one budget it is."""
    monkeypatch.setattr(claims, "_hardware", lambda: "test machine")
    study = _study_with_rates([100, 104, 98, 102], [1590, 1610])
    study.rows[0].update(epochs=2, train_images=4500)
    study.rows[1].update(epochs=21, train_images=18900)
    found = {c.key: c for c in casestudy.claims(study)}["casestudy_accuracy"]
    assert found.verdict == claims.NOT_MEASURABLE and "different budgets" in found.reason
    assert "21 epoch(s) of 18900 images" in found.reason
    study.rows[1].update(epochs=2, train_images=4500)
    assert {c.key: c for c in casestudy.claims(study)}["casestudy_accuracy"].verdict == claims.HOLDS


def test_an_accuracy_stage_after_a_kept_ddp_stage_is_not_compared_with_the_baseline(monkeypatch):
    """A kept DDP stage doubles the global batch on 2 processes: the optimizer stage after it trains half the
    steps of the baseline (Intel Xeon, cpu profile: 40.7% against the baseline seeds' 55.4%, DDP alone 51.1%),
    so its top-1 against the baseline seeds says nothing about AdamW."""
    monkeypatch.setattr(claims, "_hardware", lambda: "test machine")
    study = _study_with_rates([100, 104, 98, 102], [300, 310], top1s=(0.61, 0.55, 0.50))
    study.rows[0].update(world_size=1, batch_per_process=128)
    study.rows.insert(1, {"stage": "optimizer", "kept": True, "images_per_second": 110, "epoch_rates": [110, 112],
                          "val_top1": 0.40, "val_images": 1000, "world_size": 2, "batch_per_process": 128,
                          "epochs": 2, "train_images": 4500})
    found = {c.key: c for c in casestudy.claims(study)}["casestudy_adamw"]
    assert found.verdict == claims.NOT_MEASURABLE
    assert "global batch of 256 against the baseline's 128" in found.reason and "run_ddp=false" in found.reason
    study.rows[1].update(world_size=1)  # one process, the baseline's batch: decided against the seeds' band
    assert {c.key: c for c in casestudy.claims(study)}["casestudy_adamw"].verdict == claims.REFUTED


def _fitted(bundle, config, rates, top1, precision="off"):
    """A FitResult as train.fit returns it, one history row per epoch (no model: record reads only the numbers)."""
    history = [{"images_per_second": rate, "epoch_seconds": 1.0, "val_top1": top1, "train_loss": 1.0}
               for rate in rates]
    return train.FitResult(model=None, history=history, classes=bundle.classes, config=config, checkpoint_path=None,
                           precision=precision, duration_seconds=2.0)


def test_record_makes_the_row_records_it_and_carries_only_a_kept_config_forward(config):
    bundle = SimpleNamespace(train=list(range(600)), val=list(range(200)), classes=list("abcdefgh"))
    study = casestudy.CaseStudy(casestudy.baseline_config(config), profile="smoke", bundle=bundle)
    baseline = study.record("baseline", study.config, _fitted(bundle, study.config, [99.0, 100.0, 101.0], 0.5), {})
    assert baseline["kept"] and (baseline["train_images"], baseline["val_images"]) == (600, 200)
    assert baseline["wall_seconds"] == 2.0 and baseline["epoch_rates"] == [99.0, 100.0, 101.0]
    assert study.baseline_top1s == [0.5] and study.baseline_rates == [99.0, 100.0, 101.0] and study.num_classes == 8
    slower = study.config.replace(num_workers=1)
    row = study.record("data_loader", slower, _fitted(bundle, slower, [79.0, 80.0, 81.0], 0.5), {"num_workers": 1})
    assert not row["kept"] and study.config.num_workers == 0  # not kept: the next stage starts without it
    faster = study.config.replace(precision="bf16")
    row = study.record("amp", faster, _fitted(bundle, faster, [199.0, 200.0, 201.0], 0.5, "bf16"), {"precision": "bf16"})
    assert row["kept"] and row["precision"] == "bf16" and row["change"] == "precision=bf16"
    assert study.config is faster and study.config_of["amp"] is faster and study.world_size == 1
    rows = ledger.Ledger().rows(kind=casestudy.LEDGER_KIND)
    assert [r["name"] for r in rows] == ["amp", "data_loader", "baseline"]
    assert rows[0]["parameters"]["changes"] == {"precision": "bf16"} and rows[0]["parameters"]["world_size"] == 1
    study.record_seed(_fitted(bundle, study.config_of["baseline"], [100.0], 0.52))
    assert study.baseline_top1s == [0.5, 0.52] and len(study.baseline_rates) == 4 and study.accuracy_band() > 0
    with pytest.raises(ConfigError, match="unknown stage"):
        study.record("turbo", study.config, None, {})


def _fit_and_record(study, stage, changes):
    """A stage as notebook 10 trains it: `changes` on the kept config, train.fit, then the study's record."""
    config = study.config.replace(**changes)
    return study.record(stage, config, train.fit(config, bundle=study.bundle_for(config), verbose=False), changes)


@pytest.mark.slow
def test_case_study_runs_records_and_tabulates(config):
    bundle = pipeline.build_datasets(config)
    study = casestudy.CaseStudy(casestudy.baseline_config(config), profile="smoke", bundle=bundle)
    baseline = _fit_and_record(study, "baseline", {})
    assert baseline["kept"] and baseline["speedup_vs_baseline"] == pytest.approx(1.0)
    assert baseline["full_epoch_seconds"] == pytest.approx(len(bundle.train) / baseline["images_per_second"])
    # every epoch's speed reaches the ledger: a DDP stage (known only from the ledger) gets its noise from it
    assert ledger.Ledger().rows(kind="train")[0]["metrics"]["epoch_images_per_second"] == baseline["epoch_rates"]
    study.skip("ddp", "skipped: test")
    _fit_and_record(study, "regularization", casestudy.stage_changes("regularization", study.config, device="cpu"))
    assert study.config.mixup_alpha == 0.3  # kept changes carry forward
    first = study.config_of["baseline"]
    study.record_seed(train.fit(first.replace(seed=1), bundle=study.bundle_for(first), verbose=False))
    noise = statistics.seed_noise(study.baseline_top1s)
    assert noise["runs"] == 2 and len(study.baseline_top1s) == 2 and study.accuracy_band() > 0
    table = study.table()
    assert list(table.index) == ["baseline", "ddp", "regularization"]
    for column in ("images_per_second", "rate_noise_band", "full_epoch_seconds", "data_wait_fraction",
                   "peak_memory_bytes", "val_top1", "val_top1_band", "top1_vs_baseline_seeds", "article_top1", "kept"):
        assert column in table.columns, column
    assert table.loc["baseline", "article_epoch_minutes"] == 40.0
    assert table.loc["regularization", "article_top1"] == pytest.approx(0.938)
    assert table.loc["regularization", "article_speedup"] == pytest.approx(10.0)
    rows = ledger.Ledger().rows(kind=casestudy.LEDGER_KIND)
    assert [r["name"] for r in rows] == ["regularization", "ddp", "baseline"]
    assert rows[0]["parameters"]["stage"] == "regularization" and rows[0]["parameters"]["study_id"] == study.study_id
    assert rows[1]["status"] == "skipped"
    earlier = casestudy.previous_studies()
    assert len(earlier) == 1 and earlier.loc[0, "baseline speed-up"] == pytest.approx(1.0)
    assert table["MFU"].notna().sum() == 2 and table.loc["ddp", "MFU"] != table.loc["ddp", "MFU"]
    found = casestudy.claims(study, hardware="test machine")
    assert [c.key for c in found] == ["case_study_speedup", "casestudy_dataloader", "casestudy_amp", "casestudy_ddp",
                                      "casestudy_adamw", "casestudy_regularization", "casestudy_accuracy"]
    assert all(c.hardware == "test machine" for c in found)
    # No fastest-recipe stage, no data_loader stage; ddp was skipped with a reason.
    assert found[0].verdict == found[1].verdict == found[3].verdict == claims.NOT_MEASURABLE
    assert found[3].reason == "skipped: test" and "data_loader was not run" in found[1].reason
    assert found[5].verdict in (claims.HOLDS, claims.REFUTED, claims.NOT_SHOWN) and "points vs the baseline" in found[5].reason
    assert set(table["top1_vs_baseline_seeds"].dropna()) <= {"higher", "lower", "within noise"}


def test_previous_studies_empty_ledger():
    assert casestudy.previous_studies().empty


def _study_with_rates(baseline_rates, fastest_rates, top1s=(0.70, 0.72, 0.71), fastest_top1=0.9):
    study = casestudy.CaseStudy(casestudy.baseline_config(make_config("smoke")), profile="smoke")
    study.rows = [{"stage": "baseline", "kept": True, "images_per_second": sum(baseline_rates[:2]) / 2,
                   "epoch_rates": baseline_rates[:2], "val_top1": top1s[0], "val_images": 1000,
                   "speedup_vs_baseline": 1.0},
                  {"stage": "fastest_recipe", "kept": True, "images_per_second": sum(fastest_rates) / len(fastest_rates),
                   "epoch_rates": fastest_rates, "val_top1": fastest_top1, "val_images": 1000,
                   "speedup_vs_baseline": None}]
    study.baseline_rates, study.baseline_top1s, study.train_images = list(baseline_rates), list(top1s), 6000
    return study


def test_the_speedup_claim_has_a_bootstrap_interval(monkeypatch):
    monkeypatch.setattr(claims, "_hardware", lambda: "test machine")
    study = _study_with_rates([100, 104, 98, 102, 101, 99], [1590, 1610])  # 16x, as the article claims
    speedup = casestudy.speedup_interval(study)
    assert speedup["ratio"] == pytest.approx(1600 / 100.666, rel=1e-3) and speedup["low"] < 15.9 < speedup["high"]
    found = {c.key: c for c in casestudy.claims(study)}
    assert found["case_study_speedup"].verdict == claims.HOLDS and found["case_study_speedup"].low is not None
    assert found["casestudy_accuracy"].verdict == claims.HOLDS  # +19 points, far beyond the seeds' band
    slow = {c.key: c for c in casestudy.claims(_study_with_rates([100, 104, 98, 102], [300, 310], fastest_top1=0.71))}
    assert slow["case_study_speedup"].verdict == claims.REFUTED
    # 71%, the baseline seeds' mean: inside their band, so not shown beyond noise (not refuted)
    assert slow["casestudy_accuracy"].verdict == claims.NOT_SHOWN and "noise band" in slow["casestudy_accuracy"].reason
    # One timing of the fastest stage: a ratio without an interval.
    single = casestudy.speedup_interval(_study_with_rates([100, 104], [1600]))
    assert single["low"] is None and single["ratio"] == pytest.approx(1600 / 102)


def test_run_notes_name_the_stages_not_kept():
    study = _study_with_rates([100, 104], [1600])
    study.rows.append({"stage": "ddp", "kept": False})
    notes = casestudy.run_notes(study, smoke=True, synthetic=True)
    assert "not kept on this hardware: ddp" in notes and "SYNTHETIC" in notes and "Smoke" in notes


def test_a_ddp_stage_records_the_precision_its_workers_resolved(config, tmp_path):
    """precision=auto is resolved by the torchrun workers: the stage's row (and its MFU) takes the
    precision their ledger row names. Before, the row kept "auto" and the table's MFU raised. A kept
    DDP stage carries its processes into the next stage."""
    from course_lib.engine import torchrun

    metrics = {"images_per_second": 120.0, "epoch_images_per_second": [118.0, 122.0], "val_top1": 0.5}
    launched = torchrun.LaunchResult(run_id="test", commands=[], returncode=0, world_size=2, nnodes=1,
                                     duration_seconds=1.0, lines=[], rank_lines={}, failures=[], log_dir=tmp_path,
                                     rows=[{"metrics": metrics, "parameters": {"precision_used": "bf16"}}])
    study = casestudy.CaseStudy(casestudy.baseline_config(config).replace(precision="auto"), profile="cpu")
    study.rows = [{**_row("baseline", 100.0, rates=[99.0, 100.0, 101.0]), "speedup_vs_baseline": 1.0,
                   "world_size": 1, "precision": "off"}]
    study.num_classes = 8
    row = study.record("ddp", study.config, launched, {})
    assert row["precision"] == "bf16" and row["world_size"] == 2 and row["change"] == "2 processes"
    assert row["kept"] and study.world_size == 2
    assert study.table().loc["ddp", "MFU"] > 0


def test_a_stage_within_the_baselines_noise_says_how_many_seeds_would_settle_it(monkeypatch):
    from course_lib.analysis import statistics

    monkeypatch.setattr(claims, "_hardware", lambda: "test machine")
    study = _study_with_rates([100, 104, 98, 102], [300, 310], top1s=(0.70, 0.72, 0.71), fastest_top1=0.715)
    found = {c.key: c for c in casestudy.claims(study)}["casestudy_accuracy"]
    needed = statistics.seeds_needed(0.005, 0.01 * 2 ** 0.5)  # +0.5 points; one run's difference spreads by std * sqrt 2
    assert found.verdict == claims.NOT_SHOWN and needed > 3
    assert f"power: about {needed} paired seeds of this stage and the baseline would show +0.5 points" in found.reason
    assert study.seeds_needed(0.71) is None  # no difference to find
    shown = {c.key: c for c in casestudy.claims(_study_with_rates([100, 104], [1600]))}["casestudy_accuracy"]
    assert shown.verdict == claims.HOLDS and "power" not in shown.reason
