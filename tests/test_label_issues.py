"""Suspect labels (`analysis.label_issues`): planted flips, cleanlab's ranking on probabilities where the
flips are obvious, the finder's precision and recall, and the suspects table."""
import numpy as np
import pytest

from course_lib.analysis import label_issues


def test_planted_flips_move_the_asked_share_to_other_classes_uniformly():
    targets = np.arange(10_000) % 5
    noisy, flipped = label_issues.plant_flips(targets, 0.05, 5, seed=3)
    assert len(flipped) == 500 and len(set(flipped.tolist())) == 500
    assert (noisy[flipped] != targets[flipped]).all()
    unchanged = np.setdiff1d(np.arange(len(targets)), flipped)
    assert (noisy[unchanged] == targets[unchanged]).all()
    shifts = np.bincount((noisy[flipped] - targets[flipped]) % 5, minlength=5)
    assert shifts[0] == 0 and shifts[1:].min() > 90  # each of the 4 other classes about 125 times
    again, _ = label_issues.plant_flips(targets, 0.05, 5, seed=3)
    assert (again == noisy).all()  # the seed fixes the plant
    with pytest.raises(ValueError, match="share of labels to flip"):
        label_issues.plant_flips(targets, 1.0, 5)


def _obvious_probabilities(targets, classes, confidence=0.9, seed=0):
    """What a good model says: most of its probability on the true class, the rest spread at random."""
    rng = np.random.default_rng(seed)
    rest = rng.dirichlet(np.ones(classes - 1), len(targets)) * (1 - confidence)
    probabilities = np.zeros((len(targets), classes))
    for row, label in enumerate(targets):
        probabilities[row, label] = confidence
        probabilities[row, [c for c in range(classes) if c != label]] = rest[row]
    return probabilities


def test_the_finder_recovers_most_planted_flips_when_they_are_obvious():
    targets = np.arange(600) % 4
    noisy, flipped = label_issues.plant_flips(targets, 0.05, 4, seed=0)
    flagged = label_issues.rank_label_issues(noisy, _obvious_probabilities(targets, 4))
    score = label_issues.score_finder(flagged, flipped)
    assert score.recall >= 0.9 and score.precision >= 0.9, score.line()
    assert "precision" in score.line() and "recall" in score.line()


def test_score_finder_counts_and_the_suspects_table_names_given_and_predicted():
    score = label_issues.score_finder([1, 2, 3, 4], [2, 4, 9])
    assert (score.flagged, score.planted, score.found) == (4, 3, 2)
    assert score.precision == 0.5 and score.recall == pytest.approx(2 / 3)
    probabilities = np.array([[0.1, 0.9], [0.8, 0.2], [0.3, 0.7]])
    table = label_issues.suspects_table([2, 0], [0, 0, 0], probabilities, ["cat", "dog"], names=["a", "b", "c"])
    assert table.to_dict("list") == {"index": [2, 0], "given": ["cat", "cat"], "predicted": ["dog", "dog"],
                                     "p(given)": [0.3, 0.1], "p(predicted)": [0.7, 0.9], "image": ["c", "a"]}
