"""One dataclass of plain values that configures every notebook, the CLI and the engine.

Profiles (`smoke`, `cpu`, `gpu`, `auto`) are named sets of values for the same fields,
so a notebook runs everywhere without edits. Building a config refuses unknown names
and wrong types with a one-line message that names the closest valid names (or lists them), and values outside their
field's range (NaN and inf included) with a one-line message that gives the range.
"""
from __future__ import annotations

import dataclasses
import difflib
import math
import os
import typing
from dataclasses import dataclass, fields

PROFILE_NAMES = ("smoke", "cpu", "gpu", "auto", "rehearsal", "reference")
# The data switches' values (data.decode, data.pipeline and data.loaders use these names too).
DECODER_NAMES = ("pil", "opencv", "torchvision", "nvjpeg")
STORAGE_NAMES = ("files", "cache", "shards", "device")
AUGMENTATION_PLACES = ("cpu", "device", "none")
# class_balance's values (data.class_balance implements the two corrections).
CLASS_BALANCE_NAMES = ("none", "weighted_loss", "sampler")
# The committed landcover-synth sample (relative to the project root).
SAMPLE_DATA_DIR = "data_samples/landcover-synth"


class WorkbookError(Exception):
    """Bad input the user can fix; the CLI prints the message as one line, without a traceback."""


def plural(count: int, noun: str) -> str:
    """"1 notebook", "16 notebooks": a count and its noun, as the one-line messages print them."""
    return f"{count} {noun}{'' if count == 1 else 's'}"


def unknown_name(kind: str, name: str, valid, where: str = "") -> str:
    """The one line for a `name` that is not among `valid`: the closest valid names when some are close
    ("unknown parameter 'epoch'; did you mean 'epochs'?"), else every valid name."""
    valid = list(valid)
    close = difflib.get_close_matches(name, valid, n=3, cutoff=0.6)
    if close:
        return f"unknown {kind} {name!r}{where}; did you mean {' or '.join(map(repr, close))}?"
    return f"unknown {kind} {name!r}{where}; valid names: {', '.join(valid)}"


# optimizer=muon's default learning rate: airbench94_muon trains its conv kernels with Muon at 0.24 per step at
# batch 2000; scaled linearly to the speed-run recipe's batch of 128 (0.24 x 128 / 2000), which keeps the summed
# step over an epoch (the integral of the schedule) about where airbench's is. A starting point, not a measurement.
MUON_LR = 0.015


class ConfigError(WorkbookError, ValueError):
    """A configuration value or name that cannot be used; the message says the fix."""


