"""Notebook 12's race and ablation: the speed-run recipe against the workbook's default recipe and a naive loop
for the same wall-clock budget, then the recipe with one ingredient taken out at a time over several seeds
(paired by seed, `analysis.statistics.compare_variants`); section 5 races the `imagenette` recipe under fast.ai's
Imagenette leaderboard rules (`imagenette_plan`, the claim in `analysis.imagenette`).
The race itself is `engine.speedrun.race`; this module holds what only the notebook needs.
"""
from __future__ import annotations

import dataclasses

import matplotlib.pyplot as plt
import pandas as pd
import timm
import torch

from course_lib import paths
from course_lib.analysis import claims as claim_records
from course_lib.analysis import imagenette, statistics
from course_lib.chapters.setup import ChapterSetup, sizes
from course_lib.config import RECIPES, SAMPLE_DATA_DIR, Config, make_config, resolve_profile
from course_lib.data import class_split, datasets, pipeline
from course_lib.engine import speedrun
from course_lib.instruments.progress import Progress
from course_lib.measure import flops

# Each ingredient of the speed-run recipe and the Config change that takes it out. The data ingredients
# step down one at a time: resident on the device -> the memmapped cache through a DataLoader -> files.
ABLATIONS: dict[str, dict] = {
    "test-time augmentation (8 views)": {"tta_views": 1},
    "symmetries of the square (overhead)": {"augment_recipe": "light"},
    "label smoothing": {"label_smoothing": 0.0},
    "linear decay (vs cosine)": {"lr_schedule": "cosine"},
    "warm-up": {"warmup_epochs": 0.0},
    "progressive resizing (from 32 px)": {"min_image_size": 0},
    "resident on the device (storage=device)": {"storage": "cache"},
    "pre-decoded cache": {"storage": "files", "num_workers": -1},
    "augmentation on the device": {"storage": "cache", "augmentation": "cpu", "num_workers": -1},
    "torchvision JPEG decoding (vs PIL)": {"decoder": "pil"},
    "channels_last": {"channels_last": False},
    "measured precision (auto)": {"precision": "off"},
    "batch 128, learning rate scaled with it (vs 64)": {
        "batch_size": 64, "lr": RECIPES["speedrun"]["lr"] * 64 / RECIPES["speedrun"]["batch_size"]},
    "small residual net (vs resnet18)": {"model": "resnet18"},
    # Candidates from the CIFAR-10 record-holders (issue 48), each turned on over the recipe, not yet adopted: "+"
    # rows add, the others take out. Muon (airbench94_muon) on the conv kernels but the stem, the rest on the recipe's
    # SGD; Lookahead (Zhang et al. 2019; airbench's earlier records) every 5 steps half-way, the paper's k and alpha;
    # the whitened stem: airbench's first conv from the patch covariance, frozen; selective TTA: hiverge's views only
    # for the least-confident quarter of each batch (the seconds show what it saves); ReLU: Page's ResNet-9 activation
    # against the recipe's GELU (airbench's); the side growing until the last epoch: speedrun2's progressive resizing.
    "+ Muon (conv weights)": {"optimizer": "muon"},
    "+ Lookahead (k=5, alpha=0.5)": {"lookahead_steps": 5, "lookahead_alpha": 0.5},
    "+ whitened stem": {"whiten_stem": True},
    "+ selective TTA (least-confident quarter)": {"tta_selective": 0.25},
    "ReLU (vs GELU)": {"activation": "relu"}, "+ side grows until the last epoch": {"resize_ramp": 1.0},
    # torch.compile (Inductor, default mode): a compile per image size and train/eval mode, inside the race's clock
    # (benchmarks/bench_ablation.py --warmup states a cold compile apart). Then the run's length and a larger batch.
    "+ torch.compile (default mode)": {"compile": True}, "21 epochs (vs 14)": {"epochs": 14},
    "+ batch 256, learning rate scaled with it": {"batch_size": 256, "lr": RECIPES["speedrun"]["lr"] * 2},
}
# What the cpu profile's `ingredients="auto"` leaves out, and why (`ingredients=all` runs them;
# benchmarks/bench_ablation.py --recipe-budget measures the last four at the recipe's own sizes).
CPU_LEAVES_OUT = {"small residual net (vs resnet18)": "resnet18 is a slow net on 2 cores",
                  "batch 128, learning rate scaled with it (vs 64)": "the cpu ablation already trains at batch 64",
                  "+ torch.compile (default mode)": "a compile per image size, minutes on 2 cores",
                  "21 epochs (vs 14)": "the cpu ablation trains 3 epochs",
                  "+ batch 256, learning rate scaled with it": "24 steps of 2,000 images"}


