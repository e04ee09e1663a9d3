"""Evaluation of a classifier: top-1/top-k accuracy, per-class precision/recall/F1 (scikit-learn),
expected calibration error with a reliability diagram, and confusion matrices drawn with seaborn
that stay readable from 10 to 100+ classes. `evaluate` runs a checkpoint on a split and saves the
predictions (one .npz + JSON sidecar per evaluation under runs/evals/, a ledger row of kind "eval").

Calibration: Guo et al., "On Calibration of Modern Neural Networks", ICML 2017 (ECE, reliability
diagrams). Metrics: https://scikit-learn.org/stable/modules/model_evaluation.html
"""
from __future__ import annotations

import dataclasses
import json
import re
import time
from pathlib import Path

import numpy as np

NORMALIZATIONS = ("none", "true", "pred")  # counts | each row sums to 1 (recall) | each column (precision)
ORDERINGS = ("name", "confusion")
EVALS_DIR = Path("runs") / "evals"
# Beyond this many classes per-cell numbers are unreadable; the heat map alone carries the message.
ANNOTATE_MAX_CLASSES = 20
# The confusion-matrix figure never grows past this side (inches), whatever the class count.
MAX_FIGURE_INCHES = 12.0


# ---------------------------------------------------------------------------------------------
# Scores -> probabilities, accuracies
# ---------------------------------------------------------------------------------------------

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
    """Fraction of images whose true class is among the k highest scores (logits or probabilities).

    k is capped at the number of classes (top-5 of a 3-class problem is top-3, i.e. 1.0). Ties
    are broken as scikit-learn's `top_k_accuracy_score` breaks them, which it uses for k < C.
    """
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
    """Precision, recall, F1 and support per class plus macro and weighted averages
    (`precision_recall_fscore_support`). A class that never occurs has support 0 and scores 0
    (zero_division=0), so it still gets a row instead of vanishing."""
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


# ---------------------------------------------------------------------------------------------
# Calibration
# ---------------------------------------------------------------------------------------------

def reliability_table(probabilities, labels, bins: int = 15) -> "pd.DataFrame":
    """Per confidence bin (equal width on (0, 1]): images, mean confidence, accuracy and the gap.

    Confidence is the top probability; an image falls in bin b when lower < confidence <= upper.
    """
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


# ---------------------------------------------------------------------------------------------
# Confusion matrices
# ---------------------------------------------------------------------------------------------

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
    """Indices that order the classes: alphabetically ("name"), or so that classes the model mixes
    up sit next to each other ("confusion": average-linkage hierarchical clustering of the
    symmetrised confusion rates with optimal leaf ordering, scipy.cluster.hierarchy)."""
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
    import pandas as pd

    counts = np.asarray(counts)
    values = normalize_confusion(counts, normalize)
    keep = most_confused_classes(counts, max_classes) if max_classes else np.arange(len(classes))
    sub_classes = [classes[i] for i in keep]
    order = keep[class_order(counts[np.ix_(keep, keep)], sub_classes, ordering)]
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
    """Seaborn heat map of a confusion matrix (rows true, columns predicted). Per-cell numbers up to
    20 classes; beyond `max_classes` classes only the most-confused sub-block is drawn and the
    title says so. The figure side is capped at 12 inches. Returns the Figure."""
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
    import pandas as pd

    before, after = np.asarray(counts_before), np.asarray(counts_after)
    if before.shape != after.shape:
        raise ValueError(f"confusion matrices differ in shape {before.shape} vs {after.shape}; "
                         "compare evaluations of the same classes")
    difference = normalize_confusion(after, normalize) - normalize_confusion(before, normalize)
    combined = before + after
    keep = most_confused_classes(combined, max_classes) if max_classes else np.arange(len(classes))
    order = keep[class_order(combined[np.ix_(keep, keep)], [classes[i] for i in keep], ordering)]
    names = [classes[i] for i in order]
    return pd.DataFrame(difference[np.ix_(order, order)], index=pd.Index(names, name="true"),
                        columns=pd.Index(names, name="predicted"))


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
    """(share of all misclassified images that fall between the classes of `pairs`, the share
    expected if mistakes were spread evenly over all off-diagonal cells). Pairs are unordered
    class-name tuples, e.g. a dataset's known look-alike classes; names not in `classes` are ignored."""
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


