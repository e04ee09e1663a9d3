"""Notebook 10's order of optimisations (issue 47, point 6; article 1, section 6.5: "the order matters: first fix
the data pipeline and the GPU's utilisation, then tune the model and the training strategy"). The case study's
stages ran in the article's order; the notebook runs them again from the same baseline with the model stages first
(`CaseStudy.restart`), and this module sets the two orders side by side and decides the claim.

Both orders end with the same changes, so they reach the same accuracy in expectation; what the order changes is
the time the stages on the way cost, because a model stage run before the pipeline fixes trains at the slow
pipeline's speed. The measure is the stages' training time, each epoch's images over its measured images/s
(the stage's start-up and validation left out: they do not depend on the order), compared as the ratio of the two
totals, with a bootstrap interval that resamples each stage's epochs (`statistics.stratified_ratio_interval`).
DDP belongs to the pipeline side in both orders (the article puts it after single-device tuning; where it did not
run, neither order has it). The workbook's fastest recipe is no article stage and stays out.
"""
from __future__ import annotations

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
    import pandas as pd

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
    """optimisation_order: the model-first order's extra training time over the article's order, in percent of
    the article's, with its bootstrap interval (its rule: `analysis.claims.RULES`); both orders' last top-1
    beside it, read against the baseline seeds' noise band."""
    from course_lib.analysis import claims, statistics

    article_rows, model_rows = _stage_rows(article_order, ARTICLE_ORDER), _stage_rows(model_first, MODEL_FIRST)
    ran = sorted(row["stage"] for row in article_rows)
    if not article_rows or ran != sorted(row["stage"] for row in model_rows):
        return claims.not_measurable("optimisation_order", "the two orders did not run the same stages", hardware)
    seconds = {name: {row["stage"]: _epoch_seconds(row) for row in rows}
               for name, rows in (("model first", model_rows), ("pipeline first", article_rows))}
    slow, fast = ([seconds[name][stage] for stage in ran] for name in ("model first", "pipeline first"))
    total_slow, total_fast = sum(map(sum, slow)), sum(map(sum, fast))
    if min(map(len, slow + fast)) < 2:
        return claims.checked("optimisation_order", None, f"{total_slow:.0f} s model first against {total_fast:.0f} "
                              "s pipeline first; one epoch per stage gives no interval", hardware=hardware)
    ratio = statistics.stratified_ratio_interval(slow, fast)
    band = article_order.accuracy_band()
    last = f"last top-1 {100 * article_rows[-1]['val_top1']:.1f}% pipeline first, " \
           f"{100 * model_rows[-1]['val_top1']:.1f}% model first" + \
           (f" (baseline seeds' noise band +-{100 * band:.1f})" if band is not None else "")
    return claims.decided(
        "optimisation_order", 100 * (ratio["ratio"] - 1), (100 * (ratio["low"] - 1), 100 * (ratio["high"] - 1)),
        f"the {len(ran)} stages' training took {total_slow:.0f} s model first against {total_fast:.0f} s pipeline first "
        f"({ratio['ratio']:.2f}x, each stage's epochs resampled); {last}", hardware=hardware)