# The smoke profile is a check that the notebook runs: tiny images, few steps, a quarter-size net.
SMOKE_SIZES = dict(image_size=32, max_train_images=128, max_steps=2, epochs=2, batch_size=16, precision="off")
# Per profile: the racers' Config values over the recipe's; the speed-run racer's clock (s); the naive and default
# racers' clock (0: the racer's; cpu: 60 s unless budget_seconds is given); seeds per ablation run; whether the
# racers train on CUDA where it is here (the MFU); ingredients="auto" (the first `first` of ABLATIONS, 0: all, less
# `leaves_out`); the ablation's sizes (images None, batch 0, epochs 0: the recipe's, the learning rate scaled to the
# batch; validation images per class, 0: all). cpu measures what each ingredient changes, not the final figure:
# 3 epochs of at most 2,000 images at batch 64 (about 110 steps on EuroSAT), a fixed 100 images per class.
# Section 5 (`imagenette_plan`): where it races ("imagenette": data_cache/imagenette/ from `workbook data get
# imagenette`; "sample": the committed sample, a check that it runs), how many runs (0: not here, for `why`; the
# leaderboard averages 5, which `imagenette_seeds` asks for on cpu) and its Config values over the recipe's.
IMAGENETTE_SMOKE = dict(model="test_resnet", image_size=32, batch_size=16, epochs=1, max_steps=2, max_train_images=128,
                        precision="off")
IMAGENETTE_CPU_WHY = ("5 runs of resnet50d (23.5 M parameters) at 160 px for 5 epochs are over 200,000 training "
                      "images, hours on a few CPU cores; the gpu profile races them, `imagenette_seeds=5` asks for "
                      "them here, and benchmarks/bench_imagenette.py runs them anywhere")
SIZES = {
    "smoke": dict(config=SMOKE_SIZES, budget=5.0, rivals=0.0, seeds=1, cuda=False, first=2, leaves_out={},
                  ablation=dict(images=None, validation=0, batch=0, epochs=1),
                  imagenette=dict(on="sample", runs=1, config=IMAGENETTE_SMOKE, why="")),
    "cpu": dict(config={}, budget=300.0, rivals=60.0, seeds=3, cuda=False, first=0, leaves_out=CPU_LEAVES_OUT,
                ablation=dict(images=2000, validation=100, batch=64, epochs=3),
                imagenette=dict(on="imagenette", runs=0, config={}, why=IMAGENETTE_CPU_WHY)),
    "gpu": dict(config={}, budget=120.0, rivals=0.0, seeds=3, cuda=True, first=0, leaves_out={},
                ablation=dict(images=None, validation=0, batch=0, epochs=0),
                imagenette=dict(on="imagenette", runs=5, config={}, why="")),
}


@dataclasses.dataclass(kw_only=True)
class RaceSetup(ChapterSetup):
    """Notebook 12's racers and clocks on the data every run finds (`setup`); `config` is the speed-run racer."""

    default: Config  # the profile's own recipe, whole split, the same data
    budget: float  # seconds on the speed-run racer's clock
    rivals: float  # seconds on the naive and default racers' clocks
    seeds: int  # seeds per ablation run

    @property
    def recipe(self) -> Config:
        """The speed-run racer's config (`config`)."""
        return self.config

    @property
    def device(self) -> str:
        """Where the racers trained, for the MFU of the tables: cuda in the gpu profile on a CUDA machine."""
        return "cuda" if sizes(SIZES, self.profile)["cuda"] and torch.cuda.is_available() else "cpu"

    def ingredients(self, choice: str = "auto") -> list[str]:
        """Names of ABLATIONS: "all", "auto" (the profile's, `SIZES`) or a list split at ";" if any (names hold ",")."""
        everything = list(ABLATIONS)
        if choice == "all":
            return everything
        if choice == "auto":
            chosen = sizes(SIZES, self.profile)
            return [name for name in everything[:chosen["first"] or None] if name not in chosen["leaves_out"]]
        return [name.strip() for name in choice.split(";" if ";" in choice else ",") if name.strip()]

    def line(self) -> str:
        return (f"profile {self.profile}: budget {self.budget:.0f} s for the speed-run racer, {self.rivals:.0f} s "
                f"for the others; {self.hardware}")


