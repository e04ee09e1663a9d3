"""Intervals that a reader can trust: coverage of the t interval, paired differences, ratio and
Wilson intervals, and the per-variant comparison every notebook uses."""
import math

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


def test_stratified_ratio_interval_resamples_within_each_part_only():
    # Parts of very different sizes with little noise inside each: the total's ratio is tight, although the
    # values pooled across parts spread widely (an unstratified bootstrap would mix the parts up).
    slow = [[10.0, 10.2], [20.0, 20.4], [5.0, 5.1]]
    fast = [[5.0, 5.1], [10.0, 10.2], [5.0, 5.05]]
    result = statistics.stratified_ratio_interval(slow, fast)
    assert result["ratio"] == pytest.approx(sum(map(sum, slow)) / sum(map(sum, fast)))
    assert result["low"] <= result["ratio"] <= result["high"] and result["high"] - result["low"] < 0.05
    constant = statistics.stratified_ratio_interval([[2.0, 2.0], [4.0, 4.0]], [[1.0, 1.0], [2.0, 2.0]])
    assert constant["low"] == pytest.approx(2.0) and constant["high"] == pytest.approx(2.0)
    with pytest.raises(ValueError, match="at least 2 repeats"):
        statistics.stratified_ratio_interval([[1.0]], [[1.0, 2.0]])


def test_wilson_interval_matches_the_closed_form():
    low, high = statistics.binomial_interval(90, 100)
    z, p, n = 1.959964, 0.9, 100
    centre = (p + z**2 / (2 * n)) / (1 + z**2 / n)
    half = z / (1 + z**2 / n) * np.sqrt(p * (1 - p) / n + z**2 / (4 * n**2))
    assert low == pytest.approx(centre - half, abs=1e-5) and high == pytest.approx(centre + half, abs=1e-5)
    with pytest.raises(ValueError, match="correct <= total"):
        statistics.binomial_interval(5, 3)


@pytest.mark.parametrize("before, after, expected", [
    ((48, 80), (56, 70), (0.2000, 0.0524, 0.3339)),  # Newcombe 1998, Table II, example (a), method 10
    ((3, 10), (9, 10), (0.6000, 0.1705, 0.8090)),  # example (b)
])
def test_difference_of_proportions_matches_newcombes_table(before, after, expected):
    found = statistics.difference_of_proportions(*before, *after)
    assert (found["delta"], found["low"], found["high"]) == pytest.approx(expected, abs=5e-5)
    swapped = statistics.difference_of_proportions(*after, *before)  # the interval turns round with the sign
    assert (swapped["low"], swapped["high"]) == pytest.approx((-expected[2], -expected[1]), abs=5e-5)


def test_difference_of_proportions_narrows_with_more_images():
    small = statistics.difference_of_proportions(80, 100, 85, 100)
    large = statistics.difference_of_proportions(800, 1000, 850, 1000)
    assert large["delta"] == pytest.approx(small["delta"])
    assert large["high"] - large["low"] < small["high"] - small["low"]
    assert small["low"] < 0 < large["low"]  # 5 points on 100 images is within noise, on 1000 it is not
    with pytest.raises(ValueError, match="correct <= total"):
        statistics.difference_of_proportions(5, 3, 1, 3)


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


def test_difference_beyond_noise_closed_form():
    from course_lib.analysis import statistics

    test = statistics.difference_beyond_noise([3.0, 5.0], [1.0, 1.0, 1.0])
    assert test["delta"] == pytest.approx(3.0)
    assert test["band"] == pytest.approx(2 * (2.0 / 2) ** 0.5)  # z * sqrt(s^2/n + 0/3), s^2 = 2
    assert test["beyond"] == 1
    assert statistics.difference_beyond_noise([2.0, 4.0], [1.0, 1.0, 1.0])["beyond"] == 0  # delta 2 = band 2
    single = statistics.difference_beyond_noise([10.0], [1.0, 3.0])  # one run borrows the other's std
    assert single["band"] == pytest.approx(2 * (2.0 + 1.0) ** 0.5) and single["beyond"] == 1
    with pytest.raises(ValueError, match="2 or more"):
        statistics.difference_beyond_noise([1.0], [2.0])


def test_seed_noise_and_band_closed_forms():
    noise = statistics.seed_noise([0.70, 0.72, 0.74])
    assert noise == {"mean": pytest.approx(0.72), "std": pytest.approx(0.02), "runs": 3}
    assert statistics.noise_band(0.02, 3) == pytest.approx(2 * 0.02 * math.sqrt(4 / 3))
    with pytest.raises(ValueError, match="at least 2 runs"):
        statistics.seed_noise([0.7])


def test_binomial_std_closed_form():
    assert statistics.binomial_std(0.5, 100) == pytest.approx(0.05)
    assert statistics.binomial_std(1.0, 10) == 0.0


def test_compare_to_baseline_flags_only_deltas_outside_the_band():
    table = pd.DataFrame({"val top-1": [0.72, 0.74, 0.80, 0.60]}, index=["baseline", "small", "big", "worse"])
    compared = statistics.compare_to_baseline(table, {"val top-1": [0.71, 0.72, 0.73]}, metrics=("val top-1",))
    band = 2 * 0.01 * math.sqrt(4 / 3)
    assert compared["val top-1 noise band"].iloc[0] == pytest.approx(band)
    assert compared["val top-1 delta"].tolist() == pytest.approx([0.0, 0.02, 0.08, -0.12])
    assert compared["val top-1 beyond noise"].tolist() == ["no", "no", "yes", "yes"]


