"""Regularization tricks compared one at a time (notebook 07): each variant is a set of Config
overrides for the same baseline run; `score` measures a trained model on a split (top-1,
cross-entropy, calibration error) and `compare_to_baseline` says whether a variant's change is
larger than the run-to-run noise measured by repeating the baseline with other seeds.

The tricks themselves run inside the engine (`train.fit`): label smoothing (Szegedy et al. 2016,
arXiv:1512.00567), MixUp (Zhang et al. 2018, arXiv:1710.09412) and CutMix (Yun et al. 2019,
arXiv:1905.04899) through timm's `Mixup`, Random Erasing (Zhong et al. 2020, arXiv:1708.04896)
and a weight EMA (Polyak & Juditsky 1992) through timm's `ModelEmaV3`. Calibration error as in
Guo et al., "On Calibration of Modern Neural Networks", ICML 2017 (`calibration.expected_calibration_error`).
"""
from __future__ import annotations

from course_lib.analysis.statistics import _scores
from course_lib.config import ConfigError

# The article's "safe combination": label smoothing 0.1 + MixUp alpha 0.2 + light Random Erasing.
# "Light" is read as erasing a box in a quarter of the images (timm's usual probability).
ARTICLE_COMBO = {"label_smoothing": 0.1, "mixup_alpha": 0.2, "random_erasing": 0.25}
CUTMIX_ALPHA = 1.0  # Beta(1, 1): uniform box area, the CutMix paper's setting
EMA_PLACEHOLDER = "ema"  # in VARIANTS, stands for the run-length-dependent decay of `ema_decay_for`
# name -> Config overrides, in the order the notebook runs them; each changes one thing
# from the baseline, except the two combinations.
VARIANTS: dict[str, dict] = {
    "baseline": {},
    "label_smoothing": {"label_smoothing": 0.1},
    "mixup": {"mixup_alpha": 0.2},
    "cutmix": {"cutmix_alpha": CUTMIX_ALPHA},
    "random_erasing": {"random_erasing": 0.25},
    "ema": {"ema_decay": EMA_PLACEHOLDER},
    "article_combo": dict(ARTICLE_COMBO),
    "article_combo_ema": {**ARTICLE_COMBO, "ema_decay": EMA_PLACEHOLDER},
    # "Too many tricks can add noise": everything at once (timm switches MixUp/CutMix per batch).
    "everything": {**ARTICLE_COMBO, "cutmix_alpha": CUTMIX_ALPHA, "ema_decay": EMA_PLACEHOLDER},
}


def select_variants(names: str | list[str]) -> list[str]:
    """`"all"`, a comma-separated string or a list -> variant names in run order; "baseline" is
    always included (every comparison is against it)."""
    if isinstance(names, str):
        names = list(VARIANTS) if names.strip() == "all" else [n.strip() for n in names.split(",") if n.strip()]
    unknown = [n for n in names if n not in VARIANTS]
    if unknown:
        raise ConfigError(f"unknown variant {unknown[0]!r}; valid variants: all, {', '.join(VARIANTS)}")
    wanted = set(names) | {"baseline"}
    return [name for name in VARIANTS if name in wanted]


def ema_decay_for(total_steps: int, horizon_fraction: float = 0.1) -> float:
    """An EMA decay whose averaging horizon 1 / (1 - decay) is `horizon_fraction` of the run
    (at least 2 steps). A fixed 0.9999 averages over ~10,000 steps: on a run of a few hundred
    steps the EMA would still be mostly the random initial weights."""
    if total_steps < 1:
        raise ConfigError(f"total_steps must be at least 1, got {total_steps}")
    horizon = max(2.0, horizon_fraction * total_steps)
    return 1.0 - 1.0 / horizon


def variant_config(config, name: str, ema_decay: float, seed: int | None = None):
    """The baseline `config` with variant `name`'s overrides and its own output_dir
    (`<output_dir>/07_<name>`, plus `_seed<N>` when `seed` is given: fit writes `last.pt`
    there, so runs must not share one)."""
    if name not in VARIANTS:
        raise ConfigError(f"unknown variant {name!r}; valid variants: {', '.join(VARIANTS)}")
    overrides = {key: (ema_decay if value == EMA_PLACEHOLDER else value) for key, value in VARIANTS[name].items()}
    folder = f"{config.output_dir.rstrip('/')}/07_{name}"
    if seed is not None:
        overrides["seed"] = seed
        folder += f"_seed{seed}"
    return config.replace(**overrides, output_dir=folder)


def fit_variant(config, name: str, ema_decay: float, bundle, seed: int | None = None, **fit_options):
    """Train variant `name` (`variant_config`) on `bundle` with `train.fit`. The engine's
    per-epoch validation is switched off (the bundle is passed without its val split): the
    notebook scores every run once with `score_run`, which also needs the probabilities for ECE."""
    import dataclasses

    from course_lib.engine import train

    fit_options = {"progress": True, "verbose": False, **fit_options}  # a bar per epoch, no log lines
    return train.fit(variant_config(config, name, ema_decay, seed), bundle=dataclasses.replace(bundle, val=None),
                     **fit_options)




def score(model, dataset, config, bins: int = 15) -> dict:
    """top-1, mean cross-entropy, expected calibration error and mean confidence of `model` on
    `dataset` (fp32 forward passes, `evaluation.predict`)."""
    from course_lib.analysis import evaluation

    labels, probabilities = evaluation.predict(model, dataset, config)
    return _scores(labels, probabilities, bins)


def training_speed(history: list[dict]) -> dict:
    """images/s and seconds of training (evaluation excluded). With more than one epoch the first
    is dropped from images/s as a warm-up (allocator, cuDNN autotuning, worker start)."""
    if not history:
        raise ValueError("empty history: the run completed no epoch")
    timed = history[1:] if len(history) > 1 else history
    images = sum(row["images_per_second"] * row["epoch_seconds"] for row in timed)
    seconds = sum(row["epoch_seconds"] for row in timed)
    return {"images_per_second": images / seconds,
            "train_seconds": sum(row["epoch_seconds"] for row in history)}


def choose_weights(raw: dict, ema: dict | None) -> str:
    """The article's rule: evaluate the EMA and the raw weights on the validation set and keep
    the better one (higher top-1; on a tie, lower loss). Returns "raw" or "ema"."""
    if ema is None:
        return "raw"
    if ema["top1"] != raw["top1"]:
        return "ema" if ema["top1"] > raw["top1"] else "raw"
    return "ema" if ema["loss"] < raw["loss"] else "raw"


def score_run(name: str, result, dataset) -> list[dict]:
    """Rows of the comparison table for one `train.fit` result: its raw weights and, when it kept
    a weight EMA, the EMA weights too, each scored on `dataset`; "kept" marks the weights
    `choose_weights` keeps. Speed is the run's training speed (`training_speed`)."""
    speed = training_speed(result.history)
    raw = score(result.model, dataset, result.config)
    ema = score(result.ema_model, dataset, result.config) if result.ema_model is not None else None
    kept = choose_weights(raw, ema)
    rows = []
    for weights, scores in (("raw", raw), ("ema", ema)):
        if scores is not None:
            rows.append({"variant": name, "weights": weights, "kept": weights == kept,
                         "val top-1": scores["top1"], "val loss": scores["loss"], "ECE": scores["ece"],
                         "confidence": scores["confidence"], "images/s": speed["images_per_second"],
                         "train s": speed["train_seconds"]})
    return rows
