"""Notebook 09's evaluation turned into the articles' claims (`analysis.claims`): top-1/top-5 as the metrics,
classes that score differently beyond binomial noise, the confusion matrix pointing at specific pairs, and MixUp's
gain with its bootstrap interval; the numbers come from `analysis.evaluation`, `confusion` and `comparison`.
Section 9, class imbalance: a long-tailed cut of the training split (`data.long_tail`) trained with each
`class_balance` correction, per-class recall and macro-F1, and "few samples explain low per-class accuracy"."""
from __future__ import annotations

import dataclasses
import math
import time

import numpy as np
import pandas as pd
from scipy.stats import spearmanr

from course_lib.analysis import claims as claim_records
from course_lib.analysis import evaluation, metrics, statistics
from course_lib.analysis.comparison import bootstrap_scores
from course_lib.chapters.setup import ChapterSetup
from course_lib.config import make_config, profile_entry, resolve_profile
from course_lib.data import datasets, long_tail, pipeline
from course_lib.data.class_split import targets_of
from course_lib.data.datasets import TransformedSubset, limit_indices
from course_lib.engine import train

# Values over the profile: the model the chapter analyses and its explorer shows is the speed-run recipe's
# (about 97% on EuroSAT in a few minutes on 2 cores; `engine.cached_fit` trains it once, and notebook 13 starts
# from the same model), so its confusions are a trained model's, not an undertrained one's (at one epoch of
# resnet18 the matrix showed 46% top-1). Its floor: `analysis.floors`.
STUDY_PROFILES = {"cpu": {"recipe": "speedrun"}, "gpu": {"recipe": "speedrun"}}


@dataclasses.dataclass(kw_only=True)
class ConfusionSetup(ChapterSetup):
    """Notebook 09's config (the baseline's and the MixUp run's: the speed-run recipe in cpu and gpu) and data."""

    def line(self) -> str:
        config = self.config
        return (f"profile {self.profile}: {config.model} at {config.image_size}px on {config.dataset} "
                f"{config.data_dir or '(generated cache)'}; {self.hardware}")


def setup(profile: str, data_dir: str | None = None, **params) -> ConfusionSetup:
    """The data `datasets.config_with_data` picks, `STUDY_PROFILES` over the profile, then `params` (None: not
    given), and the datasets of that config."""
    config, data = datasets.config_with_data(profile, STUDY_PROFILES, data_dir=data_dir, **params)
    return ConfusionSetup(profile=resolve_profile(profile), data=data, config=config,
                          bundle=pipeline.build_datasets(config))


def _recall(classes_only, name) -> tuple[float, float, float]:
    """A class's recall and its Wilson interval over its validation images."""
    recall, support = classes_only.loc[name, "recall"], int(classes_only.loc[name, "support"])
    return (recall, *statistics.binomial_interval(round(recall * support), support))


def claims(summary: dict, classes_only, pairs, designed_share: float, even_share: float,
           mixup_summary: dict | None = None, mixup_overall: dict | None = None, mixup_alpha: float = 0.0) -> list:
    """From the baseline's `Evaluation.summary()`, its per-class table (recall, support), `most_confused_pairs`,
    `confusion.pair_error_share` (NaN without look-alike pairs) and, when it ran, the MixUp run's summary and
    `comparison.compare(...).overall`."""
    low, high = statistics.binomial_interval(round(summary["top1"] * summary["images"]), summary["images"])
    found = [claim_records.checked(
        "top1_top5_metrics", True, value=summary["top1"], interval=(low, high),
        reason=f"top-1 {summary['top1']:.3f} (95% Wilson [{low:.3f}, {high:.3f}]), top-{summary['top5_k']} "
               f"{summary['top5']:.3f} on {summary['images']} images")]
    worst, best = classes_only["recall"].idxmin(), classes_only["recall"].idxmax()
    (bad, bad_low, bad_high), (good, good_low, good_high) = _recall(classes_only, worst), _recall(classes_only, best)
    found.append(claim_records.checked(
        "classes_differ", True if bad_high < good_low else None, value=good - bad,  # overlap: not shown
        reason=f"recall {bad:.2f} ({worst}, 95% [{bad_low:.2f}, {bad_high:.2f}]) to {good:.2f} ({best}, 95% "
               f"[{good_low:.2f}, {good_high:.2f}]): apart when the intervals do not overlap, "
               "not shown beyond noise when they do"))
    found.append(_pairs_claim(classes_only, pairs, designed_share, even_share))
    if mixup_summary is None:
        found.append(claim_records.not_measurable("mixup_helps_09", "mixup_alpha_compare=0 skipped the MixUp run"))
    else:
        delta = mixup_overall["top1"]
        found.append(claim_records.decided(
            "mixup_helps_09", 100 * delta["delta"], (100 * delta["low"], 100 * delta["high"]),
            f"alpha {mixup_alpha}: top-1 {summary['top1']:.3f} -> {mixup_summary['top1']:.3f} "
            f"({delta['delta']:+.3f}, paired bootstrap 95% [{delta['low']:+.3f}, {delta['high']:+.3f}]), ECE "
            f"{summary['ece']:.3f} -> {mixup_summary['ece']:.3f}; one seed each (notebook 07 repeats seeds)"))
    return found