@dataclass(frozen=True)
class Config:
    # --- data ---
    dataset: str = "landcover-synth"  # landcover-synth | digits | imagefolder | eurosat | cifar10
    data_dir: str = ""  # folder of the dataset; "" = the dataset's default place
    image_size: int = 64  # pixels, side of the square the model sees
    min_image_size: int = 0  # pixels of the first epoch's training images, growing to image_size over resize_ramp of the epochs (progressive resizing); 0 = off, >= image_size: no effect
    resize_ramp: float = 0.75  # share of the epochs over which progressive resizing grows the side (FFCV's 3/4: the last quarter trains at image_size; 1 = only the last epoch does)
    max_train_images: int = 0  # images; 0 = the whole training split
    validation_from: str = "folder"  # folder (the data's val/ or valid/) | train (a fixed 10% of train per class, seed 0, to choose on; the folder's val/ is then held out as the test split)
    bad_images: str = "fail"  # fail | skip: what loading does with an unreadable image
    decoder: str = "pil"  # pil | opencv | torchvision | nvjpeg (CUDA; storage=cache only): JPEG decoding library
    storage: str = "files"  # files | cache (pre-decoded uint8, data_cache/predecoded) | shards (tar, data_cache/shards) | device (the cache as one uint8 tensor on the training device, batched there, no DataLoader)
    augmentation: str = "cpu"  # cpu (per image, in workers) | device (per batch, on the training device) | none
    augment_recipe: str = "light"  # light (crop + flip) | heavy (+ colour jitter) | overhead (8 symmetries of the square + shifts)
    rotation: float = 0.0  # degrees: each training image turned by its own random angle in [-rotation, rotation] (corners reflect-filled) on top of augment_recipe; 0 = off
    download: bool = False  # allow torchvision datasets to download (needs internet)
    # --- model ---
    model: str = "resnet18"  # any timm model name
    pretrained: bool = False  # load timm's ImageNet weights (needs them cached or internet)
    checkpoint: str = ""  # path of a workbook checkpoint to start from; "" = none
    freeze_backbone_epochs: int = 0  # epochs at the start that train only the classifier head
    backbone_lr_scale: float = 1.0  # backbone learning rate as a fraction of lr (e.g. 0.1 for fine-tuning)
    whiten_stem: bool = False  # the first conv's filters set, then frozen, from the eigenvectors of the patch covariance of 5,000 training images, each scaled by 1/sqrt(eigenvalue + 5e-4), as +v and -v (airbench's whitening layer, models/whitening.py); false = random init
    activation: str = ""  # "" (the model's own: GELU in the speedrun_resnet nets) | relu | gelu: the speedrun_resnet nets' activation (other models refuse it)
    # --- optimisation ---
    batch_size: int = 64  # images per step per process
    sync_batchnorm: bool = False  # under DDP, BatchNorm statistics over every process's batch (torch.nn.SyncBatchNorm on CUDA, engine.sync_batchnorm on CPU); one process: no effect
    epochs: int = 1  # passes over the training split
    max_steps: int = 0  # optimizer steps per epoch; 0 = no cap
    accumulation_steps: int = 1  # micro-batches per optimizer step
    optimizer: str = "sgd"  # sgd | adamw | muon (Muon on the conv kernels but the stem at muon_lr, SGD on the rest at lr; engine/muon.py)
    lr: float = 0.1  # peak learning rate (after warmup)
    muon_lr: float = MUON_LR  # peak learning rate of optimizer=muon's orthogonalised steps (spectral norm per step; airbench94_muon's 0.24 at batch 2000, scaled to batch 128), on the same schedule as lr
    momentum: float = 0.9  # SGD momentum
    weight_decay: float = 5e-4  # decoupled for AdamW, L2 for SGD
    warmup_epochs: float = 0.0  # epochs of linear warmup before the decay (onecycle: its rising phase)
    lr_schedule: str = "cosine"  # after warmup: cosine (to min_lr) | linear (straight to min_lr) | constant (lr throughout) | step (x0.1 at 50% and 75% of the steps after warmup) | onecycle (torch's OneCycleLR: cosine up from lr/25, then down to lr/25e4; SGD momentum cycles 0.95-0.85)
    min_lr: float = 0.0  # learning rate at the end of the cosine or linear decay
    grad_clip_norm: float = 0.0  # max global gradient L2 norm; 0 = no clipping
    lookahead_steps: int = 0  # optimizer steps between Lookahead's syncs (slow weights move lookahead_alpha towards the fast ones, which restart from them; engine/lookahead.py); 0 = off
    lookahead_alpha: float = 0.5  # fraction of the way the slow weights move to the fast ones at each Lookahead sync, above 0 up to 1
    # --- regularisation ---
    label_smoothing: float = 0.0  # eps, 0-1: target = (1 - eps) on the true class + eps / classes on every class
    mixup_alpha: float = 0.0  # Beta(alpha, alpha) for MixUp; 0 = off
    cutmix_alpha: float = 0.0  # Beta(alpha, alpha) for CutMix; 0 = off
    random_erasing: float = 0.0  # probability of erasing a random box per image
    ema_decay: float = 0.0  # weight EMA decay per step; 0 = off
    tta_views: int = 1  # test-time augmentation: predictions averaged over 1 (off), 2 (mirror) .. 8 (all symmetries) views
    tta_selective: float = 0.0  # fraction 0-1 of each validation batch (rounded down), its least confident images by single-view top softmax, that gets the tta_views views; the rest keep one view (hiverge's cifar10-speedrun: 0.25); 0 = every image (as 1); no effect at tta_views=1
    class_balance: str = "none"  # none | weighted_loss (cross-entropy weighted by inverse class frequency, N / (classes x n_c)) | sampler (training images drawn with replacement, each class equally often)
    # --- choosing and averaging weights ---
    save_best: bool = False  # also keep output_dir/best.pt: the checkpoint of the epoch with the highest validation top-1
    early_stopping_patience: int = 0  # epochs without a validation top-1 improvement after which training stops; 0 = off
    swa_epochs: int = 0  # stochastic weight averaging over the last N epochs (one snapshot per epoch, learning rate held constant from where SWA begins, BatchNorm statistics recomputed); 0 = off
    # --- speed switches ---
    precision: str = "auto"  # off | fp16 | bf16 | auto (chosen from measured device speed)
    channels_last: bool = False  # NHWC memory format for convolutions
    compile: bool = False  # torch.compile the model
    compile_mode: str = "default"  # default | reduce-overhead (CUDA graphs) | max-autotune (Triton autotuning): torch.compile's mode
    matmul_precision: str = "highest"  # highest (exact fp32) | high (TF32 tensor cores, Ampere+) | medium (TF32, or bf16 where torch allows): fp32 matmuls and convolutions (CUDA only)
    cudnn_benchmark: bool = False  # let cuDNN time its convolution algorithms on the first batches (CUDA only; fixed image sizes)
    num_workers: int = 0  # DataLoader worker processes; -1 = recommended: half the physical cores per process
    pin_memory: bool = False  # page-locked host memory for faster host-to-device copies
    prefetch_factor: int = 2  # batches each worker loads ahead
    persistent_workers: bool = False  # keep workers alive between epochs
    device: str = "auto"  # auto (cuda, else mps, else cpu) | cpu | cuda | cuda:N | mps
    # --- bookkeeping ---
    seed: int = 0  # seeds python, numpy and torch
    output_dir: str = "runs/checkpoints"  # where checkpoints go
    resume: bool = False  # continue from output_dir's last checkpoint
    monitor_interval: float = 0.0  # seconds between utilisation samples on a background thread (GPU SM %, memory and power through NVML; process CPU % and RSS through psutil), timeline in output_dir/monitor.csv; 0 = off
    tensorboard: bool = False  # write the run's curves for TensorBoard into output_dir/tensorboard/ (torch.utils.tensorboard): per step loss, lr and grad norm (grad_norm_log), per epoch every history number (loss, top-1, images/s, data wait, memory), utilisation samples (monitor_interval); `tensorboard --logdir runs` shows them
    grad_norm_log: bool = False  # log the total gradient L2 norm of every optimizer step (output_dir/grad_norms.csv) and name vanishing or exploding gradients in one line
    vanishing_grad_norm: float = 1e-4  # gradient L2 norm under which a step counts towards vanishing gradients (grad_norm_log)
    vanishing_grad_steps: int = 20  # consecutive optimizer steps under vanishing_grad_norm that name vanishing gradients
    exploding_grad_factor: float = 10.0  # a step whose gradient norm exceeds this many times the median of the previous 10 names exploding gradients; 0 = off
    recipe: str = ""  # "" | speedrun | speedrun2 | best | imagenette: a named set of the values above (RECIPES), applied over the profile

    def replace(self, **changes) -> "Config":
        """A copy with some fields changed, checked like `make_config`; a new `recipe` brings its
        values, then the other changes apply over them."""
        values = dataclasses.asdict(self)
        if changes.get("recipe"):
            values.update(RECIPES[_known_recipe(changes["recipe"])])
        return make_config(None, **{**values, **changes})

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


