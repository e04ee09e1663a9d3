"""Is a difference beyond noise? Seed noise of repeated runs, the validation set's own sampling noise
(bootstrap over images, and the binomial standard error of an accuracy), and a comparison of each
variant with a baseline's noise band (Bouthillier et al. 2021, "Accounting for Variance in Machine
Learning Benchmarks", arXiv:2103.03098); bootstrap resampling weights and percentile intervals (Efron &
Tibshirani 1993, "An Introduction to the Bootstrap", ch. 13) for comparing two evaluations.
"""
from __future__ import annotations

import math

import numpy as np


def _scores(labels: np.ndarray, probabilities: np.ndarray, bins: int) -> dict:
    from course_lib.analysis import calibration

    true_class = np.clip(probabilities[np.arange(len(labels)), labels], 1e-12, None)
    return {"top1": float((probabilities.argmax(axis=1) == labels).mean()),
            "loss": float(-np.log(true_class).mean()),
            "ece": calibration.expected_calibration_error(probabilities, labels, bins),
            "confidence": float(probabilities.max(axis=1).mean()),
            "images": len(labels)}


def validation_noise(labels, probabilities, draws: int = 200, seed: int = 0, bins: int = 15) -> dict:
    """Standard deviation of top-1, loss and ECE over bootstrap resamples of the evaluated images
    (Efron 1979): how much each number would move on another validation set of the same size.
    For top-1 it approaches the closed form `binomial_std`. Keys match the comparison table."""
    labels, probabilities = np.asarray(labels), np.asarray(probabilities, dtype=np.float64)
    if draws < 2:
        raise ValueError(f"draws must be at least 2, got {draws}")
    rng = np.random.default_rng(seed)
    samples = {"val top-1": [], "val loss": [], "ECE": []}
    for _ in range(draws):
        pick = rng.integers(0, len(labels), len(labels))
        scores = _scores(labels[pick], probabilities[pick], bins)
        for key, name in (("val top-1", "top1"), ("val loss", "loss"), ("ECE", "ece")):
            samples[key].append(scores[name])
    return {key: float(np.std(values, ddof=1)) for key, values in samples.items()}


def seed_noise(values) -> dict:
    """Mean and sample standard deviation of one metric over repeated runs that differ only in
    the seed (initial weights, data order, augmentation draws)."""
    values = np.asarray(list(values), dtype=np.float64)
    if len(values) < 2:
        raise ValueError(f"seed noise needs at least 2 runs, got {len(values)}")
    return {"mean": float(values.mean()), "std": float(values.std(ddof=1)), "runs": len(values)}


def noise_band(std: float, baseline_runs: int, z: float = 2.0) -> float:
    """Half-width of the band a single run's difference from the mean of `baseline_runs`
    baseline runs stays inside about 95% of the time (z = 2) when nothing really changed:
    z * std * sqrt(1 + 1 / baseline_runs). With 2-3 runs the std itself is a rough estimate."""
    return z * std * math.sqrt(1.0 + 1.0 / baseline_runs)


def binomial_std(accuracy: float, images: int) -> float:
    """Standard deviation of an accuracy measured on `images` independent images:
    sqrt(p (1 - p) / n). A second noise source besides the seed: which images the
    validation set happens to hold."""
    if images < 1:
        raise ValueError(f"images must be at least 1, got {images}")
    return math.sqrt(accuracy * (1.0 - accuracy) / images)


def compare_to_baseline(table, baseline_values: dict, metrics=("val top-1", "ECE"), floors: dict | None = None,
                        z: float = 2.0):
    """Add, for each metric column, "<metric> delta" (row minus the baseline seeds' mean),
    "<metric> noise band" and "<metric> beyond noise" (yes/no: |delta| larger than `noise_band`).
    `baseline_values` maps each metric to its values over the baseline seeds; `floors` optionally
    maps a metric to a lower bound for its per-run std (e.g. `binomial_std` for top-1), so that
    2-3 seeds that happen to agree do not make every difference look real. Returns a new DataFrame."""
    table = table.copy()
    for metric in metrics:
        noise = seed_noise(baseline_values[metric])
        std = max(noise["std"], (floors or {}).get(metric, 0.0))
        band = noise_band(std, noise["runs"], z)
        delta = table[metric] - noise["mean"]
        table[f"{metric} delta"] = delta
        table[f"{metric} noise band"] = band
        table[f"{metric} beyond noise"] = np.where(delta.abs() > band, "yes", "no")
    return table


