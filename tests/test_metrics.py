import io

import numpy as np
import pytest
from sklearn.metrics import (
    classification_report,
    confusion_matrix,
    top_k_accuracy_score,
)

from course_lib.analysis import calibration, confusion, metrics
from course_lib.analysis.evaluation import (
    Evaluation,
    _raw_image,
    evaluate_model,
    image_of,
    image_reference,
    list_evaluations,
    predict,
    suggest_actions,
)
from course_lib.config import make_config

# Fixed inputs: 12 images, 4 classes, deliberate confusions 1<->2 and 3->0.
LABELS = np.array([0, 0, 0, 1, 1, 1, 2, 2, 2, 3, 3, 3])
PREDICTIONS = np.array([0, 0, 1, 1, 2, 1, 2, 1, 2, 3, 0, 0])
CLASSES = ["cat", "dog", "fox", "owl"]


def test_per_class_table_matches_scikit_learn_report():
    table = metrics.per_class_table(LABELS, PREDICTIONS, CLASSES)
    report = classification_report(LABELS, PREDICTIONS, labels=range(4), target_names=CLASSES,
                                   output_dict=True, zero_division=0)
    for name in CLASSES + ["macro avg", "weighted avg"]:
        for column, key in (("precision", "precision"), ("recall", "recall"), ("f1", "f1-score")):
            assert table.loc[name, column] == pytest.approx(report[name][key])
        assert table.loc[name, "support"] == report[name]["support"]
    assert table.loc["owl", "recall"] == pytest.approx(1 / 3)  # closed form: 1 of 3 owls right


def test_top_k_on_hand_made_logits():
    logits = np.array([
        [5.0, 4.0, 1.0, 0.0],  # true 1: second      -> top-1 miss, top-2 hit
        [0.0, 1.0, 2.0, 3.0],  # true 3: first       -> hit
        [3.0, 2.0, 1.0, 0.0],  # true 3: last        -> only top-4 hits
        [1.0, 9.0, 3.0, 2.0],  # true 2: second      -> top-2 hit
    ])
    labels = np.array([1, 3, 3, 2])
    assert metrics.top_k_accuracy(logits, labels, 1) == pytest.approx(1 / 4)
    assert metrics.top_k_accuracy(logits, labels, 2) == pytest.approx(3 / 4)
    assert metrics.top_k_accuracy(logits, labels, 3) == pytest.approx(3 / 4)
    assert metrics.top_k_accuracy(logits, labels, 4) == 1.0
    assert metrics.top_k_accuracy(logits, labels, 5) == 1.0  # k capped at 4 classes
    for k in (2, 3):
        assert metrics.top_k_accuracy(logits, labels, k) == pytest.approx(
            top_k_accuracy_score(labels, logits, k=k, labels=range(4)))
    # Softmax is monotonic: probabilities give the same top-k as logits.
    assert metrics.top_k_accuracy(metrics.softmax(logits), labels, 2) == pytest.approx(3 / 4)
    two_class = np.array([[0.2, 0.8], [0.9, 0.1], [0.4, 0.6]])
    assert metrics.top_k_accuracy(two_class, [1, 1, 1], 1) == pytest.approx(2 / 3)
    assert metrics.top_k_accuracy(two_class, [1, 1, 1], 5) == 1.0


def test_top_k_rejects_mismatched_inputs():
    with pytest.raises(ValueError, match="labels"):
        metrics.top_k_accuracy(np.zeros((3, 4)), [0, 1], 1)
    with pytest.raises(ValueError, match="0..3"):
        metrics.top_k_accuracy(np.zeros((2, 4)), [0, 4], 1)


def test_softmax_rows_sum_to_one_and_survive_large_logits():
    probabilities = metrics.softmax([[1000.0, 1000.0, 0.0], [1.0, 2.0, 3.0]])
    assert probabilities.sum(axis=1) == pytest.approx([1.0, 1.0])
    assert probabilities[0, :2] == pytest.approx([0.5, 0.5])


