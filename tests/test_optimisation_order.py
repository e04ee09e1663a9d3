"""Notebook 10's order of optimisations: the two orders' training time side by side, and the claim both ways."""
import pytest

from course_lib.analysis import claims
from course_lib.chapters import optimisation_order
from course_lib.chapters.casestudy import CaseStudy
from course_lib.config import make_config


def _study(rates: dict, top1: float = 0.8, world_size: int = 1) -> CaseStudy:
    """A study whose rows hold each stage's two epochs' images/s (1,000 images an epoch) and three baseline seeds."""
    study = CaseStudy(make_config("smoke"), profile="smoke", world_size=world_size)
    study.rows = [{"stage": "baseline", "kept": True, "precision": "off", "epoch_rates": [100.0, 100.0],
                   "images_per_second": 100.0, "epoch_seconds": 10.0, "val_top1": top1, "val_images": 1000}]
    for stage, stage_rates in rates.items():
        study.rows.append({"stage": stage, "kept": True, "precision": "bf16", "epoch_rates": stage_rates,
                           "images_per_second": stage_rates[-1], "epoch_seconds": 1000 / stage_rates[-1],
                           "val_top1": top1, "val_images": 1000})
    study.baseline_top1s = [top1 - 0.01, top1, top1 + 0.01]
    return study


def _orders(model_stage_rate: float, ddp: bool = False):
    """The article's order: the model stages at 200 images/s after the speed stages; model first: at
    `model_stage_rate` before them (the speed stages themselves at the same speed in both). `ddp`: both orders have
    a torchrun stage too, whose rows carry no epoch time (its epochs' images are the split's)."""
    article = _study({"data_loader": [150.0, 152.0], "amp": [200.0, 198.0], "optimizer": [201.0, 199.0],
                      "regularization": [199.0, 200.0]})
    model_first = _study({"optimizer": [model_stage_rate, model_stage_rate * 1.01],
                          "regularization": [model_stage_rate * 0.99, model_stage_rate],
                          "data_loader": [151.0, 150.0], "amp": [199.0, 200.0]})
    for study in (article, model_first) if ddp else ():
        study.rows.append({"stage": "ddp", "kept": False, "precision": "off", "epoch_rates": [180.0, 182.0],
                           "images_per_second": 181.0, "epoch_seconds": None, "train_images": 1000,
                           "val_top1": 0.8, "val_images": 1000})
    return article, model_first


def test_the_table_adds_each_stages_training_seconds_in_its_order():
    table = optimisation_order.table(*_orders(100.0))
    assert list(table.loc["model first"].index) == [s for s in optimisation_order.MODEL_FIRST if s != "ddp"]
    assert table.loc[("pipeline first", "data_loader"), "training s"] == pytest.approx(1000 / 150 + 1000 / 152, abs=0.01)
    assert table.loc[("model first", "amp"), "total s"] == pytest.approx(
        table.loc["model first", "training s"].sum(), abs=0.05)


def test_the_claim_holds_when_the_model_stages_pay_for_the_slow_pipeline_and_is_refuted_when_they_do_not():
    slow = optimisation_order.claim(*_orders(100.0), hardware="test")
    assert slow.verdict == claims.HOLDS and slow.measured > 30
    same = optimisation_order.claim(*_orders(200.0), hardware="test")
    assert same.verdict == claims.REFUTED and abs(same.measured) < 2
    assert "pipeline first" in same.reason and "noise band" in same.reason


def test_a_ddp_stage_counts_in_both_orders_and_the_orders_must_run_the_same_stages():
    with_ddp = optimisation_order.claim(*_orders(100.0, ddp=True), hardware="test")
    assert with_ddp.verdict == claims.HOLDS and "the 5 stages' training" in with_ddp.reason
    table = optimisation_order.table(*_orders(100.0, ddp=True))
    assert table.loc[("model first", "ddp"), "training s"] == pytest.approx(1000 / 180 + 1000 / 182, abs=0.01)
    article, model_first = _orders(100.0)
    model_first.rows = model_first.rows[:-1]
    missing = optimisation_order.claim(article, model_first, hardware="test")
    assert missing.verdict == claims.NOT_MEASURABLE and "same stages" in missing.reason


def test_restart_shares_the_baseline_and_keeps_nothing_else():
    study = _study({"amp": [200.0, 200.0]})
    study.config_of = {"baseline": study.config, "amp": study.config.replace(precision="bf16")}
    study.config, study.world_size = study.config_of["amp"], 2
    again = study.restart()
    assert [row["stage"] for row in again.rows] == ["baseline"] and again.world_size == 1
    assert again.config.precision == "off" and again.baseline_top1s == study.baseline_top1s
    assert again.study_id == f"{study.study_id}-model-first"
    again.baseline_top1s.append(0.5)
    assert len(study.baseline_top1s) == 3