def setup(profile: str, data_dir: str | None = None, budget_seconds: float = 0.0, rival_seconds: float = 0.0,
          recipe_epochs: int = 0, seeds: int = 0) -> RaceSetup:
    """The notebook's parameters (0 and None: the profile's) as racers on the data `datasets.config_with_data` picks,
    always a folder (landcover-synth included): the hand-written loop reads its train/ and val/ itself."""
    profile = resolve_profile(profile)
    chosen = sizes(SIZES, profile)
    recipe, data = datasets.config_with_data(profile, data_dir=data_dir, recipe="speedrun", **chosen["config"])
    pinned = {"dataset": recipe.dataset, "data_dir": str(datasets.image_folder_root(recipe))}
    recipe = recipe.replace(**pinned, **({"epochs": recipe_epochs} if recipe_epochs else {}))
    default, _ = datasets.config_with_data(profile, **{**pinned, "max_train_images": 0, **chosen["config"]})
    budget = budget_seconds or chosen["budget"]
    rivals = rival_seconds or (chosen["rivals"] if chosen["rivals"] and not budget_seconds else budget)
    return RaceSetup(profile=profile, data=data, config=recipe, default=default, budget=budget, rivals=rivals,
                     seeds=seeds or chosen["seeds"])


def ablation_config(setup: RaceSetup, epochs: int = 0, images: int = -1, validation: int = -1) -> tuple[Config, int]:
    """(config of every ablation run, validation images per class; 0: all), at the profile's sizes where an argument
    is -1 or 0. The recipe is chosen here, so it validates on a carve-out of train, never on the split reported."""
    recipe, chosen = setup.recipe, sizes(SIZES, setup.profile)["ablation"]
    profile_images = recipe.max_train_images if chosen["images"] is None else chosen["images"]
    images = profile_images if images < 0 else images
    validation = chosen["validation"] if validation < 0 else validation
    batch = chosen["batch"]
    # Both learning rates scale with the batch (muon_lr is used by the Muon row only).
    small_batch = dict(batch_size=batch, lr=recipe.lr * batch / recipe.batch_size,
                       muon_lr=recipe.muon_lr * batch / recipe.batch_size) if batch else {}
    epochs = epochs or chosen["epochs"] or recipe.epochs
    return recipe.replace(epochs=epochs, max_train_images=images, validation_from="train", **small_batch), validation


@dataclasses.dataclass
class Ablation:
    ingredient: str  # "full recipe" for the reference runs
    changes: dict
    results: list  # one speedrun.RaceResult per seed

    def row(self) -> dict:
        accuracies = [r.val_top1 for r in self.results]
        # One seed (the smoke profile) has no spread to show.
        noise = statistics.seed_noise(accuracies) if len(accuracies) > 1 else {"mean": accuracies[0], "std": float("nan")}
        return {"without": self.ingredient, "changes": ", ".join(f"{k}={v}" for k, v in self.changes.items()) or "-",
                "val top-1 mean": noise["mean"], "val top-1 std": noise["std"], "seeds": len(accuracies),
                "seconds mean": sum(r.seconds for r in self.results) / len(self.results),
                "images/s mean": sum(r.images_per_second for r in self.results) / len(self.results)}


def ablate(config: Config, seeds: list[int], ingredients: list[str], *, validation_per_class: int = 0,
           progress: bool = True) -> list[Ablation]:
    """The full recipe and the recipe without each ingredient, once per seed, for `config`'s epochs (no budget: the
    differences are the ingredient's); every run scored on the same `validation_per_class` images per class (0: all)."""
    def scored(changes: dict):  # the bundle holding those validation images (None: each run builds its own)
        if not validation_per_class:
            return None
        data = pipeline.build_datasets(config.replace(**changes))
        return class_split.subset_bundle(data, data.classes, val_per_class=validation_per_class)

    unknown = [name for name in ingredients if name not in ABLATIONS]
    if unknown:
        raise ValueError(f"unknown ingredient {unknown[0]!r}; choose from: {', '.join(ABLATIONS)}")
    runs = [("full recipe", {})] + [(name, ABLATIONS[name]) for name in ingredients]
    shared, out = scored({}), []
    # One bar over all the fits (about 280 s on cpu); `progress` adds a bar per epoch of each.
    bar = Progress(len(runs) * len(seeds), "ablation", unit="fits")
    for ingredient, changes in runs:
        results = []
        # The data pipeline changes with storage/augmentation: only reuse the bundle when it cannot.
        same_data = not {"storage", "augmentation", "augment_recipe", "num_workers"} & set(changes)
        own = shared if same_data else scored(changes)
        for seed in seeds:
            bar.set_postfix_str(f"{ingredient}, seed {seed}")
            variant = config.replace(**changes, seed=seed)
            results.append(speedrun.race(variant, label=run_label(ingredient, changes),
                                         bundle=own, progress=progress, verbose=False))
            bar.update()
        out.append(Ablation(ingredient, changes, results))
    bar.close()
    return out


