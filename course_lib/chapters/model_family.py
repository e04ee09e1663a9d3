"""Notebook 12's model-family comparison: timm models of several families trained with one schedule on the same
seeds and data, their validation top-1 against training seconds and parameters, and the Pareto front of both. It
scores the first article's §5.1: a bigger model of a family is rarely much better at several times the cost, and
ViT-style models overfit small datasets (Dosovitskiy et al. 2021, arXiv:2010.11929; DeiT, Touvron et al. 2021,
arXiv:2012.12877, needs heavy augmentation to train on ImageNet-1k alone).
"""
from __future__ import annotations

import dataclasses

import matplotlib.pyplot as plt
import pandas as pd
import timm

from course_lib.analysis import claims as claim_records
from course_lib.chapters import time_to_accuracy
from course_lib.chapters.regularization_study import paired_over_seeds
from course_lib.chapters.setup import sizes
from course_lib.config import Config
from course_lib.data import class_split, pipeline
from course_lib.engine import speedrun
from course_lib.engine.loss_guard import NonFiniteLossError
from course_lib.instruments.progress import Progress
from course_lib.models import factory  # importing course_lib.models registers the workbook's own nets with timm

# The models compared and their family. The speed-run nets are the workbook's own (models/speedrun.py),
# the ViT is DeiT-Tiny's widths on 8 px patches (models/small_vit.py); the rest are timm's.
FAMILY: dict[str, str] = {model: family for family, models in {
    "speed-run net": ("speedrun_resnet_tiny", "speedrun_resnet_small", "speedrun_resnet"),
    "ResNet": ("resnet18", "resnet34", "resnet50"), "EfficientNet": ("efficientnet_b0", "efficientnet_b2"),
    "MobileNetV3": ("mobilenetv3_small_100", "mobilenetv3_large_100"), "RegNet": ("regnetx_002", "regnety_004"),
    "ConvNeXt": ("convnext_atto", "convnext_nano"), "ViT (DeiT-Tiny)": ("vit_tiny_patch8_64", "vit_tiny_patch16_64"),
}.items() for model in models}
# Per profile (models=auto): smoke checks that the section runs; cpu keeps it to about four minutes on 2
# cores (five of the eight it once ran: resnet50, regnetx_002 and convnext_atto, the slowest per image or the least
# taught by, left out for issue 51's 45-minute budget; `family=all` or their names run them) (training images/s
# at 64 px, batch 64, on a 2-core AMD EPYC: speed-run small 2,360 bf16, regnetx_002 1,215, mobilenetv3_small
# 1,220 fp32, speed-run 900, convnext_atto 570, resnet18 465, vit_tiny_patch16_64 460, efficientnet_b0 410 fp32,
# resnet50 196, vit_tiny_patch8_64 140, so the cpu profile's ViT is the 16 px-patch one); gpu runs every family.
MODELS: dict[str, tuple[str, ...]] = {
    "smoke": ("speedrun_resnet_tiny", "resnet18", "vit_tiny_patch16_64"),
    "cpu": ("speedrun_resnet_small", "speedrun_resnet", "resnet18", "mobilenetv3_small_100", "vit_tiny_patch16_64"),
    "gpu": tuple(FAMILY),
}
# Smaller -> bigger model of one family: the article's "bigger is not always better" pairs.
BIGGER: tuple[tuple[str, str], ...] = (
    ("resnet18", "resnet34"), ("resnet18", "resnet50"), ("efficientnet_b0", "efficientnet_b2"),
    ("mobilenetv3_small_100", "mobilenetv3_large_100"), ("convnext_atto", "convnext_nano"),
    ("speedrun_resnet_small", "speedrun_resnet"))
# A gain of top-1 (fraction) the article would call "much better": the claim's rule, one point.
MUCH_BETTER = claim_records.RULES["bigger_model_not_better"].margin / 100
VITS, CONVNET = ("vit_tiny_patch8_64", "vit_tiny_patch16_64"), "resnet18"  # compared for overfitting: the first ViT that ran
# One schedule for every family: AdamW (timm's default for ConvNeXt and ViT, and fine for the convnets; SGD
# at the speed-run's learning rate diverges for a ViT), no label smoothing so that the training and validation
# losses measure the same thing, and single-view scoring.
SETTINGS = dict(optimizer="adamw", lr=2e-3, weight_decay=0.05, label_smoothing=0.0, tta_views=1, ema_decay=0.0)


def models_for(profile: str, choice: str = "auto") -> list[str]:
    """"auto" (the profile's `MODELS`), "all" (every model of `FAMILY`) or comma-separated timm names."""
    if choice == "auto":
        return list(MODELS[profile])
    if choice == "all":
        return list(FAMILY)
    names = [name.strip() for name in choice.split(",") if name.strip()]
    for name in names:
        if not timm.is_model(name):
            raise ValueError(f"family: {name!r} is not a timm model; use auto, all or names such as "
                             f"{', '.join(list(FAMILY)[:4])} (timm.list_models() lists them)")
    if not names:
        raise ValueError("family: no model named; use auto, all or comma-separated timm names")
    return names


