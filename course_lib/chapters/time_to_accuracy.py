"""Notebook 12's race and ablation: the speed-run recipe against the workbook's default recipe and a
naive loop, each for the same wall-clock budget, then the recipe with one ingredient taken out at a
time, over several seeds (the spread is the seed noise, `analysis.statistics.seed_noise`).
The race itself is `engine.speedrun.race`; this module holds what only the notebook needs.
"""
from __future__ import annotations

import dataclasses

import torch

from course_lib.analysis import statistics
from course_lib.config import Config
from course_lib.engine import precision, speedrun
from course_lib.measure import flops

# Each ingredient of the speed-run recipe and the Config change that takes it out.
ABLATIONS: dict[str, dict] = {
    "test-time augmentation (8 views)": {"tta_views": 1},
    "symmetries of the square (overhead)": {"augment_recipe": "light"},
    "label smoothing": {"label_smoothing": 0.0},
    "warm-up": {"warmup_epochs": 0.0},
    "pre-decoded cache": {"storage": "files", "num_workers": -1},
    "augmentation on the device": {"augmentation": "cpu", "num_workers": -1},
    "channels_last": {"channels_last": False},
    "measured precision (auto)": {"precision": "off"},
    "small residual net (vs resnet18)": {"model": "resnet18"},
}


@dataclasses.dataclass
class Ablation:
    ingredient: str  # "full recipe" for the reference runs
    changes: dict
    results: list  # one speedrun.RaceResult per seed

    def row(self) -> dict:
        accuracies = [r.val_top1 for r in self.results]
        # One seed (the smoke profile) has no spread to show.
        noise = statistics.seed_noise(accuracies) if len(accuracies) > 1 else {"mean": accuracies[0], "std": float("nan")}
        return {"without": self.ingredient, "changes": ", ".join(f"{k}={v}" for k, v in self.changes.items()) or "-",
                "val top-1 mean": noise["mean"], "val top-1 std": noise["std"], "seeds": len(accuracies),
                "seconds mean": sum(r.seconds for r in self.results) / len(self.results),
                "images/s mean": sum(r.images_per_second for r in self.results) / len(self.results)}


def ablate(config: Config, seeds: list[int], ingredients: list[str] | None = None, *, bundle=None,
           progress: bool = False) -> list[Ablation]:
    """The full recipe and the recipe without each ingredient, once per seed, all with `config`'s
    epochs (no budget: the same training length, so accuracy differences are the ingredient's)."""
    chosen = list(ABLATIONS) if ingredients is None else ingredients
    unknown = [name for name in chosen if name not in ABLATIONS]
    if unknown:
        raise ValueError(f"unknown ingredient {unknown[0]!r}; choose from: {', '.join(ABLATIONS)}")
    runs = [("full recipe", {})] + [(name, ABLATIONS[name]) for name in chosen]
    out = []
    for ingredient, changes in runs:
        results = []
        for seed in seeds:
            variant = config.replace(**changes, seed=seed)
            # The data pipeline changes with storage/augmentation: only reuse the bundle when it cannot.
            same_data = not {"storage", "augmentation", "augment_recipe", "num_workers"} & set(changes)
            results.append(speedrun.race(variant, label=f"without {ingredient}" if changes else ingredient,
                                         bundle=bundle if same_data else None, progress=progress, verbose=False))
        out.append(Ablation(ingredient, changes, results))
    return out


def ablation_table(ablations: list[Ablation]):
    """One row per ingredient taken out: mean and spread of the final validation top-1 over seeds,
    the change against the full recipe and whether it is beyond two standard deviations of the
    seed noise (the larger of the two runs' spreads)."""
    import pandas as pd

    rows = [a.row() for a in ablations]
    table = pd.DataFrame(rows).set_index("without")
    full = table.loc["full recipe"]
    table["change vs full"] = table["val top-1 mean"] - full["val top-1 mean"]
    spread = table["val top-1 std"].clip(lower=full["val top-1 std"])
    table["beyond noise"] = table["change vs full"].abs() > 2 * spread
    table.loc["full recipe", "beyond noise"] = False
    return table


def race_table(results: list, device: str = "cpu") -> "object":
    """Time to 90/95/97% validation top-1, final top-1, images/s and MFU per racer: training FLOPs
    per image (`measure.flops`) times images/s, against this device's peak at the racer's precision."""
    import pandas as pd
    import timm

    rows = []
    for result in results:
        model = timm.create_model(result.config.model, num_classes=result.num_classes or 1000)
        per_image = flops.training_flops_per_image(model, result.config.image_size)
        dtype = precision.DTYPES.get(result.precision, torch.float32)
        utilization = flops.model_flops_utilization(per_image, result.images_per_second, device, dtype)
        rows.append({**result.row(), "MFU": utilization["mfu"], "MFU peak from": utilization["peak_source"]})
    return pd.DataFrame(rows).set_index("label")


def plot_race(results: list, title: str = "", axis=None):
    """Validation top-1 against wall-clock seconds, one line per racer."""
    import matplotlib.pyplot as plt

    axis = axis or plt.subplots(figsize=(7, 4))[1]
    for result in results:
        seconds = [0.0] + [p["seconds"] for p in result.curve]
        accuracy = [0.0] + [p["val_top1"] for p in result.curve]
        axis.plot(seconds, accuracy, marker="o", label=result.label)
    for level in speedrun.MILESTONES:
        axis.axhline(level, ls=":", c="grey", lw=0.8)
    axis.set_xlabel("wall-clock seconds (decoding included)")
    axis.set_ylabel("validation top-1")
    axis.set_ylim(0, 1)
    axis.set_title(title, fontsize=9)
    axis.legend()
    return axis
