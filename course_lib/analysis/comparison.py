"""Comparing two evaluations of the same images, image by image: side-by-side and difference
confusion matrices, per-class precision/recall/F1 deltas with paired bootstrap confidence
intervals (Efron & Tibshirani 1993, ch. 13: resample images, recompute both models' scores on the
same resample), and the images that flipped from right to wrong and from wrong to right.
`workbook compare EVAL_A EVAL_B [--json]` prints it; the explorer shows it in Jupyter. Two runs or two
ledger rows are compared in `analysis.run_comparison`.
"""
from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from course_lib import ledger
from course_lib.analysis import confusion, evaluation, statistics
from course_lib.analysis.evaluation import Evaluation
from course_lib.analysis.metrics import per_class_table

if TYPE_CHECKING:  # pandas is imported where it is used, to keep imports light
    import pandas as pd

SCORES = ("precision", "recall", "f1")
FLIPS = ("right_to_wrong", "wrong_to_right")
CHECKPOINT_SUFFIXES = (".pt", ".pth")


def check_same_images(before: Evaluation, after: Evaluation) -> None:
    """ValueError unless both evaluations scored the same images, in the same order, over the same
    classes: only then can they be compared image by image."""
    if before.classes != after.classes:
        raise ValueError(f"{before.name} and {after.name} have different classes; compare evaluations of "
                         "the same dataset")
    if len(before.labels) != len(after.labels) or list(before.image_refs) != list(after.image_refs) \
            or not np.array_equal(before.labels, after.labels):
        raise ValueError(f"{before.name} ({len(before.labels)} images) and {after.name} ({len(after.labels)} "
                         "images) evaluated different images; compare evaluations of the same split and dataset")


def bootstrap_scores(labels, predictions, num_classes: int, weights: np.ndarray) -> dict[str, np.ndarray]:
    """Per-class precision, recall and F1 and top-1 under each row of bootstrap `weights`; zero denominators score 0
    (scikit-learn's zero_division=0), so a resample without a class matches `per_class_table`."""
    classes = np.arange(num_classes)
    truth = (np.asarray(labels)[:, None] == classes).astype(np.float64)  # images x classes, one-hot
    predicted = (np.asarray(predictions)[:, None] == classes).astype(np.float64)
    true_positives = weights @ (truth * predicted)
    predicted_count, true_count = weights @ predicted, weights @ truth

    def ratio(numerator, denominator):
        return np.divide(numerator, denominator, out=np.zeros_like(numerator), where=denominator > 0)

    return {"precision": ratio(true_positives, predicted_count), "recall": ratio(true_positives, true_count),
            "f1": ratio(2 * true_positives, predicted_count + true_count),
            "top1": true_positives.sum(axis=1) / weights.sum(axis=1)}


@dataclasses.dataclass
class Comparison:
    """`after` against `before` on the same images: each score per class (`per_class`) and top-1 and macro F1
    (`overall`) before, after, their delta and its bootstrap interval, and the flipped images (`flips`)."""

    before: Evaluation
    after: Evaluation
    per_class: "pd.DataFrame"
    overall: dict
    flips: dict
    level: float
    draws: int

    def figure(self, normalize: str = "true", ordering: str = "name", max_classes: int | None = 30):
        """Before, after and after - before, side by side (matplotlib + seaborn)."""
        import matplotlib.pyplot as plt

        classes = self.before.classes
        shown = min(len(classes), max_classes or len(classes))
        side = min(6.0, 2.0 + 0.35 * shown)
        figure, axes = plt.subplots(1, 3, figsize=(3 * side + 2, side))
        for ax, evaluation in zip(axes, (self.before, self.after)):
            confusion.plot_confusion(evaluation.counts(), classes, normalize, ordering, max_classes,
                                     title=evaluation.name, ax=ax)
        confusion.plot_difference(self.before.counts(), self.after.counts(), classes, normalize, ordering,
                                  max_classes, title="difference", ax=axes[2])
        figure.tight_layout()
        return figure

    def significant(self, score: str = "f1") -> "pd.DataFrame":
        """Classes whose `score` interval excludes 0: the changes the validation set can vouch for."""
        low, high = self.per_class[f"{score}_low"], self.per_class[f"{score}_high"]
        return self.per_class[(low > 0) | (high < 0)]

    def to_dict(self) -> dict:
        """Plain JSON-able values (what `workbook compare --json` prints)."""
        def records(table):
            return [{k: (v.item() if hasattr(v, "item") else v) for k, v in row.items()}
                    for row in table.to_dict(orient="records")]

        return {"before": self.before.name, "after": self.after.name, "images": int(len(self.before.labels)),
                "level": self.level, "draws": self.draws, "overall": self.overall,
                "per_class": records(self.per_class.reset_index()),
                "flips": {kind: records(table) for kind, table in self.flips.items()}}


