"""Notebook 13's studies: a teacher trained by the workbook is distilled, pruned, quantized, exported and taught
new classes, each result a table row of accuracy, size and speed. The techniques live in `engine.distillation`,
`engine.continual` and `deploy.*`, applied in the notebook's cells; this module sets the chapter up, makes each
table row and decides the article's claims.
"""
from __future__ import annotations

import dataclasses
from pathlib import Path

import pandas as pd

from course_lib.analysis import claims as claim_records
from course_lib.analysis import statistics
from course_lib.chapters.setup import ChapterSetup, sizes
from course_lib.chapters.time_to_accuracy import SMOKE_SIZES
from course_lib.config import PROFILES, Config, resolve_profile
from course_lib.data import class_split, datasets, pipeline
from course_lib.deploy import export, pruning, quantization
from course_lib.deploy.latency import forward_flops_per_image, speed_row
from course_lib.measure.inventory import CPU_ISA_MEANING, cpu_isa
from course_lib.models import factory


@dataclasses.dataclass(kw_only=True)
class DeploySetup(ChapterSetup):
    """Notebook 13's configs and datasets (`setup`): `config` is every later fit's (students, pruning fine-tunes,
    continual steps: the recipe's data path, shorter), `bundle` the data every study trains and scores on."""

    teacher: Config  # the speed-run recipe on the whole training split: the model every study starts from
    val_per_class: int  # validation images per class in every evaluation; 0: all
    seeds: list = dataclasses.field(default_factory=list)  # of every student
    speed: dict | None = None  # options of deploy.latency.speed_row (None: its defaults)
    calibration_batches: int = 8  # training batches that set the int8 ranges
    sparsities: list = dataclasses.field(default_factory=list)  # unstructured pruning, each a fine-tune
    channel_ratios: list = dataclasses.field(default_factory=list)  # channel pruning, each a fine-tune
    converged_bundle: object = None  # what the students and pruning fine-tunes train on (None: `bundle`), scored
    # on bundle.val: the models this chapter concludes from reach its floors, not the short fits' few images
    finetune_epochs: int = 1  # epochs of each pruning fine-tune
    student_epochs: int | None = None  # epochs of each student (None: the later fits' own)
    memory_per_class: int = 20  # continual learning: old images kept per class, replayed in balance
    compile_int8: bool = False  # compile_int8=auto: compile the int8 graph (the gpu profile's choice)

    @property
    def converged_data(self):
        """The students' and the pruning fine-tunes' training data: `converged_bundle`, else `bundle`."""
        return self.converged_bundle if self.converged_bundle is not None else self.bundle

    def compiles_int8(self, choice: str | bool = "auto") -> bool:
        """The notebook's `compile_int8`: true, false, or auto (the profile's choice, `SIZES`: the gpu profile
        only, a C++ compile takes 30-90 s on 2 cores)."""
        return choice is True or choice == "true" or (choice == "auto" and self.compile_int8)

    def line(self) -> str:
        bundle = self.bundle
        return (f"profile {self.profile}: {bundle.source}, {len(bundle.classes)} classes, {len(bundle.train)} "
                f"training images for the short fits, {len(self.converged_data.train)} for the students and "
                f"fine-tunes, {len(bundle.val)} validation images; {self.hardware}")


