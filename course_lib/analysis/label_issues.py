"""Suspect labels: out-of-fold predicted probabilities (`engine.out_of_fold`) ranked by cleanlab's
confident learning (Northcutt, Jiang & Chuang 2021, "Confident Learning: Estimating Uncertainty in
Dataset Labels", arXiv:1911.00068; `cleanlab.filter.find_label_issues`), and the planted-noise check
that measures the finder: flip a known share of the training labels, then compare what it flags with
what was flipped (`workbook scan --labels`, notebook 15).
"""
from __future__ import annotations

import dataclasses

import numpy as np


def plant_flips(targets, fraction: float, num_classes: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """(noisy labels, indices flipped): `fraction` of the labels, drawn with `seed`, each moved to
    another class drawn uniformly."""
    if not 0 <= fraction < 1:
        raise ValueError(f"the share of labels to flip must be in [0, 1), got {fraction}")
    if num_classes < 2:
        raise ValueError("flipping a label needs at least 2 classes")
    targets = np.asarray(targets, dtype=np.int64)
    rng = np.random.default_rng(seed)
    flipped = np.sort(rng.choice(len(targets), int(round(fraction * len(targets))), replace=False))
    noisy = targets.copy()
    # A shift of 1..k-1 classes (mod k) lands on every other class with the same chance, never on its own.
    noisy[flipped] = (targets[flipped] + rng.integers(1, num_classes, len(flipped))) % num_classes
    return noisy, flipped


def rank_label_issues(targets, probabilities) -> np.ndarray:
    """Indices of the images whose label confident learning doubts, most doubtful first (cleanlab's
    `find_label_issues`, ranked by self-confidence: the probability given to the label)."""
    from cleanlab.filter import find_label_issues

    return np.asarray(find_label_issues(np.asarray(targets, dtype=np.int64), np.asarray(probabilities),
                                        return_indices_ranked_by="self_confidence"), dtype=np.int64)


@dataclasses.dataclass(frozen=True)
class FinderScore:
    flagged: int
    planted: int
    found: int  # flagged images that were planted

    @property
    def precision(self) -> float:
        return self.found / self.flagged if self.flagged else float("nan")

    @property
    def recall(self) -> float:
        return self.found / self.planted if self.planted else float("nan")

    def line(self) -> str:
        return (f"flagged {self.flagged}, planted {self.planted}: precision {self.precision:.1%} "
                f"({self.found} of the flagged were planted), recall {self.recall:.1%}")


def score_finder(flagged, planted) -> FinderScore:
    """The finder against the planted flips: precision (flagged that were planted) and recall."""
    flagged, planted = set(int(i) for i in flagged), set(int(i) for i in planted)
    return FinderScore(len(flagged), len(planted), len(flagged & planted))


def suspects_table(flagged, targets, probabilities, classes, names=None, limit: int = 0):
    """The flagged images, most doubtful first: given and predicted class, the probability of each,
    and the image's name when `names` are given."""
    import pandas as pd

    flagged = np.asarray(flagged, dtype=np.int64)[:limit or None]
    targets, probabilities = np.asarray(targets), np.asarray(probabilities)
    predicted = probabilities[flagged].argmax(axis=1)
    rows = {"index": flagged, "given": [classes[t] for t in targets[flagged]],
            "predicted": [classes[p] for p in predicted],
            "p(given)": probabilities[flagged, targets[flagged]], "p(predicted)": probabilities[flagged, predicted]}
    if names is not None:
        rows["image"] = [names[i] for i in flagged]
    return pd.DataFrame(rows).round({"p(given)": 3, "p(predicted)": 3})
