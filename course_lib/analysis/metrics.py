"""Accuracy of a classifier from its scores: softmax, top-1/top-k accuracy, and per-class
precision/recall/F1 (scikit-learn's `precision_recall_fscore_support`).
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:  # pandas is imported where it is used, to keep imports light
    import pandas as pd


def softmax(logits) -> np.ndarray:
    """Row-wise softmax of an N x C array, shifted by the row max for stability."""
    logits = np.asarray(logits, dtype=np.float64)
    shifted = logits - logits.max(axis=1, keepdims=True)
    exponentials = np.exp(shifted)
    return exponentials / exponentials.sum(axis=1, keepdims=True)


def _check_scores(scores, labels) -> tuple[np.ndarray, np.ndarray]:
    scores, labels = np.asarray(scores), np.asarray(labels).astype(np.int64)
    if scores.ndim != 2:
        raise ValueError(f"scores must be N x C (one row per image), got shape {scores.shape}")
    if len(scores) != len(labels):
        raise ValueError(f"{len(scores)} score rows but {len(labels)} labels; they must match one to one")
    if len(labels) and (labels.min() < 0 or labels.max() >= scores.shape[1]):
        raise ValueError(f"labels must lie in 0..{scores.shape[1] - 1} (one column per class)")
    return scores, labels


def top_k_accuracy(scores, labels, k: int = 1) -> float:
    """Fraction of images whose true class is among the k highest scores, k capped at the class count (top-5 of 3
    classes is 1.0); ties broken as scikit-learn's `top_k_accuracy_score`, used for k < C."""
    from sklearn.metrics import top_k_accuracy_score

    scores, labels = _check_scores(scores, labels)
    num_classes = scores.shape[1]
    k = min(int(k), num_classes)
    if k < 1:
        raise ValueError(f"k must be at least 1, got {k}")
    if len(labels) == 0:
        return float("nan")
    if k == num_classes:
        return 1.0
    if k == 1 or num_classes == 2:  # sklearn wants 1-D scores for two classes; top-1 is plain accuracy
        return float(np.mean(scores.argmax(axis=1) == labels))
    return float(top_k_accuracy_score(labels, scores, k=k, labels=np.arange(num_classes)))


def per_class_table(labels, predictions, classes) -> "pd.DataFrame":
    """Precision, recall, F1 and support per class plus macro and weighted averages; a class that never occurs
    scores 0 (zero_division=0), so it still gets a row instead of vanishing."""
    import pandas as pd
    from sklearn.metrics import precision_recall_fscore_support

    class_ids = np.arange(len(classes))
    precision, recall, f1, support = precision_recall_fscore_support(
        labels, predictions, labels=class_ids, zero_division=0)
    table = pd.DataFrame({"precision": precision, "recall": recall, "f1": f1, "support": support},
                         index=pd.Index(list(classes), name="class"))
    for average in ("macro", "weighted"):
        p, r, f, _ = precision_recall_fscore_support(labels, predictions, labels=class_ids, average=average,
                                                     zero_division=0)
        table.loc[f"{average} avg"] = [p, r, f, int(support.sum())]
    table["support"] = table["support"].astype(int)
    return table


def dataset_class_counts(dataset, num_classes: int) -> np.ndarray:
    """Images per class in a dataset that exposes `.targets` (all the workbook's datasets do)."""
    targets = getattr(dataset, "targets", None)
    if targets is None:
        raise ValueError("dataset has no .targets; count its labels by iterating instead")
    return np.bincount(np.asarray(targets, dtype=np.int64), minlength=num_classes)
