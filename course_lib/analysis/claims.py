"""Every number the two source articles assert, and one record for "claimed vs. measured".

`ARTICLE_CLAIMS` holds the articles' 20 numeric claims (article, section, the claimed value or range,
its unit, and the notebook that measures it). A notebook turns a measurement into a `Claim` with
`measured(key, value, interval)` (the verdict comes from comparing the interval with the claimed
range) or `not_measurable(key, reason)`, and `show([...])` writes each claim to the ledger and returns
the table. `scoreboard()` reads the newest measurement of every claim per machine back from the ledger
(`workbook claims`, and a section of the run report).

Verdicts (exactly one per measurement, `VERDICTS`):
- "holds": the measured interval (or the value, without one) meets the claimed range and, for a claim
  of an effect, excludes "no effect" (`ArticleClaim.no_effect`: 1.0x, 0 points). An interval that only
  touches the range counts as meeting it: the measurement cannot tell it apart from the claim.
- "refuted": the interval lies wholly outside the claimed range (whether or not it contains "no
  effect": a speed-up of [0.9x, 1.3x] refutes "1.5-3x").
- "not shown beyond noise" (inconclusive): the interval overlaps the claimed range but also contains
  "no effect", so this measurement cannot tell the claim from nothing having changed.
- "not measurable here", with the reason (no GPU, one disk, data absent ...).
A claim the notebook checks itself (`checked`: a qualitative claim, or a test that is not a range)
holds when the check passes and is refuted when it fails; a check that was inconclusive (the
notebook's interval contains "no effect", see `beyond_noise`) passes None and reads "not shown beyond
noise".

Each measurement is recorded with the profile it ran in (the ledger's profile column: the runner's
`WORKBOOK_PROFILE`, or `show(..., profile=)`; rows without one read "unknown"). A smoke-profile run is
a check that the notebook runs, with a few steps on tiny inputs: `scoreboard` lists its verdicts apart
as "smoke: not evidence" and leaves them out of the counts.

`accuracy_counts` counts, per accuracy chapter (`ACCURACY_CLAIMS`: notebooks 03, 06, 07, 08, 09, 10, 12, 13 and 15),
how many accuracy verdicts are conclusive (holds or refuted) and how many inconclusive, for the reader's
newest measurements or for the committed reference results; `workbook claims` and the run report show it.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields

HOLDS, REFUTED, NOT_SHOWN, NOT_MEASURABLE = "holds", "refuted", "not shown beyond noise", "not measurable here"
# Shown, not measured: a check that holds by construction (the engine's scheduler against its own formula,
# a property of the installed wheel, the article's own arithmetic). Listed and counted apart from the
# verdicts: it teaches, but it is no evidence for or against a claim.
DEMONSTRATED = "demonstrated (shown, not measured)"
VERDICTS = (HOLDS, REFUTED, NOT_SHOWN, NOT_MEASURABLE, DEMONSTRATED)
NOT_MEASURED = "not measured yet"  # scoreboard only: no measurement in the ledger
SMOKE = "smoke: not evidence"  # scoreboard only: a smoke-profile measurement, listed apart and not counted
SMOKE_PROFILE, UNKNOWN_PROFILE = "smoke", "unknown"
# Profiles that check that the notebooks run, at smoke sizes: their measurements are no evidence (the
# rehearsal is the smoke profile with the gpu profile's switches).
CHECK_PROFILES = (SMOKE_PROFILE, "rehearsal")
LEDGER_KIND = "claim"

ARTICLES = {
    "A1": "GPU算力服务器上CNN图像分类训练优化实战指南：从硬件到精度调优 (CNN image classification on GPU servers)",
    "A2": "GPU服务器如何高效训练ImageNet数据集 (training ImageNet efficiently on GPU servers)",
}


@dataclass(frozen=True)
class ArticleClaim:
    """One number an article asserts. `low`/`high` bound the claimed value in `unit` (None: open side)."""

    key: str
    article: str  # key of ARTICLES
    section: str  # the article's own section number
    statement: str  # what the article says, in English
    low: float | None
    high: float | None
    unit: str  # "x" (ratio), "%" (percent change or share), "points" (accuracy points), "GB", "cores", ...
    notebook: str  # the notebook that measures it, "02"
    # The value that means "no effect" (1.0 for a speed-up ratio, 0 for a gain in points or percent; None
    # for a level such as memory in GB). A claim of an effect holds only when the measured interval
    # excludes it: an interval that contains both the claim and "nothing changed" has not shown the claim.
    no_effect: float | None = None

    @property
    def claimed(self) -> str:
        if self.low is None and self.high is None:
            return "(not quantified)"
        if self.low is not None and self.high is not None and self.low != self.high:
            return f"{format_value(self.low, self.unit)} to {format_value(self.high, self.unit)}"
        if self.low is not None and self.high is not None:
            return f"about {format_value(self.low, self.unit)}"
        if self.low is not None:
            return f">= {format_value(self.low, self.unit)}"
        return f"<= {format_value(self.high, self.unit)}"


def _claim(key, article, section, statement, low, high, unit, notebook, no_effect=None):
    return key, ArticleClaim(key, article, section, statement, low, high, unit, notebook, no_effect)


# The articles' numeric claims, in the order the first article makes them. Where an article gives one
# number ("about 2x"), the range is that number +-25%: "about" is not a point.
ARTICLE_CLAIMS: dict[str, ArticleClaim] = dict([
    _claim("gpu_starved_utilisation", "A1", "1.1", "a data-starved GPU is busy only 30-50% of the time", 30, 50,
           "%", "02"),
    _claim("cpu_cores_per_gpu", "A1", "1.1", "one training GPU needs at least 16 physical CPU cores", 16, None,
           "cores", "02"),
    _claim("nvme_vs_sata", "A1", "1.1", "SATA SSD -> NVMe SSD cuts an epoch's data-reading time by about 60%",
           45, 75, "%", "02", no_effect=0),
    _claim("resnet50_amp_memory", "A1", "1.3", "ResNet-50, 224 px, batch 256, mixed precision needs 12-16 GB",
           12, 16, "GB", "01"),
    _claim("dataloader_tuning", "A1", "3", "tuning the DataLoader alone made training about 3x faster", 2.25, 3.75,
           "x", "02", no_effect=1),
    _claim("num_workers_knee", "A1", "3.1", "throughput stops growing at about half the physical cores "
           "(8-16 workers on 32 cores)", 0.25, 0.5, "of the cores", "02"),
    _claim("pin_memory", "A1", "3.1", "pin_memory=True raises throughput by 5-15%", 5, 15, "%", "02", no_effect=0),
    _claim("opencv_decode", "A1", "3.2", "OpenCV imdecode decodes JPEG about 2x faster than PIL", 1.5, 2.5,
           "x", "02", no_effect=1),
    _claim("tar_shards", "A1", "3.4", "tar shards read 5-10x faster than loose files (hundreds/s -> 2-3 thousand/s)",
           5, 10, "x", "02", no_effect=1),
    _claim("amp_speedup", "A1", "4.1", "mixed precision trains 1.5-3x faster", 1.5, 3, "x", "03", no_effect=1),
    _claim("amp_memory", "A1", "4.1", "mixed precision needs about half the memory", 0.4, 0.6, "x", "03", no_effect=1),
    _claim("amp_second_article", "A2", "mixed precision", "mixed precision trains 1.5-2x faster at almost "
           "unchanged accuracy", 1.5, 2, "x", "03", no_effect=1),
    _claim("torch_compile", "A1", "7", "torch.compile raises CNN throughput by 10-30%", 10, 30, "%", "03", no_effect=0),
    _claim("ddp_efficiency", "A1", "4.4", "4-GPU DDP reaches at least 85% scaling efficiency", 85, None, "%", "05"),
    _claim("ddp_vs_dataparallel", "A1", "4.2", "DDP (a model replica per GPU, only gradients synchronised) trains "
           "faster than the old DataParallel on the same GPUs (read: at least 1.1x the images/s)", 1.1, None, "x",
           "05", no_effect=1),
    _claim("allreduce_nvlink_vs_pcie", "A1", "1.2", "between two GPUs, PCIe instead of NVLink gives several times "
           "(read: at least 2x) less communication bandwidth", 2, None, "x", "05", no_effect=1),
    _claim("adamw_vs_sgd", "A1", "5.2", "AdamW beats SGD and is less sensitive to the learning rate and seed "
           "(accuracy of AdamW minus SGD, mean over learning rates and seeds)", 0, None, "points", "06", no_effect=0),
    _claim("regularization_remote_sensing", "A1", "5.3", "label smoothing 0.1 + MixUp 0.2 + light Random Erasing "
           "add about 1.5 points on a remote-sensing set", 1.0, 2.0, "points", "07", no_effect=0),
    _claim("regularization_cifar10", "A1", "5.3", "the same combination adds about 0.8 points on CIFAR-10",
           0.5, 1.1, "points", "07", no_effect=0),
    _claim("mixup_remote_sensing", "A1", "6.4", "MixUp helps remote-sensing images more than others (gain on "
           "remote sensing minus gain on a non-remote-sensing control)", 0, None, "points", "07", no_effect=0),
    _claim("transfer_learning", "A1", "5.4", "fine-tuning pretrained weights reaches from-scratch accuracy with "
           "about 80% less training", 60, 100, "%", "08", no_effect=0),
    _claim("case_study_speedup", "A1", "6", "the four stages cut total training time to about 1/16", 12, 20,
           "x", "10", no_effect=1),
])

def _qualitative(key, article, section, statement, notebook):
    """A claim without a number: no claimed range, no unit; its verdict comes from `checked`."""
    return _claim(key, article, section, statement, None, None, "", notebook)


# Claims the articles make without a number (or that the notebooks add as context): the same Claim
# shape, shown in each notebook's table, listed after the numeric ones by `scoreboard`. Each notebook
# adds its own under its marker; `checked(key, holds, reason)` gives their verdicts.
QUALITATIVE_CLAIMS: dict[str, ArticleClaim] = dict([  # filled per notebook below
    # notebook 00
    _qualitative("cuda_available", "A1", "2", "torch.cuda.is_available() is True on a GPU server", "00"),
    _qualitative("cpu_gpu_same_matmul", "A1", "2", "the CPU and the GPU give the same matmul result (check a new "
           "driver this way)", "00"),
    _qualitative("gpu_much_faster", "A1", "2", "the GPU multiplies matrices tens to hundreds of times faster than the CPU "
           "(value: GPU / CPU GFLOP/s)", "00"),
    _qualitative("wheel_ships_cuda_runtime", "A1", "2", "the torch wheel ships its own CUDA runtime (no separate toolkit "
           "needed)", "00"),
    # notebook 01
    _qualitative("batch_doubling_memory", "A1", "1.3", "doubling the batch (ResNet-50, 256 -> 512) adds 30-40% memory "
           "(value: the growth in %)", "01"),
    _qualitative("amp_memory_estimate", "A1", "4.1", "mixed precision roughly halves ResNet-50's training memory "
           "(the workbook's estimate; notebook 03 measures it)", "01"),
    _qualitative("card_24gb_batch256", "A1", "1.3", "on a 24 GB card (RTX 4090) ResNet-50 with mixed precision "
           "only goes up to about batch 256", "01"),
    _qualitative("cores_and_ram_per_gpu", "A1", "1.1", "a GPU server should have >= 16 physical CPU cores and >= 64 GB "
           "RAM per GPU (does this machine?)", "01"),
    _qualitative("workers_half_the_cores", "A1", "3.1", "num_workers: start at half the physical cores", "01"),
    _qualitative("random_reads_slower", "A1", "1.1", "IOPS matter: small random reads are far slower than sequential "
           "ones (value: random / sequential MB/s)", "01"),
    _qualitative("tensor_cores_fp16", "A1", "4.1", "tensor cores make fp16/bf16 matmuls faster than fp32 (value: the "
           "best reduced-precision speed-up)", "01"),
    # notebook 02
    _qualitative("predecoded_cache", "A1", "3.2", "decoding once into a pixel cache saves decoding every epoch, at a "
           "price in disk space", "02"),
    _qualitative("device_augmentation", "A1", "3.3", "augmenting per batch on the device takes load off the CPU "
           "workers (more loader images/s)", "02"),
    # notebook 03
    _qualitative("amp_accuracy", "A1", "6", "mixed precision leaves accuracy unchanged (88.5% with and without AMP in "
           "its remote-sensing run)", "03"),
    _qualitative("channels_last", "A1", "4.1", "channels_last memory format speeds up convolutions with AMP (context the "
           "notebook adds: PyTorch's advice for convnets, not quantified by the articles)", "03"),
    _qualitative("compile_first_run", "A1", "7", "torch.compile's first compile takes tens of seconds to minutes: switch it "
           "on for the final run, not while experimenting", "03"),
    # notebook 04
    _qualitative("accumulation_equals_big_batch", "A1", "4.3", "N micro-batches with the loss divided by N give the big "
           "batch's gradient (value: max relative difference, no BatchNorm)", "04"),
    _qualitative("forgetting_one_over_n", "A1", "4.3", "without the 1/N the accumulated gradient is N times too large "
           "(value: the largest relative error)", "04"),
    _qualitative("batchnorm_caveat", "A1", "4.3", "with BatchNorm, accumulation does not reproduce the big batch: each "
           "micro-batch has its own statistics", "04"),
    _qualitative("accumulation_memory", "A1", "4.3", "accumulation reaches a bigger effective batch without the memory "
           "of a bigger batch (value: accumulated / one-batch peak)", "04"),
    _qualitative("accumulation_cost", "A1", "4.3", "(not discussed by the article) accumulation costs speed: small "
           "micro-batches use the hardware less (value: images/s at the most micro-batches / at one)", "04"),
    # notebook 05
    _qualitative("ddp_article_example", "A1", "4.4", "1 GPU 100 min, 4 GPUs 35 min per epoch is about 71% scaling "
           "efficiency: low", "05"),
    _qualitative("ddp_communication_share", "A1", "4.4", "act (larger batch, less frequent communication, a better "
           "network) when gradient communication takes more than 15% of a step (torch.profiler)", "05"),
    _qualitative("ddp_stage3_speedup", "A1", "6", "stage 3: 4 GPUs with DDP gave about 2.5x over single-GPU AMP", "05"),
    _qualitative("ddp_equivalence", "A1", "4.4", "DDP only averages gradients: N workers train like 1 worker with the global "
           "batch (context the notebook adds)", "05"),
    # notebook 06
    _qualitative("warmup_cosine", "A1", "5.2", "SGD: lr 0.1 at batch 256, 5 epochs of linear warm-up, cosine decay to "
           "0.001 (and A2: warm up from a small learning rate, decay it late)", "06"),
    _qualitative("lr_sweep", "A1", "5.2", "first run a small learning-rate sweep to find the largest initial learning "
           "rate that still converges", "06"),
    _qualitative("adamw_lr_range", "A1", "5.2", "AdamW: sweep the initial learning rate between 3e-4 and 1e-3", "06"),
    _qualitative("adamw_sensitivity", "A1", "5.2", "AdamW is less sensitive to its hyper-parameters than SGD (spread of "
           "accuracy over learning rates and seeds)", "06"),
    _qualitative("batch_lr_scaling", "A2", "training tips", "on a single 24 GB card a batch of 64-128 is suitable, "
           "with the learning rate scaled to the batch (value: the linear rule's worst top-1 at 64-128 minus the "
           "best of a batch sweep, points)", "06"),
    _qualitative("syncbn_small_batches", "A1", "4.3", "BatchNorm's statistics are unstable when the batch on each GPU "
           "is small, costing accuracy (value: at the smallest per-process batch, top-1 with BatchNorm over the global "
           "batch, SyncBatchNorm, minus with each process's own statistics, points)", "05"),
    _qualitative("schedule_over_optimizer", "A2", "training tips", "a reasonable learning-rate schedule matters more "
           "than the choice of optimizer (value: mean |top-1 change| from changing the schedule minus that from "
           "changing the optimizer, points)", "06"),
    # notebook 07
    _qualitative("ema_steady_gain", "A1", "5.3", "an EMA of the weights gives a steady gain (evaluate EMA and raw weights "
           "on the validation set, keep the better)", "07"),
    _qualitative("combo_training_time", "A1", "5.3", "the combination adds almost no training time (the augmentation runs "
           "on the device)", "07"),
    _qualitative("too_many_tricks", "A1", "5.3", "combining too many tricks can add noise instead of accuracy", "07"),
    _qualitative("label_smoothing_alone", "A1", "5.3", "label smoothing 0.1 on its own raises accuracy (one ingredient of "
           "the combination)", "07"),
    _qualitative("label_smoothing_calibration", "A1", "5.3", "label smoothing changes calibration (ECE; the article does "
           "not discuss it: context)", "07"),
    _qualitative("early_stopping", "A2", "training monitoring", "use early stopping: stop when validation accuracy no "
           "longer improves, saving epochs at no accuracy cost (value: best.pt of the stopped run minus the full run's "
           "last weights, points)", "07"),
    _qualitative("best_checkpoint_gain", "A2", "training monitoring", "(context the notebook adds) the best validation "
           "epoch's checkpoint (best.pt) scores above the last weights on held-out images (value: points)", "07"),
    _qualitative("augmentation_prevents_overfitting", "A2", "data augmentation", "without enough augmentation "
           "(random crop, flip, colour jitter, small rotations) the model does well on its training images and "
           "poorly on new ones; stronger augmentation improves generalisation (value: the training-minus-validation "
           "top-1 gap without augmentation minus with the strongest level, points; validation top-1 must rise too)",
           "07"),
    _qualitative("swa_gain", "Izmailov et al. 2018 (arXiv:1803.05407)", "SWA", "(context the notebook adds) averaging "
           "the weights of the last epochs (SWA) scores above the last weights, as an EMA does (value: points)", "07"),
    # notebook 08
    _qualitative("transfer_beats_scratch", "A1", "5.4", "fine-tuning pretrained weights beats training from scratch "
           "(93.5% against 92% on the article's inspection task)", "08"),
    _qualitative("transfer_freeze_recipe", "A1", "5.4", "train the new head on a frozen backbone first, then fine-tune "
           "everything at 1e-4 or less so the pretrained features are not destroyed", "08"),
    # notebook 09
    _qualitative("top1_top5_metrics", "A2", "evaluation", "top-1 and top-5 accuracy are the standard evaluation metrics "
           "(value: top-1 with its binomial interval)", "09"),
    _qualitative("classes_differ", "A2", "evaluation", "some classes score much higher than others (value: best minus "
           "worst recall)", "09"),
    _qualitative("confusion_pairs", "A2", "evaluation", "the confusion matrix shows which classes the model mixes up "
           "(value: the top pair's share of its true class)", "09"),
    _qualitative("mixup_helps_09", "A1", "6.4", "MixUp helps remote-sensing images (unclear class boundaries): one "
           "seed, image-by-image (value: top-1 gain)", "09"),
    _qualitative("few_samples_low_recall", "A2", "evaluation", "a class scores low because it has too few training "
           "images (on a long-tailed cut, value: Spearman correlation of training images and recall per class)", "09"),
    _qualitative("imbalance_weighted_loss", "A2", "evaluation", "(context the notebook adds) weighting the loss by "
           "inverse class frequency raises macro-F1 on a long-tailed split (value: macro-F1 change)", "09"),
    _qualitative("imbalance_sampler", "A2", "evaluation", "(context the notebook adds) a class-balanced sampler raises "
           "macro-F1 on a long-tailed split (value: macro-F1 change)", "09"),
    # notebook 10
    _qualitative("casestudy_dataloader", "A1", "6", "stage 1: the DataLoader fix (workers, pinned memory, prefetch) cut "
           "the epoch from 40 to 26 min (1.54x), GPU utilisation 40% -> 85%", "10"),
    _qualitative("casestudy_amp", "A1", "6", "stage 2: mixed precision halved the epoch (26 -> 13 min) and the memory "
           "(39 -> 23 GB) at unchanged accuracy (88.6% -> 88.5%)", "10"),
    _qualitative("casestudy_ddp", "A1", "6", "stage 3: DDP on 4 GPUs, about 2.5x over single-GPU mixed precision", "10"),
    _qualitative("casestudy_adamw", "A1", "6", "stage 3: AdamW 2e-4 with warm-up and cosine decay lifts top-1 to 91.2% "
           "(100 epochs)", "10"),
    _qualitative("casestudy_regularization", "A1", "6", "stage 4: pretrained weights + label smoothing + MixUp reach "
           "93.8% (60 epochs)", "10"),
    _qualitative("casestudy_accuracy", "A1", "6", "overall: +5 points of top-1 (88.6% -> 93.8%) besides 1/16 of the time", "10"),
    _qualitative("optimisation_order", "A1", "6.5", "the order matters: fix the data pipeline and utilisation before "
           "the model and the training strategy (value: extra training time of the same stages, model first)", "10"),
    # notebook 11
    _qualitative("compile_static_control_flow", "A1", "7", "torch.compile: data-dependent control flow breaks the graph; "
           "make it static (value: graph breaks of a Python if)", "11"),
    _qualitative("compile_first_call_slow", "A1", "7", "torch.compile: the first compile takes tens of seconds to minutes "
           "(value: seconds of the first compiled call)", "11"),
    _qualitative("preflight_catches_errors", "A1", "7", "5-10 steps on a tiny subset catch most low-level errors before "
           "the real run (value: broken setups caught)", "11"),
    _qualitative("set_epoch_reshuffles", "A1", "4.4", "call sampler.set_epoch(epoch) every epoch, else the shuffle order "
           "repeats", "11"),
    _qualitative("driver_matches_cuda", "A1", "2.1", "the driver must match the CUDA torch was built for (CUDA 12 needs "
           "driver >= 525)", "11"),
    _qualitative("container_gpu_access", "A1", "2.2", "a container reaches the GPU only when started with --gpus on "
           "a host with the NVIDIA Container Toolkit; under WSL2 the Windows driver provides it (otherwise: 'GPU access "
           "blocked by the operating system')", "11"),
    _qualitative("workers0_starves", "A1", "6", "with num_workers=0 the GPU waits for data (40% utilisation in the case "
           "study; value: data-wait fraction at num_workers=0)", "11"),
    # notebook 12
    _qualitative("eurosat_finetuned_reference", "Helber et al. 2019 (EuroSAT)", "abstract", "an ImageNet-pretrained, "
           "fine-tuned ResNet-50 reaches 98.57% on EuroSAT RGB; does the speed-run recipe match it from scratch?", "12"),
    _qualitative("eurosat_scratch_reference", "EuroSAT from-scratch results", "best known", "the best from-scratch "
           "EuroSAT figure we know of is 97.23%", "12"),
    _qualitative("speedrun_97_in_10_minutes", "workbook target", "notebook 12", "97% on EuroSAT within 10 minutes on "
           "2 CPU cores, decoding included", "12"),
    _qualitative("airbench_pipeline", "airbench (Jordan 2024, arXiv:2404.00498)", "CIFAR-10, A100", "cached uint8 data, "
           "whole-batch tensor augmentation and no DataLoader workers make the fastest pipeline", "12"),
    _qualitative("bigger_model_not_better", "A1", "5.1", "a bigger model is not always better: ResNet-101 or "
           "EfficientNet-B5 is rarely much better than ResNet-50 or B3 at several times the cost (value: pairs of one "
           "family, the bigger model's top-1 gain paired by seed; much better: over 1 point)", "12"),
    _qualitative("vit_overfits_small_data", "A1", "5.1", "ViT and Swin overfit small datasets (value: the ViT's "
           "validation-minus-training loss gap minus resnet18's, paired by seed)", "12"),
    # A figure with a unit: the gap in points (analysis/imagenette.py decides it from the t interval over the runs).
    _claim("imagenette_leaderboard", "fastai Imagenette leaderboard (github.com/fastai/imagenette)", "128 px, 5 epochs",
           "the leaderboard's best 5-epoch top-1 at 128 px is 87.43% (a 5-run mean, random weights, no TTA); does "
           "the workbook's `imagenette` recipe reach it? (value: its mean top-1 on Imagenette's official val minus "
           "87.43%, points)", None, None, "points", "12"),
    # notebook 13
    _qualitative("deploy_distillation", "A2", "model compression and acceleration", "a big model's knowledge taught to "
           "a small one: the small model keeps good accuracy and infers much faster", "13"),
    _qualitative("deploy_pruning", "A2", "model compression and acceleration", "pruning makes a trained model faster for "
           "production", "13"),
    _qualitative("deploy_quantization", "A2", "model compression and acceleration", "quantization makes a trained model "
           "faster for production", "13"),
    _qualitative("deploy_export", "A2", "model compression and acceleration", "a trained model needs optimising before "
           "it goes into production", "13"),
    _qualitative("continual_learning", "A2", "continual learning", "continual learning lets a model recognise new "
           "classes without forgetting the old ones", "13"),
    # notebook 14
    _qualitative("untuned_utilisation", "A1", "6", "before tuning, the case study's GPU was busy only 30-50% of the "
           "time (value: NVML SM utilisation %, mean over an untuned epoch)", "14"),
    _qualitative("tuned_utilisation", "A1", "6", "after tuning the input pipeline the GPU was busy about 85% of the time "
           "(75-95%; value: NVML SM utilisation %, mean over the tuned epoch)", "14"),
    _qualitative("data_wait_stand_in", "A1", "1", "find the bottleneck first: the profile shows the data wait, and the "
           "change it points to (storage=cache) removes it (value: points of the epoch's data-wait share removed)", "14"),
    _qualitative("watch_gradient_norms", "A2", "training monitoring", "watch the gradient norms during training: "
           "the log names vanishing or exploding gradients and stays quiet on a healthy run", "14"),
    # notebook 15
    _qualitative("label_finder_finds_flips", "A2", "data cleaning", "spot-check the labels: wrong labels can be "
           "found (confident learning on out-of-fold probabilities finds most of 5% planted flips, and most of what "
           "it flags was planted; value: recall)", "15"),
    _qualitative("cleaning_recovers_accuracy", "A2", "data cleaning", "fixing or dropping bad samples raises "
           "accuracy (value: top-1 change from dropping the flagged images, against training on the noisy labels, "
           "points)", "15"),
])


# How an interval decides a qualitative claim (issue 51): one rule per claim, its margin in its unit, and the
# reason for the margin. The rule is stated before any run, so a null effect becomes a conclusion once the
# interval is narrow enough (equivalence testing, TOST), and no verdict can hold on "no effect":
# - "gain" (X helps): holds when the whole interval lies above 0 and reaches the margin, the smallest effect
#   worth having; refuted when it lies wholly below the margin (within +-margin, or below 0: one-sided TOST).
# - "loss" (X hurts): the mirror of "gain": holds below 0 reaching -margin, refuted wholly above -margin.
# - "change" (X changes Y, either way): holds when the interval excludes 0 and reaches past +-margin on that
#   side, refuted when it lies wholly within +-margin.
# - "non-inferior" (X is not worse): holds when the whole interval lies above -margin, refuted wholly below.
# - "at most" (X adds at most the margin, or is not much better): holds when the whole interval lies below
#   the margin, refuted wholly above it.
GAIN, LOSS, CHANGE, NON_INFERIOR, AT_MOST = "gain", "loss", "change", "non-inferior", "at most"
RULE_KINDS = (GAIN, LOSS, CHANGE, NON_INFERIOR, AT_MOST)
# One converged EuroSAT model's seed-to-seed spread: the speed-run recipe's 5 seeds on valid, std 0.19 points
# (benchmarks/results/speedrun_speedrun.json); two seeds' spread is the smallest top-1 effect worth having.
WORTH_HAVING = "0.5 points of top-1: about two seeds' spread of a converged EuroSAT model (std 0.19 points)"


@dataclass(frozen=True)
class Rule:
    """How `decided` turns an interval into a verdict: `kind` (RULE_KINDS), `margin` in `unit`, and why."""

    kind: str
    margin: float
    unit: str
    why: str

    def text(self) -> str:
        margin = f"{self.margin:g} {self.unit}"
        return {GAIN: f"holds above 0 reaching +{margin}, refuted wholly below +{margin}",
                LOSS: f"holds below 0 reaching -{margin}, refuted wholly above -{margin}",
                CHANGE: f"holds beyond 0 reaching past +-{margin}, refuted wholly within +-{margin}",
                NON_INFERIOR: f"holds wholly above -{margin}, refuted wholly below -{margin}",
                AT_MOST: f"holds wholly below +{margin}, refuted wholly above +{margin}"}[self.kind] + f" ({self.why})"


RULES: dict[str, Rule] = {
    # notebook 03
    "amp_accuracy": Rule(NON_INFERIOR, 0.5, "points", WORTH_HAVING),
    # notebook 05
    "syncbn_small_batches": Rule(GAIN, 0.5, "points", WORTH_HAVING),
    # notebook 06
    "schedule_over_optimizer": Rule(GAIN, 0.5, "points", WORTH_HAVING),
    # notebook 07
    "ema_steady_gain": Rule(GAIN, 0.5, "points", WORTH_HAVING + "; in every run with an EMA"),
    "combo_training_time": Rule(AT_MOST, 10.0, "%", "'almost no training time' read as at most +10% per image"),
    "too_many_tricks": Rule(LOSS, 0.5, "points", WORTH_HAVING + "; everything minus the article's combination"),
    "label_smoothing_alone": Rule(GAIN, 0.5, "points", WORTH_HAVING),
    "label_smoothing_calibration": Rule(CHANGE, 1.0, "points", "1 point of ECE: a smaller change does not show in "
                                                               "a 15-bin reliability diagram"),
    "early_stopping": Rule(NON_INFERIOR, 0.5, "points", "'no accuracy cost' read as losing less than " + WORTH_HAVING),
    "best_checkpoint_gain": Rule(GAIN, 0.5, "points", WORTH_HAVING),
    "swa_gain": Rule(GAIN, 0.5, "points", WORTH_HAVING),
    "augmentation_prevents_overfitting": Rule(GAIN, 0.5, "points", WORTH_HAVING + "; for the gap, and for the "
                                                                    "validation top-1 alike"),
    # notebook 08
    "transfer_beats_scratch": Rule(GAIN, 0.5, "points", WORTH_HAVING),
    "transfer_freeze_recipe": Rule(NON_INFERIOR, 0.5, "points", "'not destroyed' read as losing less than "
                                                                + WORTH_HAVING),
    # notebook 09
    "mixup_helps_09": Rule(GAIN, 0.5, "points", WORTH_HAVING),
    "imbalance_weighted_loss": Rule(GAIN, 1.0, "points", "1 point of macro-F1: about one class's F1 moving 10 "
                                                         "points among 10"),
    "imbalance_sampler": Rule(GAIN, 1.0, "points", "1 point of macro-F1: about one class's F1 moving 10 points "
                                                   "among 10"),
    # notebook 10
    "optimisation_order": Rule(GAIN, 5.0, "%", "5% of the stages' training time: less is within what load on a "
                                               "shared machine changes between runs"),
    # notebook 12
    "bigger_model_not_better": Rule(AT_MOST, 1.0, "points", "'much better' is the claim's own 1 point, each pair"),
    # notebook 13
    "deploy_distillation": Rule(NON_INFERIOR, 1.0, "points", "'keeps good accuracy' read as losing less than 1 "
                                                             "point against the same student trained on labels"),
    "deploy_pruning": Rule(NON_INFERIOR, 2.0, "points", "'ready for production' read as within 2 points of the "
                                                        "unpruned model"),
    # notebook 15
    "cleaning_recovers_accuracy": Rule(GAIN, 0.5, "points", WORTH_HAVING),
}


def decide(rule: Rule, low: float, high: float) -> str:
    """The verdict of `rule` on the interval [low, high] (see `RULES` for the kinds)."""
    margin = rule.margin
    if rule.kind == LOSS:  # the mirror image of a gain
        low, high = -high, -low
    if rule.kind in (GAIN, LOSS):
        return REFUTED if high < margin else HOLDS if low > 0 else NOT_SHOWN
    if rule.kind == CHANGE:
        if -margin < low and high < margin:
            return REFUTED
        return HOLDS if (low > 0 and high >= margin) or (high < 0 and low <= -margin) else NOT_SHOWN
    if rule.kind == NON_INFERIOR:
        return HOLDS if low > -margin else REFUTED if high < -margin else NOT_SHOWN
    if rule.kind == AT_MOST:
        return HOLDS if high < margin else REFUTED if low > margin else NOT_SHOWN
    raise ValueError(f"rule kind {rule.kind!r}: use one of {', '.join(RULE_KINDS)}")


def combine(*verdicts: str) -> str:
    """A claim about several things at once (accuracy and speed): it holds only when every part holds, is
    refuted when one part is, and is otherwise not shown (a part not measurable makes it not measurable)."""
    if REFUTED in verdicts:
        return REFUTED
    if NOT_MEASURABLE in verdicts:
        return NOT_MEASURABLE
    return HOLDS if all(verdict == HOLDS for verdict in verdicts) else NOT_SHOWN


def format_value(value: float | None, unit: str) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    if unit == "x":
        return f"{value:.2f}x"
    if unit == "%":
        return f"{value:.0f}%" if abs(value) >= 10 else f"{value:.1f}%"
    if unit == "points":
        return f"{value:+.2f} points"
    if unit == "of the cores":
        return f"{value:.0%} of the cores"
    return f"{value:.3g} {unit}".rstrip()


@dataclass
class Claim:
    """A claim as measured on one machine: the article's side, the measurement, and the verdict."""

    key: str
    statement: str
    source: str  # "A1 §4.1"
    claimed: str
    unit: str
    measured: float | None  # in `unit`; None when not measurable here
    low: float | None  # the measurement's interval (confidence interval, or the span of repeats)
    high: float | None
    verdict: str  # one of VERDICTS
    reason: str  # how it was measured, or why it could not be
    hardware: str
    notebook: str

    def row(self) -> dict:
        interval = (f"[{format_value(self.low, self.unit)}, {format_value(self.high, self.unit)}]"
                    if self.low is not None and self.high is not None else "-")
        return {"claim": self.statement, "source": self.source, "claimed": self.claimed,
                "measured": format_value(self.measured, self.unit) if self.measured is not None else "-",
                "interval": interval, "verdict": self.verdict, "how / why": self.reason}


