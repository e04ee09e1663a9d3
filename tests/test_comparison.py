import json
import re

import matplotlib.pyplot as plt
import numpy as np
import pytest

from course_lib import cli
from course_lib.analysis import comparison, statistics
from course_lib.analysis.evaluation import Evaluation
from course_lib.analysis.metrics import per_class_table

CLASSES = ["forest", "grassland", "water"]


def _evaluation(name, predicted, labels=None, confidence=0.8):
    labels = np.array([0, 0, 0, 0, 1, 1, 1, 2, 2, 2]) if labels is None else np.asarray(labels)
    probabilities = np.full((len(predicted), 3), (1 - confidence) / 2)
    probabilities[np.arange(len(predicted)), predicted] = confidence
    return Evaluation(name, CLASSES, labels, probabilities, [f"img_{i}.jpg" for i in range(len(labels))])


BEFORE = np.array([0, 1, 1, 0, 1, 0, 1, 2, 2, 0])
AFTER = np.array([0, 0, 1, 0, 1, 1, 0, 2, 2, 2])


def test_bootstrap_scores_with_unit_weights_match_scikit_learn():
    rng = np.random.default_rng(1)
    labels, predictions = rng.integers(0, 4, 200), rng.integers(0, 4, 200)
    predictions[:5] = 0  # class 3 may vanish from predictions in a resample; here it does not matter
    scores = comparison.bootstrap_scores(labels, predictions, 4, np.ones((1, 200)))
    table = per_class_table(labels, predictions, list("abcd"))
    for score in comparison.SCORES:
        assert scores[score][0] == pytest.approx(table[score].to_numpy()[:4])
    assert scores["top1"][0] == pytest.approx(np.mean(labels == predictions))


def test_flipped_images_in_both_directions():
    before, after = _evaluation("before", BEFORE), _evaluation("after", AFTER)
    right_to_wrong = comparison.flipped_images(before, after, "right_to_wrong")
    wrong_to_right = comparison.flipped_images(before, after, "wrong_to_right")
    assert right_to_wrong["index"].tolist() == [6]  # grassland, right before, predicted forest after
    assert right_to_wrong.iloc[0][["true", "predicted_before", "predicted"]].tolist() == ["grassland", "grassland",
                                                                                         "forest"]
    assert sorted(wrong_to_right["index"].tolist()) == [1, 5, 9]
    with pytest.raises(ValueError, match="one of right_to_wrong"):
        comparison.flipped_images(before, after, "sideways")


@pytest.mark.slow
def test_compare_reports_deltas_intervals_and_flips():
    before, after = _evaluation("before", BEFORE), _evaluation("after", AFTER)
    result = comparison.compare(before, after, draws=500)
    assert result.overall["top1"]["before"] == pytest.approx(0.6)
    assert result.overall["top1"]["after"] == pytest.approx(0.8)
    assert result.overall["top1"]["delta"] == pytest.approx(0.2)
    assert result.overall["top1"]["low"] <= 0.2 <= result.overall["top1"]["high"]
    assert (result.overall["right_to_wrong"], result.overall["wrong_to_right"]) == (1, 3)
    water = result.per_class.loc["water"]
    assert water["recall_before"] == pytest.approx(2 / 3) and water["recall_after"] == pytest.approx(1.0)
    assert water["recall_delta"] == pytest.approx(1 / 3)
    for score in comparison.SCORES:
        assert (result.per_class[f"{score}_low"] <= result.per_class[f"{score}_delta"] + 1e-12).all()
        assert (result.per_class[f"{score}_delta"] <= result.per_class[f"{score}_high"] + 1e-12).all()
    json.dumps(result.to_dict())  # plain values only
    figure = result.figure()
    assert len([ax for ax in figure.axes if ax.get_title()]) == 3
    plt.close(figure)


def test_identical_evaluations_have_zero_width_intervals():
    before = _evaluation("before", BEFORE)
    result = comparison.compare(before, _evaluation("same", BEFORE), draws=100)
    assert result.overall["top1"]["low"] == result.overall["top1"]["high"] == 0.0
    assert result.significant("f1").empty


@pytest.mark.slow
def test_bootstrap_interval_covers_the_true_delta_about_95_percent_of_the_time():
    """A known case: model A is right on each image with probability 0.70, model B with 0.80,
    independently, so every class's true recall delta is 0.10. Over 200 simulated validation sets
    the 95% interval must contain 0.10 in roughly 95% of them (binomial spread: 0.88..0.99)."""
    rng = np.random.default_rng(0)
    images, classes, covered, trials = 300, 3, 0, 200
    labels = np.arange(images) % classes
    for trial in range(trials):
        predictions = []
        for accuracy in (0.70, 0.80):
            right = rng.random(images) < accuracy
            wrong_class = (labels + rng.integers(1, classes, images)) % classes
            predictions.append(np.where(right, labels, wrong_class))
        weights = statistics.bootstrap_weights(images, draws=400, seed=trial)
        recall = [comparison.bootstrap_scores(labels, p, classes, weights)["recall"][:, 0] for p in predictions]
        low, high = statistics.percentile_interval(recall[1] - recall[0], 0.95)
        covered += bool(low <= 0.10 <= high)
    assert 0.88 <= covered / trials <= 0.99


