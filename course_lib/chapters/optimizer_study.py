"""SGD against AdamW over a grid of learning rates and seeds (notebook 06), and the article's optimizer claims.

AdamW is Loshchilov & Hutter, "Decoupled Weight Decay Regularization", ICLR 2019 (arXiv:1711.05101); the learning
rate of SGD scales linearly with the batch (Goyal et al. 2017, arXiv:1706.02677). "Beats SGD" is AdamW's accuracy
minus SGD's paired by (learning-rate rank, seed), with its t interval; "less sensitive" is the spread over the grid.
Sections 5-6 (batch size against learning rate, schedule against optimizer) are `chapters.scaling_study`.
"""
from __future__ import annotations

import dataclasses
import time

import pandas as pd
import torch

from course_lib.analysis import claims as claim
from course_lib.analysis import statistics
from course_lib.chapters.setup import ChapterSetup, sizes
from course_lib.config import Config, resolve_profile
from course_lib.data import pipeline
from course_lib.data.datasets import config_with_data
from course_lib.engine import schedule, train
from course_lib.instruments.progress import Progress

# Each optimizer at its usual learning rate, a third of it and three times it.
LEARNING_RATE_FACTORS = (1 / 3, 1.0, 3.0)
ADAMW_LR = 1e-3  # the top of the article's 3e-4 to 1e-3 sweep
ADAMW_WEIGHT_DECAY = 0.05  # decoupled, per step of lr x weight_decay
ARTICLE_ADAMW_RANGE = (3e-4, 1e-3)
# The engine's in-memory path: the split pre-decoded to uint8 once, batches cut from it without
# DataLoader workers, crop and flip on the device; and the workbook's small residual net.
IN_MEMORY = {"model": "speedrun_resnet_small", "storage": "cache", "augmentation": "device", "num_workers": 0}


@dataclasses.dataclass(kw_only=True)
class NotebookSetup(ChapterSetup):
    """Notebook 06's data, config (sections 1-3), training split and the sizes its parameters left to the profile."""

    steps_per_epoch: int
    sgd_lr: float  # the article's 0.1 at batch 256, scaled linearly
    range_test_steps: int  # optimizer steps of each LR range test
    seeds: list  # of every learning rate in the grid
    grid_config: Config  # the grid's runs: the in-memory path at most 64 px
    grid_factors: tuple  # x each optimizer's usual learning rate
    adamw_lr: float = ADAMW_LR  # AdamW's peak learning rate in sections 1-3

    def line(self) -> str:
        config = self.config
        return (f"{config.model}, {config.image_size} px, batch {config.batch_size}, {config.epochs} epoch(s) x "
                f"{self.steps_per_epoch} steps, warmup {config.warmup_epochs:.2f} epochs; SGD lr {self.sgd_lr:.4g}, "
                f"AdamW lr {self.adamw_lr:g}\nhardware: {self.hardware}")


# Per profile (sections 1-4): Config values over the profile's (on a CPU the whole notebook trains the small
# residual net on the engine's in-memory path, 18 grid runs must fit in a few minutes; a GPU keeps its profile's
# model for sections 1-3), torch threads (0: torch's default; smoke: one, a tiny model at 32 px loses more than
# it gains handing each small op to 2 threads), the grid's path (smoke keeps the profile's model), the LR range
# test's steps, seeds per learning rate, and the grid's factors of each optimizer's usual learning rate.
SIZES = {
    "smoke": dict(config={}, torch_threads=1, grid={k: v for k, v in IN_MEMORY.items() if k != "model"},
                  range_test_steps=12, seeds=2, grid_factors=(1.0, 3.0)),
    "cpu": dict(config={**IN_MEMORY, "image_size": 32, "epochs": 3, "max_train_images": 800}, torch_threads=0,
                grid=IN_MEMORY, range_test_steps=60, seeds=3, grid_factors=LEARNING_RATE_FACTORS),
    "gpu": dict(config={}, torch_threads=0, grid=IN_MEMORY, range_test_steps=60, seeds=3,
                grid_factors=LEARNING_RATE_FACTORS),
}