def test_expected_calibration_error_matches_hand_computation():
    # 10 bins of width 0.1. Four images at confidence 0.85 (bin (0.8, 0.9]): 3 right -> |0.75 - 0.85| = 0.10.
    # Two at 0.55 (bin (0.5, 0.6]): 0 right -> |0 - 0.55| = 0.55. Two at 0.95: both right -> 0.05.
    # ECE = 4/8 * 0.10 + 2/8 * 0.55 + 2/8 * 0.05 = 0.20
    def row(confidence, winner):
        rest = (1 - confidence) / 2
        values = [rest, rest, rest]
        values[winner] = confidence
        return values

    probabilities = np.array([row(0.85, 0)] * 4 + [row(0.55, 1)] * 2 + [row(0.95, 2)] * 2)
    labels = np.array([0, 0, 0, 1, 0, 0, 2, 2])
    assert calibration.expected_calibration_error(probabilities, labels, bins=10) == pytest.approx(0.20, abs=1e-6)
    table = calibration.reliability_table(probabilities, labels, bins=10)
    assert table["images"].sum() == 8
    assert table.loc[8, "accuracy"] == pytest.approx(0.75)
    # A perfectly calibrated set scores 0.
    assert calibration.expected_calibration_error(np.array([row(0.5, 0)] * 2), [0, 1], bins=10) == pytest.approx(0.0)
    figure = calibration.plot_reliability(probabilities, labels, bins=10)
    assert "ECE = 0.200" in figure.axes[0].get_title()


def test_confusion_counts_and_normalisations_match_scikit_learn():
    counts = confusion.confusion_counts(LABELS, PREDICTIONS, 4)
    assert (counts == confusion_matrix(LABELS, PREDICTIONS)).all()
    rows = confusion.normalize_confusion(counts, "true")
    columns = confusion.normalize_confusion(counts, "pred")
    assert (rows == confusion_matrix(LABELS, PREDICTIONS, normalize="true")).all()
    assert columns == pytest.approx(confusion_matrix(LABELS, PREDICTIONS, normalize="pred"))
    assert np.diag(rows) == pytest.approx(metrics.per_class_table(LABELS, PREDICTIONS, CLASSES)["recall"][:4])
    with pytest.raises(ValueError, match="none, true, pred"):
        confusion.normalize_confusion(counts, "rows")


def test_classes_that_never_occur_keep_zero_rows_without_nan():
    labels, predictions = np.array([0, 0, 1, 1, 2]), np.array([0, 1, 1, 1, 2])
    classes = ["a", "b", "c", "never_seen", "never_predicted_either"]
    counts = confusion.confusion_counts(labels, predictions, len(classes))
    assert counts.shape == (5, 5) and counts[3:].sum() == 0 and counts[:, 3:].sum() == 0
    for normalize in confusion.NORMALIZATIONS:
        assert not np.isnan(confusion.normalize_confusion(counts, normalize)).any()
    table = metrics.per_class_table(labels, predictions, classes)
    assert table.loc["never_seen", "support"] == 0 and table.loc["never_seen", "recall"] == 0
    assert table.loc["weighted avg", "support"] == 5
    for ordering in confusion.ORDERINGS:
        view = confusion.confusion_view(counts, classes, "true", ordering)
        assert sorted(view.index) == sorted(classes)
        confusion.plot_confusion(counts, classes, "true", ordering)
    evaluation = Evaluation("sparse", classes, labels, np.eye(5)[predictions], [f"index:{i}" for i in range(5)])
    summary = evaluation.summary()
    assert summary["top1"] == pytest.approx(0.8) and summary["top5_k"] == 5


def test_confusion_ordering_groups_mutually_confused_classes():
    # a<->d and b<->c are confused; by name they sit apart.
    classes = ["a", "b", "c", "d"]
    counts = np.array([[8, 0, 0, 4], [0, 8, 4, 0], [0, 4, 8, 0], [4, 0, 0, 8]])
    assert list(confusion.class_order(counts, classes, "name")) == [0, 1, 2, 3]
    order = list(confusion.class_order(counts, classes, "confusion"))
    positions = {index: order.index(index) for index in range(4)}
    assert abs(positions[0] - positions[3]) == 1 and abs(positions[1] - positions[2]) == 1
    pairs = confusion.most_confused_pairs(counts, classes, top=2)
    assert set(zip(pairs["true"], pairs["predicted"])) <= {("a", "d"), ("d", "a"), ("b", "c"), ("c", "b")}
    assert pairs["share_of_true"].iloc[0] == pytest.approx(4 / 12)


def test_most_confused_classes_picks_the_confused_sub_block():
    counts = np.diag(np.full(50, 20))
    counts[10, 40] = 9
    counts[40, 10] = 3
    counts[7, 8] = 5
    chosen = confusion.most_confused_classes(counts, 4)
    assert list(chosen[:4]) == [10, 40, 7, 8]
    assert len(confusion.most_confused_classes(counts, 6)) == 6