def article_claim(key: str) -> ArticleClaim:
    found = ARTICLE_CLAIMS.get(key) or QUALITATIVE_CLAIMS.get(key)
    if found is None:
        raise KeyError(f"unknown claim {key!r}; the claims are: {', '.join([*ARTICLE_CLAIMS, *QUALITATIVE_CLAIMS])}")
    return found


def judge(claim: ArticleClaim, value: float, low: float | None = None, high: float | None = None) -> str:
    """REFUTED when [low, high] (or the value alone) lies wholly outside the claimed range; else HOLDS
    when, for a claim of an effect, it also excludes "no effect", and NOT_SHOWN when it contains it."""
    if claim.low is None and claim.high is None:
        raise ValueError(f"claim {claim.key} has no number to compare with; use checked(key, holds, reason)")
    low, high = (value if low is None else low), (value if high is None else high)
    # A range bound that equals "no effect" is open ("beats": > 0); any other bound is closed.
    above = claim.low is None or (high > claim.low if claim.low == claim.no_effect else high >= claim.low)
    below = claim.high is None or (low < claim.high if claim.high == claim.no_effect else low <= claim.high)
    if not (above and below):
        return REFUTED
    return NOT_SHOWN if contains_no_effect(claim, low, high) else HOLDS


def contains_no_effect(claim: ArticleClaim, low: float, high: float) -> bool:
    """Whether [low, high] contains the claim's "no effect" value (never, for a claim of a level)."""
    return claim.no_effect is not None and low <= claim.no_effect <= high


