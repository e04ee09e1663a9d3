"""Notebook 07 section 7: which weights to keep at the end of a run: the last ones, their EMA, an SWA average
(Izmailov et al. 2018, arXiv:1803.05407, `torch.optim.swa_utils`), the best validation epoch (best.pt), or
early stopping. Choosing by validation flatters the chosen weights, so the engine chooses on one half of the
validation split and every kept weight is scored on the other. The notebook holds the loop over `train.fit`.
"""
from __future__ import annotations

import dataclasses
import time

import numpy as np
import pandas as pd

from course_lib.analysis import claims as claim_records
from course_lib.chapters.regularization_study import ema_decay_for, interval_text, paired_claim, paired_over_seeds, \
    score, training_speed
from course_lib.chapters.setup import sizes
from course_lib.config import Config, resolve_profile
from course_lib.data import pipeline
from course_lib.data.datasets import TransformedSubset, limit_indices
from course_lib.engine.schedule import steps_per_epoch
from course_lib.models import factory

# Per profile: `config`, values over the study's config; `validation_half`, validation images in each half
# (choosing, held out; 0: half the split each); `train_images`, training images of each run (a seeded choice;
# 0: all). cpu: the speed-run's smallest net at 32 px in fp32 (precision=auto would time bf16 before each short
# run), trained on 400 images of a 2,000-image cache (notebook 09 section 9 reads the same cache), so that two
# runs per seed over 3 seeds stay within about 25 s on 2 cores; the engine validates every epoch here (best.pt
# and early stopping read it) on 400 validation images, a small share of a run (+-2.5 points binomial). The
# reference runs the cpu pass's sizes (`profile_entry`) over the reference's 5 seeds: its runs are not
# converged, and its verdicts are not the reference's evidence (docs/results.md).
SIZES: dict[str, dict] = {
    "smoke": {"config": {"epochs": 3}, "validation_half": 0, "train_images": 0},
    "cpu": {"config": {"model": "speedrun_resnet_tiny", "image_size": 32, "batch_size": 32, "epochs": 6,
                       "max_train_images": 2000, "lr": 0.05, "warmup_epochs": 0.5, "precision": "off"},
            "validation_half": 400, "train_images": 400},
    "gpu": {"config": {"model": "speedrun_resnet", "image_size": 64, "batch_size": 128, "epochs": 10,
                       "max_train_images": 5000, "lr": 0.2, "warmup_epochs": 1.0, "storage": "cache",
                       "augmentation": "device", "num_workers": 0},
            "validation_half": 0, "train_images": 0},
}
EARLY_STOPPING_PATIENCE = 2  # epochs without a higher validation top-1
SWA_SHARE = 0.25  # the last quarter of the epochs averaged (Izmailov et al. 2018 start SWA at 75% of the budget)
WEIGHTS_ORDER = ("last", "EMA", "SWA", "best.pt")


def swa_epochs_for(epochs: int) -> int:
    """SWA over the last `SWA_SHARE` of the epochs: at least 1, at most epochs - 1."""
    return min(epochs - 1, max(1, round(SWA_SHARE * epochs)))


def split_validation(dataset, seed: int = 0, limit: int = 0) -> tuple:
    """(choosing, held out): a seeded random half of the validation split for the engine to choose on, and the
    other half to score every kept weight on; `limit` > 0 caps each half at that many images."""
    order = np.random.default_rng(seed).permutation(len(dataset))
    half = len(dataset) // 2 if not limit else min(limit, len(dataset) // 2)
    return (TransformedSubset(dataset, sorted(order[:half].tolist())),
            TransformedSubset(dataset, sorted(order[half:2 * half].tolist())))


