"""Confusion matrices that stay readable from 10 to 100+ classes: counts, row/column normalisation,
ordering by confusion, the most-confused sub-block, before/after difference matrices, and the
most-confused pairs (scikit-learn's `confusion_matrix` arithmetic, seaborn heatmaps).
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:  # pandas is imported where it is used, to keep imports light
    import pandas as pd

# The confusion-matrix figure never grows past this side (inches), whatever the class count.
MAX_FIGURE_INCHES = 12.0
# Beyond this many classes per-cell numbers are unreadable; the heat map alone carries the message.
ANNOTATE_MAX_CLASSES = 20
ORDERINGS = ("name", "confusion")
NORMALIZATIONS = ("none", "true", "pred")  # counts | each row sums to 1 (recall) | each column (precision)


def confusion_counts(labels, predictions, num_classes: int) -> np.ndarray:
    """C x C counts, rows = true class, columns = predicted (scikit-learn); classes that never
    occur keep their (zero) row and column."""
    from sklearn.metrics import confusion_matrix

    return confusion_matrix(labels, predictions, labels=np.arange(num_classes))


def normalize_confusion(counts, normalize: str = "none") -> np.ndarray:
    """none: counts; true: each row divided by its sum (the diagonal is recall); pred: each column
    divided by its sum (the diagonal is precision). Empty rows/columns stay 0 instead of NaN."""
    if normalize not in NORMALIZATIONS:
        raise ValueError(f"normalize={normalize!r} is not one of {', '.join(NORMALIZATIONS)}")
    counts = np.asarray(counts, dtype=np.float64)
    if normalize == "none":
        return counts
    axis = 1 if normalize == "true" else 0
    totals = counts.sum(axis=axis, keepdims=True)
    return np.divide(counts, totals, out=np.zeros_like(counts), where=totals > 0)


def _pair_confusion(counts) -> np.ndarray:
    """Symmetric similarity in [0, 1]: the mean of the two row-normalised off-diagonal confusions."""
    rates = normalize_confusion(counts, "true")
    np.fill_diagonal(rates, 0.0)
    return (rates + rates.T) / 2


def class_order(counts, classes, ordering: str = "name") -> np.ndarray:
    """Indices ordering the classes by "name", or by "confusion": classes the model mixes up side by side (scipy's
    average-linkage clustering of the symmetrised confusion rates, optimal leaf ordering)."""
    if ordering not in ORDERINGS:
        raise ValueError(f"ordering={ordering!r} is not one of {', '.join(ORDERINGS)}")
    count = len(classes)
    if ordering == "name" or count <= 2:
        return np.array(sorted(range(count), key=lambda i: str(classes[i])), dtype=int)
    from scipy.cluster.hierarchy import leaves_list, linkage
    from scipy.spatial.distance import squareform

    distance = 1.0 - _pair_confusion(counts)
    np.fill_diagonal(distance, 0.0)
    tree = linkage(squareform(distance, checks=False), method="average", optimal_ordering=True)
    return leaves_list(tree).astype(int)


def most_confused_classes(counts, limit: int) -> np.ndarray:
    """Up to `limit` class indices taken from the most-confused pairs first (by images in both
    directions), then by lowest recall: the sub-block worth looking at in a large matrix."""
    counts = np.asarray(counts)
    count = len(counts)
    if limit >= count:
        return np.arange(count)
    symmetric = counts + counts.T
    upper_i, upper_j = np.triu_indices(count, k=1)
    weights = symmetric[upper_i, upper_j]
    chosen: list[int] = []
    for pair in np.argsort(-weights, kind="stable"):
        if weights[pair] == 0 or len(chosen) >= limit:
            break
        for index in (int(upper_i[pair]), int(upper_j[pair])):
            if index not in chosen and len(chosen) < limit:
                chosen.append(index)
    if len(chosen) < limit:  # few confusions: fill with the classes recalled worst
        recall = np.diag(normalize_confusion(counts, "true"))
        for index in np.argsort(recall, kind="stable"):
            if int(index) not in chosen:
                chosen.append(int(index))
            if len(chosen) == limit:
                break
    return np.array(chosen, dtype=int)


def confusion_view(counts, classes, normalize: str = "none", ordering: str = "name",
                   max_classes: int | None = 30) -> "pd.DataFrame":
    """The matrix to draw, as a labelled DataFrame: normalised over all classes, then restricted to
    the most-confused `max_classes` (when there are more), then ordered."""
    counts = np.asarray(counts)
    return _labelled(normalize_confusion(counts, normalize), counts, classes, ordering, max_classes)


def _labelled(values, counts, classes, ordering: str, max_classes: int | None) -> "pd.DataFrame":
    """`values` (C x C) on the most-confused `max_classes` of `counts` (all when None), ordered and labelled."""
    import pandas as pd

    keep = most_confused_classes(counts, max_classes) if max_classes else np.arange(len(classes))
    order = keep[class_order(counts[np.ix_(keep, keep)], [classes[i] for i in keep], ordering)]
    names = [classes[i] for i in order]
    return pd.DataFrame(values[np.ix_(order, order)], index=pd.Index(names, name="true"),
                        columns=pd.Index(names, name="predicted"))


def _figure_side(classes_shown: int) -> float:
    return float(min(MAX_FIGURE_INCHES, 3.0 + 0.45 * classes_shown))


def _draw_matrix(view, title, annotate, fmt, cmap, center=None, vmin=None, vmax=None, ax=None):
    import matplotlib.pyplot as plt
    import seaborn as sns

    shown = len(view)
    if ax is None:
        side = _figure_side(shown)
        figure, ax = plt.subplots(figsize=(side + 1.0, side))
    else:
        figure = ax.figure
    annotations = False
    if annotate:
        values = view.to_numpy()
        if fmt.endswith("d"):
            values = np.rint(values).astype(np.int64)
        # Blank the cells that print as zero: the eye then finds the confusions at once.
        annotations = np.vectorize(lambda v: "" if float(format(v, fmt)) == 0 else format(v, fmt))(values)
    # Labels for every class up to 60; beyond that every n-th, so ticks never overlap.
    step = max(1, int(np.ceil(shown / 60)))
    sns.heatmap(view, ax=ax, cmap=cmap, center=center, vmin=vmin, vmax=vmax, square=True,
                annot=annotations, fmt="", annot_kws={"fontsize": 8}, linewidths=0.3 if shown <= 40 else 0,
                linecolor="white", xticklabels=step, yticklabels=step, cbar_kws={"shrink": 0.7})
    fontsize = 9 if shown <= 20 else max(4, int(9 - shown / 15))
    ax.tick_params(labelsize=fontsize)
    ax.set_title(title, fontsize=10)
    figure.tight_layout()
    return figure


def plot_confusion(counts, classes, normalize: str = "none", ordering: str = "name",
                   max_classes: int | None = 30, title: str = "", ax=None):
    """Seaborn heat map of a confusion matrix (rows true), with per-cell numbers up to 20 classes; beyond
    `max_classes` only the most-confused sub-block, as the title says."""
    counts = np.asarray(counts)
    view = confusion_view(counts, classes, normalize, ordering, max_classes)
    shown = len(view)
    scope = f"{shown} most-confused of {len(classes)} classes" if shown < len(classes) else f"{shown} classes"
    label = {"none": "counts", "true": "row-normalised (recall)", "pred": "column-normalised (precision)"}
    full_title = f"{title + ': ' if title else ''}{label[normalize]}, {scope}, ordered by {ordering}"
    return _draw_matrix(view, full_title, shown <= ANNOTATE_MAX_CLASSES, "d" if normalize == "none" else ".2f",
                        "Blues", vmin=0, vmax=None if normalize == "none" else 1, ax=ax)


def difference_view(counts_before, counts_after, classes, normalize: str = "true", ordering: str = "name",
                    max_classes: int | None = 30) -> "pd.DataFrame":
    """after - before, both normalised (default by row, so evaluations of different sizes compare);
    positive on the diagonal and negative off it means the change helped."""
    before, after = np.asarray(counts_before), np.asarray(counts_after)
    if before.shape != after.shape:
        raise ValueError(f"confusion matrices differ in shape {before.shape} vs {after.shape}; "
                         "compare evaluations of the same classes")
    difference = normalize_confusion(after, normalize) - normalize_confusion(before, normalize)
    return _labelled(difference, before + after, classes, ordering, max_classes)


def plot_difference(counts_before, counts_after, classes, normalize: str = "true", ordering: str = "name",
                    max_classes: int | None = 30, title: str = "", ax=None):
    """Diverging heat map of `difference_view` (red = more images there after, blue = fewer)."""
    view = difference_view(counts_before, counts_after, classes, normalize, ordering, max_classes)
    limit = float(np.abs(view.to_numpy()).max()) or 1.0
    fmt = "d" if normalize == "none" else "+.2f"
    if normalize == "none":
        view = view.astype(int)
    full_title = f"{title + ': ' if title else ''}after - before ({normalize}-normalised), {len(view)} classes"
    return _draw_matrix(view, full_title, len(view) <= ANNOTATE_MAX_CLASSES, fmt, "RdBu_r", center=0,
                        vmin=-limit, vmax=limit, ax=ax)


def most_confused_pairs(counts, classes, top: int = 10) -> "pd.DataFrame":
    """The off-diagonal cells with most images: true, predicted, images, the share of the true
    class they take (row rate) and the reverse direction's count and rate."""
    import pandas as pd

    counts = np.asarray(counts)
    rates = normalize_confusion(counts, "true")
    off = counts.astype(np.int64).copy()
    np.fill_diagonal(off, 0)
    flat = np.argsort(-off, axis=None, kind="stable")[:top]
    rows = []
    for true_index, predicted_index in zip(*np.unravel_index(flat, off.shape)):
        if off[true_index, predicted_index] == 0:
            break
        rows.append({"true": classes[true_index], "predicted": classes[predicted_index],
                     "true_index": int(true_index), "predicted_index": int(predicted_index),
                     "images": int(off[true_index, predicted_index]),
                     "share_of_true": float(rates[true_index, predicted_index]),
                     "reverse_images": int(off[predicted_index, true_index]),
                     "reverse_share": float(rates[predicted_index, true_index])})
    return pd.DataFrame(rows, columns=["true", "predicted", "true_index", "predicted_index", "images",
                                       "share_of_true", "reverse_images", "reverse_share"])


def pair_error_share(counts, classes, pairs) -> tuple[float, float]:
    """(share of the misclassified images between the classes of `pairs`, the share mistakes spread evenly would
    give). Pairs are unordered class names (a dataset's look-alikes); names not in `classes` are ignored."""
    counts = np.asarray(counts)
    index = {name: i for i, name in enumerate(classes)}
    cells = {(index[a], index[b]) for a, b in pairs if a in index and b in index}
    cells |= {(j, i) for i, j in cells}
    errors = counts.sum() - np.trace(counts)
    count = len(classes)
    uniform = len(cells) / (count * (count - 1)) if count > 1 else float("nan")
    if errors == 0 or not cells:
        return float("nan"), uniform
    return float(sum(counts[i, j] for i, j in cells) / errors), uniform
