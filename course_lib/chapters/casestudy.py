"""The article's staged remote-sensing case study (its section 6), re-run on the real data every run finds
(`paths.choose_data`: EuroSAT when present; landcover-synth otherwise): the same model at every stage, one change
per stage (`stage_changes`), each trained in the notebook's own cells with the workbook's engine (`train.fit`, or
`torchrun.launch` for several processes) and recorded here (`CaseStudy.record`: its row, kept or not, the ledger);
a last stage runs the workbook's fastest recipe.

Stages follow the article's order: data pipeline, then mixed precision, then DDP, then the training recipe (AdamW,
warmup and cosine decay, Loshchilov & Hutter 2019, arXiv:1711.05101), then the accuracy combination (ImageNet
weights, label smoothing, Szegedy et al. 2016, arXiv:1512.00567, and MixUp, Zhang et al. 2018, arXiv:1710.09412).
A speed stage is carried into the next stage only when its images/s beat the last kept stage's by more than the
timing noise of both (each epoch is one timing; `statistics.difference_beyond_noise`); accuracy is read against the
seed-noise band of repeated baseline runs.
"""
from __future__ import annotations

import dataclasses
import itertools
import math
import secrets
import time

import matplotlib.pyplot as plt
import pandas as pd
import timm
import torch
from huggingface_hub import try_to_load_from_cache
from timm.models import get_pretrained_cfg

from course_lib import devices, ledger, machine, paths
from course_lib.analysis import claims as claim_records
from course_lib.analysis import statistics
from course_lib.chapters.setup import ChapterSetup, sizes
from course_lib.config import RECIPES, Config, ConfigError, make_config, resolve_profile
from course_lib.data import landcover, pipeline
from course_lib.engine import torchrun
from course_lib.engine.auto_precision import reduced_precision
from course_lib.measure import flops

LEDGER_KIND = "casestudy"
SPEED_STAGES = ("data_loader", "amp", "ddp")  # kept only when they speed this machine up beyond noise
# Fields that change which batches a bundle yields: a stage changing one of them gets its own bundle.
DATA_FIELDS = ("dataset", "data_dir", "image_size", "max_train_images", "bad_images", "decoder", "storage",
               "augmentation", "augment_recipe")
# The article's numbers (section 6: 8 classes, ~120k images of 512-1024 px, 4x A100 40 GB) after each stage: minutes
# per epoch and top-1 (a fraction; None: the article gives none), and what the stage changed.
ARTICLE_STAGES = {
    "baseline": (40.0, 0.886),  # single-GPU ResNet-50, every setting default (num_workers=0, fp32, SGD): GPU at 40%
    "data_loader": (26.0, None),  # num_workers 0->16, pin_memory, prefetch_factor 8, persistent_workers: 40% -> 85%+
    "amp": (13.0, 0.885),  # mixed precision (the freed memory let batch 96 -> 160): 39 GB -> 23 GB, no accuracy loss
    "ddp": (5.0, None),  # DistributedDataParallel on 4 GPUs: about 2.5x over single-GPU AMP
    "optimizer": (5.0, 0.912),  # AdamW lr 2e-4, 5 warmup epochs + cosine of 100 epochs (top-1 with DDP and recipe)
    "regularization": (4.0, 0.938),  # ImageNet weights + label smoothing 0.1 + MixUp 0.3 (60 epochs): 1/16 the time
    "fastest_recipe": (None, None),  # not in the article: the workbook's own speed-run recipe (config.RECIPES)
}
ARTICLE_LR = 2e-4  # AdamW learning rate of the article's stage 3
ARTICLE_WARMUP_FRACTION = 5 / 100  # 5 warmup epochs of 100
ARTICLE_WORKERS = 16  # num_workers of the article's stage 1

# Per profile: the study's Config values over the profile's (smoke: the profile's tiny model, 3 steps an epoch;
# cpu: a quarter of EuroSAT's split, so the nine trainings fit in minutes on 2 cores; gpu: all of it); baseline
# seeds for the noise band; landcover-synth's generated file size without real data (0: none, the committed 64 px
# sample; the article's tiles are large, so the resize to image_size costs what it costs there); and the DDP
# stage: whether it launches, with how many CPU processes without 2 GPUs, and why (run_ddp=true forces 2 where
# it launches).
STUDY = {"model": "speedrun_resnet_small", "batch_size": 128, "image_size": 64, "epochs": 2}
SIZES = {
    "smoke": {"config": {"max_steps": 3}, "check_only": True, "noise_seeds": 2, "source_image_size": 0,
              "ddp": {"launch": False, "cpu_processes": 0, "reason": "skipped in the smoke profile: a torchrun launch "
                      "alone takes longer than the notebook's budget"}},
    "cpu": {"config": {**STUDY, "max_train_images": 4500}, "check_only": False, "noise_seeds": 3,
            "source_image_size": 256,
            "ddp": {"launch": True, "cpu_processes": 2,
                    "reason": "2 CPU processes with gloo (this measures DDP's overhead, not a GPU speed-up)"}},
    "gpu": {"config": {**STUDY, "max_train_images": 0}, "check_only": False, "noise_seeds": 3,
            "source_image_size": 512,
            "ddp": {"launch": True, "cpu_processes": 0, "reason": "skipped in the gpu profile"}},
}


