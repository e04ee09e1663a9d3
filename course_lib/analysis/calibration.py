"""Calibration: does a 0.9 confidence mean 90% correct? The reliability table and diagram and the
expected calibration error (Guo et al. 2017, "On Calibration of Modern Neural Networks", arXiv:1706.04599).
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from course_lib.analysis.metrics import _check_scores

if TYPE_CHECKING:  # pandas is imported where it is used, to keep imports light
    import pandas as pd


def reliability_table(probabilities, labels, bins: int = 15) -> "pd.DataFrame":
    """Per confidence bin (equal width, lower < top probability <= upper): images, mean confidence, accuracy and
    the gap."""
    import pandas as pd

    probabilities, labels = _check_scores(probabilities, labels)
    confidence = probabilities.max(axis=1)
    correct = probabilities.argmax(axis=1) == labels
    edges = np.linspace(0.0, 1.0, bins + 1)
    which = np.clip(np.ceil(confidence * bins).astype(int) - 1, 0, bins - 1)
    rows = []
    for b in range(bins):
        inside = which == b
        count = int(inside.sum())
        rows.append({"lower": edges[b], "upper": edges[b + 1], "images": count,
                     "confidence": float(confidence[inside].mean()) if count else float("nan"),
                     "accuracy": float(correct[inside].mean()) if count else float("nan")})
    table = pd.DataFrame(rows)
    table["gap"] = table["confidence"] - table["accuracy"]  # > 0: over-confident
    return table


def expected_calibration_error(probabilities, labels, bins: int = 15) -> float:
    """ECE = sum over bins of (images in bin / all images) * |accuracy - mean confidence| (Guo et al.)."""
    table = reliability_table(probabilities, labels, bins)
    total = table["images"].sum()
    if total == 0:
        return float("nan")
    filled = table[table["images"] > 0]
    return float((filled["images"] / total * filled["gap"].abs()).sum())


def plot_reliability(probabilities, labels, bins: int = 15, title: str = ""):
    """Reliability diagram: accuracy per confidence bin against the diagonal, with a histogram of
    how many images each bin holds. Returns the Figure."""
    import matplotlib.pyplot as plt

    table = reliability_table(probabilities, labels, bins)
    ece = expected_calibration_error(probabilities, labels, bins)
    figure, (top, bottom) = plt.subplots(2, 1, figsize=(5, 5.5), sharex=True,
                                         gridspec_kw={"height_ratios": [3, 1]})
    width = 1.0 / bins
    filled = table[table["images"] > 0]
    top.bar(filled["lower"], filled["accuracy"], width=width, align="edge", edgecolor="black",
            color="tab:blue", label="accuracy")
    top.bar(filled["lower"], filled["confidence"] - filled["accuracy"], bottom=filled["accuracy"], width=width,
            align="edge", color="tab:red", alpha=0.3, hatch="//", label="gap to confidence")
    top.plot([0, 1], [0, 1], "k--", linewidth=1, label="perfect calibration")
    top.set_ylabel("accuracy")
    top.set_ylim(0, 1)
    top.legend(loc="upper left", fontsize=8)
    top.set_title(f"{title + ': ' if title else ''}ECE = {ece:.3f} ({bins} bins)")
    bottom.bar(table["lower"], table["images"], width=width, align="edge", color="grey", edgecolor="black")
    bottom.set_xlabel("confidence (top probability)")
    bottom.set_ylabel("images")
    bottom.set_xlim(0, 1)
    figure.tight_layout()
    return figure