def test_bootstrap_helpers_reject_bad_input():
    weights = statistics.bootstrap_weights(50, draws=20, seed=3)
    assert weights.shape == (20, 50) and (weights.sum(axis=1) == 50).all()
    with pytest.raises(ValueError, match="draws"):
        statistics.bootstrap_weights(10, draws=1)
    with pytest.raises(ValueError, match="level"):
        statistics.percentile_interval(np.zeros(3), 1.5)


def test_different_images_are_refused():
    before = _evaluation("before", BEFORE)
    shorter = _evaluation("short", BEFORE[:9], labels=before.labels[:9])
    with pytest.raises(ValueError, match="evaluated different images"):
        comparison.compare(before, shorter)


def test_compare_cli_json_and_text(tmp_path, capsys):
    before, after = _evaluation("before", BEFORE), _evaluation("after", AFTER)
    before.save(tmp_path)
    after.save(tmp_path)
    assert cli.main(["compare", str(tmp_path / "before.npz"), str(tmp_path / "after.npz"), "--json",
                     "--draws", "200"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["overall"]["top1"]["delta"] == pytest.approx(0.2)
    assert [row["class"] for row in report["per_class"]] == CLASSES
    assert [row["index"] for row in report["flips"]["right_to_wrong"]] == [6]
    assert cli.main(["compare", str(tmp_path / "before.npz"), str(tmp_path / "after.npz"), "--draws", "200"]) == 0
    text = capsys.readouterr().out
    assert "top1" in text and "right to wrong: 1 images" in text and "wrong to right: 3 images" in text
    # the header names the evaluations in the order of the numbers (before -> after)
    assert text.splitlines()[0].startswith("A: before -> B: after (delta = B - A)")
    first, second = (float(v) for v in re.search(r"top1\s+(\S+) -> (\S+)", text).groups())
    assert second - first == pytest.approx(0.2)
    assert cli.main(["compare", "no-such-eval", str(tmp_path / "after.npz")]) == 2
    assert "no evaluation 'no-such-eval'" in capsys.readouterr().err


def test_compare_finds_evaluations_by_ledger_name(tmp_path, capsys):
    from course_lib import ledger

    before, after = _evaluation("before", BEFORE), _evaluation("after", AFTER)
    for evaluation in (before, after):
        evaluation.save(tmp_path)
        ledger.record("eval", evaluation.name, parameters={"path": str(evaluation.path)})
    assert cli.main(["compare", "before", "after", "--json", "--draws", "100"]) == 0
    assert json.loads(capsys.readouterr().out)["after"] == "after"


def test_too_many_draws_is_one_line_not_an_out_of_memory_kill(tmp_path, capsys):
    """Issue 49 point 6: `compare --draws 10000000` was killed for memory with no message."""
    with pytest.raises(ValueError, match=r"draws=10,000,000 over 20 images needs 1\.5 GiB of resampling counts; "
                                         r"use at most 6,710,886 draws"):
        statistics.bootstrap_weights(20, draws=10_000_000)
    before, after = _evaluation("before", BEFORE), _evaluation("after", AFTER)
    before.save(tmp_path)
    after.save(tmp_path)
    assert cli.main(["compare", str(tmp_path / "before.npz"), str(tmp_path / "after.npz"),
                     "--draws", "1000000000"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "use at most" in err, err


def _damage(path, how):
    """One of the ways a saved evaluation arrives broken (issue 49, point 13)."""
    import io

    sidecar = path.with_suffix(".json")
    if how == "half an npz":
        path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    elif how == "a sidecar without classes":
        saved = json.loads(sidecar.read_text())
        del saved["classes"]
        sidecar.write_text(json.dumps(saved))
    else:
        with np.load(path) as arrays:
            arrays = dict(arrays)
        if how == "object image references":
            arrays["image_refs"] = np.array([object()] * len(arrays["labels"]), dtype=object)
        elif how == "fewer probability columns than classes":
            arrays["probabilities"] = arrays["probabilities"][:, :2]
        elif how == "label 99":
            arrays["labels"][0] = 99
        buffer = io.BytesIO()
        np.savez(buffer, **arrays)
        path.write_bytes(buffer.getvalue())


@pytest.mark.parametrize("how", ["half an npz", "a sidecar without classes", "object image references",
                                 "fewer probability columns than classes", "label 99"])
def test_a_damaged_saved_evaluation_is_one_line_naming_it(tmp_path, capsys, how):
    """`compare` on half an .npz, a sidecar without classes, an object array, probabilities narrower than the
    classes or a label outside them gave a traceback."""
    before = _evaluation("before", BEFORE).save(tmp_path)
    after = _evaluation("after", AFTER).save(tmp_path)
    _damage(after, how)
    assert cli.main(["compare", str(before), str(after)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"evaluation {after} cannot be read (" in err and "workbook eval" in err, err
