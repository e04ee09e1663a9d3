"""Notebook 06's sections 5-6: the batch sweep's scaling rules and bounds, the noise band of its table,
and schedule x optimizer's decomposition and claims, on fake runs (no training)."""
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest

from course_lib.analysis import claims
from course_lib.chapters import optimizer_study, scaling_study
from course_lib.config import ConfigError, make_config


def test_scaling_rules_closed_forms():
    linear = scaling_study.scaled_learning_rate
    assert linear("linear", 0.1, 64, 64) == linear("sqrt", 0.1, 64, 64) == pytest.approx(0.1)
    assert linear("linear", 0.1, 64, 256) == pytest.approx(0.4)  # 4x the batch: 4x the rate
    assert linear("sqrt", 0.1, 64, 256) == pytest.approx(0.2)  # 4x the batch: 2x the rate
    assert linear("linear", 0.1, 64, 32) == pytest.approx(0.05)
    assert linear("sqrt", 0.1, 64, 32) == pytest.approx(0.1 / 2 ** 0.5)
    with pytest.raises(ConfigError, match="not one of linear, sqrt"):
        linear("cubic", 0.1, 64, 128)
    with pytest.raises(ConfigError, match="positive"):
        linear("linear", 0.0, 64, 128)


def test_batch_sizes_are_powers_of_two_up_to_the_cap():
    assert scaling_study.batch_sizes(1024) == [32, 64, 128, 256, 512, 1024]
    assert scaling_study.batch_sizes(1000) == [32, 64, 128, 256, 512]
    assert scaling_study.batch_sizes(32) == [32]
    with pytest.raises(ValueError, match="below the smallest"):
        scaling_study.batch_sizes(16)


def test_batch_plan_shares_the_base_run_between_the_rules():
    plan = scaling_study.batch_plan(64, 0.1, [32, 64, 256])
    labels = [entry[0] for entry in plan]
    assert [(row["batch"], row["rules"]) for row in labels] == [
        (32, "linear"), (32, "sqrt"), (64, "linear, sqrt"), (256, "linear"), (256, "sqrt")]
    assert [row["lr"] for row in labels] == pytest.approx([0.05, 0.1 / 2 ** 0.5, 0.1, 0.4, 0.2])
    overrides = plan[3][1]
    assert overrides["batch_size"] == 256 and overrides["optimizer"] == "sgd" and overrides["lr"] == pytest.approx(0.4)


def test_largest_batch_is_bounded_by_the_split_time_and_memory():
    config = make_config("smoke", storage="cache", augmentation="device")
    largest, reason, per_image = scaling_study.largest_batch_for(config, train_images=256, time_cap=64)
    assert largest == 64 and "time cap" in reason and per_image > 0
    largest, reason, _ = scaling_study.largest_batch_for(config, train_images=100, time_cap=0)
    assert largest == 50 and "the split" in reason  # at least 2 steps per epoch
    with pytest.raises(ConfigError, match="largest_batch=16"):
        scaling_study.largest_batch_for(config, train_images=256, time_cap=16)
    with pytest.raises(ConfigError, match="max_train_images of 64"):
        scaling_study.largest_batch_for(config, train_images=40, time_cap=0)