FIELD_NAMES = tuple(f.name for f in fields(Config))
_TYPES = typing.get_type_hints(Config)
# Profiles change only what must change with the machine; everything else is a field default.
PROFILES: dict[str, dict] = {
    # CI-sized: every notebook well under a minute on 2 CPU cores, on the committed sample.
    # timm's test_resnet (a few thousand parameters): the notebooks' code runs, nothing is learned.
    "smoke": dict(data_dir=SAMPLE_DATA_DIR, model="test_resnet", image_size=32, batch_size=16, epochs=1, max_steps=4,
                  max_train_images=256, num_workers=0, device="cpu", precision="off"),
    # A laptop or a CPU server: small images, a few epochs, workers for decoding (-1: the
    # recommended number, devices.recommended_num_workers). Data switches stay at their defaults:
    # with one worker, waiting for data was under 1% of a resnet18 step at 64 px on 2 cores
    # (benchmarks/results/data_pipeline.md), so neither the cache nor moving augmentation into
    # the training process, which computes the model on the same cores, has anything to win here.
    "cpu": dict(image_size=64, batch_size=64, epochs=2, max_steps=0, max_train_images=2000,
                num_workers=-1, device="cpu", channels_last=True),
    # One or more CUDA GPUs: the articles' setting. augmentation=device: workers only decode and
    # resize to uint8, and crop, flip and normalisation run per batch on the GPU, which idles
    # while CPU workers are the bottleneck the articles describe. Measured per worker core on
    # EuroSAT at 224 px (AMD EPYC, 1 thread): 1,559 images/s instead of 637, and 151 KB per
    # image to pass on instead of 602 KB (uint8 vs float32). storage stays files: a 224 px cache
    # of the whole split costs 150 KB of disk per image, a trade to opt into (storage=cache).
    # matmul_precision=high and cudnn_benchmark: the PyTorch performance-tuning guide's two GPU
    # switches (TF32 for fp32 work on Ampere and newer; cuDNN's autotuner for the fixed 224 px).
    "gpu": dict(model="resnet50", image_size=224, batch_size=128, epochs=5, max_steps=0, max_train_images=0,
                num_workers=-1, pin_memory=True, persistent_workers=True, prefetch_factor=4,
                device="cuda", precision="auto", channels_last=True, augmentation="device",
                matmul_precision="high", cudnn_benchmark=True),
}
# The gpu profile's switches (its data path, layout, precision choice and GPU switches) for a
# rehearsal on the CPU at the smoke profile's sizes: `workbook run --profile rehearsal` runs every
# notebook in its smoke branches with these on, so the gpu profile's code paths have run before a
# GPU does. One worker process (persistent_workers needs one). Off: compile (a first CPU compile of
# each model and size takes about a minute; notebook 03's section 4 compiles once, tests/test_rehearsal.py),
# the gpu profile's resnet50 at 224 px (2-4 s per CPU step even at 32 px; the smoke model runs instead)
# and its sizes. CUDA-only switches do nothing on the CPU and are named (`devices.skipped_switches`).
REHEARSAL_SWITCHES = {name: PROFILES["gpu"][name] for name in (
    "pin_memory", "persistent_workers", "channels_last", "augmentation", "precision", "matmul_precision",
    "cudnn_benchmark")} | {"num_workers": 1, "prefetch_factor": 2}
