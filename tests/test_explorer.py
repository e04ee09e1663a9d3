import matplotlib.pyplot as plt
import numpy as np
import pytest

from course_lib.analysis import confusion, explorer
from course_lib.analysis.evaluation import Evaluation
from course_lib.analysis.explorer import ConfusionExplorer

CLASSES = ["forest", "grassland", "water"]


def _probabilities(predicted, confidence):
    rows = np.full((len(predicted), 3), 0.0)
    for row, (p, c) in enumerate(zip(predicted, confidence)):
        rows[row] = (1 - c) / 2
        rows[row, p] = c
    return rows


def _evaluation(name="baseline", predicted=None):
    # 12 images; image i is a solid grey of level 10*i, so a gallery's pixels say which images it shows.
    labels = np.array([0, 0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2])
    predicted = np.array([0, 1, 1, 1, 0, 1, 0, 1, 1, 2, 2, 2]) if predicted is None else predicted
    confidence = np.array([0.9, 0.55, 0.95, 0.7, 0.8, 0.9, 0.6, 0.7, 0.8, 0.9, 0.9, 0.9])
    evaluation = Evaluation(name, CLASSES, labels, _probabilities(predicted, confidence),
                            [f"img_{i}.jpg" for i in range(12)])
    evaluation.image_loader = lambda index: np.full((8, 8, 3), 10 * index, np.uint8)
    return evaluation


def _shown_levels(figure):
    """The grey level of every image drawn in a gallery figure, in reading order."""
    return [int(ax.images[0].get_array()[0, 0, 0]) for ax in figure.axes if ax.images]


def test_cell_images_lists_the_cell_most_confident_first_and_filters_by_confidence():
    evaluation = _evaluation()
    table = explorer.cell_images(evaluation, 0, 1)  # forest predicted as grassland: images 1, 2, 3
    assert table["index"].tolist() == [2, 3, 1]
    assert table["confidence"].tolist() == pytest.approx([0.95, 0.7, 0.55])
    assert table["true_class_probability"].tolist() == pytest.approx([0.025, 0.15, 0.225])
    assert explorer.cell_images(evaluation, 0, 1, min_confidence=0.6, max_confidence=0.9)["index"].tolist() == [3]
    assert explorer.cell_images(evaluation, 2, 0).empty
    with pytest.raises(ValueError, match="outside 0..2"):
        explorer.cell_images(evaluation, 0, 3)


def test_selection_callback_builds_the_gallery_for_the_chosen_cell():
    view = ConfusionExplorer(_evaluation())
    table = view.on_cell_selected({"new": (0, 1)})  # what the widget calls; no browser involved
    assert view.selected_cell == (0, 1)
    assert table["index"].tolist() == [2, 3, 1]
    assert _shown_levels(view.gallery_figure) == [20, 30, 10]
    titles = [ax.get_title() for ax in view.gallery_figure.axes if ax.images]
    assert titles[0].startswith("conf 0.95, p(true) 0.03")
    view.confidence_range = (0.0, 0.75)
    view.on_cell_selected({"new": (0, 1)})
    assert _shown_levels(view.gallery_figure) == [30, 10]
    view.on_cell_selected({"new": (1, 0)})
    assert _shown_levels(view.gallery_figure) == [60]
    plt.close("all")


def test_widget_controls_drive_the_same_handlers():
    pytest.importorskip("ipywidgets")
    baseline = _evaluation("baseline")
    after = _evaluation("after", predicted=np.array([0, 0, 1, 0, 0, 1, 1, 1, 1, 2, 2, 2]))
    view = ConfusionExplorer([after, baseline], normalize="true", ordering="name")
    root = view.widget()
    assert root.children  # built without a browser
    controls = view._controls
    first_pair = controls["pairs"].options[0]
    assert first_pair[1] == (0, 1)  # after: forest -> grassland is its only confusion
    controls["pairs"].value = first_pair[1]
    assert view.gallery_table["index"].tolist() == [2]
    assert (controls["true"].value, controls["predicted"].value) == (0, 1)  # a chosen pair sets the dropdowns too
    controls["min_confidence"].value = 0.96
    assert view.confidence_range == (0.96, 1.0) and view.gallery_table.empty
    assert "no images here" in controls["gallery"].value
    controls["compare"].value = "baseline"
    assert view.compare_name == "baseline"
    difference = view.matrix_figure()
    assert "after vs baseline" in difference.axes[0].get_title()
    assert "after</b> vs <b>baseline" in controls["comparison"].value
    assert controls["wrong_to_right"].description == "wrong -> right (3)"
    controls["min_confidence"].value = 0.0
    controls["wrong_to_right"].click()
    assert view.gallery_mode == "wrong_to_right" and view.gallery_table["index"].tolist() == [3, 6, 1]
    controls["normalize"].value = "pred"
    assert view.normalize == "pred"
    controls["true"].value, controls["predicted"].value = 1, 1
    controls["show"].click()
    assert view.selected_cell == (1, 1) and view.gallery_mode == "cell"
    plt.close("all")


