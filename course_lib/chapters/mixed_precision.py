"""Mixed precision, channels_last and torch.compile timed side by side (notebook 03), and the articles' claims about
them as `analysis.claims.Claim`s.

Mixed precision: Micikevicius et al., "Mixed Precision Training", ICLR 2018 (arXiv:1710.03740); torch.compile:
Ansel et al., "PyTorch 2", ASPLOS 2024. Each variant trains its own copy of the model with the engine's step, built
and timed by the step harness (`engine.step_bench`); the variants take turns, repeat after repeat, so that a shared
machine's slow moments fall on all of them alike, and the speed-up's interval comes from those pairs of repeats
(`statistics.paired_ratio_interval`: repeat i of a variant over repeat i of the baseline, point estimate the ratio of
the medians the table shows).
"""
from __future__ import annotations

import dataclasses

import pandas as pd
import torch

from course_lib.analysis import claims as claim_records
from course_lib.analysis import statistics
from course_lib.chapters.setup import ChapterSetup, sizes
from course_lib.config import Config, resolve_profile
from course_lib.data.datasets import config_with_data
from course_lib.devices import resolve_device
from course_lib.engine.step_bench import StepBench
from course_lib.engine.train import recorded_compile_runs
from course_lib.models.factory import build_model

REDUCED = ("fp16", "bf16")


@dataclasses.dataclass
class StepSpeeds:
    """Images per second of each repeat, per variant, and the first step's seconds (compile included)."""

    images_per_second: dict[str, list[float]]
    first_step_seconds: dict[str, float]
    settings: dict[str, dict]
    batch_size: int
    device: str

    def table(self, baseline: str):
        """One row per variant: precision, median images/s, speed-up over `baseline` (the ratio of the two medians)
        with its 95% interval from the paired repeats, first and steady step seconds (the baseline: 1.0x [1.0, 1.0])."""
        rows = {}
        for label, speeds in self.images_per_second.items():
            ratio = statistics.paired_ratio_interval(speeds, self.images_per_second[baseline])
            median, setting = float(pd.Series(speeds).median()), self.settings[label]
            matmul = {"matmul_precision": setting["matmul_precision"]} if "matmul_precision" in setting else {}
            rows[label] = {"precision": setting.get("precision", "off"), **matmul, "images/s": median,
                           "speed-up": ratio["ratio"], "low": ratio["low"], "high": ratio["high"],
                           "first step s": self.first_step_seconds[label], "step s": self.batch_size / median}
        return pd.DataFrame.from_dict(rows, orient="index")


def time_training_steps(config: Config, variants: dict[str, dict], num_classes: int, *, repeats: int = 5,
                        steps: int = 1, device=None) -> StepSpeeds:
    """Train a copy of `config.model` per variant (`precision`, `channels_last`, `compile`, `matmul_precision`,
    `cudnn_benchmark`; the rest from `config`) on one fixed random batch of `config.batch_size`."""
    device = torch.device(device) if device is not None else resolve_device(config.device)
    bench = StepBench(build_model(config, num_classes), config.image_size, config.batch_size, device, num_classes,
                      seed=config.seed)
    timed_steps, first, settings = {}, {}, {}
    for label, changes in variants.items():
        setting = {"precision": config.precision, "channels_last": config.channels_last, "compile": config.compile,
                   "matmul_precision": config.matmul_precision, "cudnn_benchmark": config.cudnn_benchmark, **changes}
        if setting["precision"] == "auto":
            raise ValueError(f"variant {label!r}: give a precision (off, fp16, bf16), not auto")
        timed = bench.variant(setting["precision"], setting["channels_last"], setting["compile"],
                              compile_mode=config.compile_mode, matmul_precision=setting["matmul_precision"],
                              cudnn_benchmark=setting["cudnn_benchmark"])
        # The first step (allocations, kernel choice, the compile) is timed and thrown away with a second one, in
        # which fp16's scale and the allocator settle; then the variants take turns, `repeats` times, `steps` each.
        first[label] = timed.first_step()
        timed.step()
        timed_steps[label], settings[label] = timed, setting
    speeds = {label: [] for label in variants}
    for _ in range(repeats):
        for label, timed in timed_steps.items():
            speeds[label].append(timed.time(repeats=1, warmup=0, calls=steps).images_per_second)
    return StepSpeeds(speeds, first, settings, config.batch_size, str(device))