@pytest.mark.parametrize("max_classes", [30, None])
@pytest.mark.slow
def test_hundred_class_figure_stays_within_size_limits(max_classes):
    import matplotlib.pyplot as plt
    from PIL import Image

    rng = np.random.default_rng(0)
    classes = [f"class_{i:03d}" for i in range(100)]
    labels = rng.integers(0, 100, 3000)
    predictions = np.where(rng.random(3000) < 0.7, labels, rng.integers(0, 100, 3000))
    counts = confusion.confusion_counts(labels, predictions, 100)
    figure = confusion.plot_confusion(counts, classes, "true", "confusion", max_classes=max_classes)
    width, height = figure.get_size_inches()
    assert width <= confusion.MAX_FIGURE_INCHES + 1 and height <= confusion.MAX_FIGURE_INCHES
    heat_map = figure.axes[0]
    assert len(heat_map.texts) == 0  # no per-cell numbers past 20 classes
    shown = 30 if max_classes else 100
    assert len(heat_map.get_yticklabels()) <= 60
    assert f"{shown} most-confused of 100" in heat_map.get_title() if max_classes else "100 classes" in \
        heat_map.get_title()
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=100)
    plt.close(figure)
    with Image.open(buffer) as png:
        assert png.size[0] <= 1400 and png.size[1] <= 1300


def test_ten_class_figure_annotates_cells():
    counts = np.diag(np.arange(1, 11))
    counts[0, 1] = 3
    figure = confusion.plot_confusion(counts, [f"c{i}" for i in range(10)], "none", "name")
    texts = [t.get_text() for t in figure.axes[0].texts]
    assert "3" in texts and "10" in texts and "0" not in texts  # zeros left blank to keep it readable


def test_difference_view_is_after_minus_before():
    before = np.array([[8, 2], [4, 6]])
    after = np.array([[9, 1], [2, 8]])
    view = confusion.difference_view(before, after, ["x", "y"], "true", "name")
    assert view.loc["x", "x"] == pytest.approx(0.1) and view.loc["y", "x"] == pytest.approx(-0.2)
    confusion.plot_difference(before, after, ["x", "y"])
    with pytest.raises(ValueError, match="shape"):
        confusion.difference_view(before, np.eye(3), ["x", "y"])


def test_evaluation_saves_and_loads(tmp_path):
    probabilities = metrics.softmax(np.random.default_rng(1).normal(size=(12, 4)))
    evaluation = Evaluation("round trip", CLASSES, LABELS, probabilities, [f"/images/{i}.jpg" for i in range(12)],
                            {"split": "val"})
    path = evaluation.save(tmp_path)
    assert path.name == "round trip.npz" and path.with_suffix(".json").exists()
    loaded = Evaluation.load(path)
    assert loaded.classes == CLASSES and (loaded.labels == LABELS).all()
    assert loaded.probabilities == pytest.approx(evaluation.probabilities)
    assert loaded.image_refs[3] == "/images/3.jpg" and loaded.metadata == {"split": "val"}
    listing = list_evaluations(tmp_path)
    assert listing["name"].tolist() == ["round trip"]
    assert listing["top1"].iloc[0] == pytest.approx(evaluation.summary()["top1"])
    with pytest.raises(FileNotFoundError, match="workbook eval"):
        Evaluation.load(tmp_path / "missing.npz")


def test_image_references_follow_subsets_to_files_and_array_indices():
    from conftest import SAMPLE_DIR

    from course_lib.data.datasets import (
        ArrayImageDataset,
        ImageFolderDataset,
        TransformedSubset,
    )

    folder = ImageFolderDataset(SAMPLE_DIR / "val")
    subset = TransformedSubset(TransformedSubset(folder, [5, 9, 20]), [2, 0])
    assert image_reference(subset, 0) == folder.samples[20][0]
    assert image_reference(subset, 1) == folder.samples[5][0]
    images = np.zeros((4, 8, 8, 3), np.uint8)
    images[3] = 200
    array_subset = TransformedSubset(ArrayImageDataset(images, [0, 1, 0, 1], ["a", "b"]), [3, 1])
    assert image_reference(array_subset, 0) == "index:3"
    assert np.asarray(_raw_image(array_subset.dataset, 3)).mean() == 200


def test_image_of_shows_a_file_or_the_pixels_channels_last():
    from conftest import SAMPLE_DIR
    from PIL import Image

    from course_lib.data.datasets import ImageFolderDataset

    folder = ImageFolderDataset(SAMPLE_DIR / "val")
    assert image_of(folder, 0).size == Image.open(folder.samples[0][0]).size

    class Cache:  # a pre-decoded cache serves uint8 rows channels first
        def __getitem__(self, index):
            image = np.zeros((3, 8, 6), np.uint8)
            image[0] = 250  # red
            return image, 0

    shown = np.asarray(image_of(Cache(), 0))
    assert shown.shape == (8, 6, 3) and shown[..., 0].min() == 250 and shown[..., 1].max() == 0


