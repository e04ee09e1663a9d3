"""Exploring confusions: galleries of the images behind a confusion-matrix cell (with confidences),
the most-confused pairs with examples, and an ipywidgets explorer that ties them together.

Every view is a plain function returning a table or a Figure, so a notebook run by papermill (no
browser) shows the same analysis; `ConfusionExplorer.widget()` only adds controls around them.
Widgets: https://ipywidgets.readthedocs.io/
"""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from course_lib.analysis import confusion
from course_lib.analysis.evaluation import Evaluation, list_evaluations

if TYPE_CHECKING:  # pandas is imported where it is used, to keep imports light
    import pandas as pd

GALLERY_COLUMNS = 6
THUMBNAIL_INCHES = 1.8  # side of one gallery image


def cell_images(evaluation: Evaluation, true_index: int, predicted_index: int, min_confidence: float = 0.0,
                max_confidence: float = 1.0, limit: int | None = None) -> "pd.DataFrame":
    """The images of class `true_index` that the model predicted as `predicted_index`, with the top
    probability in [min_confidence, max_confidence], most confident first (the most confident
    mistakes are the most telling)."""
    import pandas as pd

    for value in (true_index, predicted_index):
        if not 0 <= int(value) < evaluation.num_classes:
            raise ValueError(f"class index {value} is outside 0..{evaluation.num_classes - 1}")
    confidence = evaluation.confidences
    chosen = np.flatnonzero((evaluation.labels == true_index) & (evaluation.predictions == predicted_index)
                            & (confidence >= min_confidence) & (confidence <= max_confidence))
    chosen = chosen[np.argsort(-confidence[chosen], kind="stable")]
    if limit is not None:
        chosen = chosen[:limit]
    return pd.DataFrame({
        "index": chosen.astype(int),
        "image": [evaluation.image_refs[i] for i in chosen],
        "true": evaluation.classes[true_index],
        "predicted": evaluation.classes[predicted_index],
        "confidence": confidence[chosen].astype(float),
        "true_class_probability": evaluation.probabilities[chosen, true_index].astype(float),
    }, columns=["index", "image", "true", "predicted", "confidence", "true_class_probability"])


def _short_name(ref: str) -> str:
    return ref if ref.startswith("index:") else Path(ref).stem[-18:]


def _clip(name: str, characters: int = 14) -> str:
    """Class names short enough for a thumbnail's caption."""
    return name if len(name) <= characters else name[:characters - 1] + "…"


def plot_gallery(evaluation: Evaluation, table, columns: int = GALLERY_COLUMNS, title: str = ""):
    """A grid of the images listed in `table` (a `cell_images` result), each titled with its
    confidence and (for wrong predictions) the probability given to the true class."""
    import matplotlib.pyplot as plt

    count = len(table)
    columns = max(1, min(columns, count or 1))
    rows = max(1, int(np.ceil(count / columns)))
    # 0.5 inch per row for the two caption lines, so captions never overlap the row above.
    figure, axes = plt.subplots(rows, columns, figsize=(THUMBNAIL_INCHES * columns,
                                                        (THUMBNAIL_INCHES + 0.5) * rows + 0.4), squeeze=False)
    for ax in axes.flat:
        ax.axis("off")
    for ax, item in zip(axes.flat, table.itertuples()):
        ax.imshow(evaluation.load_image(int(item.index)))
        caption = f"conf {item.confidence:.2f}"
        if item.true != item.predicted:
            caption += f", p(true) {item.true_class_probability:.2f}"
        ax.set_title(f"{caption}\n{_short_name(item.image)}", fontsize=7)
    if count == 0:
        axes.flat[0].text(0.5, 0.5, "no images in this cell\nat this confidence", ha="center", va="center")
    figure.suptitle(title or (f"true {table['true'].iloc[0]} -> predicted {table['predicted'].iloc[0]} "
                              f"({count} shown)" if count else ""), fontsize=9)
    figure.tight_layout()
    return figure