# ---------------------------------------------------------------------------------------------
# One evaluation: arrays, metrics, saving and loading
# ---------------------------------------------------------------------------------------------

@dataclasses.dataclass
class Evaluation:
    """Predictions of one model on one split. `image_refs[i]` is a file path, or "index:<n>" (the
    image's index in the split's underlying array dataset, rendered from the rebuilt dataset)."""

    name: str
    classes: list
    labels: np.ndarray  # N true class indices
    probabilities: np.ndarray  # N x C softmax outputs
    image_refs: list
    metadata: dict = dataclasses.field(default_factory=dict)  # checkpoint, split, config ...
    path: Path | None = None  # the .npz it was saved to
    image_loader: object = None  # optional callable(index) -> image; overrides image_refs

    def __post_init__(self):
        self.labels = np.asarray(self.labels, dtype=np.int64)
        self.probabilities = np.asarray(self.probabilities, dtype=np.float32)
        self.classes = [str(c) for c in self.classes]
        self.image_refs = [str(r) for r in self.image_refs]
        _check_scores(self.probabilities, self.labels)
        if self.probabilities.shape[1] != len(self.classes):
            raise ValueError(f"{self.probabilities.shape[1]} probability columns but {len(self.classes)} classes")
        if len(self.image_refs) != len(self.labels):
            raise ValueError(f"{len(self.image_refs)} image references for {len(self.labels)} images")
        self._dataset_cache = None

    @property
    def num_classes(self) -> int:
        return len(self.classes)

    @property
    def predictions(self) -> np.ndarray:
        return self.probabilities.argmax(axis=1)

    @property
    def confidences(self) -> np.ndarray:
        """Top probability per image."""
        return self.probabilities.max(axis=1)

    def counts(self) -> np.ndarray:
        return confusion_counts(self.labels, self.predictions, self.num_classes)

    def per_class(self) -> "pd.DataFrame":
        return per_class_table(self.labels, self.predictions, self.classes)

    def summary(self, bins: int = 15) -> dict:
        """Headline numbers: top-1, top-5 (k capped at the class count), macro/weighted F1, ECE."""
        table = self.per_class()
        return {
            "images": int(len(self.labels)),
            "classes": self.num_classes,
            "top1": top_k_accuracy(self.probabilities, self.labels, 1),
            "top5": top_k_accuracy(self.probabilities, self.labels, 5),
            "top5_k": min(5, self.num_classes),
            "macro_precision": float(table.loc["macro avg", "precision"]),
            "macro_recall": float(table.loc["macro avg", "recall"]),
            "macro_f1": float(table.loc["macro avg", "f1"]),
            "weighted_f1": float(table.loc["weighted avg", "f1"]),
            "ece": expected_calibration_error(self.probabilities, self.labels, bins),
            "mean_confidence": float(self.confidences.mean()) if len(self.labels) else float("nan"),
        }

    def load_image(self, index: int):
        """The image `index` refers to, as a PIL image (for galleries)."""
        if self.image_loader is not None:
            return _as_pil(self.image_loader(index))
        ref = self.image_refs[index]
        if ref.startswith("index:"):
            return _as_pil(_raw_image(self._base_dataset(), int(ref.split(":", 1)[1])))
        from course_lib.data import load_rgb

        return load_rgb(ref)

    def _base_dataset(self):
        """The split's underlying dataset, rebuilt from the stored config (array datasets only)."""
        if self._dataset_cache is None:
            config_values = self.metadata.get("config")
            if not config_values:
                raise FileNotFoundError(f"evaluation {self.name!r} stores image indices but no config to rebuild "
                                        "the dataset from; pass image_loader=")
            from course_lib.config import FIELD_NAMES, make_config
            from course_lib.data import build_datasets

            known = {k: v for k, v in config_values.items() if k in FIELD_NAMES}
            bundle = build_datasets(make_config(None, **known))
            self._dataset_cache = _unwrap(getattr(bundle, self.metadata.get("split", "val")), 0)[0]
        return self._dataset_cache

    def save(self, folder: str | Path | None = None) -> Path:
        """Write <folder>/<name>.npz (labels, probabilities, image_refs) and <name>.json (classes,
        metadata, summary). Default folder: <project>/runs/evals."""
        folder = Path(folder) if folder else _evals_dir()
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / f"{self.name}.npz"
        np.savez_compressed(path, labels=self.labels, probabilities=self.probabilities,
                            image_refs=np.array(self.image_refs, dtype=str))
        sidecar = {"name": self.name, "classes": self.classes, "metadata": self.metadata,
                   "summary": self.summary()}
        path.with_suffix(".json").write_text(json.dumps(sidecar, indent=2, default=str))
        self.path = path
        return path

    @classmethod
    def load(cls, path: str | Path) -> "Evaluation":
        path = Path(path)
        if path.suffix != ".npz":
            path = path.with_suffix(".npz")
        if not path.exists():
            raise FileNotFoundError(f"no evaluation at {path}; run `workbook eval CHECKPOINT` first")
        sidecar = json.loads(path.with_suffix(".json").read_text())
        with np.load(path, allow_pickle=False) as arrays:
            return cls(sidecar["name"], sidecar["classes"], arrays["labels"], arrays["probabilities"],
                       arrays["image_refs"].tolist(), sidecar.get("metadata", {}), path)