# Per profile (`sizes`): the teacher's values over the recipe's (smoke: time_to_accuracy.SMOKE_SIZES and the
# profile's test_resnet: the speed-run net's int8 graph and pruning alone took 90 s of the smoke minute on 2 busy
# cores); every later fit's sizes (cpu: 1,000 training images for 8 epochs, about 15 fits in a few minutes);
# validation images per class in every evaluation (0: all); whether compile_int8=auto compiles the int8 graph
# (a C++ compile takes 30-90 s on 2 cores). What each measures beyond its sizes. smoke: one timing repeat (a
# check, not a measurement), two calibration batches, one sparsity and ratio; cpu: medians of 3 repeats (about
# 18 models are timed), one sparsity and one channel ratio; gpu: the whole sweeps with the timing defaults.
# converged_images: the training images of the students and pruning fine-tunes (0: the whole split; None: the
# later fits' own). student_epochs: each student's epochs (None: the later fits'). speedrun_resnet_tiny alone (labels
# only, seed 0) reached 93.3% on the carve-out of train after 8 epochs of the rest (17,010 images; 58 s on a 2-core AMD
# EPYC, 2026-12-05), above the 90% floor of the distilled student. finetune_epochs: each pruning fine-tune's,
# chosen on the carve-out too: a teacher trained on the rest of train (97.4% on the carve-out) with half its
# channels removed recovered to 95.3% after 2 epochs of that rest, 95.6% after 4 and 96.0% after 6 (seed 0,
# the same machine, single view): six keep it within the 2-point floor (`analysis.floors`) with room.
SIZES = {
    "smoke": {"teacher": {**SMOKE_SIZES, "model": PROFILES["smoke"]["model"]}, "fits": {"max_steps": 2, "epochs": 1},
              "val_per_class": 0, "compile_int8": False, "seeds": 1,
              "speed": {"repeats": 1, "warmup": 1, "min_images": 1}, "calibration_batches": 2, "sparsities": [0.8],
              "channel_ratios": [0.5], "memory_per_class": 4, "converged_images": None, "finetune_epochs": 1,
              "student_epochs": None},
    "cpu": {"teacher": {}, "fits": {"max_train_images": 1000, "epochs": 8}, "val_per_class": 100,
            "compile_int8": False, "seeds": 1, "speed": {"repeats": 3, "warmup": 1}, "calibration_batches": 8,
            "sparsities": [0.9], "channel_ratios": [0.5], "memory_per_class": 20, "converged_images": 0,
            "finetune_epochs": 6, "student_epochs": 8},
    "gpu": {"teacher": {}, "fits": {}, "val_per_class": 0, "compile_int8": True, "seeds": 3, "speed": None,
            "calibration_batches": 8, "sparsities": [0.3, 0.5, 0.7, 0.9], "channel_ratios": [0.25, 0.5, 0.75],
            "memory_per_class": 20, "converged_images": 0, "finetune_epochs": 6, "student_epochs": None},
}
# The long version of the distillation study (issue 51): the cpu pass's -0.0 points [-1.3, +1.2] over 3 seeds on 1,000
# validation images cannot decide against the 1-point margin. 5 seeds (its spread, 0.49 points, asks for 4 to
# bring the interval inside the margin), every validation image, and students of 16 epochs: on the carve-out of
# train (seed 0, labels only, AMD EPYC) 8 epochs gave 93.3%, 12 gave 95.0% and 16 gave 95.8%.
# The cpu pass trains one student per method (six 8-epoch students took 9 of the 97 minutes of the whole cpu run on a
# 2-core Intel Xeon, issue 51's 45-minute budget): it shows the method and the floor; the reference decides the claim.
SIZES["reference"] = {**SIZES["cpu"], "seeds": 5, "val_per_class": 0, "student_epochs": 16}


OUTPUT_DIR = "runs/checkpoints/13_compress_and_deploy"
STUDENT_MODEL = "speedrun_resnet_tiny"  # a quarter of the teacher's arithmetic (models/speedrun.py)