def beyond_noise(low: float, high: float, no_effect: float = 0.0) -> bool | None:
    """For `checked`: True when the interval [low, high] of a claimed gain lies wholly above
    `no_effect` (shown), False when wholly below it (the opposite shown: refuted), None when it
    contains it (not shown beyond noise)."""
    return True if low > no_effect else False if high < no_effect else None


def measured(key: str, value: float, interval: tuple[float, float] | None = None, reason: str = "",
             hardware: str | None = None) -> Claim:
    """A claim measured here: `value` in the claim's unit, `interval` its (low, high) uncertainty."""
    claim = article_claim(key)
    if value is None or not math.isfinite(value):
        raise ValueError(f"claim {key}: measured value must be a finite number, got {value!r}; "
                         "use not_measurable(key, reason) when it cannot be measured")
    low, high = interval if interval is not None else (None, None)
    if low is not None and not low <= value <= high:
        raise ValueError(f"claim {key}: the interval [{low}, {high}] must contain the value {value}")
    verdict = judge(claim, value, low, high)
    if verdict == NOT_SHOWN:
        no_effect = format_value(claim.no_effect, claim.unit).replace("+", "")
        reason = f"{reason}; the interval contains {no_effect} (no effect): not shown beyond noise".lstrip("; ")
    return Claim(key, claim.statement, f"{claim.article} §{claim.section}", claim.claimed, claim.unit, float(value),
                 None if low is None else float(low), None if high is None else float(high),
                 verdict, reason, hardware or _hardware(), claim.notebook)