def test_suggestions_follow_the_numbers():
    classes = ["big", "rare", "left", "right"]
    # "rare" has low recall and few images; left/right lose 40% and 30% to each other.
    labels = np.array([0] * 10 + [1] * 4 + [2] * 10 + [3] * 10)
    predictions = np.array([0] * 10 + [1, 0, 0, 0] + [2] * 6 + [3] * 4 + [3] * 7 + [2] * 3)
    evaluation = Evaluation("rules", classes, labels, np.eye(4)[predictions], ["index:0"] * len(labels))
    table = suggest_actions(evaluation, merge_share=0.25, pair_share=0.1)
    actions = dict(zip(table["classes"], table["action"]))
    assert actions["rare"] == "collect more data"
    assert actions["left + right"] == "consider merging"
    assert "big" not in actions
    one_way = suggest_actions(evaluation, merge_share=0.35, pair_share=0.1)
    assert set(one_way["action"]) == {"collect more data", "targeted augmentation"}


def test_evaluate_model_saves_predictions_and_records_ledger(tmp_path):
    import torch

    from course_lib import ledger

    config = make_config("smoke", image_size=16, batch_size=16)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.AdaptiveAvgPool2d(2), torch.nn.Flatten(), torch.nn.Linear(12, 8))
    evaluation = evaluate_model(model, config, "val", name="tiny", out_dir=tmp_path)
    assert evaluation.path == tmp_path / "tiny.npz"
    assert len(evaluation.labels) == 80 and evaluation.probabilities.shape == (80, 8)
    assert evaluation.probabilities.sum(axis=1) == pytest.approx(np.ones(80), abs=1e-5)
    assert evaluation.image_refs[0].endswith(".jpg") and "val" in evaluation.image_refs[0]
    assert evaluation.load_image(0).size == (64, 64)
    rows = ledger.Ledger().rows(kind="eval")
    assert rows[0]["name"] == "tiny" and rows[0]["metrics"]["top1"] == pytest.approx(evaluation.summary()["top1"])
    with pytest.raises(ValueError, match="trained on classes"):
        evaluate_model(model, config, "val", classes=["x"] * 8, out_dir=tmp_path, record=False)


def test_workbook_eval_evaluates_a_checkpoint(tmp_path, capsys):
    import torch

    from course_lib import cli, ledger
    from course_lib.data.landcover import LANDCOVER_CLASSES
    from course_lib.models import checkpoint, factory

    config = make_config("smoke", model="resnet10t", image_size=16, batch_size=40, output_dir=str(tmp_path))
    torch.manual_seed(0)
    model = factory.build_model(config, len(LANDCOVER_CLASSES))
    path = checkpoint.save_checkpoint({"model": model.state_dict(), "ema": None, "config": config.to_dict(),
                                       "classes": list(LANDCOVER_CLASSES)}, tmp_path / "last.pt")
    code = cli.main(["eval", str(path), "--split", "test", "--name", "cli-test", "--out", str(tmp_path / "evals"),
                     "-p", "batch_size=32"])
    out = capsys.readouterr().out
    assert code == 0
    assert "top-1" in out and "macro avg" in out and "saved" in out
    saved = Evaluation.load(tmp_path / "evals" / "cli-test.npz")
    assert saved.metadata["split"] == "test" and saved.metadata["checkpoint"] == str(path)
    assert saved.metadata["config"]["batch_size"] == 32 and len(saved.labels) == 80
    # The same weights give the same probabilities as running the model directly.
    direct = evaluate_model(model, config, "test", out_dir=tmp_path / "direct", record=False)
    assert saved.probabilities == pytest.approx(direct.probabilities, abs=1e-5)
    assert ledger.Ledger().rows(kind="eval")[0]["parameters"]["checkpoint"] == str(path)
    assert cli.main(["eval", str(path), "--ema", "--out", str(tmp_path)]) == 2
    assert "no EMA weights" in capsys.readouterr().err
    assert cli.main(["eval", str(tmp_path / "missing.pt")]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_pair_error_share_counts_errors_between_named_pairs():
    counts = np.array([[5, 3, 1], [1, 5, 0], [0, 0, 5]])
    share, uniform = confusion.pair_error_share(counts, ["a", "b", "c"], [("a", "b"), ("x", "y")])
    assert share == pytest.approx(4 / 5) and uniform == pytest.approx(2 / 6)
    assert np.isnan(confusion.pair_error_share(np.eye(3), ["a", "b", "c"], [("a", "b")])[0])


def test_array_dataset_evaluations_render_images_from_the_rebuilt_dataset(tmp_path):
    import torch
    from sklearn.datasets import load_digits

    config = make_config("smoke", dataset="digits", data_dir="", image_size=8, batch_size=64)
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(3 * 8 * 8, 10))
    evaluation = evaluate_model(model, config, "val", name="digits", out_dir=tmp_path, record=False)
    assert all(ref.startswith("index:") for ref in evaluation.image_refs)
    reloaded = Evaluation.load(evaluation.path)  # a fresh object rebuilds the dataset from the stored config
    index = int(reloaded.image_refs[0].split(":")[1])
    expected = (load_digits().images[index] * (255.0 / 16.0)).astype(np.uint8)
    image = np.asarray(reloaded.load_image(0))
    assert image.shape == (8, 8, 3) and (image[..., 0] == expected).all()