def test_matrix_cells_are_buttons_that_show_their_images_when_clicked():
    pytest.importorskip("ipywidgets")
    view = ConfusionExplorer(_evaluation(), normalize="none", ordering="name")
    view.widget()
    cells = view.matrix_cells()
    assert len(cells) == 9
    forest_as_grassland = cells[(cells["true"] == "forest") & (cells["predicted"] == "grassland")].iloc[0]
    assert (forest_as_grassland["images"], forest_as_grassland["label"]) == (3, "3")
    assert cells[(cells["true"] == "water") & (cells["predicted"] == "forest")].iloc[0]["label"] == ""  # zero: blank
    button = view._buttons[(0, 1)]
    assert button.tooltip == "true forest, predicted grassland: 3 images"
    assert "workbook-cm-cell" in button._dom_classes
    button.click()  # what a mouse click or Enter on the focused button does
    assert view.selected_cell == (0, 1)
    gallery = view._controls["gallery"].value
    assert gallery.count('class="workbook-thumb"') == 3
    assert "true forest → predicted grassland: 3 of 3 images with confidence ≥ 0.00" in gallery
    assert gallery.index('data-image="img_2.jpg"') < gallery.index('data-image="img_3.jpg"')  # most confident first
    assert button.layout.border.startswith("3px")  # the selected cell is marked
    controls = view._controls
    assert (controls["true"].value, controls["predicted"].value) == (0, 1)  # the dropdowns follow the click
    view._buttons[(2, 2)].click()
    assert (controls["true"].label, controls["predicted"].label) == ("water", "water")
    button.click()
    view._controls["min_confidence"].value = 0.6
    assert view._controls["gallery"].value.count('class="workbook-thumb"') == 2
    view._controls["normalize"].value = "true"  # the grid is rebuilt, the selection kept
    assert view._buttons[(0, 1)].description == ".60" and view.selected_cell == (0, 1)
    plt.close("all")


def test_split_filter_switches_to_that_splits_evaluation():
    val = _evaluation("model-val")
    test = _evaluation("model-test", predicted=np.array([0, 1, 0, 0, 0, 1, 0, 1, 1, 2, 2, 2]))
    val.metadata["split"], test.metadata["split"] = "val", "test"
    view = ConfusionExplorer([val, test])
    assert view.splits() == ["test", "val"]
    view.select(0, 1)
    view.set_split("test")
    assert view.evaluation_name == "model-test" and view.names_in_split() == ["model-test"]
    assert view.refresh()["index"].tolist() == [1]  # the same cell, the test split's images
    view.set_split(None)
    assert view.names_in_split() == ["model-val", "model-test"]
    with pytest.raises(ValueError, match="no evaluation of split 'train'"):
        view.set_split("train")
    with pytest.raises(ValueError, match="min_confidence"):
        view.min_confidence = 1.5
    plt.close("all")


def test_matrix_cells_colour_and_group_large_matrices():
    rng = np.random.default_rng(0)
    counts = rng.integers(0, 5, size=(100, 100)) + np.eye(100, dtype=int) * 2000
    classes = [f"class{i:03d}" for i in range(100)]
    cells = explorer.matrix_cells(counts, classes, "true", "confusion", max_classes=30)
    assert len(cells) == 30 * 30  # the most-confused block, not 10,000 buttons
    diagonal = cells[cells["true_index"] == cells["predicted_index"]]
    assert len(diagonal) == 30 and (diagonal["text"] == "white").all()  # dark cells get white numbers
    difference = explorer.matrix_cells(counts, classes, "none", "name", max_classes=10, baseline_counts=counts)
    assert (difference["value"] == 0).all() and (difference["label"] == "").all()