PROFILES["rehearsal"] = {**PROFILES["smoke"], **REHEARSAL_SWITCHES}
# The long version of the accuracy studies (issue 51): the cpu profile's machine settings, and in the chapters
# that draw accuracy verdicts, their own `reference` sizes (converged models, at least 5 seeds: what the
# verdicts need to conclude); a chapter without such sizes runs its cpu pass (`profile_entry`). Run once on a
# quiet machine and committed with `workbook reference save` (results/reference/<hardware>/); the cpu
# profile stays the reader's quick pass, shown beside it.
PROFILES["reference"] = dict(PROFILES["cpu"])
# Set (to 1) in the kernels of `workbook run --profile rehearsal`: the notebooks run with profile
# smoke, and every make_config("smoke") they build carries REHEARSAL_SWITCHES.
REHEARSAL_ENV = "WORKBOOK_REHEARSAL"


# Recipes: named sets of values for the same fields, like profiles but about *how* to train rather
# than *where*: applied over the profile, under explicit overrides. Each ingredient is one field, so
# `-p recipe=speedrun -p tta_views=1` shows what test-time augmentation was worth. Notebook 12
# measures every ingredient; the values and their reasons are in docs/time_to_accuracy.md.
RECIPES: dict[str, dict] = {
    # The fastest road to 97% on EuroSAT on 2 CPU cores (an airbench-style net on the resident, pre-decoded split),
    # each value chosen on a carve-out of train: the measurements are in docs/time_to_accuracy.md, "The speed-run recipe".
    "speedrun": dict(model="speedrun_resnet_small", image_size=64, min_image_size=32, max_train_images=0, max_steps=0,
                     storage="device", augmentation="device", augment_recipe="overhead", num_workers=0,
                     decoder="torchvision",
                     batch_size=128, epochs=21, optimizer="sgd", lr=0.2, momentum=0.9, weight_decay=5e-4,
                     warmup_epochs=1.0, lr_schedule="linear", min_lr=0.0, label_smoothing=0.1, precision="auto", channels_last=True,
                     tta_views=8),
}
# The speed-run, quicker (issue 48): Muon on the conv kernels at batch 256 and 14 epochs, the side growing until the last
# epoch; chosen on the carve-out of train: docs/time_to_accuracy.md, "speedrun2".
RECIPES["speedrun2"] = {**RECIPES["speedrun"], "optimizer": "muon", "batch_size": 256, "lr": 0.4, "muon_lr": 0.03,
                        "epochs": 14, "resize_ramp": 1.0}
# The most accurate recipe from scratch: the speed-run's pipeline and schedule with the 4x wider net, 60 epochs on tiles
# upsampled to 80 px (40 px maps after the 2x2 stem); the runs that chose it: docs/time_to_accuracy.md, "The record from scratch".
RECIPES["best"] = {**RECIPES["speedrun"], "model": "speedrun_resnet", "epochs": 60, "image_size": 80,
                   "min_image_size": 40}
# Where `workbook data get imagenette` lays Imagenette out (paths.CACHE_DIR/imagenette, relative to the project
# root; this module is a leaf and names it itself).
IMAGENETTE_DATA_DIR = "data_cache/imagenette"
# The ImageNet-style path (issue 47 point 7): Imagenette under its leaderboard's rules (random weights, no TTA, 5 epochs),
# close to fastai's train_imagenette, not yet tuned; each value's why: docs/time_to_accuracy.md, "The ImageNet-style path".
RECIPES["imagenette"] = dict(dataset="imagefolder", data_dir=IMAGENETTE_DATA_DIR, validation_from="folder",
                             max_train_images=0, max_steps=0, model="resnet50d", pretrained=False, image_size=160,
                             min_image_size=0, augment_recipe="light", batch_size=64, epochs=5, optimizer="adamw",
                             lr=3e-3, weight_decay=0.01, warmup_epochs=1.0, lr_schedule="cosine", min_lr=0.0,
                             label_smoothing=0.1, mixup_alpha=0.0, cutmix_alpha=0.0, ema_decay=0.0, tta_views=1,
                             precision="auto", channels_last=True)