def setup(profile: str, *, range_test_steps: int = 0, seeds: int = 0, warmup_epochs: float | None = None,
          adamw_lr: float = ADAMW_LR, **given) -> NotebookSetup:
    """The profile's own data (`find_real=False`: 18 grid runs must fit in minutes; WORKBOOK_DATA=<folder>
    changes it), the profile's `SIZES`, then `given` (None: not given)."""
    profile = resolve_profile(profile)
    chosen = sizes(SIZES, profile)
    if chosen["torch_threads"]:
        torch.set_num_threads(chosen["torch_threads"])
    config, data = config_with_data(profile, find_real=False, **{**chosen["config"],
                                                                  "output_dir": "runs/checkpoints/06_optimizers",
                                                                  **{k: v for k, v in given.items() if v is not None}})
    config = config.replace(warmup_epochs=warmup_epochs if warmup_epochs is not None else config.epochs * 5 / 120)
    bundle = pipeline.build_datasets(config)
    return NotebookSetup(profile=profile, data=data, config=config, bundle=bundle,
                         steps_per_epoch=schedule.steps_per_epoch(len(bundle.train), config),
                         sgd_lr=sgd_learning_rate(config.batch_size),
                         range_test_steps=range_test_steps or chosen["range_test_steps"],
                         seeds=list(range(seeds or chosen["seeds"])),
                         grid_config=config.replace(**chosen["grid"], image_size=min(config.image_size, 64)),
                         grid_factors=chosen["grid_factors"], adamw_lr=adamw_lr)


def sgd_learning_rate(batch_size: int) -> float:
    """The article's 0.1 at batch 256, scaled linearly to `batch_size`."""
    return 0.1 * batch_size / 256


def learning_rate_grid(batch_size: int, adamw_lr: float = ADAMW_LR, factors=LEARNING_RATE_FACTORS) -> dict:
    """{"sgd": [...], "adamw": [...]}: each optimizer's usual learning rate times `factors`."""
    return {"sgd": [sgd_learning_rate(batch_size) * f for f in factors], "adamw": [adamw_lr * f for f in factors]}


def optimizer_overrides(optimizer: str, lr: float) -> dict:
    """Config values for one grid point: warm-up + cosine to lr / 100 for both optimizers."""
    decay = {"adamw": ADAMW_WEIGHT_DECAY, "sgd": 5e-4}[optimizer]
    return {"optimizer": optimizer, "lr": lr, "min_lr": lr / 100, "weight_decay": decay}


def grid_plan(grid: dict) -> list[tuple[dict, dict]]:
    """(labels, Config overrides) per grid point, with the learning rate's rank in its optimizer's grid
    (0 = smallest): the pairing of `adamw_minus_sgd`."""
    return [({"optimizer": optimizer, "lr": lr, "lr rank": rank}, optimizer_overrides(optimizer, lr))
            for optimizer, learning_rates in grid.items() for rank, lr in enumerate(learning_rates)]


def run_plan(config: Config, plan, seeds, bundle=None, fit=train.fit, progress: bool = True,
             description: str = "runs") -> list[dict]:
    """Train `config` with each plan entry's overrides once per seed, seed by seed (a change in the machine's
    load then spreads over every entry): one row per run with the entry's labels and what the run measured."""
    rows = []
    bar = Progress(len(plan) * len(seeds), description, unit="fits", enabled=progress)
    for seed in seeds:
        for labels, overrides in plan:
            bar.set_postfix_str(", ".join(f"{k} {v:.3g}" if isinstance(v, float) else f"{k} {v}"
                                          for k, v in labels.items()) + f", seed {seed}")
            started = time.perf_counter()
            final = fit(config.replace(seed=seed, **overrides), bundle=bundle, progress=progress, verbose=False).final
            rows.append({**labels, "seed": seed, "val top-1": final.get("val_top1"),
                         "train loss": final.get("train_loss"), "steps": final.get("optimizer_steps"),
                         "images/s": final.get("images_per_second"), "seconds": time.perf_counter() - started})
            bar.update()
    bar.close()
    return rows


def sensitivity(frame):
    """Per optimizer: mean top-1 over the grid, its spread over learning rates (max - min of their means), over
    seeds (mean of the per-learning-rate stds) and in all (std over every run), and the best learning rate."""
    rows = {}
    for optimizer, part in frame.groupby("optimizer", sort=False):
        by_lr = part.groupby("lr")["val top-1"]
        means = by_lr.mean()
        rows[optimizer] = {"mean top-1": part["val top-1"].mean(), "best lr": float(means.idxmax()),
                           "best top-1": means.max(), "spread over lrs": means.max() - means.min(),
                           "spread over seeds": by_lr.std().mean(), "std over all runs": part["val top-1"].std()}
    return pd.DataFrame.from_dict(rows, orient="index")