def pairs_gallery(evaluation: Evaluation, top: int = 4, per_pair: int = 5, min_confidence: float = 0.0):
    """One row per most-confused pair (true -> predicted): the pair's most confident mistakes,
    next to one correctly classified image of each class for reference. Returns (Figure, pairs table)."""
    import matplotlib.pyplot as plt

    pairs = confusion.most_confused_pairs(evaluation.counts(), evaluation.classes, top=top)
    rows = max(1, len(pairs))
    columns = per_pair + 2
    figure, axes = plt.subplots(rows, columns, figsize=(THUMBNAIL_INCHES * columns * 0.8,
                                                        THUMBNAIL_INCHES * rows * 0.9 + 0.4), squeeze=False)
    for ax in axes.flat:
        ax.axis("off")
    if pairs.empty:
        axes[0, 0].text(0, 0.5, "no confusions: every image is on the diagonal", va="center")
    for row, pair in enumerate(pairs.itertuples()):
        for column, class_index in enumerate((pair.true_index, pair.predicted_index)):
            reference = cell_images(evaluation, class_index, class_index, limit=1)
            ax = axes[row, column]
            if len(reference):
                ax.imshow(evaluation.load_image(int(reference["index"].iloc[0])))
                ax.set_title(f"a correct\n{evaluation.classes[class_index]}", fontsize=7)
            else:
                ax.set_title(f"(no correct\n{evaluation.classes[class_index]})", fontsize=7)
        mistakes = cell_images(evaluation, pair.true_index, pair.predicted_index, min_confidence, limit=per_pair)
        for offset, item in enumerate(mistakes.itertuples()):
            ax = axes[row, 2 + offset]
            ax.imshow(evaluation.load_image(int(item.index)))
            ax.set_title(f"{_clip(pair.true)}\nas {_clip(pair.predicted)} {item.confidence:.2f}", fontsize=7)
    figure.suptitle(f"{evaluation.name}: most-confused pairs; first two columns: a correct image of each class, "
                    "then mistakes (true, as predicted, confidence)", fontsize=9)
    figure.tight_layout()
    return figure, pairs