def run_label(ingredient: str, changes: dict) -> str:
    """"without X" for an ingredient taken out; the name itself for the full recipe and a "+" candidate."""
    return f"without {ingredient}" if changes and not ingredient.startswith("+") else ingredient


def rounded(table):
    """`table` with each number to the digits it means: top-1 and changes to a tenth of a point, MFU to a hundredth
    of a percent, images/s whole, seconds to a tenth."""
    digits = {}
    for column in table.columns:
        name = str(column).lower()
        if "mfu" in name and "peak" not in name:
            digits[column] = 4
        elif "top-1" in name or "change" in name:
            digits[column] = 3
        elif "images/s" in name:
            digits[column] = 0
        elif name.startswith("s to") or "seconds" in name or name.endswith(" s"):
            digits[column] = 1
    return table.round(digits)  # text and empty columns are left as they are


def shown(table):
    """`table` as displayed: numbers as `rounded` left them, and a value a row cannot have (a threshold never
    reached, the spread of one seed) as "-", not "None" or "NaN"; the table keeps its numbers."""
    return table.style.format(lambda value: f"{value:g}" if isinstance(value, float) else value, na_rep="-")


def ablation_table(ablations: list[Ablation], level: float = 0.95, device: str = "cpu"):
    """One row per ingredient taken out: top-1 mean and spread over seeds, images/s and MFU, the change against the
    full recipe paired by seed with its interval and verdict (`statistics.compare_variants`; none with one seed)."""
    rows = [a.row() for a in ablations]
    for row, ablation in zip(rows, ablations):
        row["MFU"] = mfu(ablation.results[0], row["images/s mean"], device)
    table = pd.DataFrame(rows).set_index("without")
    table.insert(list(table.columns).index("images/s mean") + 1, "MFU", table.pop("MFU"))
    runs = pd.DataFrame([{"without": a.ingredient, "seed": seed, "val top-1": r.val_top1}
                         for a in ablations for seed, r in enumerate(a.results)])
    compared = statistics.compare_variants(runs, "val top-1", baseline="full recipe", variant="without", level=level)
    full = table.loc["full recipe", "val top-1 mean"]
    table["change vs full"] = compared["delta"] if "delta" in compared else table["val top-1 mean"] - full
    table["change vs full"] = table["change vs full"].fillna(table["val top-1 mean"] - full)
    for column in ("delta low", "delta high", "verdict"):
        table[column] = compared.get(column)
    table.loc["full recipe", "change vs full"] = 0.0
    table["beyond noise"] = table["verdict"].isin(["better", "worse"])
    return rounded(table.rename(columns={"delta low": "change low", "delta high": "change high"}))


def top1_at(result, seconds: float, slack: float = 0.05) -> float | None:
    """The best validation top-1 a racer's curve shows by `seconds` (None: no point yet); `slack` admits the point
    just after a budget of `seconds`, which a racer passes by the optimizer step in flight."""
    points = [p["val_top1"] for p in result.curve if p["seconds"] <= seconds * (1 + slack)]
    return max(points) if points else None


_FLOPS: dict = {}  # (model, image size, classes) -> training FLOPs per image


def _utilization(result, images_per_second: float, device: str) -> dict:
    """`flops.model_flops_utilization` of a race result's model at `images_per_second` on `device`'s peak at the
    race's precision, its training FLOPs per image counted once per (model, image size, classes)."""
    key = (result.config.model, result.config.image_size, result.num_classes or 1000)
    if key not in _FLOPS:
        _FLOPS[key] = flops.training_flops_per_image(timm.create_model(key[0], num_classes=key[2]), key[1])
    return flops.model_flops_utilization(_FLOPS[key], images_per_second, device, result.precision,
                                         result.config.matmul_precision)