def adamw_minus_sgd(frame) -> dict:
    """AdamW's top-1 minus SGD's in points, paired by (learning-rate rank, seed), with its t interval."""
    pivot = frame.pivot_table(index=["lr rank", "seed"], columns="optimizer", values="val top-1").dropna()
    return {**statistics.paired_difference(100 * pivot["adamw"], 100 * pivot["sgd"]), "pairs": len(pivot)}


def sweep_kept_best(spread, stable: dict) -> bool | None:
    """Whether a learning-rate sweep's largest stable rate (`stable`, per optimizer) would have kept the
    grid's best learning rate: False when, for some optimizer, it lies above; None when none was swept."""
    verdicts = [spread.loc[name, "best lr"] <= rate * (1 + 1e-9) for name, rate in stable.items()
                if name in spread.index and rate and rate > 0]
    return all(verdicts) if verdicts else None


def claims(frame, range_tests: dict, article_values: list[float], article_steps_per_epoch: int = 50,
           batch_size: int | None = None) -> list:
    """Notebook 06's optimizer claims: AdamW beats SGD and is less sensitive (the grid), the warm-up + cosine
    recipe (the schedule at known points), the learning-rate sweep (range tests) and the AdamW range."""
    spread = sensitivity(frame)
    difference = adamw_minus_sgd(frame)
    grid_text = ", ".join(f"{name} {', '.join(f'{lr:.3g}' for lr in sorted(part['lr'].unique()))}"
                          for name, part in frame.groupby("optimizer", sort=False))
    spread_text = "; ".join(f"{name}: {row['spread over lrs'] * 100:.1f} points over learning rates, "
                            f"{row['spread over seeds'] * 100:.1f} over seeds, std {row['std over all runs'] * 100:.1f}"
                            for name, row in spread.iterrows())
    first, peak, last = article_values[0], article_values[5 * article_steps_per_epoch], article_values[-1]
    stable = {name: result.largest_stable_lr for name, result in range_tests.items()}
    best_adamw, (low, high) = spread.loc["adamw", "best lr"], ARTICLE_ADAMW_RANGE
    sgd_spread, adamw_spread = (spread.loc[name, "std over all runs"] for name in ("sgd", "adamw"))
    return [
        claim.measured("adamw_vs_sgd", difference["delta"], (difference["low"], difference["high"]),
                       reason=f"mean of {difference['pairs']} pairs (learning-rate rank x seed): "
                              f"{len(frame[frame['optimizer'] == 'sgd'])} runs per optimizer over "
                              f"{frame['seed'].nunique()} seeds at {grid_text}" + statistics.power_note(difference)),
        claim.checked("adamw_sensitivity", adamw_spread < sgd_spread, f"top-1 spread over the grid; {spread_text}"),
        # The engine's scheduler against the article's formula: shown by construction, not measured.
        claim.demonstrated("warmup_cosine", first < peak and abs(peak - 0.1) < 1e-3 and abs(last - 0.001) < 1e-4,
                           f"the engine's scheduler gives {first:.4f} at step 0, {peak:.3f} after 5 warm-up epochs, "
                           f"{last:.4f} at the end of 120 epochs"),
        # The sweep's advice can fail: a grid run above its largest stable rate that beats every run at or
        # below it would mean the sweep cut off the best learning rate.
        claim.checked("lr_sweep", sweep_kept_best(spread, stable),
                      reason="range test, largest stable learning rate: "
                             + ", ".join(f"{name} {value:.3g}" for name, value in stable.items())
                             + "; the grid's best learning rate: "
                             + ", ".join(f"{name} {spread.loc[name, 'best lr']:.3g}" for name in stable
                                         if name in spread.index)
                             + (f" (the article's SGD 0.1 at batch 256, scaled to batch {batch_size}: "
                                f"{sgd_learning_rate(batch_size):.3g})" if batch_size else "")
                             + " (holds when the best grid rate lies at or below the sweep's largest stable rate)"),
        claim.checked("adamw_lr_range", low <= best_adamw <= high,
                      reason=f"best AdamW learning rate of the grid {best_adamw:.3g} (mean over seeds); range test's "
                             f"largest stable AdamW learning rate {stable.get('adamw', float('nan')):.3g}"),
    ]