@dataclasses.dataclass(kw_only=True)
class CaseSetup(ChapterSetup):
    """Notebook 10's data, config, the baseline's datasets (shared by the stages that read files) and choices."""

    noise_seeds: list  # baseline seeds after the first, for the accuracy noise band
    ddp_processes: int  # processes of the DDP stage; 0: skipped
    ddp_reason: str
    smoke: bool  # a check that the notebook runs (smoke's 3 steps an epoch), not a measurement: run notes say so

    def line(self) -> str:
        config, bundle = self.config, self.bundle
        budget = f" of at most {config.max_steps} steps" if config.max_steps else " over the training images"
        source = ("SYNTHETIC DATA: landcover-synth (generated images), not real satellite tiles. "
                  if self.data.synthetic else "Real images: ") + f"{bundle.source}"
        return (f"{source}\n{config.model} at {config.image_size} px; {len(bundle.train)} training images, "
                f"{len(bundle.val)} validation; budget per stage: {config.epochs} epoch(s){budget}\n"
                f"hardware: {self.hardware}")


def setup(profile: str, dataset: str | None = None, data_dir: str | None = None, source_image_size: int = 0,
          *, noise_seeds: int = 0, run_ddp: str | bool = "auto", **given) -> CaseSetup:
    """The study's data (`dataset`/`data_dir`, else `paths.choose_data`'s, else landcover-synth generated at
    `source_image_size` px; 0: the profile's), config (`SIZES`, then `given`), the baseline's datasets, `noise_seeds`
    (0: the profile's) and the DDP stage's processes (`run_ddp` false skips it, true forces 2 where it launches)."""
    resolved = resolve_profile(profile)
    chosen = sizes(SIZES, resolved)
    data = paths.choose_data(resolved, data_dir, dataset)
    if data.synthetic and chosen["source_image_size"] and not data.overrides.get("data_dir"):
        folder = landcover.landcover_cache_dir(source_image_size or chosen["source_image_size"])
        data = dataclasses.replace(data, overrides={"dataset": "landcover-synth", "data_dir": str(folder)},
                                   folder=folder)
    given = {k: v for k, v in given.items() if v is not None}
    config = make_config(profile, **{**data.overrides, **chosen["config"],
                                     "output_dir": "runs/checkpoints/10_case_study", **given})
    processes, reason = ddp_world_size(resolved, "cuda" if config.device.startswith("cuda") else "cpu")
    if run_ddp is False or run_ddp == "false":
        processes, reason = 0, "skipped: run_ddp is false"
    elif (run_ddp is True or run_ddp == "true") and processes < 2 and chosen["ddp"]["launch"]:
        processes, reason = 2, "forced by run_ddp"
    bundle = pipeline.build_datasets(baseline_config(config))
    return CaseSetup(profile=resolved, data=data, config=config, bundle=bundle,
                     noise_seeds=list(range(1, noise_seeds or chosen["noise_seeds"])), ddp_processes=processes,
                     ddp_reason=reason, smoke=chosen["check_only"])


def baseline_config(config: Config) -> Config:
    """The article's starting point: every speed switch and recipe setting at its default."""
    return config.replace(num_workers=0, pin_memory=False, prefetch_factor=2, persistent_workers=False,
                          precision="off", channels_last=False, compile=False, optimizer="sgd",
                          warmup_epochs=0.0, label_smoothing=0.0, mixup_alpha=0.0, cutmix_alpha=0.0,
                          random_erasing=0.0, ema_decay=0.0, pretrained=False, checkpoint="", resume=False,
                          accumulation_steps=1)