def _evals_dir() -> Path:
    from course_lib.ledger import project_root

    return project_root() / EVALS_DIR


def list_evaluations(folder: str | Path | None = None) -> "pd.DataFrame":
    """Saved evaluations (newest first) with their headline numbers, from the JSON sidecars."""
    import pandas as pd

    folder = Path(folder) if folder else _evals_dir()
    rows = []
    for sidecar in sorted(folder.glob("*.json"), key=lambda p: p.stat().st_mtime, reverse=True):
        data = json.loads(sidecar.read_text())
        summary = data.get("summary", {})
        rows.append({"name": data["name"], "path": str(sidecar.with_suffix(".npz")),
                     "split": data.get("metadata", {}).get("split"), "images": summary.get("images"),
                     "top1": summary.get("top1"), "macro_f1": summary.get("macro_f1"), "ece": summary.get("ece")})
    return pd.DataFrame(rows, columns=["name", "path", "split", "images", "top1", "macro_f1", "ece"])


def _as_pil(image):
    from PIL import Image

    if isinstance(image, Image.Image):
        return image.convert("RGB")
    array = np.asarray(image)
    if array.dtype != np.uint8:  # float in [0, 1], channels first or last
        if array.ndim == 3 and array.shape[0] in (1, 3) and array.shape[-1] not in (1, 3):
            array = array.transpose(1, 2, 0)
        array = (np.clip(array, 0, 1) * 255).astype(np.uint8)
    if array.ndim == 3 and array.shape[-1] == 1:
        array = array[..., 0]
    return Image.fromarray(array).convert("RGB")


def _unwrap(dataset, index: int):
    """Follow subsets (`.dataset`/`.indices`) down to the dataset that holds the images."""
    while hasattr(dataset, "dataset") and hasattr(dataset, "indices"):
        index = int(dataset.indices[index])
        dataset = dataset.dataset
    return dataset, index


def image_reference(dataset, index: int) -> str:
    """A file path for image `index` of a (possibly nested) subset of an ImageFolder-like dataset,
    or "index:<n>" into the underlying array dataset (digits, CIFAR-10)."""
    base, base_index = _unwrap(dataset, index)
    samples = getattr(base, "samples", None) or getattr(base, "imgs", None)
    if samples is not None:
        return str(samples[base_index][0])
    return f"index:{base_index}"