def checked(key: str, holds: bool | None, reason: str, value: float | None = None,
            interval: tuple[float, float] | None = None, hardware: str | None = None) -> Claim:
    """A claim whose verdict the notebook decides itself (a qualitative claim, or a test that is not a
    range: "within seed noise", "bit-identical"); `reason` says what was tested. `holds`: True ->
    HOLDS, False -> REFUTED (the check failed), None -> NOT_SHOWN (the check was inconclusive, e.g.
    `beyond_noise` of an interval that contains "no effect")."""
    claim = article_claim(key)
    if not reason:
        raise ValueError(f"claim {key}: say what was measured to decide it")
    low, high = interval if interval is not None else (None, None)
    return Claim(key, claim.statement, f"{claim.article} §{claim.section}", claim.claimed, claim.unit,
                 None if value is None else float(value), low, high,
                 NOT_SHOWN if holds is None else HOLDS if holds else REFUTED, reason,
                 hardware or _hardware(), claim.notebook)


def decided(key: str, value: float, interval: tuple[float, float] | None, reason: str,
            hardware: str | None = None, also: str | None = None) -> Claim:
    """A qualitative claim decided by its rule (`RULES[key]`) from `value` and its 95% `interval`, both in
    the rule's unit (without an interval, the value alone decides). `also`: the verdict of a second part
    the claim makes (a speed beside an accuracy), `combine`d with this one. The reason gains the rule."""
    if key not in RULES:
        raise KeyError(f"claim {key!r} has no rule; the claims with one are: {', '.join(RULES)}")
    rule, claim = RULES[key], article_claim(key)
    if value is None or not math.isfinite(value):
        raise ValueError(f"claim {key}: measured value must be a finite number, got {value!r}")
    low, high = (value, value) if interval is None else (float(interval[0]), float(interval[1]))
    verdict = decide(rule, low, high)
    if also is not None:
        verdict = combine(verdict, also)
    return Claim(key, claim.statement, f"{claim.article} §{claim.section}", claim.claimed, rule.unit, float(value),
                 None if interval is None else low, None if interval is None else high, verdict,
                 f"{reason}; rule: {rule.text()}", hardware or _hardware(), claim.notebook)