def pretrained_weights_cached(model: str) -> tuple[bool, str]:
    """(available, reason): are timm's ImageNet weights for `model` in the local Hugging Face cache? Checked without
    the network, so a notebook never hangs on a download."""
    config = get_pretrained_cfg(model)
    hub_id = getattr(config, "hf_hub_id", None) if config else None
    if not hub_id:
        return False, f"timm has no pretrained weights for {model}"
    for filename in ("model.safetensors", "pytorch_model.bin"):
        found = try_to_load_from_cache(hub_id, filename)
        if isinstance(found, str):
            return True, f"{hub_id} cached at {found}"
    return False, (f"{hub_id} is not in the Hugging Face cache (and this notebook does not download); "
                   f"fetch it once with timm.create_model({model!r}, pretrained=True)")


def ddp_world_size(profile: str, device) -> tuple[int, str]:
    """(processes, reason) for the DDP stage: every GPU when there are 2 or more, else the profile's (`SIZES`)."""
    plan = sizes(SIZES, profile)["ddp"]
    if not plan["launch"]:
        return 0, plan["reason"]
    if torch.device(device).type == "cuda":
        count = torch.cuda.device_count()
        if count >= 2:
            return count, f"{count} GPUs, NCCL"
        return 0, "skipped: 1 GPU visible, DDP needs 2 or more (the article used 4)"
    return plan["cpu_processes"], plan["reason"]


def stage_changes(stage: str, config: Config, *, device, gpus: int = 0, pretrained: bool = False,
                  lr: float = ARTICLE_LR) -> dict:
    """The Config fields stage `stage` changes, computed for this machine."""
    if stage in ("baseline", "ddp"):
        return {}  # ddp: the number of processes, not a Config field
    if stage == "data_loader":
        # The article's 16 workers, but no more than this machine's starting point (half the physical cores per
        # training process, `devices.recommended_num_workers`).
        return {"num_workers": min(ARTICLE_WORKERS, devices.recommended_num_workers(max(1, gpus))),
                "pin_memory": True, "prefetch_factor": 8, "persistent_workers": True}
    if stage == "amp":
        # The one precision rule (bf16 where the device runs it, fp16 with GradScaler otherwise): the stage always
        # measures a reduced precision, even where precision='auto' would keep fp32.
        return {"precision": reduced_precision(device)}
    if stage == "optimizer":
        # At least one optimizer step of warmup in short runs: 5% of 2 epochs is a fraction of an epoch.
        return {"optimizer": "adamw", "lr": lr, "weight_decay": 0.05,
                "warmup_epochs": ARTICLE_WARMUP_FRACTION * config.epochs}
    if stage == "regularization":
        return {"label_smoothing": 0.1, "mixup_alpha": 0.3, "pretrained": pretrained}
    if stage == "fastest_recipe":
        # The recipe over the kept stages at its own budget (its epochs over the whole split): the one stage
        # trained at a full budget (about 97% on EuroSAT; the floor of `analysis.floors`), so its top-1 is the
        # study's end point, not a 2-epoch snapshot. Its images/s still compare with every stage's; its top-1
        # compares with the baseline's only at the same budget (`claims`). The study's model and image size;
        # one view at validation like every other stage.
        recipe = {k: v for k, v in RECIPES["speedrun"].items() if k not in ("model", "image_size", "max_steps")}
        return {**recipe, "tta_views": 1, "mixup_alpha": 0.0, "pretrained": False}
    raise ConfigError(f"unknown stage {stage!r}; stages: {', '.join(ARTICLE_STAGES)}")