def setup(profile: str, data_dir: str | None = None, *, val_per_class: int = -1, model: str | None = None,
          epochs: int | None = None, seeds: int = 0, **given) -> DeploySetup:
    """The data `datasets.config_with_data` picks and the teacher: the speed-run recipe on the whole training split
    (`model`, `epochs` replacing its own). Later fits: the recipe on the profile's fit sizes, pre-decoded, and `given`
    (None: not given); every evaluation on `val_per_class` images per class (-1: the profile's; 0: all)."""
    profile = resolve_profile(profile)
    given = {k: v for k, v in given.items() if v is not None}
    choices = dict(sizes(SIZES, profile))
    teacher, data = datasets.config_with_data(profile, data_dir=data_dir, recipe="speedrun",
                                              **{"output_dir": f"{OUTPUT_DIR}/teacher", **choices.pop("teacher"),
                                                 **{k: v for k, v in given.items() if k == "image_size"}})
    teacher = teacher.replace(**{k: v for k, v in {"model": model, "epochs": epochs}.items() if v is not None})
    config = teacher.replace(storage="cache", min_image_size=0, tta_views=1, output_dir=OUTPUT_DIR,
                             **{**choices.pop("fits"), **given})
    bundle = pipeline.build_datasets(config)
    profile_val_per_class = choices.pop("val_per_class")
    val_per_class = profile_val_per_class if val_per_class < 0 else val_per_class
    if val_per_class:
        bundle = class_split.subset_bundle(bundle, bundle.classes, val_per_class=val_per_class)
    choices["seeds"] = list(range(seeds or choices["seeds"]))
    converged_images = choices.pop("converged_images")
    if converged_images is not None and converged_images != config.max_train_images:
        whole = pipeline.build_datasets(config.replace(max_train_images=converged_images))
        choices["converged_bundle"] = class_split.subset_bundle(whole, whole.classes, val_per_class=val_per_class)
    return DeploySetup(profile=profile, data=data, config=config, bundle=bundle, teacher=teacher,
                       val_per_class=val_per_class, **choices)


def top1(model, bundle, config) -> float:
    """Top-1 of `model` on `bundle`'s validation split."""
    return export.top1(model, bundle.val, config, bundle.device_stage)


# `deploy.latency.speed_row`'s smoke timing: one repeat, a check that runs without spending its minute on clocks.
SMOKE_SPEED = SIZES["smoke"]["speed"]


def describe(model, bundle, config, speed: dict | None = None, *, flops_of=None, peak_precision: str = "fp32",
             **extra) -> dict:
    """One table row: top-1, parameters, MB of weights, speed at batch 1 and 64 (`speed`: `speed_row`'s options) with
    the inference MFU: forward FLOPs of `flops_of` (default `model`; the fp32 module of a bf16/int8/exported copy)."""
    flops_per_image = forward_flops_per_image(flops_of if flops_of is not None else model, config.image_size)
    return {**extra, "val top-1": top1(model, bundle, config), "parameters": factory.count_parameters(model),
            "MB": quantization.model_size_bytes(model) / 1e6,
            **speed_row(model, config.image_size, flops_per_image=flops_per_image, precision=peak_precision,
                        **(speed or {}))}


def pruned_row(model, bundle, config, speed: dict | None, method: str, requested: float) -> dict:
    """One row of notebook 13's pruning table: `describe` with the fraction of weights that are exactly zero."""
    return describe(model, bundle, config, speed, method=method, requested=requested,
                    **{"zero weights": pruning.weight_sparsity(model)})


def int8_row(graph, model, bundle, config, speed: dict | None, precision: str, compiled=None, **extra) -> dict:
    """An int8 row of the quantization table: the PT2E `graph` (or `compiled`) run as a module, with the FLOPs and
    parameters of the fp32 `model` it came from and the MB of its int8 weights."""
    runner = (export.InferenceModel(graph, "PT2E int8 reference") if compiled is None
              else export.InferenceModel(compiled, "PT2E int8 + Inductor"))
    return {**describe(runner, bundle, config, speed, flops_of=model, precision=precision),
            "parameters": factory.count_parameters(model), "MB": quantization.model_size_bytes(graph) / 1e6, **extra}