def demonstrated(key: str, shown: bool, reason: str, value: float | None = None,
                 hardware: str | None = None) -> Claim:
    """A check that holds by construction (a formula against itself, a property of the installed wheel):
    DEMONSTRATED when `shown`, REFUTED when even that failed (a bug to report). Counted apart from the
    verdicts (`verdict_counts`), never as evidence for the article."""
    claim = article_claim(key)
    if not reason:
        raise ValueError(f"claim {key}: say what was shown")
    return Claim(key, claim.statement, f"{claim.article} §{claim.section}", claim.claimed, claim.unit,
                 None if value is None else float(value), None, None, DEMONSTRATED if shown else REFUTED,
                 reason, hardware or _hardware(), claim.notebook)


def not_measurable(key: str, reason: str, hardware: str | None = None) -> Claim:
    """A claim this machine cannot test, with the reason (and what it could measure instead)."""
    claim = article_claim(key)
    if not reason:
        raise ValueError(f"claim {key}: say why it is not measurable here")
    return Claim(key, claim.statement, f"{claim.article} §{claim.section}", claim.claimed, claim.unit, None, None,
                 None, NOT_MEASURABLE, reason, hardware or _hardware(), claim.notebook)


def _hardware() -> str:
    from course_lib import ledger

    return ledger.describe_hardware()


