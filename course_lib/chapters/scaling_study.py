"""Notebook 06, sections 5-6 (issue 27, point 5), the second article's "a batch of 64-128 on a 24 GB card" and
"the schedule matters more than the optimizer": a batch sweep with the learning rate scaled linearly (Goyal et al.
2017, arXiv:1706.02677) or by the square root (Krizhevsky 2014, arXiv:1404.5997), each size checked against the
sweep's best beyond seed noise (`scaling_table`); and schedule x optimizer, tested seed by seed
(`schedule_vs_optimizer`). Both start from the learning rates `chapters.optimizer_study` tuned, on the in-memory path.
"""
from __future__ import annotations

import dataclasses
import math
from itertools import combinations
from typing import ClassVar

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from course_lib import paths
from course_lib.analysis import claims as claim
from course_lib.analysis import statistics
from course_lib.chapters.optimizer_study import IN_MEMORY, optimizer_overrides
from course_lib.chapters.setup import ChapterSetup, sizes
from course_lib.config import Config, ConfigError, make_config, resolve_profile
from course_lib.data import pipeline
from course_lib.data.datasets import TransformedSubset, limit_indices
from course_lib.devices import resolve_device
from course_lib.engine.schedule import SCHEDULES
from course_lib.measure import memory, memory_fit
from course_lib.models import factory

SCALING_RULES = ("linear", "sqrt")  # lr0 x B / B0 (Goyal et al. 2017); lr0 x sqrt(B / B0) (Krizhevsky 2014,
# arXiv:1404.5997; Hoffer et al. 2017, arXiv:1705.08741)
SMALLEST_BATCH = 32  # images per step: the sweep's first size
MIN_STEPS_PER_EPOCH = 2  # a batch leaving fewer optimizer steps per epoch is past what the split can show
STUDY_SCHEDULES = ("constant", "step", "cosine", "onecycle")  # Config.lr_schedule values, the control first
STUDY_OPTIMIZERS = ("sgd", "adamw")
# Per profile: Config values over the profile's (epochs, images and pixels that keep both studies within their
# budget), the top of the batch sweep by time (0: none beyond memory and steps per epoch), and the validation
# images each run is scored on (0: the whole split; cpu's 1000: a binomial standard error of about 1.5 points at
# 60% top-1, below the seed noise of such short runs).
SIZES = {
    "smoke": dict(config={"storage": "cache", "augmentation": "device", "num_workers": 0, "max_steps": 0,
                          "max_train_images": 128}, largest_batch=64, validation_images=0),
    # 2 epochs of 2048 EuroSAT tiles at 32 px: batch 1024 still gets 2 steps per epoch; about 4 minutes
    # for both studies on 2 cores
    "cpu": dict(config={**IN_MEMORY, "image_size": 32, "epochs": 2, "max_train_images": 2048, "max_steps": 0},
                largest_batch=1024, validation_images=1000),
    "gpu": dict(config={**IN_MEMORY, "image_size": 64, "epochs": 5, "max_train_images": 0, "max_steps": 0},
                largest_batch=0, validation_images=0),
}
SCALING_OUTPUT_DIR = "runs/checkpoints/06_scaling"


@dataclasses.dataclass(kw_only=True)
class ScalingSetup(ChapterSetup):
    """The data, base config (the base run: batch B0, SGD at lr0, warmup + cosine), datasets (the training
    split, and the validation images every run is scored on) and sizes of sections 5 and 6 (`setup`)."""

    seeds: list
    tuned_lrs: dict  # {"sgd": lr0, "adamw": ...}: section 4's best learning rates at batch B0
    batch_sizes: list  # images per step, the sweep of section 5
    largest_batch_reason: str  # which bound set the sweep's top
    bytes_per_image: int  # training memory per image of the batch (estimate on the meta device)
    announces_time: ClassVar[bool] = False  # the notebook's setup said it; the hook set then still applies

    @property
    def base_batch(self) -> int:
        return self.config.batch_size

    def line(self) -> str:
        config, bundle = self.config, self.bundle
        tuned = ", ".join(f"{name} lr {lr:.3g}" for name, lr in self.tuned_lrs.items())
        return "\n".join([f"{config.model}, {config.image_size} px, {config.epochs} epoch(s) of {len(bundle.train)} "
                          f"training images, scored on {len(bundle.val)} validation images; seeds {self.seeds}",
                          f"data path: {bundle.pipeline}", f"B0 = {self.base_batch}; tuned in section 4: {tuned}",
                          f"batch sweep {self.batch_sizes}: {self.largest_batch_reason}", f"hardware: {self.hardware}"])


