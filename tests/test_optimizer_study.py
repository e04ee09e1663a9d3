"""The SGD/AdamW grid of notebook 06: learning rates, pairing by (learning-rate rank, seed), the
spreads, and the claims' keys and verdicts on fake runs (no training)."""
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest

from course_lib.analysis import claims
from course_lib.chapters import optimizer_study
from course_lib.config import ConfigError, make_config
from course_lib.engine import schedule


def test_learning_rate_grid_scales_sgd_with_the_batch():
    grid = optimizer_study.learning_rate_grid(64)
    assert grid["sgd"] == pytest.approx([0.025 / 3, 0.025, 0.075])
    assert grid["adamw"] == pytest.approx([1e-3 / 3, 1e-3, 3e-3])
    assert optimizer_study.optimizer_overrides("adamw", 1e-3) == {"optimizer": "adamw", "lr": 1e-3, "min_lr": 1e-5,
                                                                   "weight_decay": 0.05}


def fake_fit(accuracy):
    """A stand-in for train.fit whose top-1 is accuracy(optimizer, lr, seed)."""
    def fit(config, bundle=None, progress=True, verbose=True):
        top1 = accuracy(config.optimizer, config.lr, config.seed)
        return SimpleNamespace(final={"val_top1": top1, "train_loss": 1.0, "images_per_second": 100.0})
    return fit


def grid_frame(accuracy, seeds=(0, 1, 2)):
    config = make_config("smoke")
    grid = optimizer_study.learning_rate_grid(config.batch_size)
    return pd.DataFrame(optimizer_study.run_grid(config, grid, seeds, fit=fake_fit(accuracy)))


def article_values():
    article = make_config(None, optimizer="sgd", lr=0.1, warmup_epochs=5.0, min_lr=0.001, epochs=120)
    return schedule.schedule_values(article, steps_per_epoch=50)


def range_tests(sgd=0.3, adamw=3e-3):
    return {"sgd": SimpleNamespace(largest_stable_lr=sgd), "adamw": SimpleNamespace(largest_stable_lr=adamw)}


def robust_adamw(optimizer, lr, seed):
    if optimizer == "adamw":  # flat over learning rates, best at 1e-3
        return 0.80 + 0.01 * seed + (0.01 if abs(lr - 1e-3) < 1e-9 else 0.0)
    return 0.60 + 0.01 * seed + 10 * lr  # SGD: worse, and it depends on the learning rate


def test_run_grid_pairs_by_learning_rate_rank_and_seed():
    frame = grid_frame(robust_adamw)
    assert len(frame) == 18 and set(frame["lr rank"]) == {0, 1, 2}
    difference = optimizer_study.adamw_minus_sgd(frame)
    assert difference["pairs"] == 9
    expected = (frame[frame.optimizer == "adamw"]["val top-1"].mean()
                - frame[frame.optimizer == "sgd"]["val top-1"].mean()) * 100
    assert difference["delta"] == pytest.approx(expected)
    spread = optimizer_study.sensitivity(frame)
    assert spread.loc["adamw", "best lr"] == pytest.approx(1e-3)
    assert spread.loc["adamw", "spread over lrs"] == pytest.approx(0.01)
    assert spread.loc["sgd", "spread over seeds"] == pytest.approx(0.01)


def test_claims_when_adamw_wins_and_is_flatter():
    found = {c.key: c for c in optimizer_study.claims(grid_frame(robust_adamw), range_tests(), article_values())}
    assert list(found) == ["adamw_vs_sgd", "adamw_sensitivity", "warmup_cosine", "lr_sweep", "adamw_lr_range"]
    assert found["adamw_vs_sgd"].verdict == "holds" and found["adamw_vs_sgd"].low > 0
    assert found["adamw_sensitivity"].verdict == "holds"
    assert found["warmup_cosine"].verdict == claims.DEMONSTRATED  # the scheduler against its own formula
    assert found["lr_sweep"].verdict == "holds"  # the best grid rates (SGD 0.019, AdamW 1e-3) under 0.3 and 3e-3
    assert found["adamw_lr_range"].verdict == "holds"


def test_claims_when_sgd_wins_and_adamw_depends_on_the_learning_rate():
    def sgd_better(optimizer, lr, seed):
        if optimizer == "adamw":
            return 0.5 + 50 * lr + 0.01 * seed  # best at 3e-3, outside the article's range
        return 0.9 + 0.01 * seed
    found = {c.key: c for c in optimizer_study.claims(grid_frame(sgd_better), range_tests(), article_values())}
    assert found["adamw_vs_sgd"].verdict == "refuted" and found["adamw_vs_sgd"].measured < 0
    assert found["adamw_sensitivity"].verdict == "refuted"
    assert found["adamw_lr_range"].verdict == "refuted"


# --- Sections 5 and 6: batch size against learning rate, schedule against optimizer ---