def _known_recipe(name: str) -> str:
    if name not in RECIPES:
        raise ConfigError(f"recipe={name!r} is not one of {', '.join(RECIPES)} (or \"\" for none)")
    return name


def mps_available() -> bool:
    """Whether torch can use an Apple-silicon GPU through Metal (False on builds without MPS).
    Here because the auto profile needs it and this module is a leaf; `devices` re-exports it."""
    import torch

    backend = getattr(torch.backends, "mps", None)
    return bool(backend is not None and backend.is_available())


def resolve_profile(profile: str | None) -> str | None:
    """`auto` becomes `gpu` when CUDA is available, else `cpu` (on Apple silicon `make_config`
    then trains the cpu profile's sizes on device=mps)."""
    if profile is None:
        return None
    if profile not in PROFILE_NAMES:
        raise ConfigError(f"unknown profile {profile!r}; valid profiles: {', '.join(PROFILE_NAMES)}")
    if profile == "auto":
        import torch

        return "gpu" if torch.cuda.is_available() else "cpu"
    return profile


def _check_type(name: str, value):
    expected = _TYPES[name]
    if expected is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if expected is bool and not isinstance(value, bool):
        raise ConfigError(f"{name} must be true or false, got {value!r}")
    if expected is int and (isinstance(value, bool) or not isinstance(value, int)):
        raise ConfigError(f"{name} must be an integer, got {value!r}")
    if not isinstance(value, expected):
        raise ConfigError(f"{name} must be {expected.__name__}, got {type(value).__name__} {value!r}")
    return value


_CHOICES = {
    "dataset": ("landcover-synth", "digits", "imagefolder", "eurosat", "cifar10"),
    "bad_images": ("fail", "skip"),
    "validation_from": ("folder", "train"),
    "compile_mode": ("default", "reduce-overhead", "max-autotune"),
    "matmul_precision": ("highest", "high", "medium"),  # torch.set_float32_matmul_precision
    "decoder": DECODER_NAMES,
    "storage": STORAGE_NAMES,
    "augmentation": AUGMENTATION_PLACES,
    "augment_recipe": ("light", "heavy", "overhead"),  # data.transforms.RECIPES
    "optimizer": ("sgd", "adamw", "muon"),  # engine.schedule.make_optimizer
    "lr_schedule": ("cosine", "linear", "constant", "step", "onecycle"),  # engine.schedule.SCHEDULES
    "precision": ("off", "fp16", "bf16", "auto"),
    "class_balance": CLASS_BALANCE_NAMES,
    "activation": ("", "relu", "gelu"),  # models.speedrun.ACTIVATIONS; "" = the model's own
}
# The models that take `activation` (models/speedrun.py registers them; this module is a leaf and names them).
ACTIVATION_MODELS = ("speedrun_resnet", "speedrun_resnet_small", "speedrun_resnet_tiny")


# Sizes in pixels a run can take: under 8 px the convolutions have nothing left to look at; over
# 4096 px one 3-channel image is 200 MB of float32 before the first layer, and the activations of a
# batch of them tens of GB (image_size=99999 asked for about 30 GB at the first allocation).
IMAGE_SIZE_RANGE = (8, 4096)
# Seconds between utilisation samples: under 10 ms the sampler thread competes with training for the
# interpreter; over an hour a run shows no timeline.
MONITOR_INTERVAL_RANGE = (0.01, 3600.0)
_DEFAULTS = {f.name: f.default for f in fields(Config)}
# Upper bounds, far above any useful value but below the ones that take the machine down: each
# worker is a process holding a copy of the dataset object (num_workers=400 forked 400 of them),
# a batch of 65,536 images is 3 GB of float32 at 64 px before the first layer, and a weight decay of
# 1 per step zeroes the weights. The unit is the field's own. lr has no upper bound: a diverging lr
# is what the loss guard (engine.loss_guard) catches and names, and its tests diverge on purpose.
UPPER_BOUNDS = {
    "batch_size": 65_536, "epochs": 10_000, "max_steps": 10_000_000, "accumulation_steps": 1024,
    "num_workers": 128, "prefetch_factor": 64, "max_train_images": 1_000_000_000, "freeze_backbone_epochs": 10_000,
    "warmup_epochs": 10_000, "weight_decay": 1.0, "grad_clip_norm": 1e6, "mixup_alpha": 100.0,
    "cutmix_alpha": 100.0, "backbone_lr_scale": 100.0, "early_stopping_patience": 10_000,
    "lookahead_steps": 10_000_000,
}
# Below this a learning rate moves no float32 weight at all (the smallest step that changes 1.0 is
# 6e-8 of it; 1e-12 leaves a wide margin and refuses lr=5e-324).
MIN_LR = 1e-12