def served_row(label: str, runner, model, path: Path | None, images, bundle, config, speed: dict | None = None) -> dict:
    """A row of the export table: `model` served as `runner` from `path` (None: eager), its largest logit difference
    from `model` on `images`, top-1 and speed (MFU on `model`'s FLOPs: the same however it is served)."""
    flops_per_image = forward_flops_per_image(model, config.image_size)
    return {"served as": label, "file MB": Path(path).stat().st_size / 1e6 if path is not None else None,
            "max |logit diff|": export.max_difference(model, runner, images) if runner is not model else 0.0,
            "val top-1": top1(runner, bundle, config),
            **speed_row(runner, config.image_size, flops_per_image=flops_per_image, **(speed or {}))}


# Learning without Forgetting's weight on the old model's soft targets. With one head for all classes
# (class-incremental), the new classes' logits outgrow the old ones and the 0.5 of a task-incremental
# setting (Li and Hoiem's lambda_o = 1) keeps almost nothing: on digits, 5 + 5 classes, the old
# classes kept 0% of their top-1 at 0.5, 7% at 0.9 and 27% at 0.95, while the new classes fell from
# 99% to 82% and 52% (tests/test_continual.py holds the 0.95 case against naive fine-tuning).
LWF_WEIGHT = 0.95


def isa_table():
    """The CPU's reduced-precision instruction sets: present or not, and what each means."""
    flags = cpu_isa()
    return pd.DataFrame([{"instruction set": name, "present": "yes" if flags[name] else "no", "meaning": meaning}
                         for name, meaning in CPU_ISA_MEANING.items()]).set_index("instruction set")


def claims(distillation, pruned, quantized, served, continual_rows) -> list:
    """The article's five claims from the studies' tables: `distillation` (a row per student and seed), `pruned`,
    `quantized` (by precision), `served` (by "served as") and `continual_rows` (a row per strategy)."""
    distillation, pruned, continual_rows = (pd.DataFrame(distillation), pd.DataFrame(pruned),
                                            pd.DataFrame(continual_rows))
    dense = pruned[pruned["method"] == "dense (teacher)"].iloc[0]
    return [_distillation_claim(distillation, dense), _pruning_claim(pruned, dense),
            _quantization_claim(quantized, served), _export_claim(served), _continual_claim(continual_rows)]


def _distillation_claim(distillation, dense):
    """Distilled against labels-only students, paired by seed; the students must also serve 1.5x the teacher."""
    labels_only = distillation[distillation["method"] == "labels only"].sort_values("seed")
    distilled = distillation[distillation["method"] != "labels only"].sort_values("seed")
    if len(labels_only) >= 2:
        paired = statistics.paired_difference(100 * distilled["val top-1"], 100 * labels_only["val top-1"])
        delta, interval = paired["delta"], (paired["low"], paired["high"])
        accuracy = (f"distilled minus labels only {delta:+.1f} points [{paired['low']:+.1f}, {paired['high']:+.1f}] "
                    f"over {paired['runs']} seeds")
    else:
        delta, interval = float(100 * (distilled["val top-1"].mean() - labels_only["val top-1"].mean())), None
        accuracy = f"distilled minus labels only {delta:+.1f} points (1 seed: no interval)"
    faster = float(distilled["images/s@64"].mean() / dense["images/s@64"])
    reason = (f"student {distilled['val top-1'].mean():.1%} (teacher {dense['val top-1']:.1%}), {accuracy}; "
              f"{faster:.1f}x the teacher's images/s at batch 64 (the rule asks at least 1.5x: "
              f"{'met' if faster >= 1.5 else 'missed'})")
    if interval is None:  # one seed (the cpu pass): a point decides nothing; a missed speed still refutes
        return claim_records.checked("deploy_distillation", None if faster >= 1.5 else False,
                                     f"{reason}; one seed gives no interval, the reference profile's five decide", value=delta)
    # Accuracy and speed together: the rule decides the accuracy, and the student must also be 1.5x faster.
    return claim_records.decided("deploy_distillation", delta, interval, reason,
                                 also=claim_records.HOLDS if faster >= 1.5 else claim_records.REFUTED)


