"""Notebook 07 section 8: augmentation strength against overfitting (issue 47, point 1). Article 2 lists random
crops, flips, colour jitter and small rotations, and warns that too little augmentation overfits. One model trains
at three strengths over the same seeds on a small training set, scored every epoch on its training images (not
augmented, eval mode) and on validation images: the gap between the two is what augmentation is for.
"""
from __future__ import annotations

import dataclasses

import matplotlib.pyplot as plt
import pandas as pd

from course_lib.analysis import claims as claim_records
from course_lib.analysis import statistics
from course_lib.chapters.regularization_study import paired_claim, paired_over_seeds, seed_list
from course_lib.chapters.setup import sizes
from course_lib.config import Config, ConfigError
from course_lib.data import class_split, pipeline

HEAVY_ROTATION = 15.0  # degrees: article 2's "small rotations"
# Each level is Config values over the section's base config. none: no augmentation at all (the training images
# as the evaluation sees them); light: the engine's default, a random resized crop of 60-100% of the area and a
# mirror; heavy: all of the article's list, the crop, the mirror, colour jitter of 0.4 and turns of up to 15 degrees.
LEVELS: dict[str, dict] = {
    "none": {"augmentation": "none"},
    "light": {"augmentation": "device", "augment_recipe": "light", "rotation": 0.0},
    "heavy": {"augmentation": "device", "augment_recipe": "heavy", "rotation": HEAVY_ROTATION},
}
# Per profile: training images per run (a low-data regime named as such: overfitting shows within minutes),
# epochs, seeds, validation images per class scoring every epoch (0: all), and training images scored per epoch
# (0: all). cpu: 3 levels x 3 seeds of 12 epochs on 1,000 tiles, about 2 minutes on 2 cores; reference: 48
# epochs, 5 seeds, every validation image.
SIZES = {
    "smoke": dict(images=64, epochs=2, seeds=2, val_per_class=4),
    "cpu": dict(images=1000, epochs=12, seeds=3, val_per_class=40),
    "gpu": dict(images=2000, epochs=30, seeds=3, val_per_class=0),
    "reference": dict(images=1000, epochs=48, seeds=5, val_per_class=0),
}


@dataclasses.dataclass
class StrengthStudy:
    """The section's base config, its levels and seeds, and the validation images per class."""

    config: Config
    levels: list[str]
    seeds: list[int]
    val_per_class: int

    def config_for(self, level: str, seed: int) -> Config:
        """The base config at `level`, trained with `seed` (which also draws the training images)."""
        return self.config.replace(seed=seed, **LEVELS[level])

    def bundle_for(self, config: Config):
        """`config`'s datasets, validation cut to `val_per_class` images per class (the same for every run)."""
        data = pipeline.build_datasets(config)
        if self.val_per_class:
            data = class_split.subset_bundle(data, data.classes, val_per_class=self.val_per_class)
        return data

    def describe(self) -> str:
        return (f"{self.config.model} at {self.config.image_size} px, {self.config.epochs} epochs on "
                f"{self.config.max_train_images or 'all'} training images, levels {', '.join(self.levels)}, "
                f"seeds {', '.join(map(str, self.seeds))}")


def select_levels(choice: str) -> list[str]:
    """"all" or comma-separated names of `LEVELS`, in the order given, "none" among them (the comparison)."""
    names = list(LEVELS) if choice.strip() == "all" else [n.strip() for n in choice.split(",") if n.strip()]
    if any(name not in LEVELS for name in names) or "none" not in names or len(names) < 2:
        raise ConfigError(f"augmentation_levels={choice!r}: use all, or at least two of {', '.join(LEVELS)} "
                          "with none among them (the comparison is against no augmentation)")
    return names


def study(config: Config, profile: str, levels: str = "all", epochs: int = 0, seeds: int = 0) -> StrengthStudy:
    """The section's study on notebook 07's `config` with the profile's `SIZES` (`epochs`, `seeds` 0: the
    profile's). A resident split (storage=device) becomes the pre-decoded cache, which serves every level."""
    chosen = sizes(SIZES, profile)
    base = config.replace(max_train_images=chosen["images"], epochs=epochs or chosen["epochs"],
                          storage="cache" if config.storage == "device" else config.storage,
                          mixup_alpha=0.0, cutmix_alpha=0.0, random_erasing=0.0, label_smoothing=0.0, ema_decay=0.0)
    return StrengthStudy(base, select_levels(levels), seed_list(config.seed, seeds or chosen["seeds"]),
                         chosen["val_per_class"])


def curves(rows: list[dict]):
    """Mean and spread over seeds, per level and epoch, of the training and validation top-1 (%) and their gap."""
    frame = pd.DataFrame(rows)
    frame["gap"] = frame["train top-1"] - frame["val top-1"]
    table = frame.groupby(["level", "epoch"])[["train top-1", "val top-1", "gap"]].agg(["mean", "std"])
    table.columns = [f"{metric} {stat}" for metric, stat in table.columns]
    return (100 * table).reset_index().assign(epoch=lambda t: t["epoch"].astype(int))


