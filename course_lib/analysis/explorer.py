"""Exploring confusions: galleries of the images behind a confusion-matrix cell (with confidences),
the most-confused pairs with examples, and an ipywidgets explorer that ties them together.

The explorer's matrix is a grid of ipywidgets Buttons, one per cell, coloured like the heat map:
a click (or Tab to a cell and Enter) shows that cell's images, most confident first; filters pick
the split, the minimum confidence and the normalisation. Buttons, dropdowns and HTML are core
ipywidgets, which JupyterLab 4 renders with no extension to build. Clicking a cell also sets the
true/predicted dropdowns to it. Ten classes fit without scrolling (the side panel wraps below the
matrix when the page is narrow); beyond that the title says the grid scrolls, and beyond
`max_classes` it shows the most-confused block. With a second evaluation of the same images it
shows the difference, per-class deltas (`comparison.py`) and the images that flipped. Where no
widget can render (nbconvert's HTML of an executed notebook: the run report) the display carries a
static PNG of the matrix instead (`ConfusionExplorer.picture_png`).

Every view is also a plain function returning a table, HTML or a Figure, so a notebook run by
papermill (no browser) shows the same analysis and tests drive it without a browser.
Widgets: https://ipywidgets.readthedocs.io/
"""
from __future__ import annotations

import base64
import functools
import html
import io
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from course_lib.analysis import comparison, confusion
from course_lib.analysis.evaluation import Evaluation, list_evaluations

if TYPE_CHECKING:  # pandas is imported where it is used, to keep imports light
    import pandas as pd

GALLERY_COLUMNS = 6
THUMBNAIL_INCHES = 1.8  # side of one gallery image


def cell_images(evaluation: Evaluation, true_index: int, predicted_index: int, min_confidence: float = 0.0,
                max_confidence: float = 1.0, limit: int | None = None) -> "pd.DataFrame":
    """The images of class `true_index` predicted as `predicted_index` with a confidence in [min_confidence,
    max_confidence], most confident first (the most confident mistakes are the most telling)."""
    for value in (true_index, predicted_index):
        if not 0 <= int(value) < evaluation.num_classes:
            raise ValueError(f"class index {value} is outside 0..{evaluation.num_classes - 1}")
    confidence = evaluation.confidences
    chosen = np.flatnonzero((evaluation.labels == true_index) & (evaluation.predictions == predicted_index)
                            & (confidence >= min_confidence) & (confidence <= max_confidence))
    chosen = chosen[np.argsort(-confidence[chosen], kind="stable")]
    return evaluation.image_table(chosen[:limit])


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


def _colour(value: float, low: float, high: float, colormap: str) -> tuple[str, str]:
    """(background, text) colours of a matrix cell: the colormap at `value` scaled into [low, high],
    with white text on dark cells so the number stays readable."""
    import matplotlib

    fraction = 0.5 if high <= low else min(1.0, max(0.0, (value - low) / (high - low)))
    red, green, blue, _ = matplotlib.colormaps[colormap](fraction)
    luminance = 0.2126 * red + 0.7152 * green + 0.0722 * blue
    return matplotlib.colors.to_hex((red, green, blue)), "white" if luminance < 0.5 else "black"


def _cell_label(value: float, normalize: str, difference: bool) -> str:
    """The number printed on a cell: blank for zero (the eye finds the confusions at once)."""
    if normalize == "none":
        number = int(round(value))
        return "" if number == 0 else (f"{number:+d}" if difference else str(number))
    text = format(value, "+.2f" if difference else ".2f")
    return "" if float(text) == 0 else text.replace("0.", ".", 1)