def test_scaling_rules_closed_forms():
    linear = optimizer_study.scaled_learning_rate
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
    assert optimizer_study.batch_sizes(1024) == [32, 64, 128, 256, 512, 1024]
    assert optimizer_study.batch_sizes(1000) == [32, 64, 128, 256, 512]
    assert optimizer_study.batch_sizes(32) == [32]
    with pytest.raises(ValueError, match="below the smallest"):
        optimizer_study.batch_sizes(16)


def test_batch_plan_shares_the_base_run_between_the_rules():
    plan = optimizer_study.batch_plan(64, 0.1, [32, 64, 256])
    labels = [entry[0] for entry in plan]
    assert [(row["batch"], row["rules"]) for row in labels] == [
        (32, "linear"), (32, "sqrt"), (64, "linear, sqrt"), (256, "linear"), (256, "sqrt")]
    assert [row["lr"] for row in labels] == pytest.approx([0.05, 0.1 / 2 ** 0.5, 0.1, 0.4, 0.2])
    overrides = plan[3][1]
    assert overrides["batch_size"] == 256 and overrides["optimizer"] == "sgd" and overrides["lr"] == pytest.approx(0.4)


def test_largest_batch_is_bounded_by_the_split_time_and_memory():
    config = make_config("smoke", storage="cache", augmentation="device")
    largest, reason, per_image = optimizer_study.largest_batch_for(config, train_images=256, time_cap=64)
    assert largest == 64 and "time cap" in reason and per_image > 0
    largest, reason, _ = optimizer_study.largest_batch_for(config, train_images=100, time_cap=0)
    assert largest == 50 and "the split" in reason  # at least 2 steps per epoch
    with pytest.raises(ConfigError, match="largest_batch=16"):
        optimizer_study.largest_batch_for(config, train_images=256, time_cap=16)
    with pytest.raises(ConfigError, match="max_train_images of 64"):
        optimizer_study.largest_batch_for(config, train_images=40, time_cap=0)