# Per profile: training images and epochs per run (None and 0: the ablation's); cpu: five models x three seeds.
SIZES = {"smoke": {"images": None, "epochs": 0}, "cpu": {"images": 1000, "epochs": 4},
         "gpu": {"images": None, "epochs": 0}}


def family_config(short: Config, profile: str, epochs: int = 0, images: int = -1) -> Config:
    """The ablation's short config (`time_to_accuracy.ablation_config`) with the one schedule every family trains
    with (`SETTINGS`), for `epochs` on `images` training images (0 and -1: `SIZES`, else the ablation's; 0: all)."""
    chosen = sizes(SIZES, profile)
    profile_images = short.max_train_images if chosen["images"] is None else chosen["images"]
    return short.replace(**SETTINGS, max_train_images=profile_images if images < 0 else images,
                         epochs=epochs or chosen["epochs"] or short.epochs)


@dataclasses.dataclass
class FamilyRun:
    model: str
    seed: int
    result: object  # speedrun.RaceResult; None when the loss diverged
    parameters: int
    reason: str = ""  # why there is no result

    def row(self) -> dict:
        result = self.result
        last = result.curve[-1] if result is not None and result.curve else {}
        return {"model": self.model, "family": FAMILY.get(self.model, "other"), "seed": self.seed,
                "parameters": self.parameters, "val top-1": getattr(result, "val_top1", None),
                "val loss": last.get("val_loss"), "train loss": last.get("train_loss"),
                "seconds": getattr(result, "seconds", None), "images/s": getattr(result, "images_per_second", None),
                "diverged": self.reason}


def run_family(config: Config, models: list[str], seeds: list[int], *, validation_per_class: int = 0,
               bundle=None, progress: bool = True) -> list[FamilyRun]:
    """Every model once per seed with `config`, all on one bundle (`validation_per_class`, 0: all validation
    images). A run whose loss turns non-finite is kept as diverged, with the reason, instead of stopping the rest."""
    data = bundle if bundle is not None else pipeline.build_datasets(config)
    if validation_per_class:
        data = class_split.subset_bundle(data, data.classes, val_per_class=validation_per_class)
    runs = []
    with Progress(len(models) * len(seeds), "model families", unit="fits", enabled=progress) as bar:
        for model in models:
            parameters = factory.count_parameters(timm.create_model(model, num_classes=data.num_classes))
            for seed in seeds:
                bar.set_postfix_str(f"{model}, seed {seed}")
                try:
                    # Only the end of each run counts here: validating after every epoch would cost seconds.
                    result = speedrun.race(config.replace(model=model, seed=seed), label=model, bundle=data,
                                           progress=False, verbose=False, every_epoch=False)
                    runs.append(FamilyRun(model, seed, result, parameters))
                except NonFiniteLossError as error:
                    runs.append(FamilyRun(model, seed, None, parameters, str(error).splitlines()[0][:160]))
                bar.update()
    return runs


def runs_frame(runs: list[FamilyRun]):
    """One row per model and seed (`FamilyRun.row`), with the loss gap (validation minus training loss)."""
    frame = pd.DataFrame([run.row() for run in runs])
    return frame.assign(**{"loss gap": frame["val loss"] - frame["train loss"]})


def pareto_front(costs, scores) -> list[bool]:
    """Per point, whether no other point is at least as good on both (low cost, high score) and better on one."""
    points = list(zip(costs, scores))
    return [not any(c <= cost and s >= score and (c < cost or s > score) for c, s in points)
            for cost, score in points]


def family_table(runs: list[FamilyRun], device: str = "cpu"):
    """One row per model: family, parameters (millions), seeds, the validation top-1's mean and spread, training
    seconds, images/s and MFU on `device`, the loss gap, and whether it is on the Pareto front of seconds and of
    parameters. Diverged runs are counted, not averaged."""
    finished = {run.model: run.result for run in runs if run.result is not None}
    rows = []
    for model, group in runs_frame(runs).groupby("model", sort=False):
        done = group[group["val top-1"].notna()]
        speed = done["images/s"].mean()
        rows.append({"model": model, "family": group["family"].iloc[0],
                     "parameters (M)": group["parameters"].iloc[0] / 1e6, "seeds": len(done),
                     "diverged": len(group) - len(done), "val top-1 mean": done["val top-1"].mean(),
                     "val top-1 std": done["val top-1"].std(), "seconds mean": done["seconds"].mean(),
                     "images/s mean": speed,
                     "MFU": time_to_accuracy.mfu(finished[model], speed, device) if len(done) else None,
                     "loss gap mean": done["loss gap"].mean()})
    table = pd.DataFrame(rows).set_index("model")
    scored = table["val top-1 mean"].notna()
    for cost, column in (("seconds mean", "front (seconds)"), ("parameters (M)", "front (parameters)")):
        table[column] = False
        table.loc[scored, column] = pareto_front(table.loc[scored, cost], table.loc[scored, "val top-1 mean"])
    return table.round({"parameters (M)": 2, "val top-1 mean": 3, "val top-1 std": 3, "seconds mean": 1,
                        "images/s mean": 0, "MFU": 4, "loss gap mean": 3})