def _pairs_claim(classes_only, pairs, designed_share: float, even_share: float):
    if not len(pairs):
        return claim_records.checked("confusion_pairs", False, reason="no confusions: nothing to point at")
    top = pairs.iloc[0]
    text = f"{top['true']} -> {top['predicted']} takes {top['share_of_true']:.0%} of {top['true']}"
    if not math.isnan(designed_share):
        holds = designed_share > even_share
        text += (f"; {designed_share:.0%} of errors fall in the generator's look-alike pairs (even spread: "
                 f"{even_share:.0%})")
    else:  # an even spread of that class's errors over the other classes would give each this share
        even = (1 - classes_only.loc[top["true"], "recall"]) / max(1, len(classes_only) - 1)
        holds = top["share_of_true"] > 2 * even
        text += f" (an even spread of its errors: {even:.0%} per class)"
    return claim_records.checked("confusion_pairs", holds, value=float(top["share_of_true"]), reason=text)


# --- class imbalance (section 9): a long-tailed training split, three corrections ---------------

IMBALANCE_RATIO = 10.0  # images of the largest class / of the smallest, after the cut (Cui et al. 2019's CIFAR-LT 10)
CORRECTIONS = ("none", "weighted_loss", "sampler")  # the class_balance values compared
BOOTSTRAP_DRAWS = 1000  # resamples of the validation images for every interval of the section
# Values over the notebook's config: the fast pipeline (pre-decoded uint8 cache, augmentation per batch
# on the device, no workers) and, on a CPU, the speed-run's smallest net in fp32 (precision=auto would
# time bf16 before each of these short runs), so that three trainings on the long tail stay within
# about 20 s on 2 cores; its 32 px cache of 2,000 training images is notebook 07 section 7's, built once.
# On a GPU the speed-run's wider net at 64 px (a 64 px cache is 12 KB per image, 224 px would be 150 KB).
IMBALANCE_PROFILES = {
    "smoke": {"storage": "cache", "augmentation": "device", "num_workers": 0},
    "cpu": {"model": "speedrun_resnet_tiny", "image_size": 32, "batch_size": 32, "epochs": 5, "max_steps": 0,
            "max_train_images": 2000, "storage": "cache", "augmentation": "device", "num_workers": 0, "lr": 0.05,
            "warmup_epochs": 0.5, "precision": "off"},
    "gpu": {"model": "speedrun_resnet", "image_size": 64, "batch_size": 128, "epochs": 10, "lr": 0.2, "warmup_epochs": 1.0,
            "storage": "cache", "augmentation": "device", "num_workers": 0},
}
# Validation images each model is scored on (a seeded choice), per profile; absent: the whole split.
IMBALANCE_VALIDATION_IMAGES = {"cpu": 1000}


@dataclasses.dataclass
class ImbalanceStudy:
    """The three trainings on one long-tailed split, each scored once on the full validation split."""

    classes: list
    train_counts: object  # np.ndarray, training images per class after the cut (head first)
    labels: object  # np.ndarray of the validation labels
    predictions: dict  # correction -> np.ndarray of predicted classes, same images
    config: object  # Config of the runs (class_balance aside)
    ratio: float
    seconds: float  # wall clock of the three trainings and their scoring
    source: str  # what the long tail was cut from

    def table(self):
        """Per class: training images and recall under each correction; then macro-F1 and top-1 rows."""
        reports = {name: metrics.per_class_table(self.labels, predicted, self.classes)
                   for name, predicted in self.predictions.items()}
        table = pd.DataFrame({"train images": list(self.train_counts)}, index=pd.Index(self.classes, name="class"))
        for name, report in reports.items():
            table[f"recall {name}"] = report["recall"].to_numpy()[:len(self.classes)]
        table.loc["macro F1"] = [None] + [float(report.loc["macro avg", "f1"]) for report in reports.values()]
        table.loc["top-1"] = [None] + [float((predicted == self.labels).mean()) for predicted in self.predictions.values()]
        table.loc[["macro F1", "top-1"], "train images"] = int(sum(self.train_counts))
        table["train images"] = table["train images"].astype("Int64")
        return table

    def describe(self) -> str:
        config = self.config
        return (f"{config.model} at {config.image_size} px, {config.epochs} epoch(s) on {int(sum(self.train_counts))} "
                f"training images ({self.train_counts[0]} to {self.train_counts[-1]} per class, ratio {self.ratio:g}) "
                f"cut from {self.source}; {len(self.labels)} validation images, one seed per correction, "
                f"{self.seconds:.0f} s")