@pytest.mark.parametrize("views", [1, 2, 8])
def test_tta_averages_exactly_the_views_it_names(views):
    import torch

    from course_lib.data import overhead_augment
    from course_lib.data.pipeline import build_datasets

    config = make_config("smoke", image_size=16, batch_size=16)
    torch.manual_seed(0)
    # A model that sees orientation: a linear layer on the raw pixels (no pooling symmetry).
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(3 * 16 * 16, 8)).eval()
    bundle = build_datasets(config)
    dataset = torch.utils.data.Subset(bundle.val, range(8))
    labels, probabilities = predict(model, dataset, config, views=views)
    images = torch.stack([dataset[i][0] for i in range(8)])
    with torch.no_grad():
        expected = sum(torch.softmax(model(v), dim=1) for v in overhead_augment.dihedral_views(images, views)) / views
    assert probabilities == pytest.approx(expected.numpy(), abs=1e-6)
    if views > 1:  # the views matter for this model: TTA is not a no-op
        assert not np.allclose(probabilities, predict(model, dataset, config, views=1)[1], atol=1e-4)
    with pytest.raises(ValueError, match="1..8"):
        predict(model, dataset, config, views=9)


def test_eval_writes_class_names_holding_control_characters_as_escapes(monkeypatch, capsys, tmp_path):
    """Issue 49 point 10: a class folder named with a newline and an escape sequence forged lines and recoloured
    the terminal through `workbook eval`'s tables."""
    from course_lib import cli
    from course_lib.analysis import evaluation

    hostile = "forest\n\x1b[31mtop-1 1.0000"
    result = Evaluation("hostile", [hostile, "sea"], [0, 0, 1, 1], [[0.1, 0.9], [0.8, 0.2], [0.3, 0.7], [0.6, 0.4]],
                        ["a.jpg", "b.jpg", "c.jpg", "d.jpg"], path=tmp_path / "hostile.npz")
    monkeypatch.setattr(evaluation, "evaluate", lambda *args, **kwargs: result)
    assert cli.main(["eval", str(tmp_path / "any.pt")]) == 0
    out = capsys.readouterr().out
    assert "\x1b" not in out and "\\x1b[31m" in out and "forest\\n" in out
    assert not any(line.startswith("\x1b") or line.lstrip().startswith("top-1 1.0000") for line in out.splitlines())


def test_an_evaluation_that_finds_a_full_disk_leaves_nothing_half_written(small_disk, tmp_path):
    """Issue 49 point 13: on a full disk `eval --out` left an .npz beside an empty .json (and a traceback)."""
    from conftest import fill_disk

    from course_lib.data.build_lock import DiskFullError

    rng = np.random.default_rng(0)
    probabilities = rng.dirichlet(np.ones(10), size=2000)
    result = Evaluation("big", [f"c{i}" for i in range(10)], rng.integers(0, 10, 2000), probabilities,
                        [f"{i}.jpg" for i in range(2000)])
    fill_disk(small_disk)
    with pytest.raises(DiskFullError, match=r"no room on the disk for the evaluation big\.npz: .*pass --out a folder"):
        result.save(small_disk)
    assert sorted(path.name for path in small_disk.iterdir()) == ["filler"]
    saved = result.save(tmp_path)  # elsewhere it saves, and loads back whole
    assert Evaluation.load(saved).probabilities.shape == (2000, 10)
