"""The SGD/AdamW grid of notebook 06: learning rates, pairing by (learning-rate rank, seed), the
spreads, and the claims' keys and verdicts on fake runs (no training)."""
from types import SimpleNamespace

import pandas as pd
import pytest

from course_lib.analysis import claims
from course_lib.chapters import optimizer_study
from course_lib.config import make_config
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
    plan = optimizer_study.grid_plan(grid)
    return pd.DataFrame(optimizer_study.run_plan(config, plan, seeds, fit=fake_fit(accuracy), progress=False))


def article_values():
    article = make_config(None, optimizer="sgd", lr=0.1, warmup_epochs=5.0, min_lr=0.001, epochs=120)
    return schedule.schedule_values(article, steps_per_epoch=50)


def range_tests(sgd=0.3, adamw=3e-3):
    return {"sgd": SimpleNamespace(largest_stable_lr=sgd), "adamw": SimpleNamespace(largest_stable_lr=adamw)}


def robust_adamw(optimizer, lr, seed):
    if optimizer == "adamw":  # flat over learning rates, best at 1e-3
        return 0.80 + 0.01 * seed + (0.01 if abs(lr - 1e-3) < 1e-9 else 0.0)
    return 0.60 + 0.01 * seed + 10 * lr  # SGD: worse, and it depends on the learning rate


def test_the_grid_pairs_by_learning_rate_rank_and_seed():
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


@pytest.mark.parametrize("sweep, verdict", [((0.3, 3e-3), "holds"), ((0.01, 3e-3), "refuted"),
                                            ((0.3, 5e-4), "refuted")])
def test_lr_sweep_fails_when_the_sweep_would_have_cut_off_the_best_rate(sweep, verdict):
    """Issue 51: lr_sweep held whenever the range test returned any positive rate."""
    found = {c.key: c for c in optimizer_study.claims(grid_frame(robust_adamw), range_tests(*sweep), article_values())}
    assert found["lr_sweep"].verdict == verdict
