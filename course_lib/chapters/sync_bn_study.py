"""Notebook 05 section 7: BatchNorm at small per-process batches, with and without `sync_batchnorm` (issue 47,
point 2). Article 1 (section 4.3) warns that BatchNorm's statistics are unstable when the batch on each GPU is
small; under DDP `sync_batchnorm=True` computes them over every process's images (`engine.sync_batchnorm`). The
notebook launches the same run at several per-process batches, with each process's own statistics and synchronised;
this module holds the sizes, the table and the claim. The section judges accuracy, so it reads real images where
the run finds them (`paths.choose_data`); on generated images its claim is not measurable.
"""
from __future__ import annotations

import pandas as pd

from course_lib.analysis import claims, statistics
from course_lib.chapters.setup import sizes
from course_lib.config import Config, ConfigError

# Per profile: the per-process batches, the seeds per setting, and Config values over the chapter's config. Every
# launch trains the same images for the same epochs, so a small batch takes more steps. cpu: speedrun_resnet_tiny
# (BatchNorm after every convolution) at 32 px, 512 images for 2 epochs, one seed: about 12 s per launch on 2 cores
# (8 launches); smoke: one batch; gpu: ResNet-18 at 64 px, 4,096 images for 3 epochs, 3 seeds (paired: the claim).
SIZES = {
    "smoke": dict(batches=[4], seeds=1, config=dict(max_train_images=64, epochs=1, max_steps=0)),
    "cpu": dict(batches=[2, 4, 8, 32], seeds=1, config=dict(model="speedrun_resnet_tiny", image_size=32,
                                                           max_train_images=512, epochs=2, max_steps=0,
                                                           precision="off", lr=0.05)),
    "gpu": dict(batches=[2, 4, 8, 32], seeds=3, config=dict(model="resnet18", image_size=64, max_train_images=4096,
                                                           epochs=3, max_steps=0)),
}


def plan(config: Config, profile: str, batches: str = "", data=None) -> tuple[Config, list[int], list[int]]:
    """(the launches' config, the per-process batches, the seeds) for `profile`; `batches`: comma-separated
    per-process batches instead of the profile's ("": the profile's; "none": no launch). `data`: a
    `paths.DataChoice` whose images the launches train and score (None: `config`'s own)."""
    chosen = sizes(SIZES, profile)
    config = config.replace(**chosen["config"], **(data.overrides if data is not None else {}))
    if batches.strip() == "none":
        return config, [], list(range(chosen["seeds"]))
    try:
        picked = [int(part) for part in batches.split(",") if part.strip()] or list(chosen["batches"])
    except ValueError:
        raise ConfigError(f"sync_bn_batches={batches!r}: use comma-separated whole numbers such as 2,4,8,32, "
                          "\"\" for the profile's or none") from None
    if min(picked) < 1:
        raise ConfigError(f"sync_bn_batches={batches!r}: every per-process batch must be at least 1")
    return config, picked, list(range(chosen["seeds"]))


def row(launched, per_process: int, synced: bool, seed: int) -> dict:
    """One launch's line: validation top-1 and the time of one optimizer step (every process's batch together)."""
    metrics = launched.metrics
    world = int(metrics.get("world_size") or launched.world_size)
    rate = metrics.get("images_per_second")
    return {"per-process batch": per_process, "sync_batchnorm": synced, "seed": seed,
            "global batch": per_process * world, "val top-1": metrics.get("val_top1"),
            "step ms": 1000 * per_process * world / rate if rate else None}


def table(rows: list[dict]):
    """One row per per-process batch: top-1 with each process's own statistics and synchronised (means over
    seeds), their difference in points, and the step time of each with the synchronisation's cost."""
    frame = pd.DataFrame(rows)
    means = frame.groupby(["per-process batch", "sync_batchnorm"])[["val top-1", "step ms"]].mean().unstack()
    out = pd.DataFrame({
        "top-1 own %": 100 * means[("val top-1", False)], "top-1 synced %": 100 * means[("val top-1", True)],
        "step ms own": means[("step ms", False)], "step ms synced": means[("step ms", True)]})
    out["synced minus own (points)"] = out["top-1 synced %"] - out["top-1 own %"]
    out["step time synced / own"] = out["step ms synced"] / out["step ms own"]
    out["seeds"] = frame.groupby("per-process batch")["seed"].nunique()
    return out.round(3)


def claim(rows: list[dict], data, hardware: str | None = None):
    """syncbn_small_batches: at the smallest per-process batch, top-1 synchronised minus each process's own,
    paired by seed (its rule: `analysis.claims.RULES`), on `data` (a `paths.DataChoice`: generated images decide
    nothing about the article's accuracy); one seed gives no interval, so no verdict."""
    if data.synthetic:
        return claims.not_measurable("syncbn_small_batches", f"trained on generated {data.name} images, not real "
                                     "ones; rerun where real data is found (workbook data get eurosat)", hardware)
    frame = pd.DataFrame(rows)
    smallest = int(frame["per-process batch"].min())
    part = frame[frame["per-process batch"] == smallest].pivot_table(index="seed", columns="sync_batchnorm",
                                                                     values="val top-1")
    if True not in part.columns or False not in part.columns:
        return claims.not_measurable("syncbn_small_batches", "a setting did not run", hardware=hardware)
    part = part.dropna()
    text = (f"{data.name}, per-process batch {smallest} (global {int(frame['global batch'].min())}): "
            f"synced {100 * part[True].mean():.1f}%, own statistics {100 * part[False].mean():.1f}%")
    if len(part) < 2:
        return claims.checked("syncbn_small_batches", None, f"{text}; one seed gives no interval (the gpu profile's "
                              "three decide)", value=float(100 * (part[True] - part[False]).mean()), hardware=hardware)
    paired = statistics.paired_difference(100 * part[True], 100 * part[False])
    return claims.decided("syncbn_small_batches", paired["delta"], (paired["low"], paired["high"]),
                          f"{text}; synced minus own {paired['delta']:+.2f} points [{paired['low']:+.2f}, "
                          f"{paired['high']:+.2f}] over {paired['runs']} seeds, paired", hardware=hardware)
