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
    """Standard deviation of top-1, loss and ECE over bootstrap resamples of the evaluated images (Efron 1979): how
    much each would move on another validation set of the same size (top-1's approaches `binomial_std`)."""
    labels, probabilities = np.asarray(labels), np.asarray(probabilities, dtype=np.float64)
    if draws < 2:
        raise ValueError(f"draws must be at least 2, got {draws}")
    rng = np.random.default_rng(seed)
    picks = (rng.integers(0, len(labels), len(labels)) for _ in range(draws))
    scores = [_scores(labels[pick], probabilities[pick], bins) for pick in picks]
    return {key: float(np.std([score[name] for score in scores], ddof=1))
            for key, name in (("val top-1", "top1"), ("val loss", "loss"), ("ECE", "ece"))}


def seed_noise(values) -> dict:
    """Mean and sample standard deviation of one metric over repeated runs that differ only in
    the seed (initial weights, data order, augmentation draws)."""
    values = np.asarray(list(values), dtype=np.float64)
    if len(values) < 2:
        raise ValueError(f"seed noise needs at least 2 runs, got {len(values)}")
    return {"mean": float(values.mean()), "std": float(values.std(ddof=1)), "runs": len(values)}


def noise_band(std: float, baseline_runs: int, z: float = 2.0) -> float:
    """Half-width of the band one run's difference from the mean of `baseline_runs` runs stays inside about 95% of
    the time (z = 2) when nothing changed. With 2-3 runs the std itself is a rough estimate."""
    return z * std * math.sqrt(1.0 + 1.0 / baseline_runs)


def binomial_std(accuracy: float, images: int) -> float:
    """Standard deviation of an accuracy measured on `images` independent images: the noise of which images the
    validation set happens to hold, besides the seed's."""
    if images < 1:
        raise ValueError(f"images must be at least 1, got {images}")
    return math.sqrt(accuracy * (1.0 - accuracy) / images)


def compare_to_baseline(table, baseline_values: dict, metrics=("val top-1", "ECE"), floors: dict | None = None,
                        z: float = 2.0):
    """`table` with "<metric> delta" (against the mean of `baseline_values[metric]`, the baseline seeds'), "noise
    band" and "beyond noise" (yes/no) per metric. `floors`: a least per-run std per metric (e.g. `binomial_std` for
    top-1), so that 2-3 seeds that happen to agree do not make every difference look real."""
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
    """draws x images resampling counts (Efron 1979): a statistic that is a sum over images becomes one matrix
    product per resample, so thousands of draws stay fast. Over BOOTSTRAP_MAX_BYTES it is refused in one line
    (10^7 draws were an out-of-memory kill with no message)."""
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
    _check_level(level)
    tail = (1.0 - level) / 2 * 100
    return np.percentile(samples, tail, axis=0), np.percentile(samples, 100 - tail, axis=0)


def difference_beyond_noise(values, reference, z: float = 2.0, floor: float = 0.0) -> dict:
    """Is mean(values) - mean(reference) beyond z standard errors of a difference of two means (Welch)? A sample of
    one run borrows the other's std, and `floor` bounds each std from below (e.g. `binomial_std` for top-1), so two
    runs that happen to agree do not make every difference look real. "beyond": +1 above the band, -1 below, 0."""
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
    """Mean of repeated runs (seeds) with its Student-t confidence interval. With 3 seeds t is 4.3 at 95%: few
    seeds give wide intervals, which is the honest answer."""
    from scipy import stats

    values = np.asarray(list(values), dtype=np.float64)
    if len(values) < 2:
        raise ValueError(f"a confidence interval needs at least 2 runs, got {len(values)}")
    _check_level(level)
    mean, std = float(values.mean()), float(values.std(ddof=1))
    half = float(stats.t.ppf(0.5 + level / 2, len(values) - 1)) * std / math.sqrt(len(values))
    return {"mean": mean, "low": mean - half, "high": mean + half, "std": std, "runs": len(values)}


def paired_difference(values, baseline, level: float = 0.95) -> dict:
    """Variant minus baseline paired by seed (the seed's own luck cancels), with the t interval of the mean
    difference; "beyond": +1 when it lies wholly above zero, -1 below, 0 when it contains zero."""
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
    """For a claim's reason: "" when `paired` (`paired_difference`) is beyond noise, else how many paired seeds
    would settle it at 80% power."""
    needed = paired.get("seeds_needed")
    if paired.get("beyond") or needed is None:
        return ""
    return (f"; power: about {needed} paired seeds would show {paired['delta']:+.2f} {unit} at 80% power, from this "
            f"run's spread of {paired['std']:.2f} over {paired['runs']} pairs")