BOOTSTRAP_MAX_BYTES = 2**30  # the draws x images counts matrix: at most 1 GiB of float64


def bootstrap_weights(images: int, draws: int = 1000, seed: int = 0) -> np.ndarray:
    """draws x images resampling counts: row b says how often each image appears in bootstrap
    resample b (Efron 1979). A statistic that is a sum over images becomes one matrix product
    per resample (`weights @ per_image_values`), so thousands of draws stay fast. A matrix over
    BOOTSTRAP_MAX_BYTES is refused in one line naming the draws that fit (10^7 draws were an
    out-of-memory kill with no message)."""
    if draws < 2:
        raise ValueError(f"draws must be at least 2, got {draws}")
    if images < 1:
        raise ValueError(f"a bootstrap needs at least 1 image, got {images}")
    if draws * images * 8 > BOOTSTRAP_MAX_BYTES:
        raise ValueError(f"draws={draws:,} over {images:,} images needs {draws * images * 8 / 2**30:.1f} GiB of "
                         f"resampling counts; use at most {BOOTSTRAP_MAX_BYTES // (images * 8):,} draws (1,000, the "
                         "default, puts the interval's ends within a few tenths of their limit)")
    rng = np.random.default_rng(seed)
    # Drawing `images` times with replacement = one multinomial draw of the per-image counts.
    return rng.multinomial(images, np.full(images, 1.0 / images), size=draws).astype(np.float64)


def percentile_interval(samples, level: float = 0.95) -> tuple[np.ndarray, np.ndarray]:
    """(low, high) percentile bootstrap interval along axis 0 of `samples` (draws x ...)."""
    if not 0 < level < 1:
        raise ValueError(f"level must lie in (0, 1), got {level}")
    tail = (1.0 - level) / 2 * 100
    return np.percentile(samples, tail, axis=0), np.percentile(samples, 100 - tail, axis=0)


def difference_beyond_noise(values, reference, z: float = 2.0, floor: float = 0.0) -> dict:
    """Is mean(values) - mean(reference) larger than the noise of both samples (repeated timings
    of one setting, or seeds)? The band is z standard errors of the difference of two means,
    z * sqrt(s_v^2 / n_v + s_r^2 / n_r) (Welch); a sample of one run borrows the other's std,
    and `floor` is a lower bound on each std (e.g. `binomial_std` for top-1), so two runs that
    happen to agree do not make every difference look real. Returns delta, band and
    "beyond" (+1 above the band, -1 below it, 0 inside)."""
    values, reference = np.asarray(list(values), dtype=np.float64), np.asarray(list(reference), dtype=np.float64)
    if not len(values) or not len(reference):
        raise ValueError("both samples need at least one value")
    if len(values) < 2 and len(reference) < 2:
        raise ValueError("at least one sample needs 2 or more values to estimate the noise")
    stds = [sample.std(ddof=1) if len(sample) > 1 else None for sample in (values, reference)]
    known = [s for s in stds if s is not None]
    value_std, reference_std = (max(s if s is not None else max(known), floor) for s in stds)
    band = z * math.sqrt(value_std**2 / len(values) + reference_std**2 / len(reference))
    delta = float(values.mean() - reference.mean())
    return {"delta": delta, "band": band, "beyond": int(np.sign(delta)) if abs(delta) > band else 0}


def confidence_interval(values, level: float = 0.95) -> dict:
    """Mean of repeated runs (seeds) with its Student-t confidence interval:
    mean +- t_{n-1} * s / sqrt(n). With 3 seeds t is 4.3 at 95%: few seeds give wide intervals,
    which is the honest answer. Returns mean, low, high, std and runs."""
    from scipy import stats

    values = np.asarray(list(values), dtype=np.float64)
    if len(values) < 2:
        raise ValueError(f"a confidence interval needs at least 2 runs, got {len(values)}")
    _check_level(level)
    mean, std = float(values.mean()), float(values.std(ddof=1))
    half = float(stats.t.ppf(0.5 + level / 2, len(values) - 1)) * std / math.sqrt(len(values))
    return {"mean": mean, "low": mean - half, "high": mean + half, "std": std, "runs": len(values)}


