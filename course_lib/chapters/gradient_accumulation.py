"""Notebook 04's measurements turned into the article's claims about gradient accumulation
(`analysis.claims`): equal gradients with the 1/N scaling, what forgetting it does, the BatchNorm
caveat, memory against the effective batch, and what accumulation costs in speed. The measuring is
`engine.accumulation` and `engine.train`; this module compares."""
from __future__ import annotations

import dataclasses

import pandas as pd
import torch

from course_lib import devices
from course_lib.analysis import claims as claim_records
from course_lib.chapters.setup import ChapterSetup
from course_lib.config import resolve_profile
from course_lib.data import pipeline
from course_lib.data.datasets import config_with_data
from course_lib.data.loaders import make_loader
from course_lib.engine import train
from course_lib.measure import flops
from course_lib.models import factory

ROUNDING = 1e-4  # largest relative difference float32 rounding explains (about 1e-6 measured)


def engine_table(rows: list[dict], models: dict, image_size: int, device, precision: str = "off"):
    """The engine runs (a row per model and accumulation_steps, with "images/s") with an MFU column computed from
    each row's own model (`models`: name -> module)."""
    table = pd.DataFrame(rows)
    return pd.concat([flops.with_mfu(group, models[name], image_size, device, precision=precision)
                      for name, group in table.groupby("model", sort=False)])


def claims(gradients, engine, memory_table, max_steps: int) -> list:
    """The five claims in the notebook's order, from its section-2 gradients, section-3 engine runs (with "images/s"
    and "MFU") and section-4 memory tables."""
    no_bn, with_bn = gradients[~gradients["BatchNorm"]], gradients[gradients["BatchNorm"]]
    free, bn = no_bn["max relative difference"].max(), with_bn["max relative difference"].max()
    free_model, bn_model = no_bn["model"].iloc[0], with_bn["model"].iloc[0]
    weights = engine.groupby("model")["max weight difference vs steps=1"].max()
    # Without the 1/N each gradient is N times the right one: a relative error of N - 1.
    unscaled_error = (no_bn["without the 1/N"] - (no_bn["micro-batches"] - 1)).abs().max()
    largest = memory_table.iloc[-1]
    memory_ratio = largest["accumulated MiB"] / largest["bigger batch MiB"]
    speed = engine[engine["model"] == bn_model].set_index("accumulation_steps")
    slowdown = speed.loc[speed.index.max(), "images/s"] / speed.loc[speed.index.min(), "images/s"]
    return [
        claim_records.checked(
            "accumulation_equals_big_batch", free < ROUNDING, value=free,
            reason=f"{free_model} (no BatchNorm): max relative gradient difference {free:.1e} (float32 rounding "
                   f"< {ROUNDING:g}); weights after {max_steps} engine steps differ by {weights[free_model]:.1e}"),
        claim_records.checked(
            "forgetting_one_over_n", unscaled_error < 0.01, value=float(no_bn["without the 1/N"].max()),
            reason="relative gradient error without the 1/N: " + ", ".join(
                f"{e:.2f} at N={n}" for n, e in zip(no_bn["micro-batches"], no_bn["without the 1/N"]))
            + " (N - 1 expected)"),
        claim_records.checked(
            "batchnorm_caveat", bn > max(1e-3, 100 * free), value=bn,
            reason=f"{bn_model}: max relative gradient difference {bn:.1e} with BatchNorm vs {free:.1e} without; "
                   f"weights after {max_steps} engine steps differ by {weights[bn_model]:.1e}"),
        claim_records.checked(
            "accumulation_memory", memory_ratio < 1, value=memory_ratio,
            reason=f"effective batch {int(largest['effective batch'])}: {largest['accumulated MiB']:.1f} MiB "
                   f"accumulated vs {largest['bigger batch MiB']:.1f} MiB as one batch (step peak)"),
        claim_records.checked(
            "accumulation_cost", slowdown < 1, value=slowdown,
            reason=f"{bn_model}: " + ", ".join(f"{s} micro-batches {r['images/s']:.0f} images/s (MFU {r['MFU']:.1%})"
                                               for s, r in speed.iterrows())
            + " (one run each, short: indicative)"),
    ]


@dataclasses.dataclass(kw_only=True)
class AccumulationSetup(ChapterSetup):
    """Notebook 04's config, data, one big batch of real images as the model takes it, and the two models the
    equivalence compares (`setup`)."""

    images: object  # the big batch, staged for the model (augmented, normalised, on the device)
    targets: object
    with_batchnorm: object  # config.model
    without_batchnorm: object  # the normalizer-free model
    without_batchnorm_name: str  # its timm name

    def line(self) -> str:
        return (f"big batch: {len(self.images)} images of {self.config.image_size} px from {self.bundle.source}\n"
                f"with BatchNorm: {self.config.model}; without: {self.without_batchnorm_name}; "
                f"hardware: {self.hardware}")


def setup(profile: str, model_without_batchnorm: str = "test_nfnet", *, max_steps: int | None = None,
          **given) -> AccumulationSetup:
    """The profile's own data (the lesson is the gradients, not the data), one epoch of at most `max_steps` (None: 3)
    steps, and one training batch staged as the model takes it (augmented here with augmentation=device)."""
    config, data = config_with_data(profile, find_real=False, epochs=1, max_steps=max_steps or 3,
                                    output_dir="runs/checkpoints/04_accumulation", **given)  # None: not given
    device = devices.resolve_device(config.device)
    if device.type == "cpu":
        config = config.replace(precision="off")  # exact weight comparisons, and no per-run precision probe
    bundle = pipeline.build_datasets(config)
    torch.manual_seed(config.seed)
    images, targets = next(iter(make_loader(bundle.train, config, train=True)))
    images, targets = train.stage_batch(bundle, images, targets, device, train=True)
    return AccumulationSetup(
        profile=resolve_profile(profile), data=data, config=config, bundle=bundle, images=images, targets=targets,
        with_batchnorm=factory.build_model(config, bundle.num_classes),
        without_batchnorm=factory.build_model(config.replace(model=model_without_batchnorm), bundle.num_classes),
        without_batchnorm_name=model_without_batchnorm)