def mfu(result, images_per_second: float, device: str = "cpu") -> float | None:
    """Model FLOPs utilization of a race result's model at `images_per_second` (`measure.flops`)."""
    return _utilization(result, images_per_second, device)["mfu"]


def race_table(results: list, device: str = "cpu", at_seconds: float | None = None) -> object:
    """Time to 90/95/97% validation top-1, final top-1, images/s and MFU per racer; with `at_seconds`, a column
    compares every racer at that same clock (`top1_at`)."""
    rows = []
    for result in results:
        utilization = _utilization(result, result.images_per_second, device)
        row = result.row()
        if at_seconds:
            row = {"label": row.pop("label"), f"val top-1 at {at_seconds:.0f} s": top1_at(result, at_seconds), **row}
        columns = list(row)
        row = {**{k: row[k] for k in columns[:columns.index("images/s") + 1]}, "MFU": utilization["mfu"],
               **{k: row[k] for k in columns[columns.index("images/s") + 1:]}, "MFU peak from": utilization["peak_source"]}
        rows.append(row)
    return rounded(pd.DataFrame(rows).set_index("label"))


def plot_race(results: list, title: str = "", axis=None, equal_seconds: float | None = None):
    """Validation top-1 against wall-clock seconds, one line per racer; `equal_seconds` marks the clock at which every
    racer is compared (the shortest budget)."""
    axis = axis or plt.subplots(figsize=(7, 4))[1]
    for result in results:
        seconds = [0.0] + [p["seconds"] for p in result.curve]
        accuracy = [0.0] + [p["val_top1"] for p in result.curve]
        axis.plot(seconds, accuracy, marker="o", label=result.label)
    for level in speedrun.MILESTONES:
        axis.axhline(level, ls=":", c="grey", lw=0.8)
    if equal_seconds:
        axis.axvline(equal_seconds, ls="--", c="black", lw=0.8, label=f"all racers compared at {equal_seconds:.0f} s")
    axis.set(xlabel="wall-clock seconds (decoding included)", ylabel="validation top-1", ylim=(0, 1))
    axis.set_title(title, fontsize=9)
    axis.legend()
    return axis


def _reference_claim(key: str, top1: str, low: float, high: float, reference: float, what: str, hardware):
    """A published figure against the racer's Wilson interval: holds when the whole interval is at or above it,
    refuted when wholly below, else not shown; the reason says which."""
    if low >= reference:
        holds, said = True, f"the whole interval is at or above {reference:.2%}"
    elif high < reference:
        holds, said = False, f"the whole interval is below {reference:.2%}"
    else:
        holds, said = None, f"the interval contains {reference:.2%}"
    return claim_records.checked(key, holds, f"{top1}: {said}, {what}", hardware=hardware)


def claims(racers: list, budget_seconds: float, target_seconds: float = 600.0, hardware: str | None = None) -> list:
    """Notebook 12's claims from the race: the speed-run racer (the last) against the published EuroSAT figures (a
    Wilson interval on its final top-1), the 97%-within-10-minutes target, and airbench's pipeline's images/s."""
    speed, default = racers[-1], next((r for r in racers if r.label == "workbook default"), racers[0])
    images = speed.val_images or 1
    low, high = statistics.binomial_interval(round(speed.val_top1 * images), images)
    views = speed.config.tta_views if getattr(speed, "config", None) is not None else 1
    top1 = (f"{speed.val_top1:.2%} [{low:.2%}, {high:.2%}] from scratch after {speed.seconds:.0f} s, "
            + (f"{views}-view test-time augmentation (the milestones are single view)" if views > 1 else "single view"))
    found = [_reference_claim("eurosat_finetuned_reference", top1, low, high, 0.9857,
                              "a fine-tuned ImageNet ResNet-50's figure", hardware),
             _reference_claim("eurosat_scratch_reference", top1, low, high, 0.9723,
                              "the best from-scratch figure we know of", hardware)]
    reached, budget = speed.time_to(0.97), budget_seconds
    if reached is None and budget < target_seconds:
        found.append(claim_records.not_measurable(
            "speedrun_97_in_10_minutes", f"this racer's budget ({budget:.0f} s) is shorter than 10 minutes and it did "
            "not reach 97%; benchmarks/bench_speedrun.py runs the 10-minute demonstration", hardware))
    else:
        found.append(claim_records.checked(
            "speedrun_97_in_10_minutes", reached is not None and reached <= target_seconds,
            f"97% at {reached:.0f} s on the clock (decoding included)" if reached is not None
            else f"97% not reached in {budget:.0f} s", hardware=hardware))
    found.append(claim_records.checked(
        "airbench_pipeline", speed.images_per_second > default.images_per_second,
        f"speed-run recipe {speed.images_per_second:.0f} images/s against {default.images_per_second:.0f} for the "
        f"{default.label} ({speed.images_per_second / max(default.images_per_second, 1e-9):.1f}x; cached uint8 data, "
        "augmentation on whole batches, no workers, a small net)", hardware=hardware))
    return found