def setup(profile: str, tuned_lrs: dict, base_batch: int, seeds, *, largest_batch: int = 0,
          **given) -> ScalingSetup:
    """Sections 5-6: the data `paths.choose_data` picks, the profile's `SIZES`, then `given`; batch `base_batch` (B0,
    where `tuned_lrs` were tuned), warmup 5/120 as the article's; the sweep up to `largest_batch` (0: the profile's)."""
    profile, chosen = resolve_profile(profile), sizes(SIZES, profile)
    if any(name not in tuned_lrs for name in STUDY_OPTIMIZERS) or any(not lr > 0 for lr in tuned_lrs.values()):
        raise ConfigError(f"tuned_lrs={tuned_lrs!r} needs a positive learning rate for each of "
                          f"{', '.join(STUDY_OPTIMIZERS)}: pass section 4's best (sensitivity(grid_runs)['best lr'])")
    data = paths.choose_data(profile, given.pop("data_dir", None))
    given = {k: v for k, v in given.items() if v is not None}
    config = make_config(profile, **{**chosen["config"], **data.overrides, "batch_size": base_batch,
                                     "output_dir": SCALING_OUTPUT_DIR, **given})
    config = config.replace(warmup_epochs=config.epochs * 5 / 120, lr_schedule="cosine",
                            **optimizer_overrides("sgd", tuned_lrs["sgd"]))
    bundle = pipeline.build_datasets(config)
    kept = limit_indices(len(bundle.val), chosen["validation_images"], seed=0)
    if kept is not None:  # the same images for every run: a fixed seed, not the run's
        bundle = dataclasses.replace(bundle, val=TransformedSubset(bundle.val, kept))
    largest, reason, per_image = largest_batch_for(config, len(bundle.train), largest_batch or chosen["largest_batch"],
                                                   len(bundle.classes))
    return ScalingSetup(profile=profile, data=data, config=config, bundle=bundle, seeds=list(seeds),
                        tuned_lrs=dict(tuned_lrs), batch_sizes=batch_sizes(largest), largest_batch_reason=reason,
                        bytes_per_image=per_image)


