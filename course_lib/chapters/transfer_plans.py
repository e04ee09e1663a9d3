"""Notebook 08's transfer-learning plan and its measurements (Kornblith et al. 2019, arXiv:1805.08974). The source
of the pretrained weights is timm's ImageNet weights when cached, else a model pre-trained here on classes of the
same dataset the target never sees (`data.class_split`), or scikit-learn's digits as an unrelated source; the target
is the remaining classes with a few labels per class. The source is trained once and reused by the digest of its
config (`engine.cached_fit`); the mechanics live in `models.factory` and `engine.freeze`.
"""
from __future__ import annotations

import dataclasses
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from course_lib import paths
from course_lib.analysis import claims as claim_records
from course_lib.analysis import statistics
from course_lib.chapters.setup import ChapterSetup, sizes
from course_lib.config import SAMPLE_DATA_DIR, Config, ConfigError, make_config, resolve_profile
from course_lib.data import class_split, pipeline
from course_lib.engine import train
from course_lib.engine.cached_fit import cached_fit
from course_lib.models import hub

SOURCE_NAMES = ("imagenet", "classes", "digits")


@dataclasses.dataclass
class TransferPlan:
    source: str  # imagenet | classes (other classes of the target's dataset) | digits
    target: str  # the target data's name: eurosat (or another real dataset found) | landcover-synth
    data_config: Config  # the whole labelled dataset: source classes and target classes
    source_config: Config | None  # the source pretraining run; None for timm's ImageNet weights
    target_config: Config  # the target runs' data, model and schedule (strategies change lr/start/freezing)
    synthetic: bool  # True when the target is generated landcover-synth, not real images
    reason: str  # one line: why this source and target on this machine


def plan_transfer(config: Config, source: str | None = None, target: str | None = None,
                  source_epochs: int = 6, data: paths.DataChoice | None = None) -> TransferPlan:
    """A source of pretrained weights and a target dataset that exist here. target auto: `data` when real (None: what
    `paths.find_real_data` finds), else landcover-synth; eurosat; or landcover-synth (the config's own, else the
    sample). source None: timm's ImageNet weights when cached or downloadable, else `classes`."""
    if target in (None, "auto"):
        data = data if data is not None else paths.find_real_data()
        found = data if data is not None and data.real else None
    elif target == "eurosat":
        folder = paths.eurosat_dir()
        if folder is None:
            raise FileNotFoundError(f"target=eurosat needs real EuroSAT ({paths.DATA_ENV}, data_cache/eurosat/ or "
                                    f"../shared/datasets/eurosat_rgb): run `{paths.GET_REAL_DATA}`, or use "
                                    "target=landcover-synth")
        found = paths.DataChoice({"dataset": "imagefolder", "data_dir": str(folder)}, "eurosat", "target=eurosat",
                                 False, folder)
    elif target == "landcover-synth":
        found = None
    else:
        raise ConfigError(f"target={target!r} is not one of auto, eurosat, landcover-synth")
    synthetic = found is None
    # Else the profile's own landcover-synth (the sample in smoke, generated on first use otherwise), else the
    # committed sample (8 generated classes, 40 training images each).
    own = found.overrides if found else {} if config.dataset == "landcover-synth" else {
        "dataset": "landcover-synth", "data_dir": SAMPLE_DATA_DIR}
    target, data_config = found.name if found else "landcover-synth", config.replace(**own, max_train_images=0)
    reasons = []
    if source is None:
        source = "imagenet" if hub.pretrained_available(config.model) else "classes"
        if source == "classes":
            reasons.append(f"ImageNet weights for {config.model} are neither cached nor downloadable here")
    if source not in SOURCE_NAMES:
        raise ConfigError(f"source={source!r} is not one of {', '.join(SOURCE_NAMES)}")
    source_config = None
    if source != "imagenet":  # pre-trained here from random weights
        base = data_config if source == "classes" else config.replace(
            dataset="digits", data_dir="", max_train_images=0, storage="files", decoder="pil")
        source_config = base.replace(epochs=source_epochs, pretrained=False, checkpoint="", freeze_backbone_epochs=0,
                                     backbone_lr_scale=1.0, output_dir=str(Path(config.output_dir) / "source"))
    reasons.append(f"source {source}, target {target}" + (" (generated images: synthetic data)"
                                                         if synthetic else " (real images)"))
    return TransferPlan(source, target, data_config, source_config, data_config, synthetic, "; ".join(reasons))