def plan_fit(accuracy):
    """A stand-in for train.fit whose top-1 is accuracy(config) and whose steps follow the batch."""
    def fit(config, bundle=None, progress=True, verbose=True):
        return SimpleNamespace(final={"val_top1": accuracy(config), "train_loss": 1.0,
                                      "optimizer_steps": 2 * (2048 // config.batch_size)})
    return fit


def sweep(accuracy, seeds=(0, 1, 2)):
    config = make_config("smoke")
    plan = optimizer_study.batch_plan(64, 0.1, [32, 64, 128, 256, 512, 1024])
    return pd.DataFrame(optimizer_study.run_plan(config, plan, list(seeds), fit=plan_fit(accuracy), progress=False))


def linear_breaks_at_512(config):
    """top-1 flat at 0.80 (+-0.005 by seed) until the linear rule's rate passes 0.6 (batch 512)."""
    return (0.80 if config.lr < 0.6 else 0.60) + 0.005 * (config.seed - 1)


def test_scaling_table_finds_where_the_linear_rule_breaks():
    frame = sweep(linear_breaks_at_512)
    assert len(frame) == 11 * 3  # 6 sizes x 2 rules, the B0 run shared, x 3 seeds
    table = optimizer_study.scaling_table(frame, val_images=10_000)
    assert table.loc[("linear", 64), "lr"] == pytest.approx(0.1) and table.loc[("sqrt", 64), "lr"] == pytest.approx(0.1)
    assert table.loc[("linear", 512), "verdict"] == "below the best"
    assert table.loc[("linear", 512), "vs best (points)"] == pytest.approx(-20.0)
    assert table.loc[("sqrt", 1024), "verdict"] != "below the best"  # sqrt: 0.1 x 4 = 0.4 < 0.6
    breaks = optimizer_study.where_rules_break(table, base_batch=64)
    assert breaks.loc["linear", "breaks at (above B0)"] == "512" and breaks.loc["linear", "below the best"] == "512, 1024"
    assert breaks.loc["sqrt", "breaks at (above B0)"] == "not up to 1024"
    (found,) = optimizer_study.scaling_claims(table, 64, "planted")
    assert found.key == "batch_lr_scaling" and found.verdict == "holds"  # 64 and 128 are within noise


def test_scaling_claim_is_refuted_when_the_article_range_falls_below_the_best():
    frame = sweep(lambda config: (0.80 if config.batch_size < 128 else 0.50) + 0.005 * config.seed)
    (found,) = optimizer_study.scaling_claims(optimizer_study.scaling_table(frame, 10_000), 64, "planted")
    assert found.verdict == "refuted" and found.measured == pytest.approx(-30.0)
    narrow = optimizer_study.scaling_table(frame[frame["batch"] == 32], 10_000)
    (missing,) = optimizer_study.scaling_claims(narrow, 64, "planted")
    assert missing.verdict == "not measurable here"


def test_the_seed_noise_floor_keeps_agreeing_seeds_from_making_every_gap_real():
    # every cell 0.1 points apart, seeds identical: without the binomial floor the band would be 0
    frame = sweep(lambda config: 0.70 + 0.001 * config.batch_size / 1024)
    table = optimizer_study.scaling_table(frame, val_images=1000)
    assert (table["verdict"] != "below the best").all()


def schedule_frame(accuracy, seeds=(0, 1, 2)):
    config = make_config("smoke")
    plan = optimizer_study.schedule_plan({"sgd": 0.05, "adamw": 1e-3})
    return pd.DataFrame(optimizer_study.run_plan(config, plan, list(seeds), fit=plan_fit(accuracy), progress=False))


SCHEDULE_GAIN = {"constant": 0.0, "step": 0.05, "cosine": 0.10, "onecycle": 0.15}


def test_schedule_plan_keeps_each_optimizer_at_its_tuned_rate():
    plan = optimizer_study.schedule_plan({"sgd": 0.05, "adamw": 1e-3})
    assert len(plan) == 8
    assert {(labels["schedule"], labels["optimizer"]) for labels, _ in plan} == {
        (s, o) for s in optimizer_study.STUDY_SCHEDULES for o in ("sgd", "adamw")}
    assert all(overrides["lr"] == (0.05 if labels["optimizer"] == "sgd" else 1e-3) and
               overrides["lr_schedule"] == labels["schedule"] for labels, overrides in plan)
    with pytest.raises(ConfigError, match="'warm' is not one of"):
        optimizer_study.schedule_plan({"sgd": 0.05, "adamw": 1e-3}, schedules=("warm", "cosine"))


def test_decomposition_holds_when_only_the_schedule_matters():
    jitter = np.random.default_rng(0)
    frame = schedule_frame(lambda c: 0.6 + SCHEDULE_GAIN[c.lr_schedule] + 0.01 * c.seed + jitter.normal(0, 0.002))
    result = optimizer_study.schedule_vs_optimizer(frame)
    # pairs of (0, 5, 10, 15) points: mean |difference| = 50 / 6; the optimizer changes nothing
    assert result["schedule effect"]["mean"] == pytest.approx(50 / 6, abs=0.5)
    assert result["optimizer effect"]["mean"] == pytest.approx(0.0, abs=0.5)
    assert result["verdict"] == "holds" and result["seeds"] == 3
    (found,) = optimizer_study.schedule_claims(result, "planted")
    assert found.key == "schedule_over_optimizer" and found.verdict == "holds" and found.low > 0
    table = optimizer_study.schedule_table(frame)
    assert table.loc["range across schedules", "sgd"] == pytest.approx(15, abs=1)
    assert table.loc["cosine", "range across optimizers"] == pytest.approx(0, abs=1)


def test_decomposition_is_refuted_when_only_the_optimizer_matters():
    jitter = np.random.default_rng(1)
    frame = schedule_frame(lambda c: 0.6 + (0.10 if c.optimizer == "adamw" else 0.0) + jitter.normal(0, 0.002))
    result = optimizer_study.schedule_vs_optimizer(frame)
    assert result["verdict"] == "refuted" and result["difference"]["high"] < 0
    (found,) = optimizer_study.schedule_claims(result, "planted")
    assert found.verdict == "refuted"


def test_decomposition_on_noise_alone_is_not_shown():
    for seed in range(5):  # several draws: noise alone never reads as either effect
        jitter = np.random.default_rng(100 + seed)
        frame = schedule_frame(lambda c: 0.6 + jitter.normal(0, 0.02))
        result = optimizer_study.schedule_vs_optimizer(frame)
        assert result["verdict"] == "not shown beyond noise", seed
        # The claim never holds on noise; a difference within 0.5 points of 0 refutes "matters more" (equivalence).
        assert optimizer_study.schedule_claims(result, "noise")[0].verdict in (claims.NOT_SHOWN, claims.REFUTED)


@pytest.mark.parametrize("sweep, verdict", [((0.3, 3e-3), "holds"), ((0.01, 3e-3), "refuted"),
                                            ((0.3, 5e-4), "refuted")])
def test_lr_sweep_fails_when_the_sweep_would_have_cut_off_the_best_rate(sweep, verdict):
    """Issue 51: lr_sweep held whenever the range test returned any positive rate."""
    found = {c.key: c for c in optimizer_study.claims(grid_frame(robust_adamw), range_tests(*sweep), article_values())}
    assert found["lr_sweep"].verdict == verdict


def test_decomposition_refuses_an_incomplete_design():
    frame = schedule_frame(lambda c: 0.6, seeds=(0,))
    with pytest.raises(ValueError, match="2\\+ seeds"):
        optimizer_study.schedule_vs_optimizer(frame)