def matrix_cells(counts, classes, normalize: str = "true", ordering: str = "confusion",
                 max_classes: int | None = 30, baseline_counts=None) -> "pd.DataFrame":
    """The clickable matrix, one row per cell: its position, classes, value (after - before with `baseline_counts`),
    images behind it, label and colours; beyond `max_classes` only the most-confused block (`confusion_view`)."""
    import pandas as pd

    counts = np.asarray(counts)
    difference = baseline_counts is not None
    if difference:
        view = confusion.difference_view(baseline_counts, counts, classes, normalize, ordering, max_classes)
        limit = float(np.abs(view.to_numpy()).max()) or 1.0
        low, high, colormap = -limit, limit, "RdBu_r"
    else:
        view = confusion.confusion_view(counts, classes, normalize, ordering, max_classes)
        low, high, colormap = 0.0, (float(view.to_numpy().max()) or 1.0) if normalize == "none" else 1.0, "Blues"
    position = {name: i for i, name in enumerate(classes)}
    rows = []
    for row, true_name in enumerate(view.index):
        for column, predicted_name in enumerate(view.columns):
            value = float(view.iat[row, column])
            background, text = _colour(value, low, high, colormap)
            true_index, predicted_index = position[true_name], position[predicted_name]
            rows.append({"row": row, "column": column, "true_index": true_index, "predicted_index": predicted_index,
                         "true": true_name, "predicted": predicted_name, "value": value,
                         "images": int(counts[true_index, predicted_index]),
                         "label": _cell_label(value, normalize, difference), "background": background, "text": text})
    return pd.DataFrame(rows, columns=["row", "column", "true_index", "predicted_index", "true", "predicted", "value",
                                       "images", "label", "background", "text"])