@dataclasses.dataclass
class CaseStudy:
    """The stages' bookkeeping: the notebook trains each stage on the kept `config`; `record` makes its row, decides
    whether it is kept and carries a kept stage's config forward; `table` and `plot` show them."""

    config: Config  # the configuration the next stage starts from
    profile: str  # smoke | cpu | gpu (resolved): DDP workers rebuild their config from it
    bundle: object = None  # a data.DataBundle shared by the single-process stages (None: `bundle_for` builds one)
    world_size: int = 1  # processes the next stage trains with (DDP kept: more than 1, torchrun.launch)
    study_id: str = dataclasses.field(default_factory=lambda: time.strftime("%Y%m%d-%H%M%S-") + secrets.token_hex(2))
    notebook: str = "10_case_study"
    rows: list[dict] = dataclasses.field(default_factory=list)
    train_images: int | None = None  # images per full epoch, to turn images/s into epoch time
    num_classes: int | None = None  # of the bundle, for the FLOPs count behind MFU
    flops_per_image: float | None = None  # training FLOPs per image of the study's model (MFU)
    baseline_top1s: list = dataclasses.field(default_factory=list)  # baseline val top-1 per seed (noise band)
    baseline_rates: list = dataclasses.field(default_factory=list)  # baseline images/s per epoch, every seed
    bundles: dict = dataclasses.field(default_factory=dict)  # data fields -> DataBundle built for them
    config_of: dict = dataclasses.field(default_factory=dict)  # stage -> the Config it trained with

    def bundle_for(self, config: Config):
        """The bundle for `config`'s data fields: the one given for the first, else one built once."""
        key = tuple(getattr(config, name) for name in DATA_FIELDS)
        if not self.bundles and self.bundle is not None:
            self.bundles[tuple(getattr(self.config, name) for name in DATA_FIELDS)] = self.bundle
        if key not in self.bundles:
            self.bundles[key] = pipeline.build_datasets(config)
        return self.bundles[key]

    def record_seed(self, result) -> None:
        """Count one more baseline run (`train.fit` with another seed; the first counts too) in the seed-noise band
        and its epochs' images/s in the baseline's timings."""
        self.baseline_top1s.append(result.final["val_top1"])
        self.baseline_rates.extend(row["images_per_second"] for row in result.history)

    def _noise(self, top1: float = 0.0) -> dict | None:
        """`statistics.seed_noise` of the baseline seeds with the binomial error of an accuracy on the validation images
        (`floor`); None before 2 seeds or without a `top1`."""
        if len(self.baseline_top1s) < 2 or top1 is None or math.isnan(top1):
            return None
        noise = statistics.seed_noise(self.baseline_top1s)
        return {**noise, "floor": statistics.binomial_std(noise["mean"], self.rows[0].get("val_images") or 1)}

    def accuracy_band(self, z: float = 2.0) -> float | None:
        """Half-width of the band a stage's single-seed top-1 stays within around the baseline seeds' mean when the
        stage changed nothing (`statistics.noise_band`, the std floored at the binomial error); None before 2 seeds."""
        noise = self._noise()
        return None if noise is None else statistics.noise_band(max(noise["std"], noise["floor"]), noise["runs"], z)

    def top1_test(self, top1: float, z: float = 2.0) -> dict | None:
        """Is a stage's single-seed top-1 beyond the baseline seeds' noise (`statistics.difference_beyond_noise`,
        their std floored at the binomial error)? delta, band, beyond (+1, -1, 0); None before 2 seeds."""
        noise = self._noise(top1)
        return None if noise is None else statistics.difference_beyond_noise([top1], self.baseline_top1s, z=z,
                                                                                floor=noise["floor"])

    def seeds_needed(self, top1: float) -> int | None:
        """How many paired seeds of a stage and the baseline would show its difference at 80% power
        (`statistics.seeds_needed`; one run's difference spreads by the seeds' std times sqrt 2); None before 2."""
        noise = self._noise(top1)
        return None if noise is None else statistics.seeds_needed(top1 - noise["mean"], noise["std"] * math.sqrt(2))

    def record(self, stage: str, config: Config, result, changes: dict, note: str = "") -> dict:
        """Record a stage trained with `config` (`changes` on the kept `self.config`; `result`: train.fit's FitResult
        or torchrun.launch's LaunchResult): its row, kept or not, the ledger; a kept stage is carried forward."""
        if stage not in ARTICLE_STAGES:
            raise ConfigError(f"unknown stage {stage!r}; stages: {', '.join(ARTICLE_STAGES)}")
        self.config_of[stage] = config
        if isinstance(result, torchrun.LaunchResult):
            metrics = dict(result.metrics)
            rates = metrics.get("epoch_images_per_second") or (
                [metrics["images_per_second"]] if metrics.get("images_per_second") else [])
            # The workers resolve precision=auto themselves: their ledger row says what they trained in.
            precision_used = result.parameters.get("precision_used") or config.precision
        else:
            bundle = self.bundle_for(config)
            metrics = {**result.final, "val_images": len(bundle.val) if bundle.val is not None else None,
                       "train_images": len(bundle.train)}
            rates = [row["images_per_second"] for row in result.history]
            precision_used = result.precision
            if self.train_images is None:
                self.train_images, self.num_classes = len(bundle.train), len(bundle.classes)
            if stage == "baseline" and not self.baseline_top1s:
                self.record_seed(result)
        processes, rate = result.world_size, metrics.get("images_per_second")
        change = ", ".join(f"{k}={v}" for k, v in changes.items()) or "-"
        row = {"stage": stage, "change": change if stage != "ddp" else f"{processes} processes",
               "world_size": processes, "batch_per_process": config.batch_size, "precision": precision_used,
               "num_workers": devices.resolve_num_workers(config.num_workers), "images_per_second": rate,
               # The capped epoch measured (max_steps) and the time a full pass over the split would take.
               "epoch_seconds": metrics.get("epoch_seconds"),
               "full_epoch_seconds": self.train_images / rate if self.train_images and rate else None,
               **{key: metrics.get(key) for key in ("data_wait_fraction", "peak_memory_bytes", "peak_memory_kind",
                                                    "train_loss", "val_top1", "val_images")},
               "epochs": config.epochs, "train_images": metrics.get("train_images", self.train_images),
               "wall_seconds": result.duration_seconds, "note": note, "epoch_rates": rates}
        self._decide(row)
        self.rows.append(row)
        ledger.record(LEDGER_KIND, stage, duration_seconds=row["wall_seconds"],
                      parameters={"stage": stage, "study_id": self.study_id, "notebook": self.notebook,
                                  "profile": self.profile, "world_size": processes, "changes": changes,
                                  **config.to_dict()},
                      metrics={k: v for k, v in row.items() if k not in ("stage", "change")})
        if row["kept"]:
            self.config, self.world_size = config, processes
        return row

    def restart(self, label: str = "model-first") -> "CaseStudy":
        """A second study from this one's baseline (its run, seeds and noise band shared, nothing else kept), for
        the same stages in another order (`chapters.optimisation_order`); recorded under `<study_id>-<label>`."""
        baseline = next(row for row in self.rows if row["stage"] == "baseline")
        return dataclasses.replace(
            self, config=self.config_of["baseline"], world_size=1, study_id=f"{self.study_id}-{label}",
            rows=[baseline], baseline_top1s=list(self.baseline_top1s), baseline_rates=list(self.baseline_rates),
            bundles=self.bundles, config_of={"baseline": self.config_of["baseline"]})

    def skip(self, stage: str, reason: str) -> dict:
        """A stage that cannot run here: a row saying why (recorded too, status 'skipped')."""
        row = {"stage": stage, "change": reason, "world_size": None, "kept": False, "note": reason}
        self.rows.append(row)
        ledger.record(LEDGER_KIND, stage, status="skipped", parameters={
            "stage": stage, "study_id": self.study_id, "notebook": self.notebook, "profile": self.profile},
            metrics={"note": reason})
        return row

    def _decide(self, row: dict) -> None:
        """Speed-up against the baseline and the last kept stage; a speed stage is kept only when its epochs' images/s
        beat the last kept stage's beyond the noise of both (`statistics.difference_beyond_noise`, z = 2)."""
        measured = [r for r in self.rows if r.get("images_per_second")]
        baseline = measured[0] if measured else row
        kept = [r for r in measured if r["kept"]]
        previous = kept[-1] if kept else baseline
        rate = row["images_per_second"]
        row["speedup_vs_baseline"] = rate / baseline["images_per_second"] if rate else None
        row["speedup_vs_previous"] = rate / previous["images_per_second"] if rate else None
        row["rate_noise_band"] = row["faster_beyond_noise"] = None
        if row["stage"] not in SPEED_STAGES:
            row["kept"] = True
            return
        mine = row.get("epoch_rates") or ([rate] if rate else [])
        theirs = previous.get("epoch_rates") or [previous["images_per_second"]]
        if not rate or (len(mine) < 2 and len(theirs) < 2):
            row["kept"] = False
            reason = "no noise estimate (one timing on each side)"
        else:
            test = statistics.difference_beyond_noise(mine, theirs)
            row["rate_noise_band"] = test["band"]
            row["faster_beyond_noise"] = row["kept"] = bool(test["beyond"] > 0)
            reason = (f"{row['speedup_vs_previous']:.2f}x the previous kept stage's images/s, "
                      f"{test['delta']:+.0f} images/s against a noise band of ±{test['band']:.0f}")
        row["note"] = (row["note"] + "; " if row["note"] else "") + ("kept: " if row["kept"] else "not kept: ") + reason

    def table(self):
        """The cumulative table: this machine's measurements next to the article's numbers."""
        table = pd.DataFrame(self.rows).set_index("stage")
        table = table.join(pd.DataFrame.from_dict(ARTICLE_STAGES, orient="index",
                                                  columns=["article_epoch_minutes", "article_top1"]), how="left")
        table["article_speedup"] = ARTICLE_STAGES["baseline"][0] / table["article_epoch_minutes"]
        band = self.accuracy_band()
        if band is not None and "val_top1" in table:
            table["val_top1_band"] = band
            tests = [self.top1_test(top1) for top1 in table["val_top1"]]
            table["top1_vs_baseline_seeds"] = [None if test is None else {1: "higher", -1: "lower", 0: "within noise"}[
                test["beyond"]] for test in tests]
        table = self._with_mfu(table)
        columns = ["change", "kept", "world_size", "precision", "num_workers", "epochs", "train_images",
                   "images_per_second", "MFU", "rate_noise_band", "full_epoch_seconds", "data_wait_fraction",
                   "peak_memory_bytes", "val_top1", "val_top1_band", "top1_vs_baseline_seeds", "speedup_vs_baseline",
                   "article_epoch_minutes", "article_speedup", "article_top1", "note"]
        return table[[c for c in columns if c in table.columns]]

    def _with_mfu(self, table):
        """The MFU column after images/s, per process, against the device's peak in each stage's precision."""
        if "images_per_second" not in table or table["images_per_second"].notna().sum() == 0:
            return table
        if self.flops_per_image is None:
            model = timm.create_model(self.config.model, num_classes=self.num_classes or 10)
            self.flops_per_image = flops.training_flops_per_image(model, self.config.image_size)
        speeds = table["images_per_second"].astype(float) / table["world_size"].fillna(1).astype(float)
        precisions = table["precision"].where(table["precision"].notna(), "off") if "precision" in table else "off"
        per_process = table.assign(images_per_second=speeds, precision=precisions)
        with_mfu = flops.with_mfu(per_process, None, self.config.image_size, devices.resolve_device(self.config.device),
                                  "precision", images_per_second="images_per_second",
                                  flops_per_image=self.flops_per_image, matmul_precision=self.config.matmul_precision)
        table = table.copy()
        table.insert(list(table.columns).index("images_per_second") + 1, "MFU", with_mfu["MFU"])
        return table

    def plot(self, axes=None):
        """The staircase: speed-up and top-1 per stage, measured vs the article."""
        table = self.table()
        measured = table[table["images_per_second"].notna()] if "images_per_second" in table else table.iloc[:0]
        if axes is None:
            _, axes = plt.subplots(1, 2, figsize=(11, 3.8))
        stages = list(table.index)
        positions = range(len(stages))
        article_speedup = table["article_speedup"].tolist()
        axes[0].step(positions, article_speedup, where="mid", color="grey", linestyle="--", label="article (4x A100)")
        axes[0].plot(positions, article_speedup, "s", color="grey")
        colours = ["C0" if kept else "C3" for kept in measured["kept"]]
        axes[0].scatter([stages.index(s) for s in measured.index], measured["speedup_vs_baseline"], c=colours,
                        zorder=3, label="measured (red: not kept)")
        kept = measured[measured["kept"]]
        axes[0].step([stages.index(s) for s in kept.index], kept["speedup_vs_baseline"], where="mid", color="C0",
                     linewidth=1)
        axes[0].axhline(1.0, color="black", linewidth=0.5)
        axes[0].set(yscale="log", ylabel="speed-up vs baseline (log)", title="speed staircase")
        axes[1].bar([p - 0.2 for p in positions], table["article_top1"].fillna(0), width=0.4, color="grey",
                    label="article top-1")
        axes[1].bar([stages.index(s) + 0.2 for s in measured.index], measured["val_top1"], width=0.4, color="C0",
                    label="measured val top-1")
        # ylim: room for the legend above the bars
        axes[1].set(ylabel="top-1 accuracy", ylim=(0, 1.2), title="accuracy per stage")
        for axis in axes:
            axis.set_xticks(list(positions))
            axis.set_xticklabels(stages, rotation=30, ha="right")
            axis.legend(fontsize=8, loc="upper left", ncol=2)
        plt.tight_layout()
        return axes