def imbalance_config(setup: ConfusionSetup):
    """The profile's config on the notebook's data with `IMBALANCE_PROFILES` (section 9 trains its own small nets)."""
    return make_config(setup.profile, IMBALANCE_PROFILES, **setup.data.overrides,
                       output_dir=f"{setup.config.output_dir.rstrip('/')}/09_imbalance")


def imbalance_study(setup: ConfusionSetup, progress: bool = True) -> ImbalanceStudy:
    """Cut the training split to a long tail (`IMBALANCE_RATIO`, head = the first class), train once per correction
    (the engine's validation off: each model is scored once, here) and predict the validation split with each."""
    started = time.perf_counter()
    config = imbalance_config(setup)
    bundle = pipeline.build_datasets(config)
    cut = long_tail.long_tail_bundle(bundle, IMBALANCE_RATIO, seed=config.seed)
    kept = limit_indices(len(bundle.val), profile_entry(IMBALANCE_VALIDATION_IMAGES, setup.profile, 0), seed=0)
    scored = bundle.val if kept is None else TransformedSubset(bundle.val, kept)
    counts = np.bincount(targets_of(cut.train), minlength=len(cut.classes))
    if len(cut.train) < config.batch_size:  # smoke: a tail of a small sample is shorter than one batch
        config = config.replace(batch_size=max(2, len(cut.train) // 4))
    predictions, labels = {}, None
    for correction in CORRECTIONS:
        run = config.replace(class_balance=correction, output_dir=f"{config.output_dir}/{correction}")
        result = train.fit(run, bundle=dataclasses.replace(cut, val=None), progress=progress, verbose=False)
        labels, probabilities = evaluation.predict(result.model, scored, run, device_stage=bundle.device_stage)
        predictions[correction] = probabilities.argmax(axis=1)
    # The data's name, not its folder: the reason lands in committed reference results (no machine's paths).
    return ImbalanceStudy(list(cut.classes), counts, labels, predictions, config, IMBALANCE_RATIO,
                          time.perf_counter() - started, setup.data.name)


def imbalance_claims(study: ImbalanceStudy, draws: int = BOOTSTRAP_DRAWS) -> list:
    """"Few samples explain low per-class accuracy": the Spearman correlation of training images and recall over
    the classes of the uncorrected run, with a bootstrap interval over validation images (holds wholly above 0);
    each correction's macro-F1 change against none on the same resamples (paired)."""
    if "none" not in study.predictions:
        return [claim_records.not_measurable("few_samples_low_recall", "the uncorrected run (none) was not trained")]
    classes, counts = len(study.classes), np.asarray(study.train_counts, dtype=float)
    weights = statistics.bootstrap_weights(len(study.labels), draws, seed=0)
    scores, exact = ({name: bootstrap_scores(study.labels, predicted, classes, draw_weights)
                      for name, predicted in study.predictions.items()}
                     for draw_weights in (weights, np.ones((1, len(study.labels)))))

    def correlation(recall):
        return float(spearmanr(counts, recall)[0]) if np.ptp(recall) > 0 else 0.0

    recall = exact["none"]["recall"][0]
    value = correlation(recall)
    low, high = statistics.percentile_interval(np.array([correlation(draw) for draw in scores["none"]["recall"]]))
    tail, head = recall[-(classes // 2):].mean(), recall[:classes // 2].mean()
    found = [claim_records.checked(
        "few_samples_low_recall", claim_records.beyond_noise(float(low), float(high)), value=value,
        interval=(min(float(low), value), max(float(high), value)),
        reason=f"no correction: Spearman correlation of training images and recall over {classes} classes "
               f"{value:+.2f}, bootstrap 95% [{low:+.2f}, {high:+.2f}] over validation images; mean recall of the "
               f"head half {head:.2f}, of the tail half {tail:.2f}; {study.describe()}")]
    for name, key in (("weighted_loss", "imbalance_weighted_loss"), ("sampler", "imbalance_sampler")):
        if name not in study.predictions:
            found.append(claim_records.not_measurable(key, f"class_balance={name} was not trained"))
            continue
        before, after = exact["none"]["f1"][0].mean(), exact[name]["f1"][0].mean()
        delta = float(after - before)
        low, high = statistics.percentile_interval(scores[name]["f1"].mean(axis=1) - scores["none"]["f1"].mean(axis=1))
        found.append(claim_records.decided(
            key, 100 * delta, (100 * min(float(low), delta), 100 * max(float(high), delta)),
            f"macro-F1 {before:.3f} -> {after:.3f} ({delta:+.3f}, paired bootstrap 95% [{low:+.3f}, {high:+.3f}] over "
            f"validation images; one seed each, so seed noise is not in the interval); tail-half recall {tail:.2f} -> "
            f"{exact[name]['recall'][0][-(classes // 2):].mean():.2f}"))
    return found