def _thumbnail_uri(image, side: int) -> str:
    from PIL import Image

    buffer = io.BytesIO()
    image.resize((side, side), Image.NEAREST).save(buffer, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode("ascii")


def column_label_html(name: str) -> str:
    """A predicted-class column header (vertical, full name on hover), escaped: class names are folder names anyone
    can choose, and an HTML widget sets innerHTML, where an event-handler attribute would run script."""
    return (f'<div title="{html.escape(str(name))}" style="writing-mode:vertical-rl;transform:rotate(180deg);'
            f'height:90px;font-size:11px;overflow:hidden">{html.escape(_clip(str(name)))}</div>')


def row_label_html(name: str) -> str:
    """A true-class row label of the matrix, escaped like `column_label_html`."""
    return (f'<div title="{html.escape(str(name))}" style="font-size:11px;text-align:right">'
            f'{html.escape(_clip(str(name), 18))}</div>')


def gallery_html(evaluation: Evaluation, table, title: str, thumbnail_pixels: int = 96) -> str:
    """`table`'s images (`cell_images`, flipped images) as HTML: a <figure class="workbook-thumb"> each, with its
    confidence (and p(true) for a mistake), real <img> elements a reader (or a test) can count."""
    figures = []
    for item in table.itertuples():
        caption = f"{html.escape(_clip(item.predicted))} {item.confidence:.2f}"
        if item.true != item.predicted:
            caption += f"<br>p(true) {item.true_class_probability:.2f}"
        if hasattr(item, "predicted_before"):
            caption += f"<br>was {html.escape(_clip(item.predicted_before))} {item.confidence_before:.2f}"
        alt = f"true {item.true}, predicted {item.predicted}, confidence {item.confidence:.2f}"
        figures.append(
            f'<figure class="workbook-thumb" data-image="{html.escape(str(item.image))}" '
            f'style="display:inline-block;margin:4px;text-align:center;font-size:11px">'
            f'<img src="{_thumbnail_uri(evaluation.load_image(int(item.index)), thumbnail_pixels)}" '
            f'alt="{html.escape(alt)}" title="{html.escape(_short_name(str(item.image)))}" '
            f'width="{thumbnail_pixels}" height="{thumbnail_pixels}"><figcaption>{caption}</figcaption></figure>')
    body = "".join(figures) or '<p class="workbook-gallery-empty">no images here at these settings</p>'
    return f'<div class="workbook-gallery-caption"><b>{html.escape(title)}</b></div><div>{body}</div>'


def comparison_html(result) -> str:
    """The per-class deltas of a `comparison.Comparison` as a small HTML table (delta [low, high])."""

    percent = f"{result.level:.0%}"
    top1 = result.overall["top1"]
    lines = [f"<p><b>{html.escape(result.after.name)}</b> vs <b>{html.escape(result.before.name)}</b>: top-1 "
             f"{top1['before']:.3f} -> {top1['after']:.3f} ({top1['delta']:+.3f}, {percent} CI "
             f"[{top1['low']:+.3f}, {top1['high']:+.3f}])</p>",
             "<table class='workbook-deltas'><tr><th>class</th><th>precision</th><th>recall</th><th>F1</th></tr>"]
    for name, row in result.per_class.iterrows():
        cells = "".join(f"<td>{row[f'{s}_delta']:+.2f} [{row[f'{s}_low']:+.2f}, {row[f'{s}_high']:+.2f}]</td>"
                        for s in ("precision", "recall", "f1"))
        lines.append(f"<tr><td>{html.escape(str(name))}</td>{cells}</tr>")
    return "".join(lines) + "</table>"


CELL_PIXELS = 46  # width of one clickable matrix cell
ROW_LABEL_PIXELS = 130  # the true-class names left of the grid
FITTING_CLASSES = 10  # EuroSAT's 10 columns fit without scrolling; more scroll, and the title says so
GRID_MAX_PIXELS = ROW_LABEL_PIXELS + FITTING_CLASSES * CELL_PIXELS + 8  # 8: the scroll box's border and slack
PICTURE_DPI = 100  # the static picture of the matrix in a rendered (non-live) notebook


@functools.cache
def _explorer_box():
    """ipywidgets.VBox whose display also carries a static picture (PNG, and HTML wrapping it) of the
    matrix: a live front-end renders the widget (its mime type ranks first), while nbconvert, which
    skips a widget whose state was not saved, shows the picture instead of a blank output."""
    import ipywidgets as widgets

    class ExplorerBox(widgets.VBox):
        picture = None  # a callable returning PNG bytes, called when the box is displayed

        def _repr_mimebundle_(self, **kwargs):
            bundle = super()._repr_mimebundle_(**kwargs)
            if bundle is not None and self.picture is not None:
                encoded = base64.b64encode(self.picture()).decode("ascii")
                bundle["image/png"] = encoded
                bundle["text/html"] = (f'<figure class="workbook-explorer-picture"><img src="data:image/png;base64,'
                                       f'{encoded}" alt="confusion matrix of the explorer"><figcaption><small>A '
                                       "picture of the explorer's matrix: open the notebook in JupyterLab with a "
                                       "kernel to click its cells.</small></figcaption></figure>")
            return bundle

    return ExplorerBox


class ConfusionExplorer:
    """Interactive confusion analysis over saved evaluations. Its state is plain attributes (`split`,
    `evaluation_name`, `compare_name` for a difference, `normalize`, `ordering`, `confidence_range`, `selected_cell`,
    `gallery_mode`), so a test or a script drives it without a browser, through the same verbs as `widget()`."""

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
        self.split: str | None = None
        self.compare_name: str | None = None
        self.selected_cell: tuple[int, int] | None = None
        self.normalize, self.ordering = normalize, ordering
        self.max_classes, self.gallery_size = max_classes, gallery_size
        self.confidence_range, self.gallery_mode = (0.0, 1.0), "cell"
        self.gallery_table = self.gallery_figure = self._comparison = self._controls = None

    @classmethod
    def from_folder(cls, folder: str | Path | None = None, **options) -> "ConfusionExplorer":
        """All evaluations saved under `folder` (default runs/evals), newest first."""
        listing = list_evaluations(folder)
        return cls({row.name: Evaluation.load(row.path) for row in listing.itertuples()}, **options)

    @property
    def evaluation(self) -> Evaluation:
        return self.evaluations[self.evaluation_name]

    @property
    def min_confidence(self) -> float:
        return self.confidence_range[0]

    @min_confidence.setter
    def min_confidence(self, value: float) -> None:
        if not 0.0 <= float(value) <= 1.0:
            raise ValueError(f"min_confidence must lie in 0..1, got {value}")
        self.confidence_range = (float(value), self.confidence_range[1])

    # --- filters --------------------------------------------------------------------------------

    @staticmethod
    def split_of(evaluation: Evaluation) -> str:
        return str(evaluation.metadata.get("split", "val"))

    def splits(self) -> list[str]:
        return sorted({self.split_of(e) for e in self.evaluations.values()})

    def names_in_split(self) -> list[str]:
        """The evaluations the split filter lets through, in the order given."""
        return [name for name, e in self.evaluations.items() if self.split in (None, self.split_of(e))]

    def set_split(self, split: str | None) -> None:
        """Keep only evaluations of `split` (None: all); the shown evaluation moves to the first of
        them when it is not, and a comparison is dropped when its partner is not."""
        if split is not None and split not in self.splits():
            raise ValueError(f"no evaluation of split {split!r}; splits here: {', '.join(self.splits())}")
        self.split = split
        names = self.names_in_split()
        if self.evaluation_name not in names:
            self.evaluation_name = names[0]
        if self.compare_name not in names or self.compare_name == self.evaluation_name:
            self.compare_name = None
        self._comparison = None

    def compare_options(self) -> list[str]:
        """Evaluations the current one can be compared with: same split, same images."""
        current = self.evaluation
        return [name for name in self.names_in_split() if name != self.evaluation_name
                and self.evaluations[name].classes == current.classes
                and self.evaluations[name].image_refs == current.image_refs]

    # --- views without widgets ------------------------------------------------------------------

    def _baseline(self) -> Evaluation | None:
        if self.compare_name and self.compare_name != self.evaluation_name:
            baseline = self.evaluations[self.compare_name]
            if baseline.classes != self.evaluation.classes:
                raise ValueError(f"{baseline.name} and {self.evaluation.name} have different classes; "
                                 "only evaluations of the same classes compare")
            return baseline
        return None

    def matrix_cells(self) -> "pd.DataFrame":
        """The cells the widget draws as buttons (see `matrix_cells`)."""
        baseline = self._baseline()
        return matrix_cells(self.evaluation.counts(), self.evaluation.classes, self.normalize, self.ordering,
                            self.max_classes, None if baseline is None else baseline.counts())

    def matrix_figure(self):
        """The current evaluation's confusion matrix, or after - before when comparing."""
        current, baseline = self.evaluation, self._baseline()
        if baseline is not None:
            return confusion.plot_difference(baseline.counts(), current.counts(), current.classes,
                                           normalize=self.normalize, ordering=self.ordering,
                                           max_classes=self.max_classes,
                                           title=f"{current.name} vs {baseline.name}")
        return confusion.plot_confusion(current.counts(), current.classes, self.normalize, self.ordering,
                                      self.max_classes, title=current.name)

    def picture_png(self) -> bytes:
        """The matrix as the widget shows it now (`matrix_figure`), as PNG bytes."""
        import matplotlib.pyplot as plt

        figure = self.matrix_figure()
        buffer = io.BytesIO()
        figure.savefig(buffer, format="png", dpi=PICTURE_DPI, bbox_inches="tight")
        plt.close(figure)
        return buffer.getvalue()

    def comparison(self):
        """`comparison.compare(baseline, current)` when comparing, else None (cached per pair)."""
        baseline = self._baseline()
        if baseline is None:
            return None
        key = (baseline.name, self.evaluation_name)
        if self._comparison is None or self._comparison[0] != key:
            self._comparison = (key, comparison.compare(baseline, self.evaluation, draws=500))
        return self._comparison[1]

    def pairs_table(self, top: int = 10):
        return confusion.most_confused_pairs(self.evaluation.counts(), self.evaluation.classes, top)

    def select(self, true_index: int, predicted_index: int):
        """Choose a cell: builds the gallery of its images within the confidence range."""
        import matplotlib.pyplot as plt

        self.selected_cell = (int(true_index), int(predicted_index))
        self.gallery_mode = "cell"
        low, high = self.confidence_range
        self.gallery_table = cell_images(self.evaluation, true_index, predicted_index, low, high,
                                         limit=self.gallery_size)
        if self.gallery_figure is not None:
            plt.close(self.gallery_figure)
        self.gallery_figure = plot_gallery(self.evaluation, self.gallery_table)
        plt.close(self.gallery_figure)  # kept for inspection; not drawn again by the inline backend
        return self.gallery_table

    def show_flips(self, direction: str = "right_to_wrong"):
        """The gallery becomes the images that flipped between the compared evaluations, within
        the confidence range of the current one."""
        result = self.comparison()
        if result is None:
            raise ValueError("pick an evaluation to compare to first (compare_name)")
        table = result.flips[direction]
        low, high = self.confidence_range
        self.gallery_mode = direction
        self.gallery_table = table[(table["confidence"] >= low) & (table["confidence"] <= high)].head(self.gallery_size)
        return self.gallery_table

    def gallery_title(self) -> str:
        low = self.min_confidence
        if self.gallery_mode != "cell":
            result = self.comparison()
            total = len(result.flips[self.gallery_mode]) if result is not None else 0
            words = self.gallery_mode.replace("_", " ")
            return (f"{words}: {len(self.gallery_table)} of {total} images with confidence ≥ {low:.2f} "
                    f"({self.evaluation_name} vs {self.compare_name})")
        if self.selected_cell is None:
            return "click a cell of the matrix to see its images"
        true_index, predicted_index = self.selected_cell
        classes = self.evaluation.classes
        total = int(self.evaluation.counts()[true_index, predicted_index])
        return (f"true {classes[true_index]} → predicted {classes[predicted_index]}: {len(self.gallery_table)} of "
                f"{total} images with confidence ≥ {low:.2f}, most confident first ({self.evaluation_name})")

    def refresh(self):
        """Rebuild the gallery for the current settings (after a filter changed)."""
        if self.selected_cell is not None and max(self.selected_cell) >= self.evaluation.num_classes:
            self.selected_cell = None
        if self.gallery_mode != "cell" and self.comparison() is not None:
            return self.show_flips(self.gallery_mode)
        self.gallery_mode = "cell"
        if self.selected_cell is not None:
            return self.select(*self.selected_cell)
        self.gallery_table = None
        return None

    # --- widget handlers (callable directly, no browser needed) -----------------------------------

    def on_cell_selected(self, change):
        """Handler for the cell controls: change["new"] is (true_index, predicted_index)."""
        true_index, predicted_index = change["new"]
        table = self.select(true_index, predicted_index)
        if self._controls is not None:  # the dropdowns name the cell shown, however it was chosen
            self._controls["true"].value, self._controls["predicted"].value = self.selected_cell
        self._show_gallery()
        self._mark_selected()
        return table

    def on_settings_changed(self, change=None):
        """Handler for the split/evaluation/comparison/normalisation/ordering/confidence controls."""
        if self._controls is not None:
            c = self._controls
            if c["split"].value != (self.split or ""):
                self.set_split(c["split"].value or None)
            else:
                self.evaluation_name = c["evaluation"].value
                self.compare_name = c["compare"].value or None
            self.normalize = c["normalize"].value
            self.ordering = c["ordering"].value
            self.min_confidence = c["min_confidence"].value
            self._sync_controls()
        self.refresh()
        self._show_matrix()
        self._show_gallery()

    def _sync_controls(self):
        """Put the state back into the controls without firing their handlers again."""
        c = self._controls
        for key in ("evaluation", "compare"):
            c[key].unobserve(self.on_settings_changed, names="value")
        c["evaluation"].options = self.names_in_split()
        c["evaluation"].value = self.evaluation_name
        c["compare"].options = [("(none)", "")] + [(n, n) for n in self.compare_options()]
        c["compare"].value = self.compare_name or ""
        for key in ("evaluation", "compare"):
            c[key].observe(self.on_settings_changed, names="value")
        c["pairs"].options = self._pair_options()
        classes = [(name, i) for i, name in enumerate(self.evaluation.classes)]
        c["true"].options, c["predicted"].options = classes, classes

    def _pair_options(self):
        options = [(f"{p.true} -> {p.predicted}  ({p.images} images, {p.share_of_true:.0%})",
                    (p.true_index, p.predicted_index)) for p in self.pairs_table(20).itertuples()]
        return options or [("(no confusions)", None)]

    def _cell_button(self, cell):
        import ipywidgets as widgets

        button = widgets.Button(description=cell.label, tooltip=f"true {cell.true}, predicted {cell.predicted}: "
                                                                 f"{cell.images} images",
                                layout=widgets.Layout(width=f"{CELL_PIXELS}px", height="30px", padding="0",
                                                      margin="0", border="1px solid white"))
        button.style.button_color = cell.background
        button.style.text_color = cell.text
        button.style.font_size = "11px"
        button.add_class("workbook-cm-cell")
        button.cell = (int(cell.true_index), int(cell.predicted_index))
        button.on_click(lambda clicked: self.on_cell_selected({"new": clicked.cell}))
        return button

    def _show_matrix(self):
        """Rebuild the grid of cell buttons (rows true, columns predicted) and the comparison."""
        if self._controls is None:
            return
        import ipywidgets as widgets

        c = self._controls
        cells = self.matrix_cells()
        shown = int(cells["row"].max()) + 1 if len(cells) else 0
        names = list(cells.loc[cells["row"] == 0, "predicted"])
        header = [widgets.HTML("<small>true \\ predicted</small>")]
        header += [widgets.HTML(column_label_html(name)) for name in names]
        children = list(header)
        self._buttons = {}
        for row in range(shown):
            row_cells = cells[cells["row"] == row]
            children.append(widgets.HTML(row_label_html(row_cells.iloc[0]["true"])))
            for cell in row_cells.itertuples():
                button = self._cell_button(cell)
                self._buttons[button.cell] = button
                children.append(button)
        c["grid"].children = children
        c["grid"].layout.grid_template_columns = f"{ROW_LABEL_PIXELS}px repeat({shown}, {CELL_PIXELS}px)"
        scope = f"{shown} most-confused of {self.evaluation.num_classes} classes" \
            if shown < self.evaluation.num_classes else f"{shown} classes"
        if shown > FITTING_CLASSES:
            scope += f" (the grid scrolls: {FITTING_CLASSES} columns fit)"
        what = f"after - before ({self.compare_name} -> {self.evaluation_name})" if self._baseline() else \
            self.evaluation_name
        c["matrix_title"].value = (f"<b>{html.escape(what)}</b>: {html.escape(self.normalize)}-normalised, {scope}, "
                                   f"ordered by {html.escape(self.ordering)}")
        result = self.comparison()
        c["comparison"].value = comparison_html(result) if result is not None else ""
        c["flips"].layout.display = "" if result is not None else "none"
        if result is not None:
            c["right_to_wrong"].description = f"right -> wrong ({result.overall['right_to_wrong']})"
            c["wrong_to_right"].description = f"wrong -> right ({result.overall['wrong_to_right']})"
        self._mark_selected()

    def _mark_selected(self):
        for cell, button in getattr(self, "_buttons", {}).items():
            selected = self.gallery_mode == "cell" and cell == self.selected_cell
            button.layout.border = "3px solid #d62728" if selected else "1px solid white"
            button.style.font_weight = "bold" if selected else "normal"

    def _show_gallery(self):
        if self._controls is None:
            return
        title, table = self.gallery_title(), self.gallery_table
        self._controls["gallery"].value = (gallery_html(self.evaluation, table, title) if table is not None else
                                           f'<div class="workbook-gallery-caption">{html.escape(title)}</div>')

    def _on_flips(self, direction: str):
        self.show_flips(direction)
        self._mark_selected()
        self._show_gallery()

    def widget(self):
        """Filters, the matrix as a grid of buttons (click, or Tab to a cell and Enter), a most-confused list and
        the chosen cell's gallery; with a comparison, the per-class deltas and flipped images."""
        c = self._controls = self._make_controls()
        for key in ("split", "evaluation", "compare", "normalize", "ordering", "min_confidence"):
            c[key].observe(self.on_settings_changed, names="value")
        c["pairs"].observe(lambda change: change["new"] is not None and self.on_cell_selected(change), names="value")
        c["show"].on_click(lambda _: self.on_cell_selected({"new": (c["true"].value, c["predicted"].value)}))
        c["right_to_wrong"].on_click(lambda _: self._on_flips("right_to_wrong"))
        c["wrong_to_right"].on_click(lambda _: self._on_flips("wrong_to_right"))
        self._show_matrix()
        self._show_gallery()
        root = self._laid_out(c)
        root.picture = self.picture_png
        root.add_class("workbook-explorer")
        return root

    def _make_controls(self) -> dict:
        """The explorer's widgets by name, each with the CSS class a browser test (or a user's CSS) finds it by."""
        import ipywidgets as widgets

        classes = [(name, i) for i, name in enumerate(self.evaluation.classes)]
        wide = {"style": {"description_width": "initial"}}
        c = {
            "split": widgets.Dropdown(options=[("all", "")] + [(s, s) for s in self.splits()], value=self.split or "",
                                      description="split", **wide),
            "evaluation": widgets.Dropdown(options=self.names_in_split(), value=self.evaluation_name,
                                           description="evaluation", **wide),
            "compare": widgets.Dropdown(options=[("(none)", "")] + [(n, n) for n in self.compare_options()],
                                        value=self.compare_name or "", description="compare to", **wide),
            "normalize": widgets.ToggleButtons(options=list(confusion.NORMALIZATIONS), value=self.normalize,
                                               description="normalise", **wide),
            "ordering": widgets.ToggleButtons(options=list(confusion.ORDERINGS), value=self.ordering,
                                              description="order by", **wide),
            "min_confidence": widgets.FloatSlider(value=self.min_confidence, min=0.0, max=1.0, step=0.05,
                                                  continuous_update=False, description="min confidence", **wide),
            "matrix_title": widgets.HTML(layout=widgets.Layout(max_width=f"{GRID_MAX_PIXELS}px")),
            "grid": widgets.GridBox(layout=widgets.Layout(grid_gap="0px", align_items="center")),
            "pairs": widgets.Select(options=self._pair_options(), value=None, rows=6,
                                    description="confused", layout=widgets.Layout(width="460px")),
            "true": widgets.Dropdown(options=classes, description="true", layout=widgets.Layout(width="220px")),
            "predicted": widgets.Dropdown(options=classes, description="predicted",
                                          layout=widgets.Layout(width="220px")),
            # flex 0 0 auto: the button keeps its words' width instead of shrinking to "s..."
            "show": widgets.Button(description="show cell", layout=widgets.Layout(width="auto", flex="0 0 auto")),
            "comparison": widgets.HTML(),
            "right_to_wrong": widgets.Button(description="right -> wrong"),
            "wrong_to_right": widgets.Button(description="wrong -> right"),
            "gallery": widgets.HTML(),
        }
        c["flips"] = widgets.HBox([c["right_to_wrong"], c["wrong_to_right"]])
        c["gallery"].add_class("workbook-gallery")
        c["grid"].add_class("workbook-matrix")
        for key in ("compare", "true", "predicted", "show", "right_to_wrong", "wrong_to_right"):
            c[key].add_class(f"workbook-{key.replace('_', '-')}")  # names a browser test (or a user's CSS) can find
        return c

    def _laid_out(self, c: dict):
        """The controls `c` in their boxes: filters on top, the matrix beside the side panel, the gallery below."""
        import ipywidgets as widgets

        # The matrix never shrinks below FITTING_CLASSES columns (flex 0 0 auto); rows wrap, so on a
        # narrow page the side panel moves below the matrix instead of squeezing it into a scroll.
        wrap = {"flex_flow": "row wrap", "align_items": "flex-start"}
        scroller = widgets.Box([c["grid"]], layout=widgets.Layout(overflow="auto", max_width=f"{GRID_MAX_PIXELS}px",
                                                                  max_height=f"{GRID_MAX_PIXELS}px"))
        return _explorer_box()([
            widgets.HBox([c["split"], c["evaluation"], c["compare"]], layout=widgets.Layout(flex_flow="row wrap")),
            widgets.HBox([c["normalize"], c["ordering"]], layout=widgets.Layout(flex_flow="row wrap")),
            c["min_confidence"],
            widgets.HBox([widgets.VBox([c["matrix_title"], scroller], layout=widgets.Layout(flex="0 0 auto")),
                          widgets.VBox([c["pairs"], widgets.HBox([c["true"], c["predicted"], c["show"]],
                                                                 layout=widgets.Layout(flex_flow="row wrap")),
                                        c["comparison"], c["flips"]], layout=widgets.Layout(flex="1 1 460px"))],
                         layout=widgets.Layout(**wrap)),
            c["gallery"],
        ])
