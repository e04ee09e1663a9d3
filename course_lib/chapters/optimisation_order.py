"""Notebook 10's order of optimisations (issue 47, point 6; article 1, section 6.5: "the order matters: first fix
the data pipeline and the GPU's utilisation, then tune the model and the training strategy"). The notebook runs the
case study's stages again from its baseline with the model stages first (`CaseStudy.restart`); this module sets the
two orders side by side and decides the claim. Both orders end with the same changes; what the order changes is the
time the stages on the way cost, as a model stage run before the pipeline fixes trains at the slow pipeline's speed.
The measure is each stage's epochs' images over their images/s (start-up and validation do not depend on the order),
the ratio of the two totals with a bootstrap interval over each stage's epochs (`statistics.stratified_ratio_interval`).
DDP counts with the pipeline in both orders (where it did not run, neither has it); the fastest recipe stays out.
"""
from __future__ import annotations

import pandas as pd

from course_lib.analysis import claims, statistics

ARTICLE_ORDER = ("data_loader", "amp", "ddp", "optimizer", "regularization")  # the pipeline first (section 6.5)
MODEL_FIRST = ("optimizer", "regularization", "data_loader", "amp", "ddp")  # what the article warns against


def _stage_rows(study, stages) -> list[dict]:
    rows = {row["stage"]: row for row in study.rows}
    return [rows[stage] for stage in stages if stage in rows and rows[stage].get("epoch_rates")]


def _epoch_seconds(row: dict) -> list[float]:
    """Seconds of each of the stage's epochs: the images of one epoch over that epoch's images/s."""
    measured = row.get("epoch_seconds") and row.get("images_per_second")
    # One epoch's images (max_steps may cap it; a torchrun stage's are every process's together).
    images = row["epoch_seconds"] * row["images_per_second"] if measured else row["train_images"]
    return [images / rate for rate in row["epoch_rates"] if rate]


def table(article_order, model_first):
    """One row per stage of each order: its training seconds, the running total, and its validation top-1."""
    rows = []
    for name, study, stages in (("pipeline first", article_order, ARTICLE_ORDER),
                                ("model first", model_first, MODEL_FIRST)):
        total = 0.0
        for row in _stage_rows(study, stages):
            seconds = sum(_epoch_seconds(row))
            total += seconds
            rows.append({"order": name, "stage": row["stage"], "kept": row["kept"], "precision": row["precision"],
                         "training s": seconds, "total s": total, "val top-1 %": 100 * row["val_top1"]})
    return pd.DataFrame(rows).set_index(["order", "stage"]).round(2)


def claim(article_order, model_first, hardware: str | None = None):
    """optimisation_order: the model-first order's extra training time over the article's, in percent, with its
    bootstrap interval (`analysis.claims.RULES`); both orders' last top-1 beside it, against the seeds' noise band."""
    article_rows, model_rows = _stage_rows(article_order, ARTICLE_ORDER), _stage_rows(model_first, MODEL_FIRST)
    ran = sorted(row["stage"] for row in article_rows)
    if not article_rows or ran != sorted(row["stage"] for row in model_rows):
        return claims.not_measurable("optimisation_order", "the two orders did not run the same stages", hardware)
    # Each order's epochs per stage, sorted by stage: stratum i is one stage in both.
    slow, fast = ([_epoch_seconds(row) for row in sorted(rows, key=lambda row: row["stage"])]
                  for rows in (model_rows, article_rows))
    total_slow, total_fast = sum(map(sum, slow)), sum(map(sum, fast))
    if min(map(len, slow + fast)) < 2:
        return claims.checked("optimisation_order", None, f"{total_slow:.0f} s model first against {total_fast:.0f} "
                              "s pipeline first; one epoch per stage gives no interval", hardware=hardware)
    ratio = statistics.stratified_ratio_interval(slow, fast)
    band = article_order.accuracy_band()
    last = (f"last top-1 {100 * article_rows[-1]['val_top1']:.1f}% pipeline first, "
            f"{100 * model_rows[-1]['val_top1']:.1f}% model first"
            + (f" (baseline seeds' noise band +-{100 * band:.1f})" if band is not None else ""))
    low, high = (100 * (ratio[end] - 1) for end in ("low", "high"))
    return claims.decided(
        "optimisation_order", 100 * (ratio["ratio"] - 1), (low, high),
        f"the {len(ran)} stages' training took {total_slow:.0f} s model first against {total_fast:.0f} s pipeline "
        f"first ({ratio['ratio']:.2f}x, each stage's epochs resampled); {last}", hardware=hardware)