def previous_studies(limit: int = 10):
    """Earlier case-study runs from the ledger, one row per study (newest first): speed-up vs baseline and val top-1
    per stage, with profile and hardware."""
    studies: dict[str, dict] = {}
    for row in ledger.Ledger().rows(kind=LEDGER_KIND):
        parameters, metrics = row["parameters"], row["metrics"]
        study = parameters.get("study_id")
        if not study or row["status"] != "ok":
            continue
        entry = studies.setdefault(study, {"study_id": study, "created_at": row["created_at"],
                                           "profile": parameters.get("profile"), "model": parameters.get("model"),
                                           "hardware": machine.describe_hardware(row["hardware"])
                                           if row["hardware"] else None})
        entry["created_at"] = min(entry["created_at"], row["created_at"])
        if metrics.get("speedup_vs_baseline") is not None:
            entry[f"{row['name']} speed-up"] = metrics["speedup_vs_baseline"]
        if metrics.get("val_top1") is not None:
            entry[f"{row['name']} top-1"] = metrics["val_top1"]
    frame = pd.DataFrame(list(studies.values()))
    if frame.empty:
        return frame
    return frame.sort_values("created_at", ascending=False).head(limit).reset_index(drop=True)


def speedup_interval(study: CaseStudy, stage: str = "fastest_recipe") -> dict | None:
    """Images/s of `stage` over the baseline's with a bootstrap interval over each epoch of both (`ratio_interval`):
    {ratio, low, high, timings}, low = high = None with fewer than 2 timings on a side; None without a speed."""
    row = next((r for r in study.rows if r["stage"] == stage and r.get("images_per_second")), None)
    if row is None or not study.baseline_rates:
        return None
    rates = row.get("epoch_rates") or [row["images_per_second"]]
    timings = f"{len(rates)} timing(s) against {len(study.baseline_rates)}"
    if len(rates) < 2 or len(study.baseline_rates) < 2:
        ratio = (sum(rates) / len(rates)) / (sum(study.baseline_rates) / len(study.baseline_rates))
        return {"ratio": ratio, "low": None, "high": None, "timings": timings}
    return {**statistics.ratio_interval(rates, study.baseline_rates), "timings": timings}