def _pruning_claim(pruned, dense):
    """The fastest pruned model against the dense teacher: 10% less time and top-1 kept, both."""
    unstructured = pruned[pruned["method"] == "unstructured L1"]
    channels = pruned[pruned["method"] == "channels L1"]
    fastest = channels.sort_values("ms@64").iloc[0] if len(channels) else dense
    most_zeros = unstructured.sort_values("requested").iloc[-1] if len(unstructured) else dense
    # Speed and accuracy together: the fastest pruned model must be at least 10% faster and keep its top-1.
    quicker = fastest["ms@64"] < 0.9 * dense["ms@64"]
    return claim_records.decided(
        "deploy_pruning", float(100 * (fastest["val top-1"] - dense["val top-1"])), None,
        f"dense {dense['ms@64']:.1f} ms per 64 images at top-1 {dense['val top-1']:.1%}; "
        f"{most_zeros['zero weights']:.0%} zero weights {most_zeros['ms@64']:.1f} ms (dense kernels multiply the "
        f"zeros); {fastest['requested']:.0%} of the channels removed {fastest['ms@64']:.1f} ms at top-1 "
        f"{fastest['val top-1']:.1%}, {1 - fastest['ms@64'] / dense['ms@64']:.0%} less time (the rule asks at least "
        f"10% less: {'met' if quicker else 'missed'})",
        also=claim_records.HOLDS if quicker else claim_records.REFUTED)


def _quantization_claim(quantized, served):
    """The fastest int8 form (eager or served) against fp32: at least 10% faster."""
    fp32 = quantized.iloc[0]
    int8 = pd.concat([quantized[quantized.index.str.contains("int8")], served[served.index.str.contains("int8")]])
    best = int8.sort_values("ms@64").iloc[0]
    return claim_records.checked(
        "deploy_quantization", best["ms@64"] < 0.9 * fp32["ms@64"],
        f"fastest int8: {best.name}, {best['ms@64']:.1f} ms vs fp32 {fp32['ms@64']:.1f} ms per 64 images, "
        f"top-1 {100 * (best['val top-1'] - fp32['val top-1']):+.1f} points (holds: at least 10% faster)")


def _export_claim(served):
    """Every fp32 export agrees with PyTorch, and the fastest served form beats eager."""
    tolerance = export.FP32_TOLERANCE
    exported = served[served.index.str.contains("fp32") & (served.index != "PyTorch eager fp32")]
    agree = bool((exported["max |logit diff|"] <= tolerance).all())
    quickest = served.sort_values("ms@64").iloc[0]
    eager = served.loc["PyTorch eager fp32"]
    return claim_records.checked(
        "deploy_export", agree and quickest["ms@64"] < eager["ms@64"],
        f"fp32 exports agree with PyTorch within {tolerance:g}: {'yes' if agree else 'no'} (largest "
        f"{exported['max |logit diff|'].max():.1e}); fastest served form {quickest.name} {quickest['ms@64']:.1f} ms "
        f"vs eager {eager['ms@64']:.1f} ms per 64 images")


def _continual_claim(continual_rows):
    """The best cure against naive fine-tuning: at most half its forgetting, and the new classes learnt."""
    steps = continual_rows.set_index("strategy")
    forgetting = steps["forgetting (old, points)"]
    cures = forgetting.drop(["step 1: old classes only", "step 2: naive"])
    cure, naive = cures.idxmin(), float(forgetting["step 2: naive"])
    return claim_records.checked(
        "continual_learning", naive > 0 and cures.min() <= naive / 2 and steps.loc[cure, "new classes"] > 0,
        f"old-class top-1 {steps['old classes'].iloc[0]:.1%} before; forgetting (points): naive {naive:.1f}, "
        + ", ".join(f"{name.removeprefix('step 2: ')} {value:.1f}" for name, value in cures.items())
        + f"; {cure.removeprefix('step 2: ')} learns the new classes to {steps.loc[cure, 'new classes']:.1%} "
        "(holds: the best cure forgets at most half of what naive fine-tuning forgets)")