def _raw_image(base, index: int):
    for attribute in ("images", "data"):  # ArrayImageDataset, torchvision CIFAR
        array = getattr(base, attribute, None)
        if isinstance(array, np.ndarray):
            return array[index]
    image = base[index][0]
    if hasattr(image, "numpy"):  # a normalised tensor: undo Normalize for display
        from course_lib.data import denormalize

        image = denormalize(image).numpy()
    return image


# ---------------------------------------------------------------------------------------------
# Running a model or a checkpoint on a split
# ---------------------------------------------------------------------------------------------

def _device(config):
    import torch

    if config.device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if config.device.startswith("cuda") and not torch.cuda.is_available():
        from course_lib.config import ConfigError

        raise ConfigError(f"device={config.device} but this torch sees no CUDA GPU; pass device=cpu")
    return torch.device(config.device)


def predict(model, dataset, config) -> tuple[np.ndarray, np.ndarray]:
    """(labels, softmax probabilities) of `model` over `dataset`, in dataset order. Evaluation runs
    in fp32: it is a small share of the time, and reduced precision would blur the calibration."""
    import torch

    from course_lib.loaders import make_loader

    device = _device(config)
    model = model.to(device).eval()
    memory_format = torch.channels_last if config.channels_last else torch.contiguous_format
    loader = make_loader(dataset, config, train=False, drop_last=False)
    all_labels, all_probabilities = [], []
    with torch.inference_mode():
        for images, labels in loader:
            images = images.to(device, non_blocking=True, memory_format=memory_format)
            logits = model(images).float()
            all_probabilities.append(torch.softmax(logits, dim=1).cpu().numpy())
            all_labels.append(np.asarray(labels))
    if not all_labels:
        raise ValueError("the split is empty: nothing to evaluate")
    return np.concatenate(all_labels), np.concatenate(all_probabilities)


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", text).strip("-") or "eval"


def evaluate_model(model, config, split: str = "val", classes=None, name: str | None = None,
                   metadata: dict | None = None, out_dir: str | Path | None = None, bundle=None,
                   record: bool = True) -> Evaluation:
    """Run `model` on `split` of the dataset `config` names; save the evaluation and (by default)
    record a ledger row of kind "eval". `bundle` reuses already-built datasets."""
    from course_lib.data import SPLITS, build_datasets

    if split not in SPLITS:
        raise ValueError(f"split={split!r} is not one of {', '.join(SPLITS)}")
    started = time.perf_counter()
    bundle = bundle or build_datasets(config)
    dataset = getattr(bundle, split)
    if dataset is None:
        raise FileNotFoundError(f"the dataset has no {split} split ({bundle.source}); use split=val")
    if classes is not None and list(classes) != list(bundle.classes):
        raise ValueError(f"the model was trained on classes {list(classes)} but {bundle.source} has "
                         f"{list(bundle.classes)}; evaluate on the dataset it was trained on")
    labels, probabilities = predict(model, dataset, config)
    refs = [image_reference(dataset, i) for i in range(len(dataset))]
    name = _slug(name or f"{config.model}-{split}-{time.strftime('%Y%m%d-%H%M%S')}")
    metadata = {"split": split, "config": config.to_dict(), "source": bundle.source, **(metadata or {})}
    evaluation = Evaluation(name, list(bundle.classes), labels, probabilities, refs, metadata)
    evaluation.save(out_dir)
    seconds = time.perf_counter() - started
    if record:
        from course_lib import ledger

        summary = evaluation.summary()
        ledger.record("eval", name, duration_seconds=seconds,
                      parameters={**config.to_dict(), "split": split, "checkpoint": metadata.get("checkpoint"),
                                  "weights": metadata.get("weights"), "path": str(evaluation.path)},
                      metrics={k: v for k, v in summary.items() if isinstance(v, (int, float))})
    return evaluation