@dataclasses.dataclass
class WeightChoice:
    """The section's base config and datasets, the two validation halves, and the two runs per seed (`plans`)."""

    config: Config
    bundle: object  # the training images every run trains on
    choosing: object  # the validation half the engine reads (best.pt, early stopping)
    held_out: object  # the other half: every kept weight is scored on it
    plans: dict  # run -> its switches over `config`: "full" (EMA, SWA, best.pt) and "early stopping" (and best.pt)
    swa_epochs: int
    patience: int = EARLY_STOPPING_PATIENCE
    rows: list = dataclasses.field(default_factory=list)  # one per seed, run and kept weights
    started: float = dataclasses.field(default_factory=time.perf_counter)
    seconds: float = 0.0  # wall-clock from `study` to the last `record`, scoring included

    def folder(self, run: str, seed: int) -> str:
        """Each run's own output_dir: fit writes last.pt and best.pt there."""
        return f"{self.config.output_dir.rstrip('/')}/07_weights_{run.replace(' ', '_')}_seed{seed}"

    def record(self, run: str, result) -> None:
        """Score every weight `result` (a `train.fit` result) kept on the held-out half."""
        kept = {"last": result.model, "EMA": result.ema_model, "SWA": result.swa_model,
                "best.pt": factory.model_from_checkpoint(result.best_checkpoint_path)}
        for weights in (name for name in WEIGHTS_ORDER if kept[name] is not None):
            scores = score(kept[weights], self.held_out, result.config, device_stage=self.bundle.device_stage)
            self.rows.append({"run": run, "weights": weights, "seed": result.config.seed,
                              "top-1 %": scores["top1"] * 100, "loss": scores["loss"],
                              "epochs trained": len(result.history), "best epoch": result.best_epoch,
                              "stopped after": result.stopped_early_after,
                              "train s": training_speed(result.history)["train_seconds"]})
        self.seconds = time.perf_counter() - self.started

    @property
    def runs(self):
        return pd.DataFrame(self.rows)

    def points(self):
        """top-1 %, one row per seed, one column per (run, weights)."""
        return self.runs.pivot_table(index="seed", columns=["run", "weights"], values="top-1 %")

    def table(self):
        """Mean over seeds per run and weights: top-1 %, the paired difference with the full run's last weights,
        epochs trained, best epoch and on how many seeds it stopped early."""
        points, rows = self.points(), []
        for (run, weights), group in self.runs.groupby(["run", "weights"], sort=False):
            row = {"run": run, "weights": weights, "seeds": len(group), "top-1 %": group["top-1 %"].mean(),
                   "epochs trained": group["epochs trained"].mean(), "best epoch": group["best epoch"].mean(),
                   "stopped early": f"{int(group['stopped after'].notna().sum())} of {len(group)}"}
            if (run, weights) != ("full", "last") and (
                    paired := paired_over_seeds(points[(run, weights)], points[("full", "last")])) is not None:
                row.update({"vs last (points)": paired["delta"], "low": paired["low"], "high": paired["high"],
                            "verdict": {1: "higher", -1: "lower", 0: "within noise"}[paired["beyond"]]})
            rows.append(row)
        return pd.DataFrame(rows).set_index(["run", "weights"])

    def describe(self) -> str:
        config = self.config
        return (f"{config.model} at {config.image_size} px, {config.epochs} epochs planned, SWA over the last "
                f"{self.swa_epochs}, patience {self.patience}, {len(set(self.runs['seed']))} seeds; scored on "
                f"{len(self.held_out)} held-out validation images")


def study(config: Config, profile: str) -> WeightChoice:
    """The section's runs on notebook 07's `config` with the profile's `SIZES`: its training images (a batch
    larger than them is cut to half of them), the validation halves, SWA and an EMA for the run's length."""
    started = time.perf_counter()
    chosen = sizes(SIZES, resolve_profile(profile))
    config = config.replace(**chosen["config"])
    bundle = pipeline.build_datasets(config)
    kept = limit_indices(len(bundle.train), chosen["train_images"], seed=0)
    if kept is not None:
        bundle = dataclasses.replace(bundle, train=TransformedSubset(bundle.train, kept))
    if len(bundle.train) < config.batch_size:
        config = config.replace(batch_size=max(1, len(bundle.train) // 2))
    choosing, held_out = split_validation(bundle.val, limit=chosen["validation_half"])
    swa_epochs, total_steps = swa_epochs_for(config.epochs), steps_per_epoch(len(bundle.train), config) * config.epochs
    plans = {"full": {"ema_decay": ema_decay_for(total_steps), "swa_epochs": swa_epochs, "save_best": True},
             "early stopping": {"early_stopping_patience": EARLY_STOPPING_PATIENCE, "save_best": True}}
    return WeightChoice(config, bundle, choosing, held_out, plans, swa_epochs, started=started)


def claims(choice: WeightChoice) -> list:
    """"Use early stopping": the stopped run's best.pt against the full run's last weights, paired by seed (not
    shown when it never stopped: nothing was saved); best.pt and SWA against the last weights of the full runs."""
    points, runs = choice.points(), choice.runs
    last = points[("full", "last")]
    early = runs[(runs["run"] == "early stopping") & (runs["weights"] == "best.pt")]
    stopped, planned = int(early["stopped after"].notna().sum()), choice.config.epochs
    found = []
    for key, run, weights in (("early_stopping", "early stopping", "best.pt"),
                              ("best_checkpoint_gain", "full", "best.pt"), ("swa_gain", "full", "SWA")):
        if (run, weights) not in points:
            found.append(claim_records.not_measurable(key, f"the {run} runs kept no {weights} weights"))
        elif (paired := paired_over_seeds(points[(run, weights)], last)) is None:
            found.append(claim_records.not_measurable(key, "fewer than 2 seeds"))
        elif key == "early_stopping":  # nothing saved (it never stopped) shows nothing, whatever the accuracy says
            found.append(paired_claim(
                key, paired, f"stopped early on {stopped} of {len(early)} seeds, "
                f"{1 - early['epochs trained'].mean() / planned:.0%} of the {planned} planned epochs saved; best.pt of "
                f"the stopped run - last weights of the full run {interval_text(paired)} (paired over seeds, 95% t); "
                f"{choice.describe()}", also=claim_records.HOLDS if stopped else claim_records.NOT_SHOWN))
        else:
            found.append(paired_claim(key, paired, f"{weights} - last weights of the same full runs "
                                      f"{interval_text(paired)} (paired over seeds, 95% t); {choice.describe()}"))
    return found