MAX_ROTATION = 45.0  # degrees of the `rotation` augmentation


def _check_ranges(values: dict) -> None:
    """Raise ConfigError for the first value outside its field's range (`values` holds every field)."""
    def refuse(name: str, rule: str, fix: str = "") -> None:
        raise ConfigError(f"{name} must be {rule}, got {values[name]!r}{'; ' + fix if fix else ''}")

    for name in FIELD_NAMES:  # NaN passes every comparison below, and inf every lower bound
        if _TYPES[name] is float and not math.isfinite(values[name]):
            refuse(name, "a finite number")
    for check in (_check_sizes, _check_rates, _check_switches, _check_optimizer_ingredients):
        check(values, refuse)


def _check_sizes(values: dict, refuse) -> None:
    """Image sizes, batches, steps, epochs, seeds and counts."""
    low, high = IMAGE_SIZE_RANGE
    if not low <= values["image_size"] <= high:
        refuse("image_size", f"{low} to {high} pixels",
               "smaller leaves the convolutions nothing to see, larger needs tens of GB per batch")
    for name in ("batch_size", "accumulation_steps", "prefetch_factor", "epochs"):
        if values[name] < 1:
            refuse(name, "at least 1")
    # At or above image_size progressive resizing has nothing to grow (a recipe's 32 px start with image_size=16).
    if values["min_image_size"] and not low <= values["min_image_size"] <= high:
        refuse("min_image_size", f"0 (off) or {low} to {high} pixels (at or above image_size it has no effect)")
    if not 0 < values["resize_ramp"] <= 1:
        refuse("resize_ramp", "a share of the epochs above 0 up to 1", "e.g. 0.75: the last quarter trains at image_size")
    for name in ("max_steps", "max_train_images", "freeze_backbone_epochs", "seed", "weight_decay", "warmup_epochs",
                 "min_lr", "grad_clip_norm", "mixup_alpha", "cutmix_alpha"):
        if values[name] < 0:
            refuse(name, "0 or more")
    if values["seed"] >= 2**63:
        refuse("seed", "below 2**63 (torch.manual_seed's limit)")


def _check_rates(values: dict, refuse) -> None:
    """Learning rates, their bounds, the output folder, and the values that are fractions or probabilities."""
    if values["lr"] < MIN_LR:
        refuse("lr", f"at least {MIN_LR:g}", "e.g. 0.1 for SGD or 1e-3 for AdamW")
    for name, high in UPPER_BOUNDS.items():
        if values[name] > high:
            refuse(name, f"at most {high:,}", "larger values exhaust the machine or diverge")
    if not values["output_dir"].strip():
        refuse("output_dir", "a folder", "e.g. runs/checkpoints (empty would write checkpoints into the project root)")
    if not 0 <= values["rotation"] <= MAX_ROTATION:
        refuse("rotation", f"0 (off) to {MAX_ROTATION:g} degrees",
               "a small rotation is an augmentation; beyond it a tile's content leaves the frame (the overhead recipe turns by 90)")
    if values["min_lr"] > values["lr"]:
        refuse("min_lr", f"at most lr ({values['lr']!r}), where the decay ends")
    for name, meaning in (("momentum", "0 (plain SGD) up to, not including, 1"),
                          ("label_smoothing", "0 (off) up to, not including, 1 (a uniform target: the labels ignored)"),
                          ("ema_decay", "0 (off) or between 0 and 1 (e.g. 0.999)")):
        if not 0 <= values[name] < 1:
            refuse(name, meaning)
    if not 0 <= values["random_erasing"] <= 1:
        refuse("random_erasing", "a probability from 0 to 1")
    if not 1 <= values["tta_views"] <= 8:
        refuse("tta_views", "1 (off) to 8 (every symmetry of the square)")
    if not 0 <= values["tta_selective"] <= 1:
        refuse("tta_selective", "a fraction from 0 to 1 (0 and 1: every image gets tta_views views)")