def payoff_epoch(table, level: str, against: str = "none") -> int | None:
    """The first epoch from which `level`'s mean validation top-1 stays at or above `against`'s to the end
    (None: not within the run)."""
    mine, theirs = (table[table["level"] == name].set_index("epoch")["val top-1 mean"] for name in (level, against))
    ahead = (mine >= theirs).reindex(sorted(mine.index))
    last_behind = max([epoch for epoch, above in ahead.items() if not above], default=0)
    return None if last_behind == max(ahead.index) else last_behind + 1


def final_table(rows: list[dict]):
    """One row per level at the last epoch: training and validation top-1, the gap with its interval over seeds,
    the gap's paired difference with no augmentation, and where the level pays off."""
    frame, table, out = _last_epoch(rows), curves(rows), []
    for level, group in frame.groupby("level", sort=False):
        gap = statistics.confidence_interval(group["gap"]) if len(group) > 1 else None
        row = {"level": level, "seeds": len(group), "train top-1 %": group["train top-1"].mean(),
               "val top-1 %": group["val top-1"].mean(), "gap (points)": group["gap"].mean(),
               "gap low": gap and gap["low"], "gap high": gap and gap["high"]}
        if level != "none":
            less = _paired_gain(frame, "none", "gap", against=level)
            row.update({"gap below none": less and less["delta"], "low": less and less["low"],
                        "high": less and less["high"], "pays off from epoch": payoff_epoch(table, level)})
        out.append(row)
    return pd.DataFrame(out).set_index("level").round(2)


def _last_epoch(rows: list[dict]):
    """The rows of each run's last epoch, in points, with the gap."""
    frame = pd.DataFrame(rows)
    frame = frame[frame["epoch"] == frame.groupby(["level", "seed"])["epoch"].transform("max")].copy()
    frame[["train top-1", "val top-1"]] *= 100
    frame["gap"] = frame["train top-1"] - frame["val top-1"]
    return frame


def _paired_gain(frame, level: str, metric: str, against: str = "none") -> dict | None:
    """`level`'s `metric` minus `against`'s, paired by seed (None: fewer than 2 shared seeds). The gap's
    reduction by `level` is `_paired_gain(frame, "none", "gap", against=level)`."""
    both = frame.pivot_table(index="seed", columns="level", values=metric).reindex(columns=[level, against])
    return paired_over_seeds(both[level], both[against])


def plot_curves(table, title: str = ""):
    """Validation top-1 (solid) and training top-1 (dashed) against epochs, one colour per level; right: the gap."""
    figure, (left, right) = plt.subplots(1, 2, figsize=(11, 3.8))
    for index, (level, group) in enumerate(table.groupby("level", sort=False)):
        colour = f"C{index}"
        left.plot(group["epoch"], group["val top-1 mean"], "o-", color=colour, label=f"{level}: validation")
        left.plot(group["epoch"], group["train top-1 mean"], "--", color=colour, label=f"{level}: training images")
        right.errorbar(group["epoch"], group["gap mean"], yerr=group["gap std"].fillna(0), color=colour, marker="o",
                       capsize=2, label=level)
    left.set(xlabel="epoch", ylabel="top-1 %", title="top-1 (mean over seeds)")
    right.set(xlabel="epoch", ylabel="training minus validation top-1 (points)", title="the gap (mean, std over seeds)")
    right.axhline(0, color="grey", linewidth=0.8)
    left.legend(fontsize=7)
    right.legend(fontsize=8)
    figure.suptitle(title, fontsize=9)
    figure.tight_layout()
    return figure


def claims(rows: list[dict], hardware: str | None = None) -> list:
    """augmentation_prevents_overfitting: the gap without augmentation minus the gap with the strongest level that
    ran, at the last epoch, paired by seed; validation top-1 must rise by the same rule."""
    key, frame = "augmentation_prevents_overfitting", _last_epoch(rows)
    strongest = [level for level in reversed(LEVELS) if level != "none" and level in set(frame["level"])]
    if not strongest:
        return [claim_records.not_measurable(key, "no augmented level ran", hardware=hardware)]
    level = strongest[0]
    less = _paired_gain(frame, "none", "gap", against=level)
    gaps, tops = (frame.groupby("level")[metric].mean() for metric in ("gap", "val top-1"))
    text = (f"gap without augmentation {gaps['none']:.1f} points, with {level} {gaps[level]:.1f} (validation top-1 "
            f"{tops['none']:.1f}% and {tops[level]:.1f}%)")
    if less is None:  # a point decides nothing (as in notebooks 05 and 13)
        return [claim_records.checked(key, None, f"{text}; one seed gives no interval",
                                      value=float(gaps["none"] - gaps[level]), hardware=hardware)]
    # The article's second half: generalisation improves, so the validation top-1 must rise by the same rule.
    gain = _paired_gain(frame, level, "val top-1")
    better = claim_records.decide(claim_records.RULES[key], gain["low"], gain["high"])
    return [paired_claim(
        key, less, f"{text}; the gap shrinks by {less['delta']:+.1f} points [{less['low']:+.1f}, {less['high']:+.1f}] "
        f"and validation top-1 moves {gain['delta']:+.1f} [{gain['low']:+.1f}, {gain['high']:+.1f}] ({better}), over "
        f"{less['runs']} seeds, paired", hardware=hardware, also=better)]