def test_difference_matrix_of_two_evaluations_shows_the_fix():
    baseline = _evaluation("baseline")
    after = _evaluation("after", predicted=np.array([0, 0, 1, 0, 0, 1, 1, 1, 1, 2, 2, 2]))
    view = confusion.difference_view(baseline.counts(), after.counts(), CLASSES, "true", "name")
    assert view.loc["forest", "forest"] == pytest.approx(0.4)  # 2/5 -> 4/5 right
    assert view.loc["forest", "grassland"] == pytest.approx(-0.4)
    assert view.loc["grassland", "forest"] == pytest.approx(-0.25)
    mismatched = Evaluation("other", ["a", "b", "c"], baseline.labels, baseline.probabilities, baseline.image_refs)
    explorer_view = ConfusionExplorer([baseline, mismatched])
    explorer_view.compare_name = "other"
    with pytest.raises(ValueError, match="different classes"):
        explorer_view.matrix_figure()


def test_pairs_gallery_shows_the_top_pairs_with_their_images():
    evaluation = _evaluation()
    figure, pairs = explorer.pairs_gallery(evaluation, top=2, per_pair=3)
    assert list(zip(pairs["true"], pairs["predicted"])) == [("forest", "grassland"), ("grassland", "forest")]
    levels = _shown_levels(figure)
    # Row 1: a correct forest (image 0), a correct grassland (image 5), then mistakes 2, 3, 1.
    assert levels[:5] == [0, 50, 20, 30, 10]
    assert levels[5:] == [50, 0, 60]  # row 2 (grassland -> forest) starts with the true class
    plt.close(figure)


def test_explorer_loads_saved_evaluations(tmp_path):
    first = _evaluation("first")
    first.save(tmp_path)
    view = ConfusionExplorer.from_folder(tmp_path)
    assert list(view.evaluations) == ["first"]
    assert view.pairs_table()["images"].tolist() == [3, 1]
    with pytest.raises(ValueError, match="no evaluations"):
        ConfusionExplorer({})


# --- issue 30 point 5: class names are text, never markup ------------------------------------------

HOSTILE = ['<img src=x onerror="alert(1)">', '" onmouseover="alert(2)', "<script>alert(3)</script>"]


def _event_handlers(markup: str) -> list[tuple[str, str]]:
    """(tag, attribute) of every event-handler attribute and every <script> element in `markup`."""
    from html.parser import HTMLParser

    found = []

    class Finder(HTMLParser):
        def handle_starttag(self, tag, attrs):
            found.extend((tag, name) for name, _ in attrs if name.startswith("on"))
            if tag == "script":
                found.append((tag, ""))

    Finder().feed(markup)
    return found


def _html_values(widget) -> list[str]:
    import ipywidgets as widgets

    values = [widget.value] if isinstance(widget, widgets.HTML) else []
    for child in getattr(widget, "children", ()):
        values += _html_values(child)
    return values


def test_hostile_class_names_reach_the_html_widgets_as_text():
    """A class folder named with an event-handler attribute ran JavaScript in the browser: ipywidgets.HTML
    sets innerHTML. Every name must arrive escaped, in the matrix labels, the captions and the gallery."""
    pytest.importorskip("ipywidgets")
    evaluation = _evaluation('baseline <b onclick="alert(4)">')
    evaluation.classes = list(HOSTILE)
    view = ConfusionExplorer(evaluation, normalize="none", ordering="name")
    root = view.widget()
    view._buttons[(0, 1)].click()  # a gallery with captions naming both classes
    markup = _html_values(root)
    assert _event_handlers("".join(markup)) == [], "a class name became markup"
    assert any("&lt;img src=x onerror=&quot;alert(1)&quot;&gt;" in value for value in markup)
    view._controls["min_confidence"].value = 1.0  # the empty gallery's caption names the classes too
    view.on_cell_selected({"new": (1, 2)})
    assert _event_handlers("".join(_html_values(root))) == []
    for name in HOSTILE:
        assert _event_handlers(explorer.column_label_html(name) + explorer.row_label_html(name)) == []
    assert _event_handlers('<p onclick="x">') == [("p", "onclick")]  # the check itself sees an attack
    plt.close("all")