def _check_switches(values: dict, refuse) -> None:
    """Workers, monitoring, gradient checks, freezing, early stopping, SWA, and the switches that exclude each other."""
    if values["num_workers"] < -1:
        refuse("num_workers", "0 or more, or -1 for the recommended number (half the physical cores per training "
               "process)")
    if values["monitor_interval"] and not MONITOR_INTERVAL_RANGE[0] <= values["monitor_interval"] <= MONITOR_INTERVAL_RANGE[1]:
        refuse("monitor_interval", f"0 (off) or {MONITOR_INTERVAL_RANGE[0]:g} to {MONITOR_INTERVAL_RANGE[1]:g} seconds",
               "NVML averages utilisation over 1/6 s to 1 s (by GPU); faster sampling only costs CPU")
    if values["vanishing_grad_norm"] < 0:
        refuse("vanishing_grad_norm", "0 or more")
    if values["vanishing_grad_steps"] < 1:
        refuse("vanishing_grad_steps", "at least 1")
    if values["exploding_grad_factor"] and values["exploding_grad_factor"] <= 1:
        refuse("exploding_grad_factor", "0 (off) or above 1 (a jump over that many times the recent median)")
    if values["backbone_lr_scale"] <= 0:
        refuse("backbone_lr_scale", "above 0", "to keep the backbone fixed use freeze_backbone_epochs")
    if values["early_stopping_patience"] < 0:
        refuse("early_stopping_patience", "0 (off) or more epochs")
    if not 0 <= values["swa_epochs"] < values["epochs"]:
        refuse("swa_epochs", f"0 (off) up to epochs - 1 ({values['epochs'] - 1})",
               "SWA averages the last epochs and needs at least one epoch of the normal schedule before them")
    if values["class_balance"] == "weighted_loss" and (values["mixup_alpha"] or values["cutmix_alpha"]):
        refuse("class_balance", "none or sampler with mixup_alpha or cutmix_alpha above 0",
               "mixed targets have no single class to weight; use class_balance=sampler")
    if values["activation"] and values["model"] not in ACTIVATION_MODELS:
        refuse("activation", f"\"\" with model={values['model']} (it builds its own activation)",
               f"relu and gelu apply to {', '.join(ACTIVATION_MODELS)}")
    if values["whiten_stem"] and (values["pretrained"] or values["checkpoint"]):
        refuse("whiten_stem", "false with pretrained or checkpoint weights",
               "whitening sets the first conv from the data and would overwrite the weights you start from")
    if values["class_balance"] != "none" and values["storage"] == "shards":
        refuse("class_balance", "none with storage=shards",
               "a tar stream gives no labels up front to count; use storage=cache or files")


def _check_optimizer_ingredients(values: dict, refuse) -> None:
    """Muon's learning rate and Lookahead's period and step fraction."""
    if values["muon_lr"] < MIN_LR:
        refuse("muon_lr", f"at least {MIN_LR:g}", f"e.g. {MUON_LR:g} at batch 128")
    if values["lookahead_steps"] < 0:
        refuse("lookahead_steps", "0 (off) or more optimizer steps", "e.g. 5")
    if not 0 < values["lookahead_alpha"] <= 1:
        refuse("lookahead_alpha", "above 0 up to 1 (the fraction of the way to the fast weights)",
               "1 keeps the fast weights as they are, 0.5 is the paper's")


def check_values(values: dict) -> dict:
    """Return `values` with types and ranges checked; raise ConfigError naming the first problem,
    so the CLI, notebooks and `workbook run` refuse a bad value in one line before any work."""
    unknown = sorted(set(values) - set(FIELD_NAMES))
    if unknown:
        raise ConfigError(unknown_name("parameter", unknown[0], FIELD_NAMES))
    checked = {name: _check_type(name, value) for name, value in values.items()}
    for name, choices in _CHOICES.items():
        if name in checked and checked[name] not in choices:
            shown = ", ".join(choice or '""' for choice in choices)  # "" reads as a value, not as nothing
            raise ConfigError(f"{name}={checked[name]!r} is not one of {shown}")
    device = checked.get("device")
    if device is not None and not (device in ("auto", "cpu", "cuda", "mps") or device.startswith("cuda:")):
        raise ConfigError(f"device={device!r} is not one of auto, cpu, cuda, cuda:N, mps")
    _check_ranges({**_DEFAULTS, **checked})
    if checked.get("recipe"):
        _known_recipe(checked["recipe"])
    return checked


def make_config(profile: str | None = "auto", *overlays: typing.Mapping[str, typing.Mapping], **params) -> Config:
    """Build a Config from a profile, its recipe, then each overlay in turn, then `params`.

    An overlay maps profile names to values, such as a chapter's sizes per profile
    (`{"cpu": {"epochs": 1}}`): only the resolved profile's entry applies, and a key that is no
    profile name is refused (a typo would otherwise apply nothing). Values that are None, in an
    overlay or in `params`, are ignored, so a notebook's parameters cell can say `batch_size = None`
    for "the profile's value"."""
    resolved = resolve_profile(profile)
    values = dict(PROFILES[resolved]) if resolved else {}
    if resolved == "smoke" and os.environ.get(REHEARSAL_ENV):
        values.update(REHEARSAL_SWITCHES)  # a notebook's smoke branches, with the gpu profile's switches
    if profile == "auto" and resolved == "cpu" and mps_available():
        values["device"] = "mps"  # Apple silicon: the cpu profile's sizes, trained on its GPU
    overlaid = _overlay_values(overlays, resolved)
    params = {k: v for k, v in params.items() if v is not None}
    recipe = params.get("recipe", overlaid.get("recipe", values.get("recipe")))
    if recipe:
        values.update(RECIPES[_known_recipe(recipe)])
    values.update(overlaid)
    values.update(params)
    return Config(**check_values(values))


