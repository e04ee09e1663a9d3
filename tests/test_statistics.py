"""Intervals that a reader can trust: coverage of the t interval, paired differences, ratio and
Wilson intervals, and the per-variant comparison every notebook uses."""
import numpy as np
import pandas as pd
import pytest

from course_lib.analysis import statistics


def test_t_interval_has_its_stated_coverage():
    rng = np.random.default_rng(0)
    covered = 0
    for _ in range(400):
        sample = rng.normal(0.8, 0.02, size=3)
        interval = statistics.confidence_interval(sample)
        covered += interval["low"] <= 0.8 <= interval["high"]
    assert 0.92 <= covered / 400 <= 0.98


def test_three_seeds_give_a_wide_interval():
    interval = statistics.confidence_interval([0.80, 0.82, 0.81])
    assert interval["mean"] == pytest.approx(0.81)
    # t(0.975, 2) = 4.303; s = 0.01; half-width = 4.303 * 0.01 / sqrt(3)
    assert interval["high"] - interval["mean"] == pytest.approx(4.303 * 0.01 / np.sqrt(3), rel=1e-3)
    with pytest.raises(ValueError, match="at least 2 runs"):
        statistics.confidence_interval([0.8])


def test_pairing_by_seed_removes_the_seeds_own_luck():
    baseline = np.array([0.70, 0.80, 0.90])  # seeds differ a lot
    variant = baseline + np.array([0.011, 0.010, 0.012])  # but the variant is always ~1 point better
    paired = statistics.paired_difference(variant, baseline)
    assert paired["beyond"] == 1 and paired["low"] > 0
    unpaired = statistics.difference_beyond_noise(variant, baseline)
    assert unpaired["beyond"] == 0  # without pairing the seed spread hides it
    with pytest.raises(ValueError, match="pair them by seed"):
        statistics.paired_difference([1, 2], [1, 2, 3])


def test_ratio_interval_contains_the_ratio_of_means():
    rng = np.random.default_rng(1)
    fast, slow = rng.normal(200, 5, 8), rng.normal(100, 3, 8)
    result = statistics.ratio_interval(fast, slow)
    assert result["low"] <= result["ratio"] <= result["high"]
    assert result["ratio"] == pytest.approx(fast.mean() / slow.mean())
    assert 1.85 < result["low"] and result["high"] < 2.15


def test_wilson_interval_matches_the_closed_form():
    low, high = statistics.binomial_interval(90, 100)
    z, p, n = 1.959964, 0.9, 100
    centre = (p + z**2 / (2 * n)) / (1 + z**2 / n)
    half = z / (1 + z**2 / n) * np.sqrt(p * (1 - p) / n + z**2 / (4 * n**2))
    assert low == pytest.approx(centre - half, abs=1e-5) and high == pytest.approx(centre + half, abs=1e-5)
    with pytest.raises(ValueError, match="correct <= total"):
        statistics.binomial_interval(5, 3)


def test_compare_variants_gives_interval_and_verdict_per_variant():
    frame = pd.DataFrame({"variant": ["baseline"] * 3 + ["better"] * 3 + ["same"] * 3,
                          "seed": [0, 1, 2] * 3,
                          "top1": [0.80, 0.85, 0.82, 0.83, 0.88, 0.85, 0.81, 0.84, 0.82]})
    table = statistics.compare_variants(frame, "top1")
    assert list(table.index) == ["baseline", "better", "same"]
    assert table.loc["better", "verdict"] == "better" and table.loc["same", "verdict"] == "within noise"
    assert table.loc["better", "delta"] == pytest.approx(0.03)
    assert table.loc["baseline", "low"] < 0.823 < table.loc["baseline", "high"]
    with pytest.raises(ValueError, match="no 'control' rows"):
        statistics.compare_variants(frame, "top1", baseline="control")


def _paired_timings(rng, repeats, ratio=1.5, noise=0.02):
    """images/s of a baseline and of a variant `ratio` times as fast, timed in turns: a shared slowdown
    per turn (up to 30%, common to both) times each run's own small lognormal noise."""
    machine = rng.uniform(0.7, 1.0, repeats)
    baseline = 100 * machine * np.exp(rng.normal(0, noise, repeats))
    return ratio * 100 * machine * np.exp(rng.normal(0, noise, repeats)), baseline


def test_paired_ratio_interval_holds_a_known_ratio_with_its_stated_coverage():
    rng = np.random.default_rng(2)
    variant, baseline = _paired_timings(rng, 5)
    result = statistics.paired_ratio_interval(variant, baseline)
    assert result["ratio"] == pytest.approx(np.median(variant) / np.median(baseline))
    assert result["low"] <= 1.5 <= result["high"] and result["high"] / result["low"] < 1.1  # narrow: pairing cancels
    # the machine's slowdown, which an unpaired bootstrap of the same timings cannot do
    unpaired = statistics.ratio_interval(variant, baseline)
    assert unpaired["high"] - unpaired["low"] > 2 * (result["high"] - result["low"])
    covered = sum(interval["low"] <= 1.5 <= interval["high"] for interval in
                  (statistics.paired_ratio_interval(*_paired_timings(rng, 5)) for _ in range(400)))
    assert 0.92 <= covered / 400 <= 0.99


def test_a_variant_paired_with_itself_is_exactly_one():
    speeds = [26.5, 3.0, 310.0]  # however noisy the repeats
    assert statistics.paired_ratio_interval(speeds, speeds) == {"ratio": 1.0, "low": 1.0, "high": 1.0, "pairs": 3}
    with pytest.raises(ValueError, match="side by side"):
        statistics.paired_ratio_interval([1.0, 2.0], [1.0, 2.0, 3.0])
    with pytest.raises(ValueError, match="at least 2 pairs"):
        statistics.paired_ratio_interval([1.0], [1.0])