@dataclasses.dataclass
class ImagenettePlan:
    """What section 5 races (config None: not run here), whether on Imagenette itself, and one line saying so."""

    config: Config | None
    seeds: list[int]
    on_imagenette: bool
    line: str


def imagenette_plan(setup: RaceSetup, runs: int = -1) -> ImagenettePlan:
    """Section 5 in this profile: `runs` seeds (-1: the profile's) of the imagenette recipe on data_cache/imagenette/,
    the smoke check on the committed sample, or nothing, with the reason (and the command that gets the data)."""
    chosen = sizes(SIZES, setup.profile)["imagenette"]
    runs = chosen["runs"] if runs < 0 else runs
    if runs == 0:
        return ImagenettePlan(None, [], False, f"not run here: {chosen['why'] or 'imagenette_seeds=0'}")
    if chosen["on"] == "sample":
        config = make_config(setup.profile, recipe="imagenette", data_dir=SAMPLE_DATA_DIR, **chosen["config"])
        return ImagenettePlan(config, list(range(runs)), False, "the imagenette recipe on the committed sample, "
                              f"{config.model} for {config.max_steps} steps: a check that this section runs, not "
                              "Imagenette")
    folder = paths.imagenette_dir()
    if folder is None:
        return ImagenettePlan(None, [], False, f"not run here: no Imagenette in {paths.CACHE_DIR}/imagenette/ "
                              f"(`{paths.GET_IMAGENETTE}` fetches it)")
    config = make_config(setup.profile, recipe="imagenette", data_dir=str(folder), **chosen["config"])
    return ImagenettePlan(config, list(range(runs)), True, f"the imagenette recipe ({config.model}, "
                          f"{config.image_size} px, {config.epochs} epochs), {runs} run(s) on {folder}, scored on "
                          f"{imagenette.OFFICIAL_VAL}")


def imagenette_table(results: list, device: str = "cpu"):
    """One row per run of section 5 (official val top-1/top-5, `valid` top-1, seconds, images/s, MFU), then the mean
    over the runs with its 95% t interval (`speedrun.seed_summary`)."""
    rows = [{"run": f"seed {r.config.seed}", "official val top-1": r.test_top1, "official val top-5": r.test_top5,
             "valid top-1": r.val_top1, "seconds": r.seconds, "images/s": r.images_per_second,
             "MFU": mfu(r, r.images_per_second, device)} for r in results]
    if len(results) > 1:
        summary = speedrun.seed_summary(results)
        for name, key in (("mean", "mean"), ("95% low", "low"), ("95% high", "high")):
            rows.append({"run": name, "official val top-1": summary["test_top1"][key],
                         "official val top-5": summary["test_top5"][key], "valid top-1": summary["top1"][key],
                         "seconds": summary["seconds"][key], "images/s": summary["images_per_second"][key]})
    return rounded(pd.DataFrame(rows).set_index("run")) if rows else pd.DataFrame()


def imagenette_line(plan: ImagenettePlan, results: list, hardware: str) -> str:
    """Where the recipe stands against the leaderboard (`analysis.imagenette.gap_line`), or the plan's line."""
    if plan.on_imagenette and results:
        return imagenette.gap_line(speedrun.seed_summary(results), plan.config, hardware)
    return plan.line


def imagenette_claim(plan: ImagenettePlan, results: list, hardware: str):
    """`imagenette_leaderboard` from section 5's runs; without them, from benchmarks/bench_imagenette.py's saved
    result on Imagenette (an expensive result is loaded when present), else not measurable with the plan's reason."""
    if plan.on_imagenette and results:
        return imagenette.claim(speedrun.seed_summary(results), plan.config, hardware)
    return imagenette.saved_claim() or imagenette.claim(None, plan.config, hardware,
                                                        why_not=plan.line.removeprefix("not run here: "))