def _overlay_values(overlays, resolved: str | None) -> dict:
    """The values `overlays` give the resolved profile, later overlays winning, None dropped."""
    merged = {}
    for overlay in overlays:
        unknown = sorted(set(overlay) - set(PROFILES))
        if unknown:
            raise ConfigError(f"overlay key(s) {', '.join(map(repr, unknown))} are no profile; "
                              f"key an overlay by {', '.join(PROFILES)}")
        merged.update({k: v for k, v in profile_entry(overlay, resolved, {}).items() if v is not None})
    return merged


def profile_entry(per_profile: typing.Mapping, resolved: str | None, default=None):
    """The entry of a per-profile mapping (an overlay, a chapter's choices) for a resolved profile;
    `rehearsal` without one of its own takes smoke's, whose sizes it runs at, and `reference` without one
    takes cpu's (a chapter with no accuracy study to lengthen runs its cpu pass as its reference)."""
    fallback = {"rehearsal": "smoke", "reference": "cpu"}
    if resolved in fallback and resolved not in per_profile:
        resolved = fallback[resolved]
    return per_profile.get(resolved, default)


def parse_bool(text: str) -> bool:
    """`true/false`, `yes/no`, `on/off` or `1/0` (any case) as a bool; ValueError otherwise."""
    lowered = text.strip().lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"not a bool: {text!r}")


def parse_value(name: str, text: str):
    """Turn the text of `-p name=value` into the field's type (CLI and runner use this)."""
    if name not in FIELD_NAMES:
        raise ConfigError(unknown_name("parameter", name, FIELD_NAMES))
    expected = _TYPES[name]
    try:
        return parse_bool(text) if expected is bool else parse_number(expected, text) if expected in (int, float) \
            else expected(text)
    except ValueError:
        raise ConfigError(f"{name} must be {expected.__name__}, got {text!r}") from None


def parse_number(kind: type, text: str):
    """`int(text)` or `float(text)` for ASCII digits only: Python also reads other scripts' digits
    ("\u0663" is 3), which no one means to type in a number."""
    if not text.isascii():
        raise ValueError(f"not an ASCII number: {text!r}")
    return kind(text)


def parse_assignments(pairs: list[str] | None) -> dict:
    """`["batch_size=32", "lr=0.1"]` -> typed dict, for any CLI `-p` flags."""
    values = {}
    for pair in pairs or []:
        if "=" not in pair:
            raise ConfigError(f"parameter {pair!r} must look like name=value")
        name, text = pair.split("=", 1)
        refuse_repeated(name.strip(), values, text)
        values[name.strip()] = parse_value(name.strip(), text)
    return values


def refuse_repeated(name: str, given: dict, text: str) -> None:
    """Two `-p` values for one name: refuse, rather than let the last one win unseen."""
    if name in given:
        raise ConfigError(f"-p {name} is given twice ({given[name]!r}, then {text!r}); give each parameter once")


def configuration_table() -> str:
    """The configuration table of docs/profiles.md (field, default, each profile's value, unit comment), in
    Markdown; `workbook docs tables` writes it there and tests/test_config.py checks the copy."""
    comments, defaults = field_comments(), Config()
    profiles = [name for name in PROFILE_NAMES if name in PROFILES]
    lines = [f"| field | default | {' | '.join(profiles)} | meaning and unit |",
             "|---|---|" + "---|" * len(profiles) + "---|"]
    for name in FIELD_NAMES:
        cells = " | ".join(str(PROFILES[profile].get(name, "")) for profile in profiles)
        lines.append(f"| `{name}` | `{getattr(defaults, name)!r}` | {cells} | {comments[name].replace(' | ', ' / ')} |")
    return "\n".join(lines)


def field_comments() -> dict[str, str]:
    """Each field's unit comment, read from this file, for `--help` and the configuration table."""
    import inspect
    import re

    comments = {}
    for line in inspect.getsource(Config).splitlines():
        match = re.match(r"\s+(\w+): \w+ = .*?  # (.*)$", line)
        if match:
            comments[match.group(1)] = match.group(2)
    return comments
