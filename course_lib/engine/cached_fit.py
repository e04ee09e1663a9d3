"""Train once, reuse by digest: the model a config trains, loaded from its checkpoint when exactly that
config (and class list) has trained all its epochs, else trained now with `train.fit` (uvadlc's notebooks
load an expensive result when it is present instead of computing it again).

The checkpoint lives in `CACHE_DIR/<digest>/`, the digest (`checkpoint.config_digest`) of every value that
decides the weights, so two chapters that train the same config share one model: notebooks 09 and 13 both
start from the speed-run recipe's model, and notebook 08 from its source model. A reader pays once.
"""
from __future__ import annotations

import dataclasses
from pathlib import Path

from course_lib import paths
from course_lib.config import Config
from course_lib.models import checkpoint

CACHE_DIR = "runs/checkpoints/cached"  # one folder per digest, each a run's output_dir


@dataclasses.dataclass
class CachedFit:
    """A model `cached_fit` trained or found: the model (eval mode), its per-epoch history, its checkpoint,
    the config it trained with (output_dir its digest's folder), and whether it was reused."""

    model: object
    history: list[dict]
    checkpoint_path: Path
    config: Config
    classes: list[str]
    digest: str
    reused: bool

    @property
    def final(self) -> dict:
        return self.history[-1] if self.history else {}

    @property
    def how(self) -> str:
        return f"reused {self.checkpoint_path}" if self.reused else "trained"

    @property
    def training_seconds(self) -> float:
        return sum(row.get("epoch_seconds", 0.0) for row in self.history)


def digest(config: Config, classes: list | None, extra: dict | None = None) -> str:
    """The name of `config`'s model: a digest of its values (where it is written and how it is loaded
    left out: `checkpoint.BOOKKEEPING_FIELDS`), the class list and `extra`."""
    return checkpoint.config_digest({**config.to_dict(), "classes": classes, **(extra or {})})


def cached_fit(config: Config, bundle=None, classes: list | None = None, *, extra: dict | None = None,
               folder: str = CACHE_DIR, **fit_options) -> CachedFit:
    """The model `config` trains on `bundle` (None: the data the config names, whose `classes` the caller
    may pass for the digest): reused from `folder/<digest>/last.pt` when that checkpoint trained these
    values for all `config.epochs` with these classes, else trained now there (`train.fit(...,
    **fit_options)`). `extra`: anything else that decides the weights (a source model's class list)."""
    from course_lib.engine import train
    from course_lib.models import factory

    if bundle is None and classes is None:  # two callers of one model must name it alike
        raise ValueError("cached_fit needs the bundle or its classes: the class list is part of the model's name "
                         "(pass classes=bundle.classes)")
    classes = list(bundle.classes) if bundle is not None else list(classes)
    name = digest(config, classes, extra)
    config = config.replace(output_dir=f"{str(folder).rstrip('/')}/{name}", resume=False)
    path = paths.resolve_path(config.output_dir) / checkpoint.LAST_NAME
    saved = _matching(path, config, classes)
    if saved is not None:
        return CachedFit(factory.model_from_checkpoint(path), saved["history"], path, config,
                         list(saved["classes"]), name, True)
    result = train.fit(config, bundle=bundle, **fit_options)
    return CachedFit(result.model, result.history, result.checkpoint_path or path, config, list(result.classes),
                     name, False)


def _matching(path: Path, config: Config, classes: list | None) -> dict | None:
    """The checkpoint at `path` when it finished `config`'s epochs with its values and `classes`; else None
    (absent, damaged, a run cut short, or another config: it is trained again over it)."""
    if not path.exists():
        return None
    try:
        saved = checkpoint.load_checkpoint(path)
    except checkpoint.CheckpointError:
        return None
    values = config.to_dict()
    same = saved.get("epoch") == config.epochs and all(
        saved["config"].get(name) == value for name, value in values.items()
        if name not in checkpoint.BOOKKEEPING_FIELDS)
    return saved if same and (classes is None or list(saved["classes"]) == classes) else None