def record(claims: list[Claim], profile: str | None = None) -> None:
    """Write each claim to the ledger (kind "claim", name = its key), with the profile it was measured
    in: `profile`, else the runner's WORKBOOK_PROFILE (the ledger's own default), else none ("unknown")."""
    from course_lib import ledger

    profile = _resolved(profile)
    for claim in claims:
        ledger.record(LEDGER_KIND, claim.key, status="ok", parameters={"hardware_line": claim.hardware},
                      metrics={k: v for k, v in asdict(claim).items() if k not in ("key", "hardware")},
                      profile=profile)


def _resolved(profile: str | None) -> str | None:
    if profile is None:
        return None
    from course_lib.config import resolve_profile

    return resolve_profile(profile)  # "auto" -> the cpu or gpu it stands for


def table(claims: list[Claim]):
    """The claims as a DataFrame: claim, source, claimed, measured, interval, verdict, how / why."""
    import pandas as pd

    return pd.DataFrame([c.row() for c in claims]).set_index("claim")


SMOKE_RUN = "smoke run: not evidence"  # a smoke-profile table's verdict column: no verdict, not even as measured


def show(claims: list[Claim], profile: str | None = None):
    """Record the claims in the ledger (with `profile`, see `record`), print the machine they were
    measured on, return the table; when a reference result of the notebook is committed
    (`analysis.reference`), its value, interval and verdict stand in columns of their own beside
    the reader's, under a line naming its machine, date and command. In the smoke profile (`profile`,
    else the runner's WORKBOOK_PROFILE) no verdict is shown: each reads "smoke run: not evidence", under
    a line saying why; the measured value stays beside it."""
    import os

    from course_lib import ledger
    from course_lib.analysis import reference

    record(claims, profile)
    hardware = sorted({c.hardware for c in claims})
    print("measured on: " + "; ".join(hardware) + " (your run)")
    shown = table(claims)
    if (_resolved(profile) or os.environ.get(ledger.PROFILE_ENV)) in CHECK_PROFILES:
        print("smoke run: a check that the chapter runs (a few steps on tiny inputs), not evidence for or against "
              "any claim; run the cpu or gpu profile for verdicts")
        shown["verdict"] = SMOKE_RUN
    shown, found = _beside_reference(claims, shown) if claims else (shown, None)
    notebooks = ", ".join(sorted({c.notebook for c in claims}))
    print(found.line() if found else f"no reference result committed for notebook {notebooks} "
          f"({reference.REFERENCE_FOLDER}/)")
    return shown


def _beside_reference(claims: list[Claim], shown):
    """`shown` (`table(claims)`) with the committed reference's measured value, interval and verdict for
    each claim in columns of their own, and the reference; `shown` unchanged and None when no
    reference of the claims' notebook is committed (`analysis.reference.find`)."""
    from course_lib.analysis import reference

    notebooks = sorted({claim.notebook for claim in claims})
    try:
        found = reference.find(notebooks[0]) if len(notebooks) == 1 else None
    except reference.ReferenceResultError as error:  # a damaged file: say so, and show the reader's run
        print(error)
        found = None
    if found is None:
        return shown, None
    figures = [_figure(found.claim(claim.key), claim.unit) for claim in claims]
    shown = shown.copy()
    shown["reference measured"] = [figure["measured"] for figure in figures]
    shown["reference interval"] = [figure["interval"] for figure in figures]
    shown["reference verdict"] = [figure["verdict"] for figure in figures]
    return shown, found


def _figure(item: dict | None, unit: str = "") -> dict:
    """A reference's claim as the tables print it: measured, interval and verdict."""
    if item is None:
        return {"measured": "-", "interval": "-", "verdict": "not in the reference"}
    unit = item.get("unit") or unit
    interval = (f"[{format_value(item['low'], unit)}, {format_value(item['high'], unit)}]"
                if item.get("low") is not None and item.get("high") is not None else "-")
    return {"measured": format_value(item["measured"], unit) if item.get("measured") is not None else "-",
            "interval": interval, "verdict": item.get("verdict")}


