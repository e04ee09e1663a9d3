"""Imagenette (fast.ai's ten easy ImageNet classes, github.com/fastai/imagenette) against its leaderboard: the figure
the workbook's `imagenette` recipe (`config.RECIPES`) is compared with, the leaderboard's rules, the gap, and the
claim `imagenette_leaderboard`, decided from the seed summary (`engine.speedrun.seed_summary`) of races scored on
Imagenette's official val, which `workbook data get imagenette` lays out as test/.

The leaderboard (the fastai/imagenette README, last changed 2022): 5 epochs at 128 px, 87.43% top-1, the mean of 5
runs (fastai2's train_imagenette.py of 2020-10 with MaxBlurPool and tuned hyper-parameters, on one GPU). Its rules:
random initial weights, no inference-time tricks (no test-time augmentation), one of its size and epoch pairs, the
mean of 5 runs where one can afford them.
"""
from __future__ import annotations

import json
import types
from pathlib import Path

from course_lib import paths
from course_lib.analysis import claims

LEADERBOARD_TOP1 = 0.8743  # top-1 on the official val, the mean of LEADERBOARD_RUNS runs
LEADERBOARD_IMAGE_SIZE = 128  # pixels, the row's side
LEADERBOARD_EPOCHS = 5  # passes over the official train
LEADERBOARD_RUNS = 5
LEADERBOARD_ENTRY = "fastai2 train_imagenette.py 2020-10 + MaxBlurPool + tuned hyper-parameters"
OFFICIAL_VAL = "Imagenette's official val (test/ of `workbook data get imagenette`; no choice made on it)"
CLAIM = "imagenette_leaderboard"
RESULT_STEM = "imagenette"  # benchmarks/results/imagenette.json and .md (benchmarks/bench_imagenette.py)


def leaderboard_line() -> str:
    """The figure as every table names it."""
    return (f"{LEADERBOARD_TOP1:.2%} at {LEADERBOARD_IMAGE_SIZE} px after {LEADERBOARD_EPOCHS} epochs, the mean of "
            f"{LEADERBOARD_RUNS} runs ({LEADERBOARD_ENTRY})")


def rules_broken(config) -> list[str]:
    """What a run of `config` does that the leaderboard's 5-epoch row does not allow (empty: nothing)."""
    broken = []
    if config.pretrained or config.checkpoint:
        broken.append("it starts from trained weights (the leaderboard's runs start from random ones)")
    if config.tta_views > 1:
        broken.append(f"{config.tta_views}-view test-time augmentation (no inference-time tricks)")
    if config.epochs != LEADERBOARD_EPOCHS:
        broken.append(f"{config.epochs} epoch(s), not the row's {LEADERBOARD_EPOCHS}")
    if config.max_train_images or config.max_steps:
        broken.append("a shortened epoch (max_train_images or max_steps)")
    return broken


def gap(summary: dict) -> dict | None:
    """The official val's top-1 (`summary["test_top1"]`) minus the leaderboard's, in points, with its t interval
    moved by the same amount (`low`/`high` None for one run); None when the races had no official val."""
    top1 = summary.get("test_top1")
    if not top1:
        return None

    def points(value):
        return None if value is None else (value - LEADERBOARD_TOP1) * 100

    return {"points": points(top1["mean"]), "low": points(top1["low"]), "high": points(top1["high"]),
            "runs": top1["runs"]}


def caveat(config, hardware: str) -> str:
    """What differs between a run of `config` and the leaderboard's row besides the recipe."""
    pixels = (config.image_size / LEADERBOARD_IMAGE_SIZE) ** 2
    return (f"{config.image_size} px against the row's {LEADERBOARD_IMAGE_SIZE} ({pixels:.2f}x the pixels per image), "
            "trained on 90% of the official train (the other tenth is `valid`, kept for choosing), on "
            f"{hardware}; the leaderboard ranks accuracy after 5 epochs, not time")


def gap_line(summary: dict, config, hardware: str) -> str:
    """The gap in one line, with the caveat, as the benchmark and notebook 12 print it."""
    found = gap(summary)
    if found is None:
        return "gap to the leaderboard: no official val (test/) in this data"
    interval = f" [{found['low']:+.2f}, {found['high']:+.2f}]" if found["low"] is not None else " (1 run)"
    return (f"gap to the leaderboard's {leaderboard_line()}: {found['points']:+.2f} points{interval}, mean of "
            f"{found['runs']} run(s) with its 95% t interval; {caveat(config, hardware)}")


def claim(summary: dict | None, config, hardware: str, why_not: str = "", source: str = ""):
    """The claim `imagenette_leaderboard`: the races' mean top-1 on the official val against 87.43%, decided by its
    95% t interval. Not measurable without races (`why_not` says why), with the rules broken, without an official
    val, or with one run (no interval). `source` names a results file it was read from."""
    if summary is None:
        return claims.not_measurable(CLAIM, why_not or "no races of the recipe on Imagenette", hardware)
    broken = rules_broken(config)
    found = gap(summary)
    if broken:
        return claims.not_measurable(CLAIM, "the runs break the leaderboard's rules: " + "; ".join(broken), hardware)
    if found is None or found["low"] is None:
        said = "no official val (test/) in the data" if found is None else \
            f"one run has no interval (the leaderboard averages {LEADERBOARD_RUNS}; run 5 seeds)"
        return claims.not_measurable(CLAIM, said, hardware)
    low, high = found["low"], found["high"]
    holds = True if low >= 0 else False if high < 0 else None
    said = {True: "the whole interval is at or above it", False: "the whole interval is below it",
            None: "the interval contains it"}[holds]
    top1 = summary["test_top1"]
    reason = (f"{config.recipe or config.model} ({config.model}): top-1 {top1['mean']:.2%} [{top1['low']:.2%}, "
              f"{top1['high']:.2%}] on the official val, mean of {found['runs']} runs, against "
              f"{LEADERBOARD_TOP1:.2%}: {said}; {caveat(config, hardware)}{source}")
    return claims.checked(CLAIM, holds, reason, value=found["points"], interval=(low, high), hardware=hardware)


def saved_claim(root=None):
    """The claim from benchmarks/results/imagenette.json when benchmarks/bench_imagenette.py wrote it from races on
    Imagenette; None without that file, or when it holds the smoke profile's check on the committed sample."""
    path = Path(root or paths.project_root()) / "benchmarks" / "results" / f"{RESULT_STEM}.json"
    try:
        record = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(record, dict) or not record.get("on_imagenette"):
        return None
    return claim(record["summary"], types.SimpleNamespace(**record["config"]), record["hardware"],
                 source=f" (read from benchmarks/results/{RESULT_STEM}.json, measured {record.get('started', '?')})")