def gpu_switch_variants(precision: str) -> dict[str, dict]:
    """The PyTorch performance-tuning guide's two GPU switches, one at a time: fp32 at each `matmul_precision`
    (highest: exact fp32; high and medium: TF32 tensor cores on Ampere and newer), then cuDNN's autotuner off and on
    at `precision` with channels_last."""
    variants = {f"fp32, matmul_precision={name}": {"precision": "off", "matmul_precision": name,
                                                   "cudnn_benchmark": False}
                for name in ("highest", "high", "medium")}
    variants.update({f"{precision} + channels_last, cudnn_benchmark={flag}": {
        "precision": precision, "channels_last": True, "cudnn_benchmark": flag, "matmul_precision": "highest"}
        for flag in (False, True)})
    return variants


def gpu_switch_note(device) -> str | None:
    """Why the GPU switches cannot be measured on `device`, or None on CUDA."""
    device = torch.device(device)
    if device.type == "cuda":
        return None
    return (f"matmul_precision and cudnn_benchmark: not measurable here ({device.type}): TF32 is a mode of NVIDIA "
            "tensor cores and cuDNN is CUDA's convolution library; the engine leaves both alone off CUDA. "
            "Run with profile='gpu' on a CUDA GPU, or `workbook gpu-check`, which times them too")


def compile_skipped_note(profile: str) -> str:
    """Why torch.compile was not measured in this run, with the newest earlier measurement on this machine's
    ledger when there is one."""
    earlier = recorded_compile_runs()
    if earlier:
        last = earlier[0]
        return (f"skipped in the {profile} profile; an earlier run's first compile took about "
                f"{last['compile_seconds']:.0f} s ({last['model']}, ledger {last['created_at']})")
    return (f"skipped in the {profile} profile: the first compile takes minutes on a CPU; run with "
            "profile='cpu' or 'gpu' (or measure_compile=true) to measure it")


def faster_reduced_precision(speeds) -> str:
    """fp16 or bf16, whichever ran more images/s (a table with an "images/s" column)."""
    return max(REDUCED, key=lambda name: speeds.loc[name, "images/s"])


def precision_advice(speeds, best: str, recommended: str, matmul=None) -> str:
    """One sentence on what the measured speed-ups mean here: whether reduced precision helps (the faster one's whole
    interval above 1x) and what precision='auto' chose (`recommended`); `matmul`, section 1's probe (dtype,
    speed_vs_fp32), tells a device without fast 16-bit units from one whose units this model's step does not reach."""
    row = speeds.loc[best]
    chosen = f"precision='auto' chooses {recommended!r} for it"
    if row["high"] >= 1.0:
        return (f"On this device {best} autocast runs at {row['speed-up']:.2f}x fp32's speed [{row['low']:.2f}, "
                f"{row['high']:.2f}]; {chosen} on these step times.")
    said = (f"On this device reduced precision does not help: bf16 runs at {speeds.loc['bf16', 'speed-up']:.2f}x "
            f"and fp16 at {speeds.loc['fp16', 'speed-up']:.2f}x fp32's speed. ")
    fast = [] if matmul is None else matmul[matmul["dtype"].isin(REDUCED) & (matmul["speed_vs_fp32"].fillna(0) > 1.2)]
    if len(fast):
        units = ", ".join(f"{r.dtype} at {r.speed_vs_fp32:.1f}x" for r in fast.itertuples())
        return said + (f"Yet its matrix units are fast (the matmul probe of section 1 runs {units} fp32): a "
                       "training step of this model at this size spends its time in small convolutions, "
                       f"normalisations and dtype conversions that the units do not speed up, so {chosen}. "
                       "A larger model or image can change the answer (exercise 1).")
    return said + ("The article's numbers assume an NVIDIA GPU with tensor cores; a CPU without native "
                   f"bf16/fp16 matrix units emulates them, so {chosen}.")


def accuracy_rows(runs: dict) -> list[dict]:
    """{(precision, seed): FitResult} -> rows of precision, seed, val top-1 for `compare_variants`."""
    return [{"precision": precision, "seed": seed, "val top-1": result.final.get("val_top1")}
            for (precision, seed), result in runs.items()]


