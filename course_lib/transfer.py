"""Transfer learning: start from weights trained on another task (timm's ImageNet weights from the
Hugging Face hub, or a workbook checkpoint), give the model a new classifier head, and fine-tune it,
optionally training only the head for the first epochs and the backbone at a smaller learning rate.

Why it works: Yosinski et al. 2014, "How transferable are features in deep neural networks?"
(arXiv:1411.1792). Head first, then everything with per-layer-group learning rates: Howard & Ruder
2018, "Universal Language Model Fine-tuning" (arXiv:1801.06146). Heads are swapped with timm's
`get_classifier()` / `reset_classifier(num_classes)` (https://huggingface.co/docs/timm/feature_extraction).
The engine (`train.fit`) calls `set_backbone_trainable`, `freeze_batchnorm` and `scale_backbone_lr`
when `freeze_backbone_epochs` / `backbone_lr_scale` are set.
"""
from __future__ import annotations

import dataclasses
import os
import socket
from pathlib import Path
from urllib.parse import urlparse

import torch

from course_lib import checkpoint as checkpoints
from course_lib.config import SAMPLE_DATA_DIR, Config, ConfigError

# What the article reports (section 5.4): an industrial inspection task, ResNet-50.
ARTICLE = {"scratch_epochs": 350, "scratch_top1": 0.92, "finetune_epochs": 40, "finetune_top1": 0.935,
           "time_saved": 0.80, "head_lr": 1e-3, "finetune_lr": 1e-4}


class PretrainedWeightsError(ConfigError):
    """timm's pretrained weights cannot be loaded here; the message names the ways to get them."""


# ---------------------------------------------------------------------------------------------
# Pretrained weights: timm's create_model(pretrained=True), with a one-line error offline
# ---------------------------------------------------------------------------------------------

def weights_repository(model_name: str) -> str | None:
    """The Hugging Face hub repository timm loads `model_name`'s default weights from, or None."""
    from timm.models import get_pretrained_cfg

    pretrained_cfg = get_pretrained_cfg(model_name)
    return getattr(pretrained_cfg, "hf_hub_id", None) or None


def weights_cached(model_name: str) -> bool:
    """Whether the Hugging Face cache (HF_HOME) already holds the weights timm would load."""
    from huggingface_hub import try_to_load_from_cache

    repository = weights_repository(model_name)
    if repository is None:
        return False
    return any(isinstance(try_to_load_from_cache(repository, name), str)
               for name in ("model.safetensors", "pytorch_model.bin"))


def hub_reachable(timeout_seconds: float = 3.0) -> bool:
    """Whether the Hugging Face hub answers a TCP connection (HF_HUB_OFFLINE=1 counts as no)."""
    from huggingface_hub import constants

    if constants.HF_HUB_OFFLINE:
        return False
    endpoint = urlparse(constants.ENDPOINT)
    try:
        with socket.create_connection((endpoint.hostname, endpoint.port or 443), timeout=timeout_seconds):
            return True
    except OSError:
        return False


def pretrained_available(model_name: str) -> bool:
    """timm has weights for `model_name` and they are cached or downloadable right now."""
    return weights_repository(model_name) is not None and (weights_cached(model_name) or hub_reachable())


def _unavailable(model_name: str, detail: str) -> PretrainedWeightsError:
    return PretrainedWeightsError(
        f"pretrained weights for {model_name} are not available ({detail}); be online once so timm can "
        "download them into the Hugging Face cache, or set HF_HUB_OFFLINE=1 with a cache (HF_HOME) that "
        "holds them, or start from a workbook checkpoint with checkpoint=<path> pretrained=false")


def create_model(model_name: str, num_classes: int, pretrained: bool = False) -> torch.nn.Module:
    """`timm.create_model` with `num_classes` outputs. With `pretrained`, timm loads the ImageNet
    weights from the Hugging Face cache or hub and gives the model a freshly initialised head;
    when it cannot, this raises a one-line PretrainedWeightsError saying how to fix it."""
    import timm

    if not pretrained:
        return timm.create_model(model_name, num_classes=num_classes)
    if weights_repository(model_name) is None:
        raise PretrainedWeightsError(f"timm has no pretrained weights for {model_name}; pick a name from "
                                     "timm.list_models(pretrained=True) or set pretrained=false")
    # Offline, huggingface_hub retries for about 50 s before giving up: fail at once instead.
    if not weights_cached(model_name) and not hub_reachable():
        raise _unavailable(model_name, f"{weights_repository(model_name)} is not in the Hugging Face cache and "
                                       "the hub cannot be reached")
    try:
        return timm.create_model(model_name, pretrained=True, num_classes=num_classes)
    except Exception as error:  # hub errors come in many types (LocalEntryNotFoundError, HTTPError, ...)
        first_line = (str(error).strip().splitlines() or [type(error).__name__])[0]
        raise _unavailable(model_name, f"{type(error).__name__}: {first_line[:120]}") from None


# ---------------------------------------------------------------------------------------------
# Workbook checkpoints as a starting point: same backbone, possibly another head
# ---------------------------------------------------------------------------------------------