def paired_difference(values, baseline, level: float = 0.95) -> dict:
    """Variant minus baseline, paired run by run (the same seed for both: the seed's own luck
    cancels), with the t interval of the mean difference. "beyond" is +1 when the whole interval
    lies above zero, -1 below, 0 when it contains zero."""
    values, baseline = np.asarray(list(values), dtype=np.float64), np.asarray(list(baseline), dtype=np.float64)
    if len(values) != len(baseline):
        raise ValueError(f"a paired comparison needs one baseline run per variant run, got {len(values)} "
                         f"and {len(baseline)}; pair them by seed")
    interval = confidence_interval(values - baseline, level)
    beyond = 1 if interval["low"] > 0 else -1 if interval["high"] < 0 else 0
    return {"delta": interval["mean"], "low": interval["low"], "high": interval["high"], "beyond": beyond,
            "runs": interval["runs"], "std": interval["std"],
            "seeds_needed": None if beyond else seeds_needed(interval["mean"], interval["std"], level=level)}


def power_note(paired: dict, unit: str = "points") -> str:
    """For a claim's reason: "" when `paired` (`paired_difference`) is beyond noise, else what would
    settle it ("; power: about 14 paired seeds would show +0.80 points at 80% power, from this run's
    spread of 1.10 over 3 pairs")."""
    needed = paired.get("seeds_needed")
    if paired.get("beyond") or needed is None:
        return ""
    return (f"; power: about {needed} paired seeds would show {paired['delta']:+.2f} {unit} at 80% power, from this "
            f"run's spread of {paired['std']:.2f} over {paired['runs']} pairs")


def paired_t_power(size: float, seeds: int, level: float = 0.95) -> float:
    """The power of a two-sided paired t test at `level` with `seeds` pairs when the true mean difference is
    `size` spreads (Cohen's d): the noncentral t's mass beyond the critical values, what statsmodels'
    `TTestPower.power` computes, except that the far tail counts as 0 where scipy's noncentral t returns NaN
    for it (a large noncentrality, where that tail is negligible): statsmodels then returns NaN, and its
    `solve_power` fails to converge, which broke notebook 07's summary. Too low by that tail, never too high."""
    from scipy import stats

    freedom, shift = seeds - 1, size * math.sqrt(seeds)
    critical = stats.t.ppf(1 - (1 - level) / 2, freedom)
    far = stats.nct.cdf(-critical, freedom, shift)
    return float(stats.nct.sf(critical, freedom, shift) + (far if math.isfinite(far) else 0.0))


MOST_SEEDS = 1_000_000  # seeds_needed gives up beyond this: no experiment runs a million seeds


def seeds_needed(effect: float, std: float, level: float = 0.95, power: float = 0.8) -> int | None:
    """A power calculation for an inconclusive paired comparison: how many seeds (pairs) a paired t
    test at `level` needs to show a true mean difference of `effect` with probability `power`, when
    the per-seed differences spread by `std` (the spread this run measured): the smallest whole number
    whose `paired_t_power` reaches `power`, at least 2. None when there is no effect to find (`effect` 0,
    or so small against `std` that more than `MOST_SEEDS` would be needed: a mean difference of rounding
    error) or no spread to measure it with (`std` 0 or not finite)."""
    _check_level(level)
    if not 0 < power < 1:
        raise ValueError(f"power must lie in (0, 1), got {power}")
    if not (math.isfinite(effect) and math.isfinite(std)) or effect == 0 or std <= 0:
        return None
    size = abs(effect) / std

    def enough(seeds: int) -> bool:
        return paired_t_power(size, seeds, level) >= power

    low, high = 1, 2  # power grows with the seeds: double until enough, then halve the gap
    while not enough(high):
        if high > MOST_SEEDS:
            return None
        low, high = high, high * 2
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (low, middle) if enough(middle) else (middle, high)
    return high