# Off smoke: the workbook's fast path (config.RECIPES["speedrun"]): a small residual net, the split pre-decoded in
# memory, the square's symmetries as augmentation on the device, no loader workers. The memmapped cache (class
# subsets of it are DataLoader datasets) and full-size images every epoch: fine-tuning from a 64 px source keeps
# the size it was trained at.
FAST = {"recipe": "speedrun", "model": "speedrun_resnet_small", "batch_size": 128, "tta_views": 1, "storage": "cache",
        "min_image_size": 0}
# Per profile: Config values over the profile's; labelled target images per class; source training images per
# class (0: all); the source's epochs; the target runs' epochs, frozen-backbone epochs and seeds; and their
# optimizer steps per epoch (0: the whole labelled set).
SIZES = {
    "smoke": dict(config={}, labels_per_class=[5], source_per_class=0, source_epochs=1, epochs=2, frozen_epochs=1,
                  seeds=2, max_steps=1),
    "cpu": dict(config=FAST, labels_per_class=[10, 50, 200], source_per_class=1000, source_epochs=4, epochs=10,
                frozen_epochs=3, seeds=3, max_steps=0),
    "gpu": dict(config=FAST, labels_per_class=[10, 50, 200], source_per_class=0, source_epochs=4, epochs=10,
                frozen_epochs=3, seeds=3, max_steps=0),
}


@dataclasses.dataclass(kw_only=True)
class TransferSetup(ChapterSetup):
    """Notebook 08's data, plan, whole labelled dataset (`bundle`: every class) and sizes fitted to the data."""

    plan: TransferPlan
    source_classes: list[str]
    held_out: list[str]
    epochs: int
    freeze_backbone_epochs: int
    source_epochs: int
    source_per_class: int  # 0: every image of the source classes
    labels_per_class: list[int]
    seeds: list[int]
    notes: list[str]  # sizes the data could not hold, and what they became
    max_steps: int = 0  # optimizer steps per epoch of every target run; 0: the whole labelled set (smoke: 1)

    def line(self) -> str:
        """The plan, what the data could not hold, the classes and sizes, and the hardware."""
        counts = (f"data {self.bundle.source}: {len(self.bundle.train)} training / {len(self.bundle.val)} validation "
                  f"images, {self.bundle.num_classes} classes\nsource classes {self.source_classes}"
                  f"{f' ({self.source_per_class} images each)' if self.source_per_class else ''}\n"
                  f"target classes {self.held_out}, {self.labels_per_class} labels per class, seeds {self.seeds}")
        synthetic = (["SYNTHETIC DATA: the target is generated landcover-synth, not real images; the numbers below "
                      "only show that the code runs."] if self.plan.synthetic else [])
        return "\n".join([self.plan.reason, *self.notes, counts, *synthetic, f"hardware: {self.hardware}"])


def _fitted(parameter: str, asked: int, available: int, given: bool, notes: list[str]) -> int:
    """`asked` when the data holds it; else the profile's choice is cut to `available` (noted), the reader's a
    ConfigError naming the largest value that fits."""
    if asked <= available:
        return asked
    if given:
        raise ConfigError(f"{parameter}={asked} asks for more training images per class than the data has "
                          f"({available}); set -p {parameter}=N with N <= {available}")
    notes.append(f"{parameter}: {asked} -> {available} (what the smallest class has)")
    return available


