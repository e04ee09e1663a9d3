"""Notebook 09's evaluation turned into the articles' claims (`analysis.claims`): top-1/top-5 as the
metrics, classes that score differently beyond binomial noise, the confusion matrix pointing at
specific pairs, and MixUp's gain with its bootstrap interval. The numbers come from
`analysis.evaluation`, `analysis.confusion` and `analysis.comparison`; this module compares, and
builds the notebook's config and data (`setup`)."""
from __future__ import annotations

import dataclasses
import math

from course_lib.analysis import claims as claim_records
from course_lib.analysis import statistics

# Values over the profile. cpu: one epoch (not the profile's two) keeps both trainings within the
# notebook's time budget; the analysis needs a model that makes mistakes, not a good one.
STUDY_PROFILES = {"cpu": {"epochs": 1}}


@dataclasses.dataclass
class ConfusionSetup:
    """Notebook 09's config, data and datasets (`setup`)."""

    config: object  # Config of both trainings (the baseline and the MixUp run)
    data: object  # paths.DataChoice: what the notebook prints first
    bundle: object  # DataBundle: its training counts per class and whether it has a test split
    profile: str  # resolved: names the saved evaluations
    hardware: str  # ledger.describe_hardware()

    @property
    def line(self) -> str:
        config = self.config
        return (f"profile {self.profile}: {config.model} at {config.image_size}px on {config.dataset} "
                f"{config.data_dir or '(generated cache)'}; {self.hardware}")


def setup(profile: str, data_dir: str | None = None, **params) -> ConfusionSetup:
    """The data `datasets.config_with_data` picks (data_dir, else real data when found, not in smoke,
    else the profile's landcover-synth), `STUDY_PROFILES` over the profile, then `params` (None: not
    given), and the datasets of that config."""
    from course_lib import ledger
    from course_lib.config import resolve_profile
    from course_lib.data import datasets, pipeline

    config, data = datasets.config_with_data(profile, STUDY_PROFILES, data_dir=data_dir, **params)
    return ConfusionSetup(config, data, pipeline.build_datasets(config), resolve_profile(profile),
                          ledger.describe_hardware())


def claims(summary: dict, classes_only, pairs, designed_share: float, even_share: float,
           mixup_summary: dict | None = None, mixup_overall: dict | None = None, mixup_alpha: float = 0.0) -> list:
    """`summary`: the baseline's `Evaluation.summary()`; `classes_only`: its per-class table (recall,
    support) without the averages; `pairs`: `most_confused_pairs`; `designed_share` / `even_share`:
    `confusion.pair_error_share` (NaN without known look-alike pairs); the MixUp run's summary and
    `comparison.compare(...).overall` when it ran."""
    low, high = statistics.binomial_interval(round(summary["top1"] * summary["images"]), summary["images"])
    found = [claim_records.checked(
        "top1_top5_metrics", True, value=summary["top1"], interval=(low, high),
        reason=f"top-1 {summary['top1']:.3f} (95% Wilson [{low:.3f}, {high:.3f}]), top-{summary['top5_k']} "
               f"{summary['top5']:.3f} on {summary['images']} images")]
    worst, best = classes_only["recall"].idxmin(), classes_only["recall"].idxmax()
    intervals = {name: statistics.binomial_interval(round(classes_only.loc[name, "recall"] * classes_only.loc[name, "support"]),
                                                    int(classes_only.loc[name, "support"])) for name in (worst, best)}
    found.append(claim_records.checked(
        "classes_differ", True if intervals[worst][1] < intervals[best][0] else None,  # overlap: not shown
        value=classes_only.loc[best, "recall"] - classes_only.loc[worst, "recall"],
        reason=f"recall {classes_only.loc[worst, 'recall']:.2f} ({worst}, 95% [{intervals[worst][0]:.2f}, "
               f"{intervals[worst][1]:.2f}]) to {classes_only.loc[best, 'recall']:.2f} ({best}, 95% "
               f"[{intervals[best][0]:.2f}, {intervals[best][1]:.2f}]): apart when the intervals do not overlap, "
               "not shown beyond noise when they do"))
    if len(pairs):
        top = pairs.iloc[0]
        text = f"{top['true']} -> {top['predicted']} takes {top['share_of_true']:.0%} of {top['true']}"
        if not math.isnan(designed_share):
            holds = designed_share > even_share
            text += f"; {designed_share:.0%} of errors fall in the generator's look-alike pairs (even spread: {even_share:.0%})"
        else:
            # an even spread of that class's errors over the other classes would give each this share
            lost = 1 - classes_only.loc[top["true"], "recall"]
            even = lost / max(1, len(classes_only) - 1)
            holds = top["share_of_true"] > 2 * even
            text += f" (an even spread of its errors: {even:.0%} per class)"
        found.append(claim_records.checked("confusion_pairs", holds, value=float(top["share_of_true"]), reason=text))
    else:
        found.append(claim_records.checked("confusion_pairs", False, reason="no confusions: nothing to point at"))
    if mixup_summary is None:
        found.append(claim_records.not_measurable("mixup_helps_09", "mixup_alpha_compare=0 skipped the MixUp run"))
    else:
        delta = mixup_overall["top1"]
        found.append(claim_records.checked(
            "mixup_helps_09", claim_records.beyond_noise(delta["low"], delta["high"]), value=delta["delta"],
            interval=(delta["low"], delta["high"]),
            reason=f"alpha {mixup_alpha}: top-1 {summary['top1']:.3f} -> {mixup_summary['top1']:.3f} "
                   f"({delta['delta']:+.3f}, paired bootstrap 95% [{delta['low']:+.3f}, {delta['high']:+.3f}]), ECE "
                   f"{summary['ece']:.3f} -> {mixup_summary['ece']:.3f}; one seed each (notebook 07 repeats seeds)"))
    return found
