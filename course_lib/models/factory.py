"""Building models: any timm model with a new number of classes, random or with timm's ImageNet
weights, or with the backbone of a workbook checkpoint under a new head; rebuilding the model a
checkpoint was trained as. Analysis uses this without the training engine.
"""
from __future__ import annotations

import os
from pathlib import Path

import torch

from course_lib import paths
from course_lib.config import Config, ConfigError, make_config
from course_lib.models import checkpoint, hub


def build_model(config: Config, num_classes: int, classes: list[str] | None = None) -> torch.nn.Module:
    """A timm model with `num_classes` outputs: random init, timm's pretrained weights, or the
    weights of a workbook checkpoint (`config.checkpoint`), whose head is replaced by a new one
    unless it was trained on `classes` (see `factory.load_backbone`)."""
    import timm

    if not timm.is_model(config.model):
        similar = timm.list_models(f"*{config.model.split('.')[0][:8]}*")[:8]
        hint = f"similar names: {', '.join(similar)}" if similar else "see timm.list_models()"
        raise ConfigError(f"unknown timm model {config.model!r}; {hint}")
    # A checkpoint overwrites every backbone weight, so ImageNet weights would be downloaded for nothing.
    model = create_model(config.model, num_classes, pretrained=config.pretrained and not config.checkpoint,
                         **architecture_options(config))
    if config.checkpoint:
        load_backbone(model, paths.resolve_path(config.checkpoint), classes, config.model)
    return model


def architecture_options(config: Config) -> dict:
    """The keyword arguments of `timm.create_model` that Config fields choose: `activation` for the workbook's
    speedrun_resnet nets ("" leaves every model its own; config.py refuses it for the others)."""
    return {"activation": config.activation} if config.activation else {}


def model_from_checkpoint(path: str | os.PathLike, map_location="cpu", use_ema: bool = False) -> torch.nn.Module:
    """Rebuild the model a checkpoint was trained as and load its (or its EMA's) weights, in eval mode."""
    state = load_trained(path, map_location=map_location)
    config = checkpoint_config(state, path)
    model = build_model(config, len(state["classes"]))
    if use_ema and state.get("ema") is None:
        raise ConfigError(f"{path} has no EMA weights (trained with ema_decay=0)")
    load_weights(model, state["ema"] if use_ema else state["model"], path, config.model)
    return model.to(map_location).eval()


# Fields that decide what a checkpoint's tensors compute: evaluation and export take them from the checkpoint, so
# `-p model=...` there would only build a model the weights cannot fill, and `-p activation=...` one they fit but
# that computes something else.
ARCHITECTURE_FIELDS = ("model", "activation")


def load_trained(path: str | os.PathLike, map_location="cpu") -> dict:
    """`checkpoint.load_checkpoint`, plus the entries that rebuilding the model and its data needs:
    'config' (a dict) and 'classes' (at least one name). A file without them is one CheckpointError."""
    state = checkpoint.load_checkpoint(path, map_location=map_location)
    for entry, kind in (("config", dict), ("classes", (list, tuple))):
        if not isinstance(state.get(entry), kind) or not state[entry]:
            raise checkpoint.CheckpointError(
                f"{path} has no {entry!r} entry, so its model and data cannot be rebuilt; use a checkpoint "
                "written by `workbook train` (or save 'config' and 'classes' with save_checkpoint)")
    return state


def checkpoint_config(state: dict, path: str | os.PathLike, **overrides) -> Config:
    """The Config a trained checkpoint is evaluated or exported with: its stored values (unknown names
    dropped), no start checkpoint or hub weights, then `overrides`; changing ARCHITECTURE_FIELDS is refused."""
    from course_lib.config import FIELD_NAMES

    stored = {key: value for key, value in state["config"].items() if key in FIELD_NAMES}
    for name in ARCHITECTURE_FIELDS:
        if name in overrides and overrides[name] is not None and overrides[name] != stored.get(name):
            holds = f"a {stored.get(name)}" if name == "model" else f"{name}={stored.get(name)!r}"
            raise ConfigError(f"-p {name}={overrides[name]} does not fit {path}, which holds {holds}; "
                              f"drop -p {name}= (the model comes from the checkpoint)")
    return make_config(None, **{**stored, "checkpoint": "", "pretrained": False,
                                **{key: value for key, value in overrides.items() if value is not None}})


def load_weights(model: torch.nn.Module, state_dict: dict, path: str | os.PathLike, model_name: str) -> None:
    """A strict `load_state_dict`; tensors that do not fit are one CheckpointError, not a page of shapes."""
    try:
        model.load_state_dict(state_dict)
    except RuntimeError as error:
        detail = " ".join(str(error).split())[:160]
        raise checkpoint.CheckpointError(f"the weights in {path} do not fit a {model_name} ({detail}); "
                                          "use the checkpoint with the model it was trained as") from None


def create_model(model_name: str, num_classes: int, pretrained: bool = False, **options) -> torch.nn.Module:
    """`timm.create_model` with `num_classes` outputs (and `options`, `architecture_options`). With `pretrained`,
    timm loads the ImageNet weights from the Hugging Face cache or hub and gives the model a freshly initialised
    head; when it cannot, this raises a one-line hub.PretrainedWeightsError saying how to fix it."""
    import timm

    if not pretrained:
        return timm.create_model(model_name, num_classes=num_classes, **options)
    if hub.weights_repository(model_name) is None:
        raise hub.PretrainedWeightsError(f"timm has no pretrained weights for {model_name}; pick a name from "
                                     "timm.list_models(pretrained=True) or set pretrained=false")
    # Offline, huggingface_hub retries for about 50 s before giving up: fail at once instead.
    if not hub.weights_cached(model_name) and not hub.hub_reachable():
        raise hub._unavailable(model_name, f"{hub.weights_repository(model_name)} is not in the Hugging Face cache and "
                                       "the hub cannot be reached")
    try:
        return timm.create_model(model_name, pretrained=True, num_classes=num_classes, **options)
    except Exception as error:  # hub errors come in many types (LocalEntryNotFoundError, HTTPError, ...)
        raise hub._unavailable(model_name, f"{type(error).__name__}: {checkpoint._first_line(error)[:120]}") from None


def load_backbone(model: torch.nn.Module, path: str | os.PathLike, classes: list[str] | None = None,
                  model_name: str | None = None) -> dict:
    """Load a workbook checkpoint's weights into `model` strictly (a wrong architecture fails loudly), keeping the
    checkpoint's head when its classes are `classes` (None: when the count agrees), else a new head of `model`'s."""
    path = Path(path)
    state = checkpoint.load_checkpoint(path)
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
        raise checkpoint.CheckpointError(f"checkpoint {path} does not fit {model_name or type(model).__name__} "
                                          f"({detail}); start from a checkpoint of the same model") from None
    same_task = source_classes == list(classes) if classes is not None else len(source_classes) == target_count
    if not same_task:
        model.reset_classifier(target_count)  # a new, randomly initialised head for the target classes
    return {"source_classes": source_classes, "head": "kept" if same_task else "new"}


def head_parameters(model: torch.nn.Module) -> list[torch.nn.Parameter]:
    return list(model.get_classifier().parameters())


def backbone_parameters(model: torch.nn.Module) -> list[torch.nn.Parameter]:
    head = {id(parameter) for parameter in head_parameters(model)}
    return [parameter for parameter in model.parameters() if id(parameter) not in head]


def count_parameters(model: torch.nn.Module, trainable_only: bool = False) -> int:
    return sum(p.numel() for p in model.parameters() if p.requires_grad or not trainable_only)