def flipped_images(before: Evaluation, after: Evaluation, direction: str = "right_to_wrong") -> "pd.DataFrame":
    """Images `before` classified right and `after` wrong (or the reverse), `after`'s most confident first:
    `Evaluation.image_table` of `after`, plus predicted_before and confidence_before."""
    if direction not in FLIPS:
        raise ValueError(f"direction={direction!r} is not one of {', '.join(FLIPS)}")
    check_same_images(before, after)
    right_before = before.predictions == before.labels
    right_after = after.predictions == after.labels
    chosen = np.flatnonzero(right_before & ~right_after if direction == "right_to_wrong" else ~right_before & right_after)
    chosen = chosen[np.argsort(-after.confidences[chosen], kind="stable")]
    table = after.image_table(chosen)
    table["predicted_before"] = np.array(after.classes, dtype=object)[before.predictions[chosen]]
    table["confidence_before"] = before.confidences[chosen].astype(float)
    return table


def compare(before: Evaluation, after: Evaluation, draws: int = 1000, level: float = 0.95,
            seed: int = 0) -> Comparison:
    """Two evaluations of the same images scored on the same bootstrap resamples: each delta's interval is how much
    it would move on another validation set of this size (not the seed's noise: `statistics.seed_noise`)."""
    import pandas as pd

    check_same_images(before, after)
    labels = before.labels
    weights = statistics.bootstrap_weights(len(labels), draws, seed)
    resampled = [bootstrap_scores(labels, e.predictions, before.num_classes, weights) for e in (before, after)]
    tables = [per_class_table(labels, e.predictions, e.classes) for e in (before, after)]
    class_rows = before.num_classes
    columns = {}
    for score in SCORES:
        low, high = statistics.percentile_interval(resampled[1][score] - resampled[0][score], level)
        columns[f"{score}_before"] = tables[0][score].to_numpy()[:class_rows]
        columns[f"{score}_after"] = tables[1][score].to_numpy()[:class_rows]
        columns[f"{score}_delta"] = columns[f"{score}_after"] - columns[f"{score}_before"]
        columns[f"{score}_low"], columns[f"{score}_high"] = low, high
    columns["support"] = tables[0]["support"].to_numpy()[:class_rows]
    per_class = pd.DataFrame(columns, index=pd.Index(before.classes, name="class"))

    overall = {}
    for name, samples in (("top1", [r["top1"] for r in resampled]),
                          ("macro_f1", [r["f1"].mean(axis=1) for r in resampled])):
        point = [float(np.mean(e.predictions == labels)) if name == "top1" else float(t.loc["macro avg", "f1"])
                 for e, t in zip((before, after), tables)]
        low, high = statistics.percentile_interval(samples[1] - samples[0], level)
        overall[name] = {"before": float(point[0]), "after": float(point[1]), "delta": float(point[1] - point[0]),
                         "low": float(low), "high": float(high)}
    flips = {direction: flipped_images(before, after, direction) for direction in FLIPS}
    overall["right_to_wrong"] = int(len(flips["right_to_wrong"]))
    overall["wrong_to_right"] = int(len(flips["wrong_to_right"]))
    return Comparison(before, after, per_class, overall, flips, level, draws)


def resolve_evaluation(reference: str, split: str = "val") -> Evaluation:
    """An evaluation from what a user types: a saved .npz/.json, a checkpoint (evaluated now on `split`), an eval
    row's id, or an evaluation's name (its newest eval row, else runs/evals/<name>.npz)."""
    path = Path(reference)
    if path.suffix in CHECKPOINT_SUFFIXES:
        return evaluation.evaluate(path, split=split)
    if path.suffix in (".npz", ".json") or path.exists():
        return Evaluation.load(path)
    book = ledger.Ledger()
    if reference.isdigit():
        rows = [row for row in book.rows(kind="eval") if row["id"] == int(reference)]
    else:
        rows = book.rows(kind="eval", name=reference, limit=1)
    saved = rows[0]["parameters"].get("path") if rows else None
    if saved and Path(saved).exists():
        return Evaluation.load(saved)
    fallback = evaluation._evals_dir() / f"{reference}.npz"
    if fallback.exists():
        return Evaluation.load(fallback)
    raise FileNotFoundError(f"no evaluation {reference!r}: give a saved .npz, a checkpoint .pt, or the name or id "
                            "of an eval row (`workbook ledger --kind eval` lists them)")