# --- issue 28: ten classes fit, and a rendered notebook shows a picture of the matrix -------------

def _many_classes(count):
    rng = np.random.default_rng(0)
    labels = np.arange(200) % count
    predicted = np.where(rng.random(200) < 0.7, labels, rng.integers(0, count, 200))
    probabilities = np.full((200, count), 0.1 / count)
    probabilities[np.arange(200), predicted] += 0.9
    evaluation = Evaluation(f"{count}-classes", [f"class name {i}" for i in range(count)], labels, probabilities,
                            [f"img_{i}.jpg" for i in range(200)])
    evaluation.image_loader = lambda index: np.zeros((8, 8, 3), np.uint8)
    return evaluation


def _grid_pixels(view):
    """Width of the matrix grid from its CSS columns ("130px repeat(10, 46px)")."""
    import re

    label, count, cell = map(int, re.fullmatch(r"(\d+)px repeat\((\d+), (\d+)px\)",
                                               view._controls["grid"].layout.grid_template_columns).groups())
    return label + count * cell


def test_ten_classes_fit_without_scrolling_and_show_cell_keeps_its_words():
    pytest.importorskip("ipywidgets")
    view = ConfusionExplorer(_many_classes(10), ordering="name")
    root = view.widget()
    box = _parent(root, view._controls["grid"])  # the scrolling box around the grid
    assert _grid_pixels(view) <= int(box.layout.max_width.removesuffix("px"))  # all 10 columns, no scroll bar
    assert "scrolls" not in view._controls["matrix_title"].value
    matrix_column = _parent(root, box)
    assert matrix_column.layout.flex == "0 0 auto"  # the side panel cannot squeeze the matrix
    assert "wrap" in _parent(root, matrix_column).layout.flex_flow  # a narrow page moves the panel below instead
    show = view._controls["show"]
    assert show.layout.flex == "0 0 auto" and show.layout.width == "auto"  # never shrunk to "s..."
    wide = ConfusionExplorer(_many_classes(14), ordering="name")
    wide.widget()
    assert _grid_pixels(wide) > int(box.layout.max_width.removesuffix("px"))
    assert "the grid scrolls: 10 columns fit" in wide._controls["matrix_title"].value  # a labelled scroll
    plt.close("all")


def _parent(root, widget):
    """The box that holds `widget`, searched from `root`."""
    if widget in getattr(root, "children", ()):
        return root
    return next((found for child in getattr(root, "children", ()) if (found := _parent(child, widget)) is not None),
                None)


@pytest.mark.slow
def test_a_rendered_notebook_shows_a_picture_of_the_explorer_not_a_blank_widget(tmp_path):
    """nbconvert (the run report's HTML) skips a widget whose state was not saved, as papermill's is
    not: the explorer's display carries a PNG of its matrix, which the HTML shows instead."""
    pytest.importorskip("ipywidgets")
    import base64

    import nbformat

    from course_lib import report, runner

    view = ConfusionExplorer(_many_classes(10), ordering="name")
    bundle = view.widget()._repr_mimebundle_()
    assert "application/vnd.jupyter.widget-view+json" in bundle  # a live front-end still gets the widget
    picture = base64.b64decode(bundle["image/png"])
    assert picture.startswith(b"\x89PNG") and len(picture) > 5000
    cell = nbformat.v4.new_code_cell("view.widget()")
    cell.outputs = [nbformat.v4.new_output("display_data", data=bundle)]
    executed = tmp_path / "09_confusion_matrix_analysis.ipynb"
    nbformat.write(nbformat.v4.new_notebook(cells=[cell]), executed)
    body = runner.to_html(executed).read_text()  # the page the run report links to
    assert f'src="data:image/png;base64,{bundle["image/png"]}"' in body
    assert report.key_figure(nbformat.read(executed, as_version=4)) == picture  # and the report's thumbnail
    assert "open the notebook in JupyterLab" in body and "VBox(children" not in body
    plt.close("all")