def plot_family(table, title: str = ""):
    """Validation top-1 against training seconds and against parameters (log scales), one marker per family,
    the Pareto front of each as a step line."""
    axes = plt.subplots(1, 2, figsize=(12, 4.5), sharey=True)[1]
    scored = table[table["val top-1 mean"].notna()]
    for axis, cost, front, label in ((axes[0], "seconds mean", "front (seconds)", "training seconds (mean over seeds)"),
                                     (axes[1], "parameters (M)", "front (parameters)", "parameters (millions)")):
        for family, group in scored.groupby("family", sort=False):
            axis.errorbar(group[cost], group["val top-1 mean"], yerr=group["val top-1 std"].fillna(0), fmt="o",
                          capsize=3, label=family)
        for model, row in scored.iterrows():
            axis.annotate(model, (row[cost], row["val top-1 mean"]), fontsize=7, xytext=(3, 3),
                          textcoords="offset points")
        best = scored[scored[front]].sort_values(cost)
        axis.step(best[cost], best["val top-1 mean"], where="post", c="black", lw=0.8, ls="--", label="Pareto front")
        axis.set_xscale("log")
        axis.set_xlabel(label)
    axes[0].set_ylabel("validation top-1 (carve-out of train)")
    axes[1].legend(fontsize=7, loc="lower right")
    axes[0].figure.suptitle(title, fontsize=9)
    return axes


def _paired_gain(frame, small: str, big: str, metric: str, level: float) -> dict | None:
    """`big` minus `small` in `metric` over their finished runs, paired by seed (None: fewer than 2 shared seeds)."""
    finished = frame[frame["val top-1"].notna()]
    values = finished.pivot_table(index="seed", columns="model", values=metric, aggfunc="last")
    return paired_over_seeds(values[big], values[small], level) if {small, big} <= set(values) else None


def _bigger_claim(frame, level: float, hardware: str | None):
    """Per `BIGGER` pair that ran, the bigger model's top-1 gain paired by seed against `MUCH_BETTER` (the rule):
    holds when most pairs are shown not much better, refuted when most are shown much better."""
    key, ran = "bigger_model_not_better", set(frame["model"])
    pairs = [(small, big) for small, big in BIGGER if small in ran and big in ran]
    if not pairs:
        return claim_records.not_measurable(key, "no smaller/bigger pair of one family ran "
                                            f"(pairs: {', '.join(f'{a}/{b}' for a, b in BIGGER)})", hardware)
    seconds, size = frame.groupby("model")["seconds"].mean(), frame.groupby("model")["parameters"].first()
    verdicts, parts = [], []
    for small, big in pairs:
        gain = _paired_gain(frame, small, big, "val top-1", level)
        cost = f"{seconds[big] / seconds[small]:.1f}x the seconds, {size[big] / size[small]:.1f}x the parameters"
        if gain is None:
            parts.append(f"{big} vs {small}: fewer than 2 seeds ({cost})")
            continue
        verdicts.append(claim_records.decide(claim_records.RULES[key], 100 * gain["low"], 100 * gain["high"]))
        parts.append(f"{big} vs {small}: {gain['delta']:+.1%} [{gain['low']:+.1%}, {gain['high']:+.1%}] at {cost}")
    much, not_much = verdicts.count(claim_records.REFUTED), verdicts.count(claim_records.HOLDS)
    holds = True if not_much > len(pairs) / 2 else False if much > len(pairs) / 2 else None
    return claim_records.checked(
        key, holds, f"{not_much} of {len(pairs)} pair(s) shown not much better (gain below {MUCH_BETTER:.0%} point), "
        f"{much} shown much better; " + "; ".join(parts), hardware=hardware)


def _vit_claim(frame, level: float, hardware: str | None):
    """The ViT's loss gap minus the convnet's, paired by seed: holds above zero, refuted below."""
    key = "vit_overfits_small_data"
    vit = next((name for name in VITS if name in set(frame["model"])), VITS[0])
    gap = _paired_gain(frame, CONVNET, vit, "loss gap", level)
    if gap is None:
        return claim_records.not_measurable(key, f"a ViT ({' or '.join(VITS)}) and {CONVNET} did not both finish 2 "
                                            "or more seeds (family=auto runs both)", hardware)
    top1 = frame.groupby("model")["val top-1"].mean()
    return claim_records.checked(
        key, claim_records.beyond_noise(gap["low"], gap["high"]),
        f"loss gap (validation minus training) of {vit} minus {CONVNET}'s: {gap['delta']:+.3f} "
        f"[{gap['low']:+.3f}, {gap['high']:+.3f}] over {gap['runs']} seeds; val top-1 {top1[vit]:.1%} "
        f"against {top1[CONVNET]:.1%}", value=gap["delta"], interval=(gap["low"], gap["high"]), hardware=hardware)


def claims(runs: list[FamilyRun], level: float = 0.95, hardware: str | None = None) -> list:
    """The article's two §5.1 claims, decided from the runs: bigger_model_not_better and vit_overfits_small_data."""
    frame = runs_frame(runs)
    return [_bigger_claim(frame, level, hardware), _vit_claim(frame, level, hardware)]