def claims(speeds, best: str, memory_ratio: float, accuracy, *, device: str, layout=None, compile_speeds=None,
           compile_note: str = "") -> list:
    """Notebook 03's claims from `StepSpeeds.table("off")` of off/fp16/bf16, the reduced precision `best`, its step
    peak over fp32's, `statistics.compare_variants` over seeds ("off" the baseline), and the channels_last and
    eager/compiled tables (None: not measured; `compile_note` says why)."""
    row = speeds.loc[best]
    other = "fp16" if best == "bf16" else "bf16"
    how = (f"{best} (faster here than {other}: {speeds.loc[other, 'images/s']:.0f} images/s) over fp32, median "
           f"{row['images/s']:.0f} vs {speeds.loc['off', 'images/s']:.0f} images/s, training steps timed side by "
           f"side after warm-up on {device}" + ("; a CPU without fp16 matrix units emulates fp16"
                                                if device.startswith("cpu") else ""))
    delta = accuracy.loc[best] if best in accuracy.index else None
    if delta is not None and "delta" in accuracy.columns and delta.notna().get("delta", False):
        accuracy_text = (f"top-1 {100 * delta['delta']:+.1f} points vs fp32 over {int(delta['runs'])} seeds, 95% "
                         f"interval [{100 * delta['delta low']:+.1f}, {100 * delta['delta high']:+.1f}]: "
                         f"{delta['verdict']}")
        accuracy_claim = claim_records.decided("amp_accuracy", 100 * delta["delta"],
                                               (100 * delta["delta low"], 100 * delta["delta high"]), accuracy_text)
    else:
        accuracy_text = "accuracy over seeds not compared (fewer than 2 seeds)"
        accuracy_claim = claim_records.checked("amp_accuracy", None, reason=accuracy_text)
    speed_interval = (row["low"], row["high"])
    if accuracy_claim.verdict != claim_records.REFUTED:
        second = claim_records.measured("amp_second_article", row["speed-up"], speed_interval,
                                        reason=f"{how}; {accuracy_text}")
    else:
        second = claim_records.checked("amp_second_article", False, value=row["speed-up"], interval=speed_interval,
                                       reason=f"accuracy fell beyond seed noise: {accuracy_text}; {how}")
    rows = [claim_records.measured("amp_speedup", row["speed-up"], speed_interval, reason=how), second,
            claim_records.measured("amp_memory", memory_ratio, reason=f"measured peak of one training step, {best} "
                                                                      f"over fp32 (TrainingStepProbe on {device})"),
            accuracy_claim]
    if compile_speeds is None:
        rows += [claim_records.not_measurable(key, compile_note or "not measured in this run")
                 for key in ("torch_compile", "compile_first_run")]
    else:
        compiled = compile_speeds.loc["compiled"]
        compile_seconds = compiled["first step s"] - compiled["step s"]
        rows += [claim_records.measured(
                     "torch_compile", 100 * (compiled["speed-up"] - 1),
                     (100 * (compiled["low"] - 1), 100 * (compiled["high"] - 1)),
                     reason=f"compiled over eager images/s at {compiled['precision']}, steps timed side by side "
                            f"after the compile, on {device}"),
                 claim_records.checked(
                     "compile_first_run", compile_seconds >= 10,
                     reason=f"the first compiled step took {compiled['first step s']:.0f} s, a later one "
                            f"{compiled['step s']:.2f} s: about {compile_seconds:.0f} s of compiling")]
    if layout is not None:
        flipped = layout.loc["channels_last"]
        rows.append(claim_records.checked(
            "channels_last", claim_records.beyond_noise(flipped["low"], flipped["high"], 1.0),
            reason=f"channels_last over the default layout at {flipped['precision']}: {flipped['speed-up']:.2f}x "
                   f"[{flipped['low']:.2f}, {flipped['high']:.2f}] (holds when the whole interval is above 1, "
                   "refuted when below)"))
    return rows


# Per profile: the batch and image size over the profile's (None: its own), steps per run (max_steps: a cap on
# them), seeds per precision, turns of the side-by-side timing, and whether compile_measure=auto measures
# torch.compile. A CPU emulates fp16 (one fp16 step costs about ten fp32 steps): the cpu profile takes 32 px,
# batch 32 and 6 steps per run so it stays within minutes, the ratios being what the lesson needs; smoke (a CI
# check that the notebook runs) 2 steps, 2 seeds, 3 turns, no compile (the first compile takes minutes on a CPU).
# accuracy: what the accuracy comparison trains (None: the short runs of section 2 again, one per seed and precision;
# else Config values, over the profile's, of a recipe on real data).
SIZES = {"smoke": dict(batch_size=None, image_size=None, steps_per_run=20, max_steps=2, seeds=2, repeats=3,
                       measure_compile=False, accuracy=None),
         "cpu": dict(batch_size=32, image_size=32, steps_per_run=6, max_steps=None, seeds=3, repeats=5,
                     measure_compile=True, accuracy=None),
         "gpu": dict(batch_size=None, image_size=None, steps_per_run=20, max_steps=None, seeds=3, repeats=5,
                     measure_compile=True, accuracy=None)}