def evaluate(checkpoint_path: str | Path, split: str = "val", name: str | None = None,
             out_dir: str | Path | None = None, weights: str = "model", **overrides) -> Evaluation:
    """Load a workbook checkpoint (`train.load_checkpoint`), rebuild its model (`train.build_model`)
    and dataset from the stored config plus `overrides` (e.g. device="cpu", batch_size=256,
    data_dir=...), evaluate it on `split`, save and record the result. `weights="ema"` evaluates
    the checkpoint's weight-EMA copy (trained with ema_decay > 0)."""
    from course_lib import train
    from course_lib.config import FIELD_NAMES, ConfigError, make_config

    if weights not in ("model", "ema"):
        raise ConfigError(f"weights={weights!r} is not one of model, ema")
    path = Path(checkpoint_path)
    if not path.exists():
        raise FileNotFoundError(f"checkpoint {path} does not exist; train one with `workbook train`")
    checkpoint = train.load_checkpoint(path, map_location="cpu")
    stored = {k: v for k, v in (checkpoint.get("config") or {}).items() if k in FIELD_NAMES}
    # The weights come from this checkpoint, not from a start checkpoint or timm's hub.
    values = {**stored, "checkpoint": "", "pretrained": False,
              **{k: v for k, v in overrides.items() if v is not None}}
    config = make_config(None, **values)
    classes = list(checkpoint["classes"])
    state = checkpoint.get("ema") if weights == "ema" else checkpoint["model"]
    if state is None:
        raise ConfigError(f"{path} has no EMA weights (trained with ema_decay=0); use weights=model")
    model = train.build_model(config, len(classes))
    model.load_state_dict(state)
    name = name or f"{path.parent.name}-{path.stem}-{weights}-{split}-{time.strftime('%Y%m%d-%H%M%S')}"
    return evaluate_model(model, config, split, classes=classes, name=name,
                          metadata={"checkpoint": str(path), "weights": weights}, out_dir=out_dir)


# ---------------------------------------------------------------------------------------------
# What the numbers suggest
# ---------------------------------------------------------------------------------------------

def suggest_actions(evaluation: Evaluation, train_counts=None, low_recall: float | None = None,
                    pair_share: float = 0.10, merge_share: float = 0.25, top_pairs: int = 5,
                    few_images: float = 0.75) -> "pd.DataFrame":
    """Rules that turn the confusion analysis into next steps, each row with the evidence:

    - more data: recall below `low_recall` (default: 0.1 below the macro recall) and under
      `few_images` x the median class's training images (`train_counts`, else evaluation support);
    - targeted augmentation: a pair where one class loses at least `pair_share` of its images
      to the other (MixUp/CutMix between them, or augmentations that keep their distinguishing cue);
    - merge: two classes that each lose at least `merge_share` of their images to the other.
    """
    import pandas as pd

    counts = evaluation.counts()
    table = evaluation.per_class().iloc[:evaluation.num_classes]
    recall = table["recall"].to_numpy()
    support = table["support"].to_numpy()
    present = support > 0
    sizes = np.asarray(train_counts if train_counts is not None else support, dtype=float)
    source = "training images" if train_counts is not None else "evaluation images"
    threshold = low_recall if low_recall is not None else float(recall[present].mean()) - 0.1
    median_size = float(np.median(sizes[present])) if present.any() else 0.0
    rows = []
    for i in np.argsort(recall, kind="stable"):
        if present[i] and recall[i] < threshold and sizes[i] < few_images * median_size:
            rows.append({"action": "collect more data", "classes": evaluation.classes[i],
                         "evidence": f"recall {recall[i]:.2f} < {threshold:.2f} with {sizes[i]:.0f} {source} "
                                     f"(median class {median_size:.0f})"})
    merged = set()
    for pair in most_confused_pairs(counts, evaluation.classes, top=top_pairs).itertuples():
        key = frozenset((pair.true_index, pair.predicted_index))
        if pair.share_of_true >= merge_share and pair.reverse_share >= merge_share and key not in merged:
            merged.add(key)
            rows.append({"action": "consider merging", "classes": f"{pair.true} + {pair.predicted}",
                         "evidence": f"{pair.share_of_true:.0%} of {pair.true} predicted {pair.predicted} and "
                                     f"{pair.reverse_share:.0%} the other way (both >= {merge_share:.0%})"})
        elif pair.share_of_true >= pair_share and key not in merged:
            rows.append({"action": "targeted augmentation", "classes": f"{pair.true} -> {pair.predicted}",
                         "evidence": f"{pair.images} images ({pair.share_of_true:.0%} of {pair.true}) predicted "
                                     f"{pair.predicted} (>= {pair_share:.0%})"})
    if not rows:
        rows.append({"action": "no action from these rules", "classes": "",
                     "evidence": f"no class below recall {threshold:.2f} with few images, no pair above "
                                 f"{pair_share:.0%}"})
    return pd.DataFrame(rows, columns=["action", "classes", "evidence"])


