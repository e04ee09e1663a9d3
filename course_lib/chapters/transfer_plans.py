"""Notebook 08's transfer-learning plan: which source (ImageNet weights when they can be had, else a
model pre-trained here) and target to use, time to a target accuracy, and the strategy table and
curves (from scratch, fine-tune all, freeze-then-unfreeze). The mechanics live in
`models.factory` (new heads, loading a backbone) and `engine.freeze`.
"""
from __future__ import annotations

import dataclasses
from pathlib import Path

from course_lib.config import SAMPLE_DATA_DIR, Config, ConfigError
from course_lib.models import hub

# What the article reports (section 5.4): an industrial inspection task, ResNet-50.
ARTICLE = {"scratch_epochs": 350, "scratch_top1": 0.92, "finetune_epochs": 40, "finetune_top1": 0.935,
           "time_saved": 0.80, "head_lr": 1e-3, "finetune_lr": 1e-4}


@dataclasses.dataclass
class TransferPlan:
    source: str  # imagenet | landcover-synth | digits
    target: str  # eurosat | landcover-synth
    source_config: Config | None  # the source pretraining run; None for timm's ImageNet weights
    target_config: Config  # the target data, model and schedule (strategies change lr/start/freezing)
    reason: str  # one line: why this source and target on this machine


def plan_transfer(config: Config, source: str | None = None, target: str | None = None,
                  source_epochs: int = 3, source_images_per_class: int = 200, real_data: bool = True) -> TransferPlan:
    """Pick a source of pretrained weights and a target dataset that exist on this machine.

    target: real EuroSAT (`paths.eurosat_shared_dir()`) when present and `real_data`, else the
    committed landcover-synth sample. source: timm's ImageNet weights when cached or downloadable,
    else a model pretrained here on landcover-synth (generated, `source_images_per_class` training
    images per class; for a EuroSAT target) or on scikit-learn's digits (for a landcover target)."""
    from course_lib import paths
    from course_lib.data import landcover

    eurosat = paths.eurosat_shared_dir()
    target = target or ("eurosat" if eurosat is not None and real_data else "landcover-synth")
    if target == "eurosat":
        if eurosat is None:
            raise FileNotFoundError("target=eurosat needs ../shared/datasets/eurosat_rgb; use target=landcover-synth")
        target_config = config.replace(dataset="imagefolder", data_dir=str(eurosat))
    elif target == "landcover-synth":  # a small labelled set: 40 training images per class
        target_config = config.replace(dataset="landcover-synth", data_dir=SAMPLE_DATA_DIR)
    else:
        raise ConfigError(f"target={target!r} is not one of eurosat, landcover-synth")

    reasons = []
    if source is None:
        if hub.pretrained_available(config.model):
            source = "imagenet"
        else:
            source = "landcover-synth" if target == "eurosat" else "digits"
            reasons.append(f"ImageNet weights for {config.model} are neither cached nor downloadable here")
    if source == "imagenet":
        source_config = None
    elif source == "landcover-synth":
        if target == "landcover-synth":
            raise ConfigError("source and target are both landcover-synth; use source=digits or target=eurosat")
        per_class = {"train": source_images_per_class, "val": max(10, source_images_per_class // 4)}
        folder = landcover.landcover_cache_dir(image_size=64, per_class=per_class, seed=1)
        source_config = config.replace(dataset="landcover-synth", data_dir=str(folder), epochs=source_epochs,
                                       max_train_images=0)
    elif source == "digits":
        source_config = config.replace(dataset="digits", data_dir="", epochs=source_epochs, max_train_images=0)
    else:
        raise ConfigError(f"source={source!r} is not one of imagenet, landcover-synth, digits")
    if source_config is not None:
        source_config = source_config.replace(pretrained=False, checkpoint="", freeze_backbone_epochs=0,
                                              backbone_lr_scale=1.0,
                                              output_dir=str(Path(config.output_dir) / "source"))
    reasons.append(f"source {source}, target {target}" + ("" if target == "eurosat" or eurosat is None
                                                         else " (EuroSAT exists but this profile uses the sample)"))
    return TransferPlan(source, target, source_config, target_config, "; ".join(reasons))


def time_to_target(history: list[dict], target_top1: float) -> dict:
    """Epochs and training seconds (evaluation excluded) until val top-1 first reaches `target_top1`;
    None when it never does."""
    seconds = 0.0
    for row in history:
        seconds += row["epoch_seconds"]
        if row.get("val_top1", 0.0) >= target_top1 - 1e-9:
            return {"epochs": row["epoch"], "seconds": seconds}
    return {"epochs": None, "seconds": None}


def strategy_table(results: dict, target_top1: float, frozen_epochs: dict | None = None):
    """One row per labelled FitResult: best and final val top-1, epochs and seconds to `target_top1`,
    mean seconds per epoch with the backbone frozen and trainable. A pandas DataFrame."""
    import pandas as pd

    rows = {}
    for label, result in results.items():
        history = result.history
        frozen = (frozen_epochs or {}).get(label, result.config.freeze_backbone_epochs)
        frozen_rows, full_rows = history[:frozen], history[frozen:]
        reached = time_to_target(history, target_top1)
        rows[label] = {
            "best val top-1": max(row["val_top1"] for row in history),
            "final val top-1": history[-1]["val_top1"],
            "epochs to target": reached["epochs"],
            "train s to target": reached["seconds"],
            "train s total": sum(row["epoch_seconds"] for row in history),
            "s/epoch frozen": (sum(r["epoch_seconds"] for r in frozen_rows) / len(frozen_rows)) if frozen_rows else None,
            "s/epoch trainable": (sum(r["epoch_seconds"] for r in full_rows) / len(full_rows)) if full_rows else None,
        }
    return pd.DataFrame.from_dict(rows, orient="index")


def plot_curves(results: dict, target_top1: float | None = None, axis=None, x: str = "epoch"):
    """Validation top-1 after each epoch for each labelled FitResult, against the epoch (`x="epoch"`)
    or the training seconds so far (`x="seconds"`); head-only epochs drawn with open markers."""
    import itertools

    import matplotlib.pyplot as plt

    axis = axis or plt.gca()
    for label, result in results.items():
        if x == "seconds":
            positions = list(itertools.accumulate(row["epoch_seconds"] for row in result.history))
        else:
            positions = [row["epoch"] for row in result.history]
        accuracy = [row["val_top1"] for row in result.history]
        line, = axis.plot(positions, accuracy, marker="o", label=label)
        frozen = result.config.freeze_backbone_epochs
        if frozen:
            axis.plot(positions[:frozen], accuracy[:frozen], linestyle="none", marker="o", markersize=9,
                      markerfacecolor="white", color=line.get_color())
    if target_top1 is not None:
        axis.axhline(target_top1, color="grey", linestyle="--", linewidth=1, label=f"target {target_top1:.1%}")
    axis.set(xlabel="training seconds" if x == "seconds" else "epoch", ylabel="val top-1")
    axis.legend(fontsize=8)
    return axis