def load_backbone(model: torch.nn.Module, path: str | os.PathLike, classes: list[str] | None = None,
                  model_name: str | None = None) -> dict:
    """Load a workbook checkpoint's weights into `model`, keeping `model`'s number of classes.

    Every tensor must match (a strict load, so a wrong architecture fails loudly). The checkpoint's
    head is kept when its classes are `classes` (or, when `classes` is None, when the count agrees);
    otherwise the head is re-created with timm's `reset_classifier`. Returns what happened."""
    path = Path(path)
    state = checkpoints.load_checkpoint(path)
    saved_model = state.get("config", {}).get("model")
    if model_name and saved_model and saved_model != model_name:
        raise ConfigError(f"checkpoint {path} holds a {saved_model}, not a {model_name}; set model={saved_model}")
    source_classes = list(state.get("classes", []))
    target_count = model.num_classes
    model.reset_classifier(len(source_classes))  # the checkpoint's head shape, so the load can be strict
    try:
        model.load_state_dict(state["model"])  # strict: every tensor present, every shape equal
    except RuntimeError as error:
        detail = " ".join(str(error).split())[:200]
        raise checkpoints.CheckpointError(f"checkpoint {path} does not fit {model_name or type(model).__name__} "
                                          f"({detail}); start from a checkpoint of the same model") from None
    same_task = source_classes == list(classes) if classes is not None else len(source_classes) == target_count
    if not same_task:
        model.reset_classifier(target_count)  # a new, randomly initialised head for the target classes
    return {"source_classes": source_classes, "head": "kept" if same_task else "new"}


# ---------------------------------------------------------------------------------------------
# Freezing: the head is `model.get_classifier()`, the backbone is every other parameter
# ---------------------------------------------------------------------------------------------

def head_parameters(model: torch.nn.Module) -> list[torch.nn.Parameter]:
    return list(model.get_classifier().parameters())


def backbone_parameters(model: torch.nn.Module) -> list[torch.nn.Parameter]:
    head = {id(parameter) for parameter in head_parameters(model)}
    return [parameter for parameter in model.parameters() if id(parameter) not in head]


def set_backbone_trainable(model: torch.nn.Module, trainable: bool) -> None:
    """Switch gradients of every parameter outside the classifier on or off.

    Not `timm.utils.freeze(..., include_bn_running_stats=True)`: it swaps BatchNorm layers for
    FrozenBatchNorm2d and back, which creates new Parameter objects (the optimizer would keep
    updating the old ones) and renames state-dict entries (checkpoints would stop loading)."""
    for parameter in backbone_parameters(model):
        parameter.requires_grad_(trainable)


def freeze_batchnorm(model: torch.nn.Module) -> None:
    """Put the backbone's BatchNorm layers in eval mode; call after every `model.train()` while frozen.

    In train mode BatchNorm normalises with each batch's statistics and overwrites its running
    mean and variance with the new data's, so a backbone with frozen weights would still change
    the features it computes, and at evaluation (running statistics) the head would see other
    features than the ones it was trained on. Eval mode keeps the source task's statistics."""
    head = {id(module) for module in model.get_classifier().modules()}
    for module in model.modules():
        if isinstance(module, torch.nn.modules.batchnorm._BatchNorm) and id(module) not in head:
            module.eval()


def scale_backbone_lr(optimizer: torch.optim.Optimizer, model: torch.nn.Module,
                      scale: float) -> torch.optim.Optimizer:
    """`optimizer` with each parameter group split in place into a head part (learning rate as
    given) and a backbone part (learning rate x `scale`). Call before the first step and before
    building the scheduler, which then decays both parts by the same factor."""
    if scale == 1.0:
        return optimizer
    head = {id(parameter) for parameter in head_parameters(model)}
    groups = []
    for group in optimizer.param_groups:
        options = {key: value for key, value in group.items() if key != "params"}
        head_part = [p for p in group["params"] if id(p) in head]
        backbone_part = [p for p in group["params"] if id(p) not in head]
        groups.append({**options, "params": head_part})
        groups.append({**options, "params": backbone_part, "lr": group["lr"] * scale})
    optimizer.param_groups = []
    for group in groups:  # group 0 stays the head's: the engine logs param_groups[0]["lr"]
        if group["params"]:
            optimizer.add_param_group(group)
    return optimizer


def count_parameters(model: torch.nn.Module, trainable_only: bool = False) -> int:
    return sum(p.numel() for p in model.parameters() if p.requires_grad or not trainable_only)


# ---------------------------------------------------------------------------------------------
# Notebook 08: where the source weights come from, and reading the runs
# ---------------------------------------------------------------------------------------------

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

    target: real EuroSAT (`data.eurosat_shared_dir()`) when present and `real_data`, else the
    committed landcover-synth sample. source: timm's ImageNet weights when cached or downloadable,
    else a model pretrained here on landcover-synth (generated, `source_images_per_class` training
    images per class; for a EuroSAT target) or on scikit-learn's digits (for a landcover target)."""
    from course_lib import data

    eurosat = data.eurosat_shared_dir()
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
        if pretrained_available(config.model):
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
        folder = data.landcover_cache_dir(image_size=64, per_class=per_class, seed=1)
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
