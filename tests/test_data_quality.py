"""Notebook 15's data-quality study (`chapters.data_quality`): the four training sets of the recovery
runs, their table paired by seed, and the two data-cleaning claims decided from planted figures."""
import numpy as np
import pandas as pd
import pytest

from course_lib.analysis import claims
from course_lib.chapters import data_quality


def _study(flagged=(3, 5, 7), planted=(3, 5, 8)):
    targets = np.array([0, 1, 2, 0, 1, 2, 0, 1, 2, 0])
    noisy = targets.copy()
    noisy[list(planted)] = (targets[list(planted)] + 1) % 3
    probabilities = np.full((10, 3), 0.1)
    probabilities[np.arange(10), targets] = 0.8  # the models predict the true class
    return data_quality.LabelStudy(targets, noisy, np.array(planted), probabilities, np.array(flagged))


def test_the_four_training_sets_differ_only_where_they_should():
    study = _study()
    variants = data_quality.variant_labels(study)
    assert list(variants) == list(data_quality.VARIANTS)
    indices, labels = variants["clean labels"]
    assert (labels == study.targets).all() and len(indices) == 10
    assert (variants["planted noise"][1] == study.noisy).all()
    kept, kept_labels = variants["noise, flagged dropped"]
    assert kept.tolist() == [0, 1, 2, 4, 6, 8, 9] and (kept_labels == study.noisy[kept]).all()
    relabelled = variants["noise, flagged relabelled"][1]
    assert relabelled[[3, 5, 7]].tolist() == study.targets[[3, 5, 7]].tolist()  # the prediction, here the truth
    assert relabelled[8] == study.noisy[8]  # a planted flip the finder missed stays wrong
    assert study.score.found == 2 and study.score.precision == pytest.approx(2 / 3)


def _runs(gains):
    rows = []
    for seed, gain in enumerate(gains):
        base = 0.80 + 0.01 * seed
        rows += [{"variant": "clean labels", "seed": seed, "val top-1": base + 0.03, "training images": 10},
                 {"variant": "planted noise", "seed": seed, "val top-1": base, "training images": 10},
                 {"variant": "noise, flagged dropped", "seed": seed, "val top-1": base + gain, "training images": 7},
                 {"variant": "noise, flagged relabelled", "seed": seed, "val top-1": base + gain / 2,
                  "training images": 10}]
    return pd.DataFrame(rows)


def test_the_recovery_table_pairs_each_variant_with_the_noisy_labels():
    table = data_quality.recovery_table(_runs([0.02, 0.021, 0.019]))
    assert list(table.index) == list(data_quality.VARIANTS)
    assert table.loc["noise, flagged dropped", "delta"] == pytest.approx(0.02)
    assert table.loc["noise, flagged dropped", "verdict"] == "better"
    assert table.loc["noise, flagged dropped", "training images"] == 7
    one_seed = data_quality.recovery_table(_runs([0.02]))
    assert one_seed.loc["noise, flagged dropped", "delta"] == pytest.approx(0.02)


@pytest.mark.parametrize("gains, verdict", [([0.02, 0.021, 0.019], claims.HOLDS),
                                            ([-0.02, -0.021, -0.019], claims.REFUTED),
                                            ([0.02, -0.02, 0.001], claims.NOT_SHOWN),
                                            ([0.02], claims.NOT_SHOWN)])
def test_cleaning_recovers_accuracy_follows_the_paired_interval(gains, verdict):
    found = {c.key: c for c in data_quality.claims(_study(), data_quality.recovery_table(_runs(gains)),
                                                         hardware="test machine")}
    assert found["cleaning_recovers_accuracy"].verdict == verdict


def test_the_finder_claim_needs_recall_and_precision_above_one_half():
    many = np.arange(200)
    good = data_quality.LabelStudy(np.zeros(400, int), np.zeros(400, int), many, np.full((400, 2), 0.5), many[:190])
    poor = data_quality.LabelStudy(np.zeros(400, int), np.zeros(400, int), many, np.full((400, 2), 0.5),
                                   np.arange(200, 400))  # flags only images that were not planted
    table = data_quality.recovery_table(_runs([0.02, 0.021, 0.019]))
    verdicts = [next(c for c in data_quality.claims(s, table) if c.key == "label_finder_finds_flips").verdict
                for s in (good, poor)]
    assert verdicts == [claims.HOLDS, claims.REFUTED]