def test_compare_to_baseline_floor_stops_agreeing_seeds_from_shrinking_the_band():
    table = pd.DataFrame({"val top-1": [0.55]}, index=["variant"])
    without = statistics.compare_to_baseline(table, {"val top-1": [0.5, 0.5]}, metrics=("val top-1",))
    assert without["val top-1 beyond noise"].item() == "yes"  # std 0 from two agreeing seeds
    floored = statistics.compare_to_baseline(table, {"val top-1": [0.5, 0.5]}, metrics=("val top-1",),
                                                 floors={"val top-1": 0.05})
    assert floored["val top-1 noise band"].item() == pytest.approx(2 * 0.05 * math.sqrt(1.5))
    assert floored["val top-1 beyond noise"].item() == "no"


def test_validation_noise_bootstrap_matches_the_binomial_closed_form():
    rng = np.random.default_rng(1)
    labels = rng.integers(0, 4, 400)
    probabilities = np.full((400, 4), 0.1)
    right = rng.random(400) < 0.7  # 70% of the images get their true class on top
    probabilities[np.arange(400), np.where(right, labels, (labels + 1) % 4)] = 0.7
    noise = statistics.validation_noise(labels, probabilities, draws=400)
    accuracy = float(right.mean())
    assert noise["val top-1"] == pytest.approx(statistics.binomial_std(accuracy, 400), rel=0.15)
    assert noise["ECE"] > 0 and noise["val loss"] > 0
    assert statistics.validation_noise(labels, probabilities, draws=50) == \
        statistics.validation_noise(labels, probabilities, draws=50)  # seeded: repeatable


def test_validation_noise_is_zero_when_every_resample_scores_the_same():
    labels = np.array([0, 1, 2, 0])
    probabilities = np.eye(3)[labels] * 0.97 + 0.01
    noise = statistics.validation_noise(labels, probabilities, draws=20)
    assert noise["val top-1"] == 0.0 and noise["ECE"] == pytest.approx(0.0, abs=1e-12)


def test_seeds_needed_gives_the_textbook_sample_size_and_its_power_holds_in_simulation():
    from scipy import stats

    assert statistics.seeds_needed(1.0, 1.0) == 10  # d = 1, 5% two-sided, 80% power: n = 9.94
    assert statistics.seeds_needed(-0.5, 1.0) == 34  # d = 0.5: n = 33.4, whatever the sign
    assert statistics.seeds_needed(0.0, 1.0) is None and statistics.seeds_needed(1.0, 0.0) is None
    assert statistics.seeds_needed(10.0, 0.1) == 2  # never fewer than the 2 a t interval needs
    n = statistics.seeds_needed(0.8, 1.0)
    differences = np.random.default_rng(0).normal(0.8, 1.0, size=(4000, n))  # 4,000 experiments of n seeds
    shown = stats.ttest_1samp(differences, 0.0, axis=1).pvalue < 0.05
    assert 0.77 < shown.mean() < 0.86  # about the 80% power asked for (n rounded up: a little more)
    with pytest.raises(ValueError, match="power must lie in"):
        statistics.seeds_needed(1.0, 1.0, power=1.5)


def test_seeds_needed_for_a_large_effect_where_statsmodels_returns_nan():
    """d = 5.334: scipy's noncentral t gives NaN for the far tail, statsmodels' power is NaN from 3 pairs on and
    its solve_power does not converge; notebook 07's summary crashed on it ("cannot convert float NaN")."""
    import warnings

    from statsmodels.stats.power import TTestPower

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert np.isnan(TTestPower().power(effect_size=5.334, nobs=3, alpha=0.05, alternative="two-sided"))
    needed = statistics.seeds_needed(5.334, 1.0)
    assert needed == 3 and statistics.paired_t_power(5.334, 2) < 0.8 <= statistics.paired_t_power(5.334, 3)
    for size in (0.3, 1.0, 2.4, 3.9, 5.334, 12.0):
        for seeds in (2, 3, 4, 6, 10):
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                theirs = TTestPower().power(effect_size=size, nobs=seeds, alpha=0.05, alternative="two-sided")
            ours = statistics.paired_t_power(size, seeds)
            assert 0 < ours <= 1 and (np.isnan(theirs) or ours == pytest.approx(theirs, abs=1e-9))


def test_an_inconclusive_paired_comparison_says_how_many_seeds_would_settle_it():
    baseline = np.array([0.70, 0.80, 0.90])
    unclear = statistics.paired_difference(baseline + np.array([0.02, -0.01, 0.02]), baseline)
    assert unclear["beyond"] == 0
    assert unclear["seeds_needed"] == statistics.seeds_needed(unclear["delta"], unclear["std"]) > 3
    assert statistics.paired_difference(baseline + 0.01 + np.array([0.001, 0, -0.001]), baseline)[
        "seeds_needed"] is None  # already shown
    frame = pd.DataFrame({"variant": ["baseline"] * 3 + ["same"] * 3, "seed": [0, 1, 2] * 2,
                          "top1": [0.80, 0.85, 0.82, 0.81, 0.84, 0.84]})
    table = statistics.compare_variants(frame, "top1")
    assert table.loc["same", "verdict"] == "within noise" and table.loc["same", "seeds needed"] >= 3


def test_seeds_needed_gives_up_on_an_effect_of_rounding_error():
    """A paired difference whose mean is floating-point noise (0.1, -0.1 and 0 points: mean 1e-15) doubled the
    seeds past 2**64, where scipy's t quantile raised a TypeError (notebook 07's claims, found in a test)."""
    assert statistics.seeds_needed(1e-15, 0.1) is None
    paired = statistics.paired_difference([81.5, 83.6, 85.4], [81.5, 83.5, 85.5])
    assert paired["beyond"] == 0 and paired["seeds_needed"] is None
    assert statistics.seeds_needed(0.05, 0.1) == 34  # d = 0.5 still gives the textbook 34