def paired_t_power(size: float, seeds: int, level: float = 0.95) -> float:
    """Power of a two-sided paired t test with `seeds` pairs at a true difference of `size` spreads (Cohen's d), as
    statsmodels' `TTestPower.power`, but the far tail counts 0 where scipy's noncentral t gives NaN (statsmodels'
    NaN broke notebook 07's summary). Too low by that negligible tail, never too high."""
    from scipy import stats

    freedom, shift = seeds - 1, size * math.sqrt(seeds)
    critical = stats.t.ppf(1 - (1 - level) / 2, freedom)
    far = stats.nct.cdf(-critical, freedom, shift)
    return float(stats.nct.sf(critical, freedom, shift) + (far if math.isfinite(far) else 0.0))


MOST_SEEDS = 1_000_000  # seeds_needed gives up beyond this: no experiment runs a million seeds


def seeds_needed(effect: float, std: float, level: float = 0.95, power: float = 0.8) -> int | None:
    """The fewest seeds (pairs, at least 2) a paired t test at `level` needs to show a true mean difference of
    `effect` with probability `power`, the per-seed differences spreading by `std`. None with no effect to find
    (0, or one needing more than `MOST_SEEDS`: rounding error) or no spread to measure it with."""
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
    """A speed-up from images/s timed side by side (repeat i of `values` next to repeat i of `baseline`, so a slow
    moment of a shared machine cancels in their ratio): the ratio of the medians, with a Student-t interval on the
    logs of the per-pair ratios (timings multiply: Georges et al. 2007, "Statistically Rigorous Java Performance
    Evaluation"), widened to hold the point estimate when an outlying pair pulls the medians away."""
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
    """mean(values) / mean(baseline) of two samples NOT measured side by side, each resampled on its own (percentile
    bootstrap). Timings taken in turns belong to `paired_ratio_interval`: this would widen their interval many fold."""
    values, baseline = np.asarray(list(values), dtype=np.float64), np.asarray(list(baseline), dtype=np.float64)
    if len(values) < 2 or len(baseline) < 2:
        raise ValueError(f"a ratio interval needs at least 2 repeats of each, got {len(values)} and {len(baseline)}")
    return _bootstrap_ratio((values, baseline), lambda a, b, axis=-1: a.mean(axis=axis) / b.mean(axis=axis), level,
                            draws, seed)


def stratified_ratio_interval(groups, baseline_groups, level: float = 0.95, draws: int = 2000, seed: int = 0) -> dict:
    """sum(groups) / sum(baseline_groups) for totals made of fixed parts (stages timed in two orders), resampled
    within each part only (of 2 values or more): the parts are the design, the repeats inside a part the noise."""
    parts = [np.asarray(list(g), dtype=np.float64) for g in (*groups, *baseline_groups)]
    if min(len(part) for part in parts) < 2:
        raise ValueError("a stratified ratio interval needs at least 2 repeats in every part")
    split = len(groups)

    def total_ratio(*samples, axis=-1):
        return sum(x.sum(axis=axis) for x in samples[:split]) / sum(x.sum(axis=axis) for x in samples[split:])

    return _bootstrap_ratio(parts, total_ratio, level, draws, seed)


def _bootstrap_ratio(samples, ratio_of, level: float, draws: int, seed: int) -> dict:
    """`ratio_of(*samples)` with scipy's percentile bootstrap interval, each sample resampled on its own (the
    interval widened to hold the point estimate)."""
    from scipy import stats

    _check_level(level)
    ratio = float(ratio_of(*samples))
    result = stats.bootstrap(samples, ratio_of, n_resamples=draws, confidence_level=level, method="percentile",
                             random_state=np.random.default_rng(seed), vectorized=True)
    low, high = float(result.confidence_interval.low), float(result.confidence_interval.high)
    return {"ratio": ratio, "low": min(low, ratio), "high": max(high, ratio)}


def binomial_interval(correct: int, total: int, level: float = 0.95) -> tuple[float, float]:
    """Wilson score interval of an accuracy of `correct` out of `total` images (scipy's binomtest)."""
    from scipy import stats

    if total < 1 or not 0 <= correct <= total:
        raise ValueError(f"need 0 <= correct <= total and total >= 1, got {correct} of {total}")
    _check_level(level)
    interval = stats.binomtest(int(correct), int(total)).proportion_ci(confidence_level=level, method="wilson")
    return float(interval.low), float(interval.high)


def difference_of_proportions(correct_before: int, total_before: int, correct_after: int, total_after: int,
                               level: float = 0.95) -> dict:
    """after - before for two accuracies with Newcombe's hybrid score interval (Newcombe 1998, Stat. Med. 17:873,
    method 10; statsmodels' `confint_proportions_2indep`). It treats them as independent: conservative for two
    models on the same images, whose paired interval needs the predictions (`comparison.compare`)."""
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
    """One row per variant of a long table (a row per variant and seed): its mean and t interval, the paired
    difference to the baseline over their common seeds with its interval and verdict, and for a variant within
    noise the `seeds_needed` at 80% power. The one "is it beyond noise?" verdict of notebooks 03, 06, 07 and 10."""
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