def claims(study: CaseStudy, hardware: str | None = None) -> list:
    """The article's section-6 claims from this study's rows: the overall speed-up (the fastest recipe's images/s over
    the baseline's), a speed stage's when it was kept, an accuracy stage's when its top-1 beats the seeds' noise."""
    rows = {r["stage"]: r for r in study.rows}
    hardware = hardware or machine.describe_hardware()
    found = [_speedup_claim(study, rows, hardware)]
    found += [_missing(rows, key, stage, hardware) or _speed_stage_claim(study, rows, key, stage, hardware)
              for key, stage in (("casestudy_dataloader", "data_loader"), ("casestudy_amp", "amp"),
                                 ("casestudy_ddp", "ddp"))]
    found += [_missing(rows, key, stage, hardware) or _other_global_batch(rows, key, stage, hardware)
              or claim_records.checked(key, *_accuracy(study, rows[stage]), hardware=hardware)
              for key, stage in (("casestudy_adamw", "optimizer"), ("casestudy_regularization", "regularization"))]
    return found + [_overall_accuracy_claim(study, rows, hardware)]


def _missing(rows: dict, key: str, stage: str, hardware: str):
    """A not-measurable record when `stage` was not run or was skipped, else None."""
    row = rows.get(stage)
    if row is None:
        return claim_records.not_measurable(key, f"stage {stage} was not run", hardware)
    if row.get("images_per_second") is None:
        return claim_records.not_measurable(key, row.get("note") or "skipped", hardware)
    return None