def paired_ratio_interval(values, baseline, level: float = 0.95) -> dict:
    """A speed-up from timings taken side by side: repeat i of `values` (images/s of a variant) ran
    next to repeat i of `baseline` (the baseline's images/s), so a slow moment of a shared machine
    falls on both and cancels in their ratio.

    The point estimate is median(values) / median(baseline), the ratio of the medians a table shows
    beside it. The interval is a Student-t interval on the log of the per-pair ratios,
    exp(mean +- t_{n-1} s / sqrt(n)) (timings are multiplicative: a t interval on logs is the usual
    choice, e.g. Georges et al. 2007, "Statistically Rigorous Java Performance Evaluation"), widened
    to include the point estimate when an outlying pair pulls the medians' ratio away from the pairs'
    geometric mean. A variant paired with itself gives exactly 1 with a zero-width interval.
    Returns ratio, low, high and pairs."""
    from scipy import stats

    values, baseline = np.asarray(list(values), dtype=np.float64), np.asarray(list(baseline), dtype=np.float64)
    if len(values) != len(baseline):
        raise ValueError(f"a paired ratio needs one baseline repeat per variant repeat, got {len(values)} and "
                         f"{len(baseline)}; time them side by side, taking turns")
    if len(values) < 2:
        raise ValueError(f"a ratio interval needs at least 2 pairs of repeats, got {len(values)}")
    if not (np.all(values > 0) and np.all(baseline > 0)):
        raise ValueError("a ratio of speeds needs positive values (images/s, not an empty timing)")
    _check_level(level)
    ratio = float(np.median(values) / np.median(baseline))
    logs = np.log(values) - np.log(baseline)
    half = float(stats.t.ppf(0.5 + level / 2, len(logs) - 1)) * float(logs.std(ddof=1)) / math.sqrt(len(logs))
    centre = float(logs.mean())
    low, high = math.exp(centre - half), math.exp(centre + half)
    return {"ratio": ratio, "low": min(low, ratio), "high": max(high, ratio), "pairs": len(values)}


def ratio_interval(values, baseline, level: float = 0.95, draws: int = 2000, seed: int = 0) -> dict:
    """mean(values) / mean(baseline) for two samples that were NOT measured side by side (different
    runs, unequal counts) with a percentile bootstrap interval that resamples both samples
    independently (scipy.stats.bootstrap). Timings taken in turns belong to `paired_ratio_interval`:
    resampling them independently throws the pairing away and widens the interval many times over."""
    from scipy import stats

    values, baseline = np.asarray(list(values), dtype=np.float64), np.asarray(list(baseline), dtype=np.float64)
    if len(values) < 2 or len(baseline) < 2:
        raise ValueError(f"a ratio interval needs at least 2 repeats of each, got {len(values)} and {len(baseline)}")
    _check_level(level)
    ratio = float(values.mean() / baseline.mean())
    result = stats.bootstrap((values, baseline), lambda a, b, axis=-1: a.mean(axis=axis) / b.mean(axis=axis),
                             n_resamples=draws, confidence_level=level, method="percentile",
                             random_state=np.random.default_rng(seed), vectorized=True)
    low, high = float(result.confidence_interval.low), float(result.confidence_interval.high)
    return {"ratio": ratio, "low": min(low, ratio), "high": max(high, ratio)}


def stratified_ratio_interval(groups, baseline_groups, level: float = 0.95, draws: int = 2000, seed: int = 0) -> dict:
    """sum(groups) / sum(baseline_groups) for totals made of fixed parts (the same stages timed in two orders, a few
    epochs each), with a percentile bootstrap that resamples within each part only (scipy.stats.bootstrap draws
    every sample on its own): the parts are the design, the repeats inside a part are the noise. Each part needs
    at least 2 values. Returns ratio, low and high."""
    from scipy import stats

    parts = [np.asarray(list(g), dtype=np.float64) for g in (*groups, *baseline_groups)]
    if min(len(part) for part in parts) < 2:
        raise ValueError("a stratified ratio interval needs at least 2 repeats in every part")
    _check_level(level)
    split = len(groups)

    def total_ratio(*samples, axis=-1):
        return sum(x.sum(axis=axis) for x in samples[:split]) / sum(x.sum(axis=axis) for x in samples[split:])

    ratio = float(total_ratio(*parts))
    result = stats.bootstrap(parts, total_ratio, n_resamples=draws, confidence_level=level, method="percentile",
                             random_state=np.random.default_rng(seed), vectorized=True)
    low, high = float(result.confidence_interval.low), float(result.confidence_interval.high)
    return {"ratio": ratio, "low": min(low, ratio), "high": max(high, ratio)}