def setup(profile: str, *, model: str | None = None, batch_size: int | None = None,
          image_size: int | None = None, epochs: int | None = None, freeze_backbone_epochs: int | None = None,
          source: str = "auto", target: str = "auto", source_epochs: int = 0, source_per_class: int = 0,
          target_classes: int = 3, labels_per_class=(), seeds: int = 0, **fields) -> TransferSetup:
    """Notebook 08's data (`paths.choose_data`) and sizes from its parameters (0, [] and None: the profile's), the
    source images and labels per class cut to the smallest class; `fields`: other Config fields, applied last."""
    profile = resolve_profile(profile)
    chosen = sizes(SIZES, profile)
    given = {k: v for k, v in {"model": model, "batch_size": batch_size, "image_size": image_size}.items() if v}
    config = make_config(profile, **{**chosen["config"], **given, "output_dir": "runs/checkpoints/08_transfer",
                                     **fields})
    data = paths.choose_data(profile)  # the smoke profile: the committed sample, unless WORKBOOK_DATA names a folder
    # `data` even when it is the sample: given None, plan_transfer would look for real data itself,
    # and the smoke profile would train on EuroSAT wherever it lies beside the project.
    plan = plan_transfer(config, source=None if source == "auto" else source, target=target,
                         source_epochs=source_epochs or chosen["source_epochs"], data=data)
    if target != "auto":  # what the target parameter chose instead
        folder = paths.resolve_path(plan.data_config.data_dir) if plan.data_config.data_dir else None
        data = paths.DataChoice({"dataset": plan.data_config.dataset, "data_dir": plan.data_config.data_dir},
                                plan.target, f"the target parameter ({target})", plan.synthetic, folder)
    whole = pipeline.build_datasets(plan.data_config)
    source_classes, held_out = class_split.split_classes(whole.classes, target_classes, seed=0)
    notes: list[str] = []
    targets = class_split.targets_of(whole.train)
    largest_source = class_split.smallest_class(targets, [whole.classes.index(c) for c in source_classes])
    largest_target = class_split.smallest_class(targets, [whole.classes.index(c) for c in held_out])
    per_source = _fitted("source_per_class", source_per_class or chosen["source_per_class"], largest_source,
                         bool(source_per_class), notes)
    labels = sorted({_fitted("labels_per_class", count, largest_target, bool(labels_per_class), notes)
                     for count in (list(labels_per_class) or chosen["labels_per_class"])})
    return TransferSetup(
        profile=profile, data=data, config=config, bundle=whole, plan=plan, source_classes=source_classes,
        held_out=held_out, epochs=epochs or chosen["epochs"],
        freeze_backbone_epochs=freeze_backbone_epochs if freeze_backbone_epochs is not None else chosen["frozen_epochs"],
        source_epochs=plan.source_config.epochs if plan.source_config else 0, source_per_class=per_source,
        labels_per_class=labels, seeds=list(range(seeds or chosen["seeds"])), notes=notes,
        max_steps=chosen["max_steps"])


def source_checkpoint(source_config: Config, bundle, *, extra: dict | None = None, progress: bool = True) -> dict:
    """The source model's checkpoint (`engine.cached_fit`: reused from `<output_dir>/<digest>/` while the config and
    `extra`, e.g. its classes, match; else trained now), described for the notebook's table."""
    fitted = cached_fit(source_config, bundle, extra=extra, folder=source_config.output_dir, progress=progress,
                        verbose=False)
    return {"digest": fitted.digest, "checkpoint": str(fitted.checkpoint_path), "classes": fitted.classes,
            "training_images": len(bundle.train), "epochs": len(fitted.history), "val_top1": fitted.final.get("val_top1"),
            "training_seconds": fitted.training_seconds, "reused": fitted.reused}