LEGACY_DOES_NOT_HOLD = "does not hold"  # the one negative verdict of ledgers written before issue 24


def _current_verdict(claim: ArticleClaim, item: dict) -> str:
    """The verdict of a ledger row in today's words. Rows written before issue 24 said "does not hold"
    both for a refuted claim and for an interval that contained "no effect": a measured numeric claim
    is judged again from its value and interval; a failed check (no number to judge) was refuted."""
    verdict = item["verdict"]
    if verdict != LEGACY_DOES_NOT_HOLD:
        return verdict
    if (claim.low is None and claim.high is None) or item.get("measured") is None:
        return REFUTED
    again = judge(claim, item["measured"], item.get("low"), item.get("high"))
    return REFUTED if again == HOLDS else again  # HOLDS again: a numeric claim the notebook's check failed


def _claim_fields(metrics) -> dict | None:
    """The fields `record` writes for a claim (a Claim's, less its key and hardware) out of a claim row's
    `metrics`, other keys left aside; None when one is missing (a row written by hand or by another tool)."""
    expected = [f.name for f in fields(Claim) if f.name not in ("key", "hardware")]
    if not isinstance(metrics, dict) or any(name not in metrics for name in expected):
        return None
    return {name: metrics[name] for name in expected}


def _skip_row(row: dict, why: str) -> None:
    import sys

    print(f"workbook: warning: ledger row {row.get('id')} (claim {row.get('name')}) left out of the claims: {why}",
          file=sys.stderr)


def scoreboard(book=None) -> list[dict]:
    """Every article claim with its newest measurement per machine (from the ledger), in the
    registry's order: the numeric claims (one without a measurement yet appears once as NOT_MEASURED),
    then the qualitative ones that were measured. Each item names its `profile` ("unknown" for rows
    without one); a smoke-profile measurement is kept apart from the others (its own newest per
    machine, so it never hides a real run), with verdict SMOKE, `evidence` False and the verdict it
    would have had as `verdict_as_measured`."""
    from course_lib import ledger

    book = book or ledger.Ledger()
    references: dict = {}  # notebook -> its committed reference (analysis.reference), or None
    newest: dict[tuple[str, str, bool], dict] = {}
    for row in book.rows(kind=LEDGER_KIND):  # newest first
        claim_fields = _claim_fields(row["metrics"])
        if claim_fields is None:
            _skip_row(row, "a claim's field is missing from its metrics")
            continue
        hardware = row["parameters"].get("hardware_line") or ledger.describe_hardware(row["hardware"])
        profile = row.get("profile") or UNKNOWN_PROFILE
        newest.setdefault((row["name"], hardware, profile in CHECK_PROFILES),
                          {**claim_fields, "hardware": hardware, "profile": profile,
                           "created_at": row["created_at"], "run_id": row["run_id"], "row_id": row["id"]})
    board = []
    for key, claim in {**ARTICLE_CLAIMS, **QUALITATIVE_CLAIMS}.items():
        found = [value for (name, _, smoke), value in newest.items() if name == key and not smoke]
        smoke_runs = [value for (name, _, smoke), value in newest.items() if name == key and smoke]
        if not found and key in ARTICLE_CLAIMS:
            board.append({"key": key, "source": f"{claim.article} §{claim.section}", "statement": claim.statement,
                          "claimed": claim.claimed, "measured": "-", "interval": "-", "verdict": NOT_MEASURED,
                          "reason": f"run notebook {claim.notebook}" + (" outside the smoke profile (only smoke "
                                                                         "runs so far)" if smoke_runs else ""),
                          "notebook": claim.notebook, "hardware": "-", "profile": "-", "evidence": True,
                          "created_at": None, "run_id": None})
        for item in [*found, *smoke_runs]:
            values = {k: v for k, v in item.items() if k not in ("hardware", "profile", "created_at", "run_id", "row_id")}
            try:
                values["verdict"] = _current_verdict(claim, values)
                shown = Claim(key=key, hardware=item["hardware"], **values).row()
            except (TypeError, ValueError, KeyError) as error:  # a row no claim can be made of: one line, go on
                _skip_row({"id": item["row_id"], "name": key}, f"{type(error).__name__}: {error}")
                continue
            entry = {"key": key, **shown,
                     "statement": claim.statement, "reason": item["reason"], "notebook": claim.notebook,
                     "hardware": item["hardware"], "profile": item["profile"],
                     "evidence": item["profile"] not in CHECK_PROFILES,
                     "created_at": item["created_at"], "run_id": item["run_id"]}
            if not entry["evidence"]:
                entry.update(verdict=SMOKE, verdict_as_measured=values["verdict"])
            board.append(entry)
    for entry in board:
        entry["whose"] = "yours"
        entry["reference"] = _reference_of(entry["key"], entry["notebook"], references)
    return board


def _reference_of(key: str, notebook: str, cache: dict) -> dict | None:
    """The committed reference's figure for claim `key` (analysis.reference), for the scoreboard."""
    from course_lib.analysis import reference

    if notebook not in cache:
        try:
            cache[notebook] = reference.find(notebook)
        except reference.ReferenceResultError:
            cache[notebook] = None
    found = cache[notebook]
    item = found.claim(key) if found else None
    if item is None:
        return None
    return {"whose": "reference", **_figure(item), "hardware": found.hardware,
            "date": found.date, "profile": found.profile, "command": found.command}


# The accuracy claims of the six accuracy chapters (issue 24): those whose measurement is an accuracy, a
# difference of accuracies or a calibration error, not a time, a speed or a memory figure. A verdict on
# one is conclusive when it holds or is refuted (its interval excludes "no effect", or lies wholly
# outside the claimed range), and inconclusive when it is "not shown beyond noise".
ACCURACY_CLAIMS: dict[str, tuple[str, ...]] = {
    "03": ("amp_accuracy",),
    "05": ("syncbn_small_batches",),
    "06": ("adamw_vs_sgd", "adamw_sensitivity", "batch_lr_scaling", "schedule_over_optimizer"),
    "07": ("regularization_remote_sensing", "regularization_cifar10", "mixup_remote_sensing", "ema_steady_gain",
           "too_many_tricks", "label_smoothing_alone", "label_smoothing_calibration", "early_stopping",
           "best_checkpoint_gain", "swa_gain", "augmentation_prevents_overfitting"),
    "08": ("transfer_learning", "transfer_beats_scratch", "transfer_freeze_recipe"),
    "09": ("mixup_helps_09", "imbalance_weighted_loss", "imbalance_sampler"),
    "10": ("casestudy_adamw", "casestudy_regularization", "casestudy_accuracy"),
    "12": ("eurosat_finetuned_reference", "eurosat_scratch_reference", "speedrun_97_in_10_minutes",
           "bigger_model_not_better", "vit_overfits_small_data", "imagenette_leaderboard"),
    "13": ("deploy_distillation", "deploy_pruning", "continual_learning"),
    "15": ("cleaning_recovers_accuracy",),
}
CONCLUSIVE, INCONCLUSIVE = "conclusive", "inconclusive"
ACCURACY_OUTCOMES = (CONCLUSIVE, INCONCLUSIVE, NOT_MEASURABLE, NOT_MEASURED)


def _outcome(verdict: str | None) -> str:
    if verdict in (HOLDS, REFUTED):
        return CONCLUSIVE
    if verdict == NOT_SHOWN:
        return INCONCLUSIVE
    return NOT_MEASURABLE if verdict == NOT_MEASURABLE else NOT_MEASURED