def dataset_class_counts(dataset, num_classes: int) -> np.ndarray:
    """Images per class in a dataset that exposes `.targets` (all the workbook's datasets do)."""
    targets = getattr(dataset, "targets", None)
    if targets is None:
        raise ValueError("dataset has no .targets; count its labels by iterating instead")
    return np.bincount(np.asarray(targets, dtype=np.int64), minlength=num_classes)


# ---------------------------------------------------------------------------------------------
# CLI: `workbook eval`
# ---------------------------------------------------------------------------------------------

def add_cli(subparsers) -> None:
    parser = subparsers.add_parser("eval", help="evaluate a checkpoint: top-1/top-5, per-class, ECE, confusions")
    parser.add_argument("checkpoint", help="a checkpoint written by `workbook train`")
    parser.add_argument("--split", default="val", choices=("train", "val", "test"))
    parser.add_argument("--ema", action="store_true", help="evaluate the checkpoint's weight-EMA copy")
    parser.add_argument("-p", "--param", action="append", default=[], metavar="NAME=VALUE",
                        help="override a stored config value (e.g. device=cpu, batch_size=256, data_dir=...)")
    parser.add_argument("--name", help="name of the saved evaluation (default: <checkpoint>-<split>-<time>)")
    parser.add_argument("--out", help="folder for the .npz/.json (default: runs/evals)")
    parser.add_argument("--top-pairs", type=int, default=10, help="most-confused pairs to list")
    parser.add_argument("--json", action="store_true", help="print the summary as JSON")
    parser.set_defaults(func=_cli)


def _cli(args) -> int:
    from course_lib.config import parse_assignments
    from course_lib.ledger import describe_hardware

    evaluation = evaluate(args.checkpoint, args.split, name=args.name, out_dir=args.out,
                          weights="ema" if args.ema else "model", **parse_assignments(args.param))
    summary = evaluation.summary()
    if args.json:
        print(json.dumps({"path": str(evaluation.path), **summary}, indent=2))
        return 0
    print(f"{evaluation.name}: {summary['images']} images, {summary['classes']} classes ({describe_hardware()})")
    print(f"top-1 {summary['top1']:.4f}  top-{summary['top5_k']} {summary['top5']:.4f}  "
          f"macro F1 {summary['macro_f1']:.4f}  weighted F1 {summary['weighted_f1']:.4f}  ECE {summary['ece']:.4f}")
    print(evaluation.per_class().to_string(float_format=lambda v: f"{v:.3f}"))
    pairs = most_confused_pairs(evaluation.counts(), evaluation.classes, args.top_pairs)
    if len(pairs):
        print("most-confused pairs:")
        print(pairs.drop(columns=["true_index", "predicted_index"]).to_string(
            index=False, float_format=lambda v: f"{v:.2f}"))
    print(f"saved {evaluation.path}")
    return 0