def largest_batch_for(config: Config, train_images: int, time_cap: int = 0,
                      num_classes: int = 10) -> tuple[int, str, int]:
    """(largest batch, which bound set it, training bytes per image): the smallest of `time_cap` (0: none), the
    split and memory (`measure.memory`'s estimate on the meta device: shapes only, no step run)."""
    if time_cap and time_cap < SMALLEST_BATCH:
        raise ConfigError(f"largest_batch={time_cap} is below the sweep's first size {SMALLEST_BATCH}; "
                          f"give {SMALLEST_BATCH} or more (0: the profile's)")
    estimate = memory.estimate_training_memory(factory.create_model(config.model, num_classes), config.batch_size,
                                               config.image_size, optimizer="sgd", device="meta")
    per_image = max(1, estimate.activation_bytes_per_image + 3 * config.image_size ** 2 * 4)
    free = memory_fit.free_bytes(resolve_device(config.device))
    bounds = {"the split": train_images // MIN_STEPS_PER_EPOCH}
    if free is not None:
        bounds["memory"] = memory.largest_batch_within(estimate, memory_fit.FIT_MARGIN * free)
    if time_cap:
        bounds["the profile's time cap"] = time_cap
    bound = min(bounds, key=bounds.get)
    largest = bounds[bound]
    if largest < SMALLEST_BATCH:
        raise ConfigError(f"the batch sweep needs at least {SMALLEST_BATCH} images per step, but {bound} allows "
                          f"{largest}: give max_train_images of {SMALLEST_BATCH * MIN_STEPS_PER_EPOCH} or more")
    text = "; ".join(f"{name} {value:,}" for name, value in bounds.items())
    return largest, (f"the top is set by {bound} ({text}: split = at least {MIN_STEPS_PER_EPOCH} steps per epoch, "
                     f"memory = {per_image / 2**20:.2f} MiB per image in {memory_fit.FIT_MARGIN:.0%} of the free "
                     "memory)"), per_image


def batch_sizes(largest: int) -> list[int]:
    """Powers of two from `SMALLEST_BATCH` up to `largest` (whole images per step)."""
    if largest < SMALLEST_BATCH:
        raise ValueError(f"largest batch {largest} is below the smallest {SMALLEST_BATCH}")
    return [SMALLEST_BATCH << k for k in range((largest // SMALLEST_BATCH).bit_length())]


def scaled_learning_rate(rule: str, base_lr: float, base_batch: int, batch: int) -> float:
    """lr0 scaled from batch B0 to B: "linear" lr0 x B/B0 (the same update per image seen), "sqrt" lr0 x sqrt(B/B0)
    (the same gradient noise per step)."""
    if base_batch < 1 or batch < 1 or not base_lr > 0:
        raise ConfigError(f"scaling needs positive batches and learning rate, got B0={base_batch}, B={batch}, "
                          f"lr0={base_lr}")
    if rule == "linear":
        return base_lr * batch / base_batch
    if rule == "sqrt":
        return base_lr * math.sqrt(batch / base_batch)
    raise ConfigError(f"scaling rule {rule!r} is not one of {', '.join(SCALING_RULES)}")


def batch_plan(base_batch: int, base_lr: float, sizes, rules=SCALING_RULES) -> list[tuple[dict, dict]]:
    """(labels, Config overrides) per run of the batch sweep: SGD at each size and each rule's
    learning rate, warm-up + cosine; where the rules agree (B = B0) one run serves both."""
    plan = []
    for batch in sizes:
        by_lr: dict[float, list[str]] = {}
        for rule in rules:
            lr = scaled_learning_rate(rule, base_lr, base_batch, batch)
            same = next((known for known in by_lr if math.isclose(known, lr, rel_tol=1e-9)), lr)
            by_lr.setdefault(same, []).append(rule)
        for lr, served in by_lr.items():
            plan.append(({"batch": batch, "rules": ", ".join(served), "lr": lr},
                         {"batch_size": batch, **optimizer_overrides("sgd", lr)}))
    return plan


def schedule_plan(tuned_lrs: dict, schedules=STUDY_SCHEDULES, optimizers=STUDY_OPTIMIZERS) -> list[tuple[dict, dict]]:
    """(labels, Config overrides) per cell of schedule x optimizer, each optimizer at its tuned lr."""
    unknown = [name for name in schedules if name not in SCHEDULES]
    if unknown:
        raise ConfigError(f"schedule {unknown[0]!r} is not one of {', '.join(SCHEDULES)}")
    return [({"schedule": schedule, "optimizer": optimizer, "lr": tuned_lrs[optimizer]},
             {**optimizer_overrides(optimizer, tuned_lrs[optimizer]), "lr_schedule": schedule})
            for schedule in schedules for optimizer in optimizers]


def scaling_table(frame, val_images: int, z: float = 2.0):
    """One row per (rule, batch): learning rate, steps, mean top-1 (%) and its std over seeds, and the difference
    from the sweep's best cell in points with its noise band (Welch, z standard errors): "below the best" beyond it."""
    long = frame.assign(rule=frame["rules"].str.split(", ")).explode("rule").drop(columns="rules")  # B0 serves both
    cells = long.groupby(["rule", "batch"])
    means = cells["val top-1"].mean()
    best_key = means.idxmax()
    best = long.set_index(["rule", "batch"]).loc[[best_key], "val top-1"].to_numpy() * 100
    # each std at least the best cell's binomial std on `val_images`: seeds that happen to agree give no zero band
    floor = 100 * statistics.binomial_std(means[best_key], val_images)
    rows = []
    for (rule, batch), group in cells:
        values = group["val top-1"].to_numpy() * 100
        gap = statistics.difference_beyond_noise(values, best, z=z, floor=floor)
        rows.append({"rule": rule, "batch": batch, "lr": group["lr"].iloc[0], "steps": group["steps"].iloc[0],
                     "top-1 %": values.mean(), "std": values.std(ddof=1) if len(values) > 1 else float("nan"),
                     "vs best (points)": gap["delta"], "noise band": gap["band"],
                     "verdict": "best" if (rule, batch) == best_key else
                     "below the best" if gap["beyond"] < 0 else "within noise"})
    return pd.DataFrame(rows).set_index(["rule", "batch"])


def where_rules_break(table, base_batch: int):
    """Per rule: the batch sizes within noise of the best, and where it breaks: the smallest batch
    above B0 whose top-1 falls beyond seed noise below the best ("not up to <top>": it holds over the sweep)."""
    rows = {}
    for rule, part in table.groupby(level="rule", sort=False):
        part = part.droplevel("rule")
        below = [int(b) for b in part.index if part.loc[b, "verdict"] == "below the best"]
        above = [b for b in below if b > base_batch]
        rows[rule] = {"within noise of the best": ", ".join(str(int(b)) for b in part.index if b not in below) or "-",
                      "below the best": ", ".join(map(str, below)) or "-",
                      "breaks at (above B0)": str(min(above)) if above else f"not up to {int(part.index.max())}"}
    return pd.DataFrame.from_dict(rows, orient="index")


def plot_scaling(table, base_batch: int, axis=None):
    """top-1 against batch size per rule (log scale), error bars one std over seeds, and the best minus the
    median noise band as a dashed line."""
    if axis is None:
        _, axis = plt.subplots(figsize=(6, 3.5))
    for rule, part in table.groupby(level="rule", sort=False):
        part = part.droplevel("rule")
        axis.errorbar(part.index, part["top-1 %"], yerr=part["std"].fillna(0), marker="o", capsize=3,
                      label=f"{rule}: lr0 x {'B/B0' if rule == 'linear' else 'sqrt(B/B0)'}")
    best = table["top-1 %"].max()
    axis.axhline(best - table["noise band"].median(), linestyle="--", color="grey", label="best - noise band")
    axis.axvline(base_batch, linestyle=":", color="black", label=f"B0 = {base_batch}")
    axis.set_xscale("log", base=2)
    axis.set(xlabel="batch size (images per step)", ylabel="validation top-1 (%)",
             title="same epochs: fewer steps at larger batches")
    axis.legend(fontsize=8)
    return axis


def schedule_table(frame):
    """Mean top-1 (%) per schedule x optimizer, with the range across optimizers per schedule (a
    column) and the range across schedules per optimizer (a row)."""
    means = frame.pivot_table(index="schedule", columns="optimizer", values="val top-1", sort=False) * 100
    table = means.copy()
    table["range across optimizers"] = means.max(axis=1) - means.min(axis=1)
    table.loc["range across schedules"] = list(means.max() - means.min()) + [float("nan")]
    return table


def schedule_vs_optimizer(frame, level: float = 0.95) -> dict:
    """"The schedule matters more than the optimizer", seed by seed: the mean |top-1 difference| (points) of two runs
    that differ only in the schedule against two that differ only in the optimizer, with a t interval over seeds.
    Both are differences of two single runs: with no real effect seed noise makes neither look larger."""
    cube = frame.pivot_table(index="seed", columns=["schedule", "optimizer"], values="val top-1") * 100
    schedules, optimizers = list(dict.fromkeys(frame["schedule"])), list(dict.fromkeys(frame["optimizer"]))
    complete = cube.dropna()
    if len(schedules) < 2 or len(optimizers) < 2 or len(complete) < 2:
        raise ValueError(f"the decomposition needs 2+ schedules, 2+ optimizers and 2+ seeds with every cell; got "
                         f"{len(schedules)} schedules, {len(optimizers)} optimizers, {len(complete)} complete seeds")
    schedule_effect = np.mean([(complete[(a, o)] - complete[(b, o)]).abs()
                               for o in optimizers for a, b in combinations(schedules, 2)], axis=0)
    optimizer_effect = np.mean([(complete[(s, a)] - complete[(s, b)]).abs()
                                for s in schedules for a, b in combinations(optimizers, 2)], axis=0)
    difference = statistics.paired_difference(schedule_effect, optimizer_effect, level)
    return {"schedule effect": statistics.confidence_interval(schedule_effect, level),
            "optimizer effect": statistics.confidence_interval(optimizer_effect, level),
            "difference": difference, "seeds": len(complete),
            "verdict": {1: "holds", -1: "refuted", 0: "not shown beyond noise"}[difference["beyond"]]}


def decomposition_table(result: dict):
    """`schedule_vs_optimizer` as a table: mean (points) and 95% interval of each effect and their difference."""
    effects = {"schedule effect": result["schedule effect"], "optimizer effect": result["optimizer effect"],
               "schedule - optimizer": {**result["difference"], "mean": result["difference"]["delta"]}}
    rows = {name: {"mean (points)": e["mean"], "low": e["low"], "high": e["high"]} for name, e in effects.items()}
    return pd.DataFrame.from_dict(rows, orient="index").assign(seeds=result["seeds"])


ARTICLE_BATCHES = (64, 128)  # the second article's range on a 24 GB card


def scaling_claims(table, base_batch: int, data: str) -> list:
    """The article's "batch 64-128, learning rate scaled to the batch": holds when the linear rule's sizes in 64-128
    are all within seed noise of the sweep's best (the 24 GB card is about memory, not accuracy)."""
    linear = table.xs("linear", level="rule")
    inside = [b for b in linear.index if ARTICLE_BATCHES[0] <= b <= ARTICLE_BATCHES[1]]
    if not inside:
        return [claim.not_measurable("batch_lr_scaling", f"the sweep ({', '.join(map(str, linear.index))}) has no "
                                                         f"batch in {ARTICLE_BATCHES[0]}-{ARTICLE_BATCHES[1]}")]
    worst = min(inside, key=lambda b: linear.loc[b, "vs best (points)"])
    row = linear.loc[worst]
    gap = row["vs best (points)"]
    breaks = where_rules_break(table, base_batch)
    text = "; ".join(f"{rule}: below the best at {row_['below the best']}" for rule, row_ in breaks.iterrows())
    best_rule, best_batch = table["top-1 %"].idxmax()
    return [claim.checked(
        "batch_lr_scaling", bool(all(linear.loc[b, "verdict"] != "below the best" for b in inside)),
        reason=f"linear rule from B0 = {base_batch} on {data}: worst of batch {', '.join(map(str, inside))} is "
               f"{worst} ({int(row['steps'])} steps per epoch) at {gap:+.1f} points from the best ({best_rule} at "
               f"{best_batch}, {table['top-1 %'].max():.1f}%), noise band {row['noise band']:.1f}; {text}; the 24 GB "
               "card is not tested (accuracy only)",
        value=gap, interval=(gap - row["noise band"], gap + row["noise band"]))]


def schedule_claims(result: dict, data: str) -> list:
    """"The schedule matters more than the optimizer" from `schedule_vs_optimizer`."""
    difference = result["difference"]
    schedule, optimizer = result["schedule effect"], result["optimizer effect"]
    return [claim.decided(
        "schedule_over_optimizer", difference["delta"], (difference["low"], difference["high"]),
        f"on {data}, {result['seeds']} seeds: mean |top-1 change| from changing the schedule "
               f"{schedule['mean']:.1f} points against {optimizer['mean']:.1f} from changing the optimizer; "
               f"difference {difference['delta']:+.1f} [{difference['low']:+.1f}, {difference['high']:+.1f}] "
               f"(t interval over seeds)" + statistics.power_note(difference))]