def target_batch_size(images: int, batch_size: int) -> int:
    """At most `batch_size`, and small enough for two optimizer steps per epoch of `images` (the engine drops the
    last partial batch)."""
    return max(1, min(batch_size, images // 2))


def label_grid(strategies: dict, bundle, classes: list[str], labels_per_class, seeds, *, val_per_class: int = 0,
               progress: bool = True, echo=print) -> tuple[list[dict], dict]:
    """Train every strategy (label -> Config) on `labels_per_class` labelled images of each of `classes`, once per
    seed (which picks the images, the head and the data order), scored on `val_per_class` images per class (0: all).
    Returns (one row per run, {(labels, strategy, seed): FitResult})."""
    rows, results = [], {}
    for labels in labels_per_class:
        for seed in seeds:
            target = class_split.subset_bundle(bundle, classes, per_class=labels, seed=seed,
                                               val_per_class=val_per_class, parameter="labels_per_class")
            batch = target_batch_size(len(target.train), next(iter(strategies.values())).batch_size)
            for index, (name, config) in enumerate(strategies.items()):
                run = config.replace(seed=seed, batch_size=batch, output_dir=f"{config.output_dir}/target{index}")
                result = train.fit(run, bundle=target, progress=progress, verbose=False)
                results[(labels, name, seed)] = result
                rows.append({"labels per class": labels, "strategy": name, "seed": seed,
                             "training images": len(target.train), "validation images": len(target.val),
                             "batch": batch, "final val top-1": result.final["val_top1"],
                             "best val top-1": max(row["val_top1"] for row in result.history),
                             "train s": sum(row["epoch_seconds"] for row in result.history)})
                if echo:
                    echo(f"{labels:>4} labels/class  seed {seed}  {name:<22} val top-1 {rows[-1]['final val top-1']:.1%}")
    return rows, results


def transfer_verdict(rows: list[dict], baseline: str = "from scratch", metric: str = "final val top-1",
                     z: float = 2.0):
    """Per labels-per-class and strategy: mean and std over seeds, the difference from `baseline` and its noise band
    (`statistics.difference_beyond_noise`, the binomial error on the validation images as the floor) and the verdict."""
    frame = pd.DataFrame(rows)
    out = []
    for labels, group in frame.groupby("labels per class", sort=True):
        reference = group[group["strategy"] == baseline][metric].to_numpy()
        images = int(group["validation images"].iloc[0])
        for name, runs in group.groupby("strategy", sort=False):
            values = runs[metric].to_numpy()
            row = {"labels per class": labels, "strategy": name, "seeds": len(values), "mean": values.mean(),
                   "std": values.std(ddof=1) if len(values) > 1 else float("nan")}
            if name != baseline and len(reference) and (len(values) > 1 or len(reference) > 1):
                floor = statistics.binomial_std(float(values.mean()), images)
                test = statistics.difference_beyond_noise(values, reference, z=z, floor=floor)
                verdict = {1: f"beats {baseline} beyond seed noise", -1: f"worse than {baseline} beyond seed noise",
                           0: "within seed noise"}[test["beyond"]]
                row.update({"delta vs scratch": test["delta"], "noise band": test["band"], "verdict": verdict})
            out.append(row)
    return pd.DataFrame(out).set_index(["labels per class", "strategy"])


def mean_curves(results: dict, labels: int) -> dict:
    """{strategy: {"epoch", "seconds", "val_top1"}} at `labels` labels per class: validation top-1 after each epoch
    and the training seconds so far, averaged over the seeds."""
    curves: dict[str, list] = {}
    for (count, name, _seed), result in results.items():
        if count == labels:
            curves.setdefault(name, []).append(result.history)
    out = {}
    for name, histories in curves.items():
        accuracy = np.mean([[row["val_top1"] for row in history] for history in histories], axis=0)
        seconds = np.mean([np.cumsum([row["epoch_seconds"] for row in history]) for history in histories], axis=0)
        out[name] = {"epoch": list(range(1, len(accuracy) + 1)), "seconds": seconds.tolist(),
                     "val_top1": accuracy.tolist()}
    return out


def _first_reached(accuracies: list[float], target_top1: float) -> int | None:
    """The index of the first accuracy at `target_top1` or above (None: never)."""
    return next((i for i, value in enumerate(accuracies) if value >= target_top1 - 1e-9), None)


def time_to_target(history: list[dict], target_top1: float) -> dict:
    """Epochs and training seconds (evaluation excluded) until val top-1 first reaches `target_top1` (None: never)."""
    reached = _first_reached([row.get("val_top1", 0.0) for row in history], target_top1)
    if reached is None:
        return {"epochs": None, "seconds": None}
    return {"epochs": history[reached]["epoch"], "seconds": sum(row["epoch_seconds"] for row in history[:reached + 1])}


def curve_table(curves: dict, target_top1: float):
    """One row per strategy of `mean_curves`: final and best val top-1, and the epochs and training seconds until the
    seed-averaged curve first reaches `target_top1` (None: never)."""
    rows = {}
    for name, curve in curves.items():
        reached = _first_reached(curve["val_top1"], target_top1)
        rows[name] = {"final val top-1": curve["val_top1"][-1], "best val top-1": max(curve["val_top1"]),
                      "epochs to target": None if reached is None else curve["epoch"][reached],
                      "train s to target": None if reached is None else curve["seconds"][reached],
                      "train s total": curve["seconds"][-1]}
    return pd.DataFrame.from_dict(rows, orient="index")


def plot_curves(curves: dict, target_top1: float | None = None, axis=None, x: str = "epoch", frozen_epochs: int = 0,
                frozen_strategy: str = "freeze, then unfreeze"):
    """Seed-averaged validation top-1 of each strategy (`mean_curves`) against `x`, "epoch" or "seconds"; head-only
    epochs drawn with open markers."""
    axis = axis or plt.gca()
    for name, curve in curves.items():
        positions, accuracy = curve[x], curve["val_top1"]
        line, = axis.plot(positions, accuracy, marker="o", markersize=3, label=name)
        if frozen_epochs and name == frozen_strategy:
            axis.plot(positions[:frozen_epochs], accuracy[:frozen_epochs], linestyle="none", marker="o", markersize=7,
                      markerfacecolor="white", color=line.get_color())
    if target_top1 is not None:
        axis.axhline(target_top1, color="grey", linestyle="--", linewidth=1, label=f"target {target_top1:.1%}")
    axis.set(xlabel="training seconds" if x == "seconds" else "epoch", ylabel="val top-1 (mean over seeds)")
    axis.legend(fontsize=8)
    return axis


def plot_labels(verdict, axis=None):
    """Mean val top-1 (error bars: std over seeds) against labels per class, one line per strategy."""
    axis = axis or plt.gca()
    frame = verdict.reset_index()
    for name, group in frame.groupby("strategy", sort=False):
        axis.errorbar(group["labels per class"], group["mean"], yerr=group["std"].fillna(0), marker="o", capsize=3,
                      label=name)
    axis.set_xscale("log")
    axis.set(xlabel="labelled images per class (log)", ylabel="val top-1")
    axis.legend(fontsize=8)
    return axis


def training_saved(results: dict, labels: int, strategy: str, baseline: str = "from scratch") -> list[dict]:
    """Per seed at `labels` labels per class: the share of epochs and training seconds `strategy` saves to reach
    `baseline`'s final val top-1 of the same seed, against what `baseline` needed to first reach it (never: 0)."""
    out = []
    for (count, name, seed), result in sorted(results.items(), key=lambda item: item[0][2]):
        if count != labels or name != baseline or (labels, strategy, seed) not in results:
            continue
        goal = result.history[-1]["val_top1"]
        own = time_to_target(result.history, goal)  # the baseline's own first epoch at its final accuracy
        reached = time_to_target(results[(labels, strategy, seed)].history, goal)
        found = reached["epochs"] is not None
        out.append({"seed": seed, "goal": goal, "reached": found, "epochs": reached["epochs"],
                    "seconds": reached["seconds"], "baseline epochs": own["epochs"], "baseline seconds": own["seconds"],
                    "epochs saved": 1 - reached["epochs"] / own["epochs"] if found else 0.0,
                    "seconds saved": 1 - reached["seconds"] / own["seconds"] if found else 0.0})
    return out


def claims(results: dict, verdict, *, source_seconds: float = 0.0, setting: str = "",
                 pretrained=("fine-tune all", "freeze, then unfreeze"), hardware: str | None = None) -> list:
    """The article's section-5.4 claims at the largest label count of `label_grid`'s results and `transfer_verdict`'s
    table: training saved, a pretrained start beating from scratch, freezing first not worse than fine-tuning all."""
    labels = max(count for count, _, _ in results)
    return [_saved_claim(results, labels, source_seconds, setting, pretrained, hardware),
            _beats_claim(verdict, labels, hardware), _freeze_claim(results, labels, pretrained, hardware)]


def _saved_claim(results: dict, labels: int, source_seconds: float, setting: str, pretrained, hardware):
    """"transfer_learning": the share of training the better pretrained strategy saves, mean and t interval."""
    saved = {name: training_saved(results, labels, name) for name in pretrained}
    epochs = {name: [100 * s["epochs saved"] for s in runs] for name, runs in saved.items()}
    best = max(pretrained, key=lambda name: sum(epochs[name]) / max(1, len(epochs[name])))
    runs, shares = saved[best], epochs[best]
    seconds = sum(100 * s["seconds saved"] for s in runs) / len(runs)
    with_source = sum(100 * (1 - ((s["seconds"] or s["baseline seconds"]) + source_seconds) / s["baseline seconds"])
                      for s in runs) / len(runs)
    missed = sum(not s["reached"] for s in runs)
    others = "; ".join(f"{name}: {sum(values) / len(values):.0f}%" for name, values in epochs.items()
                       if name != best and values)
    reason = (f"{best}: epochs saved to reach each seed's from-scratch final top-1, against the epochs from scratch "
              f"needed to first reach it (training seconds saved {seconds:.0f}%"
              + (f", {with_source:.0f}% counting the {source_seconds:.0f} s of source pretraining" if source_seconds
                 else "") + ")" + (f"; {missed} seed(s) never reached it (counted as 0%)" if missed else "")
              + (f"; {others}" if others else "") + f"; {labels} labels per class" + (f"; {setting}" if setting else ""))
    if len(shares) >= 2:
        interval = statistics.confidence_interval(shares)
        return claim_records.measured("transfer_learning", interval["mean"], (interval["low"], interval["high"]),
                                      f"{len(shares)} seeds, t interval; " + reason, hardware)
    return claim_records.measured("transfer_learning", shares[0], None, "1 seed, no interval; " + reason, hardware)


def _beats_claim(verdict, labels: int, hardware):
    """"transfer_beats_scratch": the best pretrained plan against from scratch, its interval the noise band."""
    tested = verdict.loc[labels].drop("from scratch", errors="ignore")
    lines = [f"{name} {100 * row['delta vs scratch']:+.1f} points (band ±{100 * row['noise band']:.1f})"
             for name, row in tested.iterrows() if isinstance(row.get("verdict"), str)]
    others = [f"{count}: " + ", ".join(f"{name} {row['verdict']}" for name, row in verdict.loc[count].iterrows()
                                       if isinstance(row.get("verdict"), str))
              for count in verdict.index.get_level_values(0).unique() if count != labels]
    text = (f"at {labels} labels per class: " + ("; ".join(lines) or "fewer than 2 seeds: no noise estimate")
            + " (difference of seed means +- 2 standard errors)" + (f"; other label counts {'; '.join(others)}"
                                                                    if others else ""))
    banded = tested.dropna(subset=["noise band"]) if "noise band" in tested else tested.iloc[:0]
    if len(banded):  # the best pretrained plan against from scratch, its interval the noise band
        best_plan = banded.sort_values("delta vs scratch").iloc[-1]
        delta, band = 100 * best_plan["delta vs scratch"], 100 * best_plan["noise band"]
        return claim_records.decided("transfer_beats_scratch", delta, (delta - band, delta + band),
                                     f"{best_plan.name}, " + text, hardware=hardware)
    return claim_records.not_measurable("transfer_beats_scratch", text, hardware)


def _freeze_claim(results: dict, labels: int, pretrained, hardware):
    """"transfer_freeze_recipe": freeze-then-unfreeze minus fine-tune-all, paired by seed."""
    frozen, everything = pretrained[1], pretrained[0]
    pairs = [(results[(labels, frozen, seed)].history[-1]["val_top1"], results[(labels, everything, seed)].history[-1][
        "val_top1"]) for (count, name, seed) in results if count == labels and name == everything
        and (labels, frozen, seed) in results]
    if len(pairs) >= 2:
        paired = statistics.paired_difference([100 * a for a, _ in pairs], [100 * b for _, b in pairs])
        return claim_records.decided(
            "transfer_freeze_recipe", paired["delta"], (paired["low"], paired["high"]),
            f"{frozen} minus {everything}: {paired['delta']:+.1f} points [{paired['low']:+.1f}, "
            f"{paired['high']:+.1f}] paired by seed at {labels} labels per class", hardware=hardware)
    return claim_records.not_measurable("transfer_freeze_recipe", "fewer than 2 seeds: no paired interval", hardware)