def accuracy_counts(board: list[dict] | None = None, whose: str = "yours", root=None) -> dict[str, dict[str, int]]:
    """Per accuracy notebook (`ACCURACY_CLAIMS`): how many of its accuracy claims are conclusive,
    inconclusive, not measurable here and not measured yet, and their total. `whose="yours"` counts the
    newest measurement of each claim on `board` (`scoreboard()`: any machine; smoke-profile ones are not
    evidence and are left out); `whose="reference"` counts the committed reference results instead
    (`analysis.reference.find`, from `root` when given), whatever the reader has measured."""
    from course_lib.analysis import reference

    if whose not in ("yours", "reference"):
        raise ValueError(f"whose={whose!r}: count 'yours' (the ledger's measurements) or 'reference'")
    verdicts: dict[str, str | None] = {}
    if whose == "yours":
        newest: dict[str, dict] = {}
        for item in scoreboard() if board is None else board:
            if item.get("evidence", True) and item["verdict"] != NOT_MEASURED:
                kept = newest.get(item["key"])
                if kept is None or (item.get("created_at") or "") > (kept.get("created_at") or ""):
                    newest[item["key"]] = item
        verdicts = {key: item["verdict"] for key, item in newest.items()}
    else:
        for notebook, keys in ACCURACY_CLAIMS.items():
            try:
                found = reference.find(notebook, root=root)
            except reference.ReferenceResultError:
                found = None
            verdicts.update({key: (found.claim(key) or {}).get("verdict") for key in keys} if found else {})
    counts = {}
    for notebook, keys in ACCURACY_CLAIMS.items():
        outcomes = [_outcome(verdicts.get(key)) for key in keys]
        counts[notebook] = {**{outcome: outcomes.count(outcome) for outcome in ACCURACY_OUTCOMES},
                            "total": len(keys)}
    return counts


def demonstrations(root=None) -> int:
    """How many claims of the committed reference results are DEMONSTRATED (counted apart from the verdicts)."""
    from course_lib.analysis import reference

    notebooks = sorted({path.stem for path in (root or reference.folder()).glob("*/*.json")})
    found = (reference.find(notebook, root=root) for notebook in notebooks)
    return sum(item.get("verdict") == DEMONSTRATED for ref in found if ref for item in ref.claims)


def accuracy_counts_table(counts: dict[str, dict[str, int]]) -> str:
    """`accuracy_counts` as the markdown table docs/results.md carries (`workbook docs tables` writes it;
    tests/test_claims.py holds the copy to the committed reference results)."""
    lines = ["| notebook | conclusive | inconclusive | not measurable here | not measured | of |",
             "|---|---|---|---|---|---|"]
    lines += [f"| {notebook} | {count[CONCLUSIVE]} | {count[INCONCLUSIVE]} | {count[NOT_MEASURABLE]} | "
              f"{count[NOT_MEASURED]} | {count['total']} |" for notebook, count in counts.items()]
    return "\n".join(lines)


def accuracy_results_table(root=None) -> str:
    """Every accuracy claim (`ACCURACY_CLAIMS`) of the committed reference results, as the markdown
    table docs/results.md carries: notebook, claim, measured, 95% interval, verdict and how it was measured
    (the reason names the seeds, epochs and data); "-" where a notebook has no reference yet.
    `workbook reference table` prints it; tests/test_claims.py holds the copy there to the files."""
    from course_lib.analysis import reference

    lines = ["| notebook | claim | measured | 95% interval | verdict | how it was measured |", "|---|---|---|---|---|---|"]
    for notebook, keys in ACCURACY_CLAIMS.items():
        found = reference.find(notebook, root=root)
        for key in keys:
            item = found.claim(key) if found else None
            figure = _figure(item, article_claim(key).unit)
            reason = (item or {}).get("reason") or ("no reference of this notebook" if found is None else "-")
            lines.append(f"| {notebook} | `{key}` | {figure['measured']} | {figure['interval']} | {figure['verdict']} | "
                         + reason.replace("|", "/").replace("\n", " ") + " |")
    return "\n".join(lines)


def format_accuracy_counts(counts: dict[str, dict[str, int]]) -> str:
    """One line per notebook: "07: 5 of 7 accuracy verdicts conclusive (1 inconclusive, 1 not measurable here)"."""
    lines = []
    for notebook, count in counts.items():
        rest = [f"{count[outcome]} {outcome}" for outcome in ACCURACY_OUTCOMES[1:] if count[outcome]]
        lines.append(f"{notebook}: {count[CONCLUSIVE]} of {count['total']} accuracy verdicts conclusive"
                     + (f" ({', '.join(rest)})" if rest else ""))
    return "\n".join(lines)


def verdict_counts(board: list[dict]) -> dict[str, int]:
    """How many scoreboard items have each verdict, smoke-profile ones left out (they are not evidence);
    DEMONSTRATED has its own count, to be shown apart from the verdicts (`format_scoreboard`)."""
    counted = [item for item in board if item.get("evidence", True)]
    return {verdict: sum(item["verdict"] == verdict for item in counted) for verdict in (*VERDICTS, NOT_MEASURED)}


def format_counts(board: list[dict]) -> str:
    """`verdict_counts` in one line, the demonstrations apart: "3 holds, ..., 19 not measured yet; apart
    from these, 2 demonstrated (shown, not measured)"."""
    counts = verdict_counts(board)
    demonstrations = counts.pop(DEMONSTRATED)
    return (", ".join(f"{count} {verdict}" for verdict, count in counts.items())
            + f"; apart from these, {demonstrations} {DEMONSTRATED}")


def format_scoreboard(board: list[dict]) -> str:
    """Plain text for `workbook claims`: one block per claim and machine, a count of verdicts, then the
    smoke-profile measurements apart (not counted: a smoke run checks that a notebook runs)."""
    lines = []
    evidence = [item for item in board if item.get("evidence", True)]
    smoke = [item for item in board if not item.get("evidence", True)]
    for item in evidence:
        lines.append(f"[{item['notebook']}] {item['key']} ({item['source']}): {item['verdict']}")
        if item["verdict"] == NOT_MEASURED:
            lines.append(f"    claimed {item['claimed']}; {item['reason']}")
        else:
            lines.append(f"    claimed {item['claimed']}; yours: measured {item['measured']}"
                         + (f" {item['interval']}" if item["interval"] != "-" else "")
                         + f" on {item['hardware']}, profile {item.get('profile', UNKNOWN_PROFILE)}")
            if item["reason"]:
                lines.append(f"    {item['reason']}")
        figure = item.get("reference")
        if figure:
            lines.append(f"    reference (not yours): {figure['verdict']}, measured {figure['measured']}"
                         + (f" {figure['interval']}" if figure["interval"] != "-" else "")
                         + f" on {figure['hardware']}, profile {figure['profile']}, {figure['date']}")
    lines.append(format_counts(board))
    for whose in ("yours", "reference"):
        counts = accuracy_counts(board, whose)  # the references' counts: of every committed reference
        if whose == "yours" or any(count[NOT_MEASURED] < count["total"] for count in counts.values()):
            lines.append(f"accuracy verdicts per notebook ({whose}"
                         + (", not your run):" if whose == "reference" else "):"))
            lines += ["    " + line for line in format_accuracy_counts(counts).splitlines()]
    if smoke:
        lines.append(f"{SMOKE} ({len(smoke)} measurement(s) of the smoke profile, left out of the counts):")
        lines += [f"    [{item['notebook']}] {item['key']}: measured {item['measured']}"
                  + (f" {item['interval']}" if item["interval"] != "-" else "")
                  + f" on {item['hardware']}" for item in smoke]
    return "\n".join(lines)