# The long version of the accuracy comparison (issue 51): the cpu pass compares runs of 6 steps on generated 32 px
# images (+1.3 points [-19.2, +21.7] over 3 seeds on a 2-core AMD EPYC: it cannot decide against the half-point
# margin). The reference trains the speed-run recipe (21 epochs of EuroSAT's whole training split, single view) in
# fp32 and in the faster reduced precision, 5 seeds each, scored on every validation image. Chosen on the carve-out
# of train (validation_from=train, 1,890 carve-out images, seed 0, single view, 2-core Intel Xeon with AMX-bf16,
# 2026-12-06): bf16 97.30% in 248 s, fp32 96.83% in 317 s after the recipe's 21 epochs (its convergence check, fp32 on
# an AMD EPYC: 97.35% after 21 epochs, 98.20% after 42, docs/results.md). The speed timing keeps the cpu sizes.
SIZES["reference"] = {**SIZES["cpu"], "seeds": 5, "accuracy": {"recipe": "speedrun", "tta_views": 1}}


@dataclasses.dataclass(kw_only=True)
class PrecisionSetup(ChapterSetup):
    """Notebook 03's config (every compared run's: at least 2 epochs, the tables report the last), data and
    the sizes its parameters left to the profile (`setup`)."""

    seeds: int  # per precision, for the accuracy comparison
    repeats: int  # turns of the side-by-side step timing
    measure_compile: bool
    accuracy_config: Config  # what the accuracy comparison trains (`config` itself, or a recipe on real data)
    accuracy_data: object = None  # paths.DataChoice of `accuracy_config` when it reads other data than `config`

    def line(self) -> str:
        config, accurate = self.config, self.accuracy_config
        text = (f"{config.model}, {config.image_size} px, batch {config.batch_size}, {config.epochs} epoch(s) x "
                f"{config.max_steps} steps per run, device {self.device}")
        if accurate is not config:
            text += (f"\naccuracy comparison: the {accurate.recipe} recipe ({accurate.model}, {accurate.epochs} epochs "
                     f"of the whole training split, single view), {self.accuracy_data.line}")
        return text + f"\nhardware: {self.hardware}"

    def reused(self, runs: dict) -> dict:
        """Section 2's runs ({precision: FitResult}) as the accuracy comparison's seed `config.seed`, keyed (precision,
        seed): all of them when it trains `config` itself (cpu, smoke), none when it trains a recipe (reference)."""
        if self.accuracy_config is not self.config:
            return {}
        return {(precision, self.config.seed): result for precision, result in runs.items()}


def setup(profile: str, *, steps_per_run: int = 0, seeds: int = 0, repeats: int = 0,
          measure_compile: str | bool = "auto", max_steps: int | None = None, batch_size: int | None = None,
          image_size: int | None = None, **given) -> PrecisionSetup:
    """Speed on the profile's own data (`config_with_data(find_real=False)`) at the profile's sizes (`SIZES`; 0 and
    None: the profile's); the accuracy comparison trains the same config, or the recipe the profile's sizes name."""
    resolved = resolve_profile(profile)
    chosen = sizes(SIZES, resolved)
    max_steps = max_steps or chosen["max_steps"]
    steps_per_run = steps_per_run or chosen["steps_per_run"]
    base, data = config_with_data(profile, find_real=False, batch_size=batch_size or chosen["batch_size"],
                                  image_size=image_size or chosen["image_size"], **given)  # None: not given
    config = base.replace(epochs=max(2, base.epochs),
                          max_steps=max_steps or min(base.max_steps or steps_per_run, steps_per_run),
                          output_dir="runs/checkpoints/03_mixed_precision")
    accuracy_config, accuracy_data = config, None
    if chosen["accuracy"] is not None:
        accuracy_config, accuracy_data = config_with_data(profile, **chosen["accuracy"],
                                                          output_dir="runs/checkpoints/03_mixed_precision/accuracy")
    return PrecisionSetup(profile=resolved, data=data, config=config, seeds=seeds or chosen["seeds"],
                          accuracy_config=accuracy_config, accuracy_data=accuracy_data,
                          repeats=repeats or chosen["repeats"],
                          measure_compile=chosen["measure_compile"] if measure_compile == "auto"
                          else measure_compile in (True, "true"))