def _other_global_batch(rows: dict, key: str, stage: str, hardware: str):
    """A not-measurable record when `stage` trained at another global batch than the baseline (a kept DDP stage's):
    fewer optimizer steps in the same epochs, so its top-1 differs by its steps as much as by its change."""
    row, baseline = rows[stage], rows.get("baseline", {})
    ours, theirs = ((r.get("world_size") or 1) * (r.get("batch_per_process") or 0) for r in (row, baseline))
    if not baseline or ours == theirs:
        return None
    return claim_records.not_measurable(
        key, f"{stage} trained on {row['world_size']} processes at a global batch of {ours} against the baseline's "
             f"{theirs} (a kept DDP stage): fewer optimizer steps in the same epochs, so its top-1 does not compare "
             "with the baseline seeds' (run_ddp=false decides it)", hardware)


def _accuracy(study: CaseStudy, row: dict) -> tuple[bool | None, str]:
    """(holds, reason) of a stage's top-1 against the baseline seeds: holds above the band, refuted below, not shown
    inside it (with the seeds a paired comparison would need)."""
    after = f"after {row.get('epochs', '?')} epoch(s) of {row.get('train_images') or '?'} images"
    test = study.top1_test(row.get("val_top1"))
    if test is None:
        return None, f"top-1 {row['val_top1']:.1%} {after} (fewer than 2 baseline seeds: no noise band)"
    holds = {1: True, -1: False, 0: None}[test["beyond"]]
    needed = study.seeds_needed(row["val_top1"]) if holds is None else None
    return holds, (f"top-1 {row['val_top1']:.1%} {after}, {100 * test['delta']:+.1f} points vs the "
                   f"baseline seeds' mean (noise band ±{100 * test['band']:.1f})"
                   + (f"; power: about {needed} paired seeds of this stage and the baseline would show "
                      f"{100 * test['delta']:+.1f} points at 80%" if needed else ""))