class ConfusionExplorer:
    """Interactive confusion analysis over one or more saved evaluations.

    State (plain attributes, so a test or a script can drive it): `evaluation_name`,
    `compare_name` (None, or a second evaluation drawn as a difference matrix), `normalize`,
    `ordering`, `confidence_range`, `selected_cell`. Verbs: `matrix_figure()`, `select(t, p)`
    (builds `gallery_table` and `gallery_figure`), `widget()`.
    """

    def __init__(self, evaluations, normalize: str = "true", ordering: str = "confusion",
                 max_classes: int | None = 30, gallery_size: int = 12):
        if isinstance(evaluations, Evaluation):
            evaluations = [evaluations]
        if not isinstance(evaluations, dict):
            evaluations = {e.name: e for e in evaluations}
        if not evaluations:
            raise ValueError("no evaluations to explore; run evaluation.evaluate(...) or `workbook eval` first")
        self.evaluations = dict(evaluations)
        self.evaluation_name = next(iter(self.evaluations))
        self.compare_name: str | None = None
        self.normalize = normalize
        self.ordering = ordering
        self.max_classes = max_classes
        self.gallery_size = gallery_size
        self.confidence_range = (0.0, 1.0)
        self.selected_cell: tuple[int, int] | None = None
        self.gallery_table = None
        self.gallery_figure = None
        self._controls = None

    @classmethod
    def from_folder(cls, folder: str | Path | None = None, **options) -> "ConfusionExplorer":
        """All evaluations saved under `folder` (default runs/evals), newest first."""
        listing = list_evaluations(folder)
        return cls({row.name: Evaluation.load(row.path) for row in listing.itertuples()}, **options)

    @property
    def evaluation(self) -> Evaluation:
        return self.evaluations[self.evaluation_name]

    # --- views without widgets ------------------------------------------------------------------

    def matrix_figure(self):
        """The current evaluation's confusion matrix, or after - before when comparing."""
        current = self.evaluation
        if self.compare_name and self.compare_name != self.evaluation_name:
            baseline = self.evaluations[self.compare_name]
            if baseline.classes != current.classes:
                raise ValueError(f"{baseline.name} and {current.name} have different classes; "
                                 "only evaluations of the same classes compare")
            return confusion.plot_difference(baseline.counts(), current.counts(), current.classes,
                                           normalize=self.normalize, ordering=self.ordering,
                                           max_classes=self.max_classes,
                                           title=f"{current.name} vs {baseline.name}")
        return confusion.plot_confusion(current.counts(), current.classes, self.normalize, self.ordering,
                                      self.max_classes, title=current.name)

    def pairs_table(self, top: int = 10):
        return confusion.most_confused_pairs(self.evaluation.counts(), self.evaluation.classes, top)

    def select(self, true_index: int, predicted_index: int):
        """Choose a cell: builds the gallery of its images within the confidence range."""
        import matplotlib.pyplot as plt

        self.selected_cell = (int(true_index), int(predicted_index))
        low, high = self.confidence_range
        self.gallery_table = cell_images(self.evaluation, true_index, predicted_index, low, high,
                                         limit=self.gallery_size)
        if self.gallery_figure is not None:
            plt.close(self.gallery_figure)
        self.gallery_figure = plot_gallery(self.evaluation, self.gallery_table)
        return self.gallery_table

    # --- widget handlers (callable directly, no browser needed) -----------------------------------

    def on_cell_selected(self, change):
        """Handler for the cell controls: change["new"] is (true_index, predicted_index)."""
        true_index, predicted_index = change["new"]
        table = self.select(true_index, predicted_index)
        self._show_gallery()
        return table

    def on_settings_changed(self, change=None):
        """Handler for evaluation/comparison/normalisation/ordering/confidence controls."""
        if self._controls is not None:
            c = self._controls
            self.evaluation_name = c["evaluation"].value
            self.compare_name = c["compare"].value or None
            self.normalize = c["normalize"].value
            self.ordering = c["ordering"].value
            self.confidence_range = tuple(c["confidence"].value)
            c["pairs"].options = self._pair_options()
            classes = [(name, i) for i, name in enumerate(self.evaluation.classes)]
            c["true"].options, c["predicted"].options = classes, classes
        if self.selected_cell is not None and max(self.selected_cell) >= self.evaluation.num_classes:
            self.selected_cell = None
        self._show_matrix()
        if self.selected_cell is not None:
            self.select(*self.selected_cell)
            self._show_gallery()

    def _pair_options(self):
        options = [(f"{p.true} -> {p.predicted}  ({p.images} images, {p.share_of_true:.0%})",
                    (p.true_index, p.predicted_index)) for p in self.pairs_table(20).itertuples()]
        return options or [("(no confusions)", None)]

    def _show(self, output, figure):
        import matplotlib.pyplot as plt
        from IPython.display import clear_output, display

        if output is None:
            return
        with output:
            clear_output(wait=True)
            display(figure)
        plt.close(figure)

    def _show_matrix(self):
        if self._controls is not None:
            self._show(self._controls["matrix_output"], self.matrix_figure())

    def _show_gallery(self):
        if self._controls is not None and self.gallery_figure is not None:
            with self._controls["gallery_output"]:
                from IPython.display import clear_output, display

                clear_output(wait=True)
                display(self.gallery_table.drop(columns=["image"]).round(3))
                display(self.gallery_figure)

    def widget(self):
        """Controls: evaluation, comparison, normalisation, ordering, confidence range, a cell
        (from the most-confused list or any true/predicted pair); outputs: matrix and gallery."""
        import ipywidgets as widgets

        names = list(self.evaluations)
        classes = [(name, i) for i, name in enumerate(self.evaluation.classes)]
        c = {
            "evaluation": widgets.Dropdown(options=names, value=self.evaluation_name, description="evaluation"),
            "compare": widgets.Dropdown(options=[("(none)", "")] + [(n, n) for n in names],
                                        value=self.compare_name or "", description="compare to"),
            "normalize": widgets.ToggleButtons(options=list(confusion.NORMALIZATIONS), value=self.normalize,
                                               description="normalise"),
            "ordering": widgets.ToggleButtons(options=list(confusion.ORDERINGS), value=self.ordering,
                                              description="order by"),
            "confidence": widgets.FloatRangeSlider(value=self.confidence_range, min=0.0, max=1.0, step=0.05,
                                                   description="confidence"),
            "pairs": widgets.Select(options=self._pair_options(), value=None, rows=6,
                                    description="confused", layout=widgets.Layout(width="520px")),
            "true": widgets.Dropdown(options=classes, description="true"),
            "predicted": widgets.Dropdown(options=classes, description="predicted"),
            "show": widgets.Button(description="show cell"),
            "matrix_output": widgets.Output(),
            "gallery_output": widgets.Output(),
        }
        self._controls = c
        for key in ("evaluation", "compare", "normalize", "ordering", "confidence"):
            c[key].observe(self.on_settings_changed, names="value")
        c["pairs"].observe(lambda change: change["new"] is not None and self.on_cell_selected(change), names="value")
        c["show"].on_click(lambda _: self.on_cell_selected({"new": (c["true"].value, c["predicted"].value)}))
        self._show_matrix()
        return widgets.VBox([
            widgets.HBox([c["evaluation"], c["compare"]]),
            widgets.HBox([c["normalize"], c["ordering"]]),
            c["confidence"],
            widgets.HBox([c["matrix_output"],
                          widgets.VBox([c["pairs"], widgets.HBox([c["true"], c["predicted"], c["show"]])])]),
            c["gallery_output"],
        ])