def plan_fit(accuracy):
    """A stand-in for train.fit whose top-1 is accuracy(config) and whose steps follow the batch."""
    def fit(config, bundle=None, progress=True, verbose=True):
        return SimpleNamespace(final={"val_top1": accuracy(config), "train_loss": 1.0,
                                      "optimizer_steps": 2 * (2048 // config.batch_size)})
    return fit


def sweep(accuracy, seeds=(0, 1, 2)):
    config = make_config("smoke")
    plan = scaling_study.batch_plan(64, 0.1, [32, 64, 128, 256, 512, 1024])
    return pd.DataFrame(optimizer_study.run_plan(config, plan, list(seeds), fit=plan_fit(accuracy), progress=False))


def linear_breaks_at_512(config):
    """top-1 flat at 0.80 (+-0.005 by seed) until the linear rule's rate passes 0.6 (batch 512)."""
    return (0.80 if config.lr < 0.6 else 0.60) + 0.005 * (config.seed - 1)


def test_scaling_table_finds_where_the_linear_rule_breaks():
    frame = sweep(linear_breaks_at_512)
    assert len(frame) == 11 * 3  # 6 sizes x 2 rules, the B0 run shared, x 3 seeds
    table = scaling_study.scaling_table(frame, val_images=10_000)
    assert table.loc[("linear", 64), "lr"] == pytest.approx(0.1) and table.loc[("sqrt", 64), "lr"] == pytest.approx(0.1)
    assert table.loc[("linear", 512), "verdict"] == "below the best"
    assert table.loc[("linear", 512), "vs best (points)"] == pytest.approx(-20.0)
    assert table.loc[("sqrt", 1024), "verdict"] != "below the best"  # sqrt: 0.1 x 4 = 0.4 < 0.6
    breaks = scaling_study.where_rules_break(table, base_batch=64)
    assert breaks.loc["linear", "breaks at (above B0)"] == "512" and breaks.loc["linear", "below the best"] == "512, 1024"
    assert breaks.loc["sqrt", "breaks at (above B0)"] == "not up to 1024"
    (found,) = scaling_study.scaling_claims(table, 64, "planted")
    assert found.key == "batch_lr_scaling" and found.verdict == "holds"  # 64 and 128 are within noise


def test_scaling_claim_is_refuted_when_the_article_range_falls_below_the_best():
    frame = sweep(lambda config: (0.80 if config.batch_size < 128 else 0.50) + 0.005 * config.seed)
    (found,) = scaling_study.scaling_claims(scaling_study.scaling_table(frame, 10_000), 64, "planted")
    assert found.verdict == "refuted" and found.measured == pytest.approx(-30.0)
    narrow = scaling_study.scaling_table(frame[frame["batch"] == 32], 10_000)
    (missing,) = scaling_study.scaling_claims(narrow, 64, "planted")
    assert missing.verdict == "not measurable here"


def test_the_seed_noise_floor_keeps_agreeing_seeds_from_making_every_gap_real():
    # every cell 0.1 points apart, seeds identical: without the binomial floor the band would be 0
    frame = sweep(lambda config: 0.70 + 0.001 * config.batch_size / 1024)
    table = scaling_study.scaling_table(frame, val_images=1000)
    assert (table["verdict"] != "below the best").all()


def schedule_frame(accuracy, seeds=(0, 1, 2)):
    config = make_config("smoke")
    plan = scaling_study.schedule_plan({"sgd": 0.05, "adamw": 1e-3})
    return pd.DataFrame(optimizer_study.run_plan(config, plan, list(seeds), fit=plan_fit(accuracy), progress=False))


SCHEDULE_GAIN = {"constant": 0.0, "step": 0.05, "cosine": 0.10, "onecycle": 0.15}


def test_schedule_plan_keeps_each_optimizer_at_its_tuned_rate():
    plan = scaling_study.schedule_plan({"sgd": 0.05, "adamw": 1e-3})
    assert len(plan) == 8
    assert {(labels["schedule"], labels["optimizer"]) for labels, _ in plan} == {
        (s, o) for s in scaling_study.STUDY_SCHEDULES for o in ("sgd", "adamw")}
    assert all(overrides["lr"] == (0.05 if labels["optimizer"] == "sgd" else 1e-3) and
               overrides["lr_schedule"] == labels["schedule"] for labels, overrides in plan)
    with pytest.raises(ConfigError, match="'warm' is not one of"):
        scaling_study.schedule_plan({"sgd": 0.05, "adamw": 1e-3}, schedules=("warm", "cosine"))


def test_decomposition_holds_when_only_the_schedule_matters():
    jitter = np.random.default_rng(0)
    frame = schedule_frame(lambda c: 0.6 + SCHEDULE_GAIN[c.lr_schedule] + 0.01 * c.seed + jitter.normal(0, 0.002))
    result = scaling_study.schedule_vs_optimizer(frame)
    # pairs of (0, 5, 10, 15) points: mean |difference| = 50 / 6; the optimizer changes nothing
    assert result["schedule effect"]["mean"] == pytest.approx(50 / 6, abs=0.5)
    assert result["optimizer effect"]["mean"] == pytest.approx(0.0, abs=0.5)
    assert result["verdict"] == "holds" and result["seeds"] == 3
    (found,) = scaling_study.schedule_claims(result, "planted")
    assert found.key == "schedule_over_optimizer" and found.verdict == "holds" and found.low > 0
    table = scaling_study.schedule_table(frame)
    assert table.loc["range across schedules", "sgd"] == pytest.approx(15, abs=1)
    assert table.loc["cosine", "range across optimizers"] == pytest.approx(0, abs=1)


def test_decomposition_is_refuted_when_only_the_optimizer_matters():
    jitter = np.random.default_rng(1)
    frame = schedule_frame(lambda c: 0.6 + (0.10 if c.optimizer == "adamw" else 0.0) + jitter.normal(0, 0.002))
    result = scaling_study.schedule_vs_optimizer(frame)
    assert result["verdict"] == "refuted" and result["difference"]["high"] < 0
    (found,) = scaling_study.schedule_claims(result, "planted")
    assert found.verdict == "refuted"


def test_decomposition_on_noise_alone_is_not_shown():
    for seed in range(5):  # several draws: noise alone never reads as either effect
        jitter = np.random.default_rng(100 + seed)
        frame = schedule_frame(lambda c: 0.6 + jitter.normal(0, 0.02))
        result = scaling_study.schedule_vs_optimizer(frame)
        assert result["verdict"] == "not shown beyond noise", seed
        # The claim never holds on noise; a difference within 0.5 points of 0 refutes "matters more" (equivalence).
        assert scaling_study.schedule_claims(result, "noise")[0].verdict in (claims.NOT_SHOWN, claims.REFUTED)


def test_decomposition_refuses_an_incomplete_design():
    frame = schedule_frame(lambda c: 0.6, seeds=(0,))
    with pytest.raises(ValueError, match="2\\+ seeds"):
        scaling_study.schedule_vs_optimizer(frame)