def _speedup_claim(study: CaseStudy, rows: dict, hardware: str):
    """The fastest recipe's images/s over the baseline's, with its bootstrap interval."""
    speedup = speedup_interval(study)
    if speedup is None:
        return claim_records.not_measurable("case_study_speedup", "the fastest recipe or the baseline was not timed",
                                            hardware)
    staircase = rows.get("regularization", {}).get("speedup_vs_baseline")
    interval = (speedup["low"], speedup["high"]) if speedup["low"] is not None else None
    return claim_records.measured(
        "case_study_speedup", speedup["ratio"], interval,
        f"the workbook's fastest recipe vs the baseline, images/s (= time per epoch), {speedup['timings']} "
        f"baseline timings (bootstrap interval); the article's own staircase (through regularization) "
        + (f"{staircase:.2f}x" if staircase else "not measured") + f"; {study.config.model}, "
        f"{study.config.image_size} px", hardware)


def _speed_stage_claim(study: CaseStudy, rows: dict, key: str, stage: str, hardware: str):
    """A speed stage (data loader, AMP, DDP) holds when it was kept; AMP must also keep its top-1."""
    row, baseline = rows[stage], rows.get("baseline", {})
    return claim_records.checked(
        key, bool(row["kept"]) and (stage != "amp" or study.top1_test(row["val_top1"]) is None
                                    or study.top1_test(row["val_top1"])["beyond"] >= 0),
        f"{row['speedup_vs_previous']:.2f}x the previous kept stage's images/s, "
        + ("faster beyond the timing noise" if row["kept"] else "not faster beyond the timing noise")
        + (f"; data wait {baseline.get('data_wait_fraction', float('nan')):.0%} -> {row['data_wait_fraction']:.0%}"
           if stage == "data_loader" and row.get("data_wait_fraction") is not None else "")
        + (f"; {row['precision']}, peak memory "
           f"{_ratio(row.get('peak_memory_bytes'), _last_kept_before(study.rows, 'amp', 'peak_memory_bytes'))}"
           f" ({row.get('peak_memory_kind')}); " + _accuracy(study, row)[1] if stage == "amp" else "")
        + (f" with {row['world_size']} processes" if stage == "ddp" else ""), hardware=hardware)


def _overall_accuracy_claim(study: CaseStudy, rows: dict, hardware: str):
    """The last stage's top-1 against the baseline's, only when both trained the same budget."""
    baseline = rows.get("baseline", {})
    last = study.rows[-1] if study.rows else {}
    budget = {name: (last.get(name), baseline.get(name)) for name in ("epochs", "train_images")}
    if last.get("images_per_second") and baseline and any(ours != theirs for ours, theirs in budget.values()):
        return claim_records.not_measurable(
            "casestudy_accuracy", f"{last['stage']} trained {budget['epochs'][0]} epoch(s) of "
            f"{budget['train_images'][0]} images (top-1 {last['val_top1']:.1%}), the baseline {budget['epochs'][1]} of "
            f"{budget['train_images'][1]}: top-1s of different budgets do not compare (the article's stages at one "
            "budget: casestudy_regularization)", hardware)
    if last.get("images_per_second") and baseline:
        holds, text = _accuracy(study, last)
        return claim_records.checked("casestudy_accuracy", holds, f"{last['stage']}: {text}", hardware=hardware)
    return (_missing(rows, "casestudy_accuracy", last.get("stage", "baseline"), hardware)
            or claim_records.not_measurable("casestudy_accuracy", "no baseline was run", hardware))


def run_notes(study: CaseStudy, *, smoke: bool = False, synthetic: bool = False) -> str:
    """What to keep in mind reading the claims: stages not kept, and the smoke / synthetic caveats."""
    notes = ["Stages not kept on this hardware: " + (", ".join(r["stage"] for r in study.rows if not r["kept"])
                                                     or "none")]
    if smoke:
        notes.append("Smoke profile: a few steps of a tiny model on 32 px images; the speed numbers mostly show "
                     "start-up costs and a busy CPU, and accuracy after 3 steps is noise. Run with profile='cpu' or "
                     "'gpu'.")
    if synthetic:
        notes.append("These numbers were measured on SYNTHETIC DATA (landcover-synth), not on real satellite tiles.")
    return "\n".join(notes)


def _last_kept_before(rows: list[dict], stage: str, field: str):
    earlier = itertools.takewhile(lambda row: row["stage"] != stage, rows)
    return ([row[field] for row in earlier if row.get("kept") and row.get(field)] or [None])[-1]


def _ratio(after, before) -> str:
    if not after or not before:
        return "n/a"
    return f"{before / 2**20:.0f} -> {after / 2**20:.0f} MiB ({after / before:.2f}x)"