def binomial_interval(correct: int, total: int, level: float = 0.95) -> tuple[float, float]:
    """Wilson score interval of an accuracy of `correct` out of `total` images (scipy's binomtest):
    how far the accuracy could move on another validation set of the same size."""
    from scipy import stats

    if total < 1 or not 0 <= correct <= total:
        raise ValueError(f"need 0 <= correct <= total and total >= 1, got {correct} of {total}")
    _check_level(level)
    interval = stats.binomtest(int(correct), int(total)).proportion_ci(confidence_level=level, method="wilson")
    return float(interval.low), float(interval.high)


def difference_of_proportions(correct_before: int, total_before: int, correct_after: int, total_after: int,
                               level: float = 0.95) -> dict:
    """after - before for two accuracies (correct of total images each), with Newcombe's hybrid
    score interval (Newcombe 1998, "Interval estimation for the difference between independent
    proportions: comparison of eleven methods", Stat. Med. 17:873, method 10), built from each
    accuracy's Wilson interval: statsmodels' `confint_proportions_2indep(method="newcomb")`. It treats
    the two accuracies as independent: for two models scored on the same images it is conservative
    (their errors are correlated), and the paired image-by-image interval needs the predictions
    (`compare` of two evaluations). Returns delta, low and high."""
    from statsmodels.stats.proportion import confint_proportions_2indep

    _check_level(level)
    for correct, total in ((correct_before, total_before), (correct_after, total_after)):
        if not 0 <= correct <= total or total <= 0:
            raise ValueError(f"an accuracy needs 0 <= correct <= total and total > 0, got {correct} of {total}")
    low, high = confint_proportions_2indep(correct_after, total_after, correct_before, total_before,
                                           method="newcomb", compare="diff", alpha=1 - level)
    return {"delta": correct_after / total_after - correct_before / total_before, "low": float(low), "high": float(high)}


def compare_variants(frame, metric: str, baseline: str = "baseline", variant: str = "variant", seed: str = "seed",
                     level: float = 0.95):
    """One row per variant of a long table (one row per variant and seed): runs, mean and its
    confidence interval, and the paired difference to the baseline over the seeds both ran, with its
    interval and a verdict ("better", "worse", "within noise"); for a variant within noise, "seeds
    needed" is the power calculation from the spread measured here (`seeds_needed`: how many seeds
    would show a difference of this size at 80% power). The one "is it beyond noise?" verdict of
    notebooks 03, 06, 07 and 10."""
    import pandas as pd

    if baseline not in set(frame[variant]):
        raise ValueError(f"the table has no {baseline!r} rows to compare with; variants: "
                         f"{', '.join(map(str, frame[variant].unique()))}")
    reference = frame[frame[variant] == baseline].set_index(seed)[metric]
    rows = []
    for name, group in frame.groupby(variant, sort=False):
        values = group.set_index(seed)[metric]
        row = {variant: name, "runs": len(values), "mean": float(values.mean())}
        if len(values) >= 2:
            interval = confidence_interval(values, level)
            row.update(low=interval["low"], high=interval["high"])
        common = values.index.intersection(reference.index)
        if name != baseline and len(common) >= 2:
            paired = paired_difference(values[common], reference[common], level)
            row.update({"delta": paired["delta"], "delta low": paired["low"], "delta high": paired["high"],
                        "verdict": {1: "better", -1: "worse", 0: "within noise"}[paired["beyond"]],
                        "seeds needed": paired["seeds_needed"]})
        rows.append(row)
    return pd.DataFrame(rows).set_index(variant)


def _check_level(level: float) -> None:
    if not 0 < level < 1:
        raise ValueError(f"level must lie in (0, 1), got {level}")
