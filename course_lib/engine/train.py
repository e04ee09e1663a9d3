"""The training engine shared by every notebook and the CLI: `fit(config)`, `workbook train`,
and `torchrun --nproc-per-node N -m course_lib train -p name=value ...`.

`fit` is a short driver over three seams, in the shape of timm's train.py:
- `prepare(config, bundle)` builds a `RunState`: loaders (`data.batches`), model (wrapped in DDP and/or
  torch.compile), optimizer, schedule, GradScaler, EMA, criterion and batch regularizers, and
  restores the last checkpoint when resuming;
- `train_one_epoch(state, epoch)` is the loop, in view (nanoGPT style, no callbacks): fetch, the
  bundle's device stage, MixUp/CutMix, random erasing, `step.training_step` per micro-batch,
  `step.optimizer_step` every `accumulation_steps` micro-batches, scheduler and EMA after each step;
- `validate(model, state)` scores a model on the validation split (the weights and their EMA).
After each epoch's validation the driver tracks the best epoch (`early_stopping.ValidationTracker`:
`save_best` keeps its checkpoint as best.pt, `early_stopping_patience` ends the run), and in the last
`swa_epochs` epochs it adds a snapshot to the weight average (`swa.WeightAverager`), scored at the end.
Each switch lives in a module named after it: `mixup.py`, `random_erasing.py`, `label_smoothing.py`,
`ema.py`, `swa.py`, `lookahead.py`, `muon.py`, `freeze.py`, `precision.py`, `schedule.py`, `distillation.py`, `data/class_balance.py`
(class_balance); the bookkeeping in small classes: `early_stopping.ValidationTracker`,
`loss_guard.LossGuard`, `epoch_meter.EpochMeter`, `freeze.BackboneFreezer`,
`checkpoint_saver.CheckpointSaver`, `run_record.RunRecorder`; monitoring is two switches:
`monitor.UtilisationMonitor` (monitor_interval) and `grad_norm.GradientNormLog` (grad_norm_log), and their curves,
with the loss, top-1 and lr, go to TensorBoard with `tensorboard_log.TensorBoardLog` (tensorboard). Distributed data parallel follows
https://pytorch.org/docs/stable/notes/ddp.html.

Randomness is reproducible per epoch: every epoch seeds python, numpy, torch and the data
order from (seed, epoch, rank), so a run resumed at an epoch boundary draws exactly the
random numbers an uninterrupted run draws (map-style datasets; a stream orders itself).
"""
from __future__ import annotations

import contextlib
import dataclasses
import random
import time
from pathlib import Path
from typing import Callable

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F

from course_lib import devices, ledger, machine, paths
from course_lib.config import Config, ConfigError
from course_lib.data import datasets, pipeline
from course_lib.data.batches import loss_weights, training_batches, validation_batches, whitening_batches
from course_lib.engine import auto_precision, freeze
from course_lib.engine.checkpoint_saver import CheckpointSaver
from course_lib.engine.distributed import Distributed, setup_distributed
from course_lib.engine.early_stopping import ValidationTracker
from course_lib.engine.ema import make_ema
from course_lib.engine.lookahead import Lookahead
from course_lib.engine.epoch_meter import EpochMeter, correct_counts
from course_lib.engine.grad_norm import LOG_FILE, GradientNormLog
from course_lib.engine.label_smoothing import make_criterion
from course_lib.engine.loss_guard import LossGuard, NonFiniteLossError  # callers catch train.NonFiniteLossError
from course_lib.engine.mixup import make_mixup
from course_lib.engine.monitor import TIMELINE_FILE, UtilisationMonitor, summary_line
from course_lib.engine.precision import apply_matmul_precision, autocast, grad_scaler
from course_lib.engine.progressive_resize import image_size_for_epoch, resize_batch
from course_lib.engine.random_erasing import make_random_erasing
from course_lib.engine.run_record import RunRecorder
from course_lib.engine.schedule import make_optimizer, make_scheduler
from course_lib.engine.step import optimizer_step, region, training_step
from course_lib.engine.swa import WeightAverager
from course_lib.engine.tensorboard_log import FOLDER as TENSORBOARD_FOLDER
from course_lib.engine.tensorboard_log import TensorBoardLog
from course_lib.instruments.peak_memory import peak_memory_bytes, peak_memory_kind, reset_peak_memory
from course_lib.instruments.progress import Progress
from course_lib.models import factory

# Reading the loss is a CPU-GPU sync point; do it every this many optimizer steps, not every step.
SYNC_EVERY_STEPS = 25


@dataclasses.dataclass
class FitResult:
    model: torch.nn.Module  # the trained model (unwrapped from DDP/compile), in eval mode
    history: list[dict]  # one dict of metrics per completed epoch
    classes: list[str]
    config: Config
    checkpoint_path: Path | None  # the last checkpoint written (rank 0), None when none was written
    ema_model: torch.nn.Module | None = None  # the weight-EMA copy when ema_decay > 0
    precision: str = "off"  # the precision actually used (auto resolved)
    device: str = "cpu"
    world_size: int = 1
    skipped_steps: int = 0  # optimizer steps GradScaler skipped because gradients overflowed (fp16)
    duration_seconds: float = 0.0
    step_log: list[dict] = dataclasses.field(default_factory=list)  # per optimizer step: epoch, step, lr, loss
    monitor: dict = dataclasses.field(default_factory=dict)  # UtilisationMonitor.summary() when monitor_interval > 0
    grad_norms: list[dict] = dataclasses.field(default_factory=list)  # per step: epoch, step, global_step, grad_norm
    best_epoch: int | None = None  # 1-based epoch of the highest validation top-1 (None without validation)
    best_val_top1: float | None = None
    best_checkpoint_path: Path | None = None  # output_dir/best.pt when save_best (rank 0)
    stopped_early_after: int | None = None  # the epoch (1-based) after which early stopping ended the run; None: it ran every epoch
    swa_model: torch.nn.Module | None = None  # the weight average of the last swa_epochs epochs, BatchNorm updated; None when off or not reached
    tensorboard_dir: Path | None = None  # this run's event files (output_dir/tensorboard/<run>/) when tensorboard is on

    @property
    def final(self) -> dict:
        return self.history[-1] if self.history else {}


@dataclasses.dataclass
class RunState:
    """Everything a run holds between steps. `prepare` builds it; the loop moves its counters."""
    config: Config
    bundle: datasets.DataBundle
    device: torch.device
    precision: str  # the precision actually used ("auto" resolved)
    distributed: Distributed
    model: torch.nn.Module  # what the loop calls: raw_model, wrapped in DDP and/or torch.compile
    raw_model: torch.nn.Module  # the plain module: its weights are saved, averaged and returned
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler  # stepped once per optimizer step
    scaler: torch.amp.GradScaler  # scales only for fp16; otherwise passes calls through
    ema: object | None  # timm ModelEmaV3 of raw_model; None when ema_decay = 0
    criterion: torch.nn.Module
    mixup: object | None  # timm Mixup (MixUp/CutMix); None when both alphas are 0
    eraser: object | None  # timm RandomErasing; None when random_erasing = 0
    train_loader: torch.utils.data.DataLoader
    sampler: torch.utils.data.DistributedSampler | None  # None for a stream (IterableDataset)
    val_loader: torch.utils.data.DataLoader | None
    steps_per_epoch: int  # optimizer steps
    global_batch: int  # images per optimizer step, all ranks together
    freezer: freeze.BackboneFreezer
    checkpoints: CheckpointSaver
    log: Callable[..., None]  # print on rank 0 when verbose, else nothing
    start_epoch: int = 0  # epochs completed before this run (resume)
    global_step: int = 0  # optimizer steps completed, all epochs
    skipped_steps: int = 0  # optimizer steps GradScaler skipped (fp16 overflow)
    history: list[dict] = dataclasses.field(default_factory=list)  # one metrics row per epoch
    step_log: list[dict] = dataclasses.field(default_factory=list)  # per optimizer step: epoch, step, lr, loss
    teacher: object | None = None  # distillation.Distiller: soft targets from a frozen teacher; None = labels only
    grad_norms: GradientNormLog | None = None  # the gradient-norm log and its detectors; None = grad_norm_log off
    tracker: ValidationTracker = dataclasses.field(default_factory=ValidationTracker)  # best epoch, early stopping
    swa: WeightAverager | None = None  # the weight average of the last swa_epochs epochs; None = swa_epochs 0
    lookahead: Lookahead | None = None  # Lookahead's slow weights; None = lookahead_steps 0


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def epoch_seed(seed: int, epoch: int, rank: int = 0) -> int:
    """A seed for one epoch of one process, so epochs (and ranks) draw independent streams
    and any epoch can be replayed without the generators' saved states."""
    return int(np.random.SeedSequence([seed, epoch, rank]).generate_state(1)[0])


def seed_epoch(state: RunState, epoch: int) -> None:
    """Every random draw of this epoch (data order, augmentation, MixUp, erasing, loader workers)
    follows from (seed, epoch, rank)."""
    seed = epoch_seed(state.config.seed, epoch, state.distributed.rank)
    seed_everything(seed)
    if state.sampler is not None:
        state.sampler.set_epoch(epoch)
    if state.train_loader.generator is not None:
        state.train_loader.generator.manual_seed(seed)


def stage_batch(bundle, images: torch.Tensor, targets: torch.Tensor, device: torch.device, *, train: bool,
                channels_last: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """A loader batch on the device as the model takes it: the bundle's device stage (the copy and,
    for uint8 batches, augmentation when training or normalisation when evaluating), then the
    channels_last layout when asked."""
    images = bundle.device_stage(images, device, train=train)
    if channels_last:
        images = images.contiguous(memory_format=torch.channels_last)
    return images, targets.to(device, non_blocking=True)


def wrap_model(raw_model: torch.nn.Module, config: Config, distributed: Distributed,
               device: torch.device) -> torch.nn.Module:
    """What the loop calls: DDP around the model when several processes train (it registers the
    parameters that require grad when it is built), then torch.compile when asked."""
    model = raw_model
    if distributed.enabled:
        model = torch.nn.parallel.DistributedDataParallel(
            model, device_ids=[device.index] if device.type == "cuda" else None)
    if config.compile:
        model = torch.compile(model, mode=config.compile_mode)  # compiles on the first step (slow once; notebook 03)
    return model


def _quiet(*args, **kwargs) -> None:
    pass


def refuse_choosing_without_validation(config: Config, val_loader) -> None:
    """save_best and early stopping read validation top-1: without a validation split, one line, not a silent no-op."""
    asked = [name for name, on in (("save_best", config.save_best),
                                   ("early_stopping_patience", config.early_stopping_patience)) if on]
    if asked and val_loader is None:
        raise ConfigError(f"{' and '.join(asked)} choose by validation top-1, but this run has no validation images; "
                          "give the data a validation split, or switch them off")


def prepare(config: Config, bundle=None, *, distributed: Distributed | None = None,
            device: torch.device | None = None, verbose: bool = True, model: torch.nn.Module | None = None,
            teacher=None) -> RunState:
    """Everything a run needs before its first step, as a RunState: data (`bundle`, or the one
    `config.dataset` names), loaders, model, optimizer, schedule, scaler, EMA, criterion, batch
    regularizers; with `config.resume` the state of `output_dir/last.pt`. Without `distributed`
    it reads torchrun's environment (and starts the process group) itself. `model` trains that
    module (a pruned or re-headed one) instead of building `config.model`; `teacher` (an
    `engine.distillation.Distiller`) adds its soft targets to the loss."""
    if distributed is None:
        distributed, device = setup_distributed(config)
    log = print if (verbose and distributed.is_main) else _quiet
    seed_everything(config.seed)  # the same initial weights on every rank
    _apply_device_switches(config, device, log)
    bundle = bundle or pipeline.build_datasets(config)
    log(f"data: {bundle.source}, {bundle.pipeline}")
    sampler, train_loader, steps_per_epoch = training_batches(bundle.train, config, distributed, device,
                                                              len(bundle.classes))
    global_batch = config.batch_size * config.accumulation_steps * distributed.world_size
    if steps_per_epoch < 1:
        raise ConfigError(f"the training split has {len(bundle.train)} images, fewer than one optimizer step "
                          f"({global_batch} = batch_size x accumulation_steps x processes); "
                          "lower batch_size or accumulation_steps")
    val_loader = validation_batches(bundle.val, config, distributed, device)
    refuse_choosing_without_validation(config, val_loader)
    num_classes = len(bundle.classes)
    raw_model = (model if model is not None else factory.build_model(config, num_classes, bundle.classes)).to(
        device, memory_format=torch.channels_last if config.channels_last else torch.preserve_format)
    refuse_one_value_batch_norm(raw_model, config)
    _whiten_stem(raw_model, config, bundle, device, log)  # before the optimizer: the frozen filters stay out of it
    raw_model = _synced_batchnorm(raw_model, config, distributed, device, log)
    precision = auto_precision.resolve(config.precision, raw_model, config.image_size, num_classes, device,
                                       batch_size=config.batch_size, channels_last=config.channels_last, log=log)
    log(f"training {config.model} on {len(bundle.train)} images ({num_classes} classes) for {config.epochs} "
        f"epoch(s) x {steps_per_epoch} steps, global batch {global_batch}, precision {precision}, "
        f"device {device} x {distributed.world_size}; {machine.describe_hardware()}")
    state = _run_state(config, bundle, device, precision, distributed, raw_model, log, teacher,
                       loaders=(train_loader, sampler, val_loader), steps_per_epoch=steps_per_epoch,
                       global_batch=global_batch)
    _resume_or_start(state)
    return state


WHITENING_IMAGES = 5000  # training images whose patches whiten the stem (airbench94_muon.py takes 5,000 of CIFAR-10's 50,000)


def _whiten_stem(raw_model: torch.nn.Module, config: Config, bundle, device: torch.device, log) -> None:
    """whiten_stem=True: the first conv's filters from the patch covariance of up to WHITENING_IMAGES training
    images, then frozen (`models.whitening`). The images are a fixed draw from the seed, so every rank computes
    the same filters (DDP also broadcasts rank 0's); the time is inside a race's clock, as airbench counts it."""
    if not config.whiten_stem:
        return
    from course_lib.models import whitening

    done = whitening.whiten_first_conv(raw_model, whitening_batches(bundle, config, device, WHITENING_IMAGES))
    log(f"whiten_stem: {done['filters']} filters of {done['layer']} from the patches of {done['images']} training "
        "images, frozen")


def _synced_batchnorm(raw_model: torch.nn.Module, config: Config, distributed: Distributed, device, log):
    """sync_batchnorm=True under DDP: every BatchNorm layer normalised over the global batch
    (`engine.sync_batchnorm`); with one process there is nothing to synchronise, and the log says so."""
    if not config.sync_batchnorm:
        return raw_model
    if not distributed.enabled:
        log("sync_batchnorm: one process, so each BatchNorm layer already sees the whole batch")
        return raw_model
    from course_lib.engine import sync_batchnorm

    raw_model = sync_batchnorm.convert(raw_model, device)
    log(f"sync_batchnorm: {sync_batchnorm.count_synced(raw_model)} BatchNorm layers normalise over the global batch "
        f"of {distributed.world_size} processes")
    return raw_model


def _apply_device_switches(config: Config, device: torch.device, log) -> None:
    """cuDNN's autotuner and the matmul precision, and a line for each switch that does nothing on `device`."""
    if config.cudnn_benchmark:
        # cuDNN times each convolution's algorithms on the first batch of every new shape, then keeps the
        # fastest; it only pays when shapes repeat (fixed image_size, drop_last). Nothing to tune elsewhere.
        torch.backends.cudnn.benchmark = device.type == "cuda"
    apply_matmul_precision(config.matmul_precision, device)  # TF32 or exact fp32 for matmuls and convolutions
    for skipped in devices.skipped_switches(config, device):  # what only acts on CUDA, named, never faked
        log(f"no effect on {device.type}: {skipped}")


def _run_state(config: Config, bundle, device, precision: str, distributed: Distributed, raw_model, log, teacher, *,
               loaders: tuple, steps_per_epoch: int, global_batch: int) -> RunState:
    """The RunState of a fresh run: optimizer, schedule, scaler, EMA, criterion, batch regularizers, checkpoints."""
    train_loader, sampler, val_loader = loaders
    num_classes = len(bundle.classes)
    # Built while every parameter is trainable, so it holds the backbone for after unfreezing.
    optimizer = freeze.scale_backbone_lr(make_optimizer(raw_model, config), raw_model, config.backbone_lr_scale)
    mixup = make_mixup(config, num_classes)
    return RunState(
        config=config, bundle=bundle, device=device, precision=precision, distributed=distributed,
        model=raw_model, raw_model=raw_model, optimizer=optimizer,
        scheduler=make_scheduler(optimizer, config, steps_per_epoch), scaler=grad_scaler(precision, device),
        ema=make_ema(raw_model, config),
        criterion=make_criterion(config, mixing=mixup is not None,
                                 class_weights=loss_weights(bundle.train, config, num_classes, device)),
        mixup=mixup, eraser=make_random_erasing(config, device), train_loader=train_loader, sampler=sampler,
        val_loader=val_loader, steps_per_epoch=steps_per_epoch,
        global_batch=global_batch, freezer=freeze.BackboneFreezer(config.freeze_backbone_epochs),
        checkpoints=CheckpointSaver(config.output_dir, distributed.is_main), log=log,
        teacher=teacher.to(device) if teacher is not None else None,
        grad_norms=GradientNormLog.from_config(config) if config.grad_norm_log else None,
        swa=WeightAverager(raw_model, config.epochs, config.swa_epochs) if config.swa_epochs else None,
        lookahead=Lookahead(raw_model, config.lookahead_steps, config.lookahead_alpha) if config.lookahead_steps else None)


def _resume_or_start(state: RunState) -> None:
    """With `resume`, the state of output_dir/last.pt; then the validation tracker, the frozen backbone of the first
    epochs, and the model wrapped (DDP, compile) around what trains."""
    config, log, raw_model = state.config, state.log, state.raw_model
    if config.resume and state.checkpoints.restore(state):
        log(f"resuming from {state.checkpoints.path}: {state.start_epoch} of {config.epochs} epochs done")
    elif config.resume:
        log(f"resume: no checkpoint at {state.checkpoints.path} yet; starting from scratch")
    state.tracker = ValidationTracker.from_history(state.history, config.early_stopping_patience)
    if state.freezer.start(raw_model, state.start_epoch):
        log(f"backbone frozen for epochs 1-{config.freeze_backbone_epochs}: training the head only "
            f"({factory.count_parameters(raw_model, trainable_only=True):,} of "
            f"{factory.count_parameters(raw_model):,} parameters)")
    state.model = wrap_model(raw_model, config, state.distributed, state.device)  # after freezing: DDP sees what trains


def _epoch_batches(state: RunState, timer):
    """This epoch's micro-batches, exactly steps x accumulation_steps of them, timed by `timer`
    (host time blocked in next(loader): no device sync per batch). A stream that ends sooner
    is an error, not a short epoch: under DDP the other ranks would wait in the all-reduce."""
    from course_lib.data.loaders import timed_batches

    needed = state.steps_per_epoch * state.config.accumulation_steps
    batches = timed_batches(state.train_loader, timer)
    try:
        for count in range(needed):
            batch = next(batches, None)
            if batch is None:
                raise ConfigError(f"the training data ended after {count} batches of {state.config.batch_size}; "
                                  f"its length ({len(state.bundle.train)}) promised {needed}")
            yield batch
    finally:
        batches.close()  # shuts down this epoch's loader workers


def train_one_epoch(state: RunState, epoch: int, *, progress: bool = True,
                    stop: Callable[[], bool] | None = None) -> dict:
    """One epoch (0-based): `steps_per_epoch` optimizer steps of `accumulation_steps` micro-batches.
    `stop()`, asked after each optimizer step, ends the epoch early (a time-to-accuracy race's
    budget; single process only, since DDP ranks must agree on the number of steps).
    Returns the epoch's training metrics row (all ranks together); the driver adds validation."""
    config, device, distributed = state.config, state.device, state.distributed
    if stop is not None and distributed.enabled:
        raise ValueError("train_one_epoch(stop=...) is for one process: DDP ranks must run the same steps")
    _begin_epoch(state, epoch)
    guard = LossGuard(config.accumulation_steps, config.lr, state.precision)
    meter = EpochMeter(device, distributed.enabled, distributed.world_size)
    # A bar in a notebook or on a terminal, a plain line every 10 s when piped (`workbook train | tee`).
    bar = Progress(state.steps_per_epoch, f"epoch {epoch + 1}/{config.epochs}", unit="steps", leave=False,
                   enabled=progress and distributed.is_main)
    batches = _epoch_batches(state, meter.timer)
    side = image_size_for_epoch(epoch, config.epochs, config.min_image_size, config.image_size, config.resize_ramp)
    if side != config.image_size:
        state.log(f"epoch {epoch + 1}: training images at {side} px (progressive resizing to {config.image_size} px)")
    meter.start()
    steps_done = 0
    for step in range(state.steps_per_epoch):
        for micro_step in range(config.accumulation_steps):
            with region("data wait"):  # a named region for torch.profiler (notebook 14)
                batch = next(batches)
            _micro_step(state, batch, side, micro_step, guard, meter)
        _optimizer_step(state, epoch, meter)
        steps_done = step + 1
        stopped = stop is not None and stop()
        last = steps_done == state.steps_per_epoch or stopped
        if steps_done % SYNC_EVERY_STEPS == 0 or last:
            _check_losses(state, epoch, steps_done, guard, meter, bar)
        bar.update(1)
        if last:
            break
    bar.close()
    meter.stop()
    batches.close()  # shut down this epoch's workers before validating
    if state.lookahead is not None and (epoch + 1 == config.epochs or stopped):
        state.lookahead.finish(state.raw_model)  # training ends: evaluate and keep the slow weights
    state.step_log += meter.step_rows(epoch, state.global_step - steps_done, config.accumulation_steps)
    return {"epoch": epoch + 1, "lr": state.optimizer.param_groups[0]["lr"], **meter.row(),
            "peak_memory_bytes": peak_memory_bytes(device), "peak_memory_kind": peak_memory_kind(device),
            "optimizer_steps": steps_done, "skipped_steps": state.skipped_steps,
            "world_size": distributed.world_size, "global_batch_size": state.global_batch}


def _begin_epoch(state: RunState, epoch: int) -> None:
    """The epoch's seeds, the backbone unfrozen when its epoch comes, training mode, the peak-memory counter reset."""
    seed_epoch(state, epoch)
    if state.freezer.maybe_unfreeze(epoch):
        # a DDP that sees every parameter
        state.model = wrap_model(state.raw_model, state.config, state.distributed, state.device)
        state.log(f"epoch {epoch + 1}: backbone unfrozen, training all parameters")
    state.model.train()
    state.freezer.hold_batchnorm()  # a frozen backbone keeps the source's BatchNorm statistics
    reset_peak_memory(state.device)


def _micro_step(state: RunState, batch, side: int, micro_step: int, guard: LossGuard, meter: EpochMeter) -> None:
    """One micro-batch: staged on the device at `side` px, mixed and erased when asked, its loss's gradients
    added up (all-reduced under DDP only on the last micro-batch of the step)."""
    config = state.config
    images, targets = stage_batch(state.bundle, *batch, state.device, train=True, channels_last=config.channels_last)
    images = resize_batch(images, side)  # a no-op at the full size
    true_classes = targets  # MixUp makes the targets soft; accuracy counts the true class
    if state.mixup is not None:
        images, targets = state.mixup(images, targets)
    if state.eraser is not None:
        images = state.eraser(images)
    # DDP all-reduces gradients in every backward; on all but the last micro-batch that
    # traffic is wasted, so skip it (the gradients still add up locally).
    sync_gradients = not state.distributed.enabled or micro_step == config.accumulation_steps - 1
    criterion = (state.criterion if state.teacher is None
                 else state.teacher.bind(images, state.criterion, state.precision))
    loss, logits = training_step(state.model, images, targets, criterion, state.scaler,
                                 state.precision, accumulation_steps=config.accumulation_steps,
                                 sync_gradients=sync_gradients)
    guard.add(loss)
    meter.add(logits, true_classes)


def _optimizer_step(state: RunState, epoch: int, meter: EpochMeter) -> None:
    """The optimizer step over the added-up gradients (skipped and counted on an fp16 overflow), the schedule (held
    during SWA's epochs), Lookahead's sync every lookahead_steps steps and the weight EMA."""
    meter.add_step(state.optimizer.param_groups[0]["lr"])  # the lr this step uses
    state.skipped_steps += optimizer_step(state.optimizer, state.scaler, clip_norm=state.config.grad_clip_norm,
                                          norm_log=state.grad_norms)
    if state.swa is None or not state.swa.holds_lr(epoch):  # SWA's epochs keep the lr they began with
        state.scheduler.step()
    state.global_step += 1
    if state.lookahead is not None:  # before the EMA, which then averages what the model holds after a sync
        state.lookahead.step(state.raw_model, state.global_step)
    if state.ema is not None:
        state.ema.update(state.raw_model, step=state.global_step)


def _check_losses(state: RunState, epoch: int, steps_done: int, guard: LossGuard, meter: EpochMeter, bar) -> None:
    """Every SYNC_EVERY_STEPS steps and at the last: the gradient-norm findings, then the losses (a CPU-GPU sync)."""
    # Gradient findings first: an exploding norm often comes just before the NaN loss that stops
    # the run, and its line is the clue (vanishing or exploding: one line each, the run goes on).
    if state.grad_norms is not None:
        for finding in state.grad_norms.check(epoch, steps_done, state.global_step):
            state.log(finding)
    losses = guard.check(epoch, steps_done)  # note: a CPU-GPU sync point
    meter.add_losses(losses)
    bar.set_postfix(loss=f"{losses.mean().item():.3f}", lr=f"{state.optimizer.param_groups[0]['lr']:.3g}")


@torch.no_grad()
def validate(model: torch.nn.Module, state: RunState, views: int = 1, selective: float = 0.0) -> dict:
    """Mean cross-entropy, top-1 and top-5 accuracy of `model` over the validation split (every
    rank scores its part; the sums are all-reduced under DDP). `views` > 1 is test-time
    augmentation: the softmax is averaged over that many symmetries of the square
    (`data.overhead_augment.dihedral_views`) and the loss is that average's cross-entropy;
    0 < `selective` < 1 gives the views only to that fraction of each batch, its least confident
    images (`engine.selective_tta`; each rank chooses among its own images)."""
    from course_lib.data.loaders import batches
    from course_lib.engine.selective_tta import tta_probabilities

    model.eval()
    device = state.device
    totals = torch.zeros(4, device=device, dtype=torch.float64)  # loss sum, top-1, top-5, images
    for images, targets in batches(state.val_loader):  # a worker's bad image: its own one-line error
        images, targets = stage_batch(state.bundle, images, targets, device, train=False,
                                      channels_last=state.config.channels_last)
        with autocast(state.precision, device):
            if views == 1:
                logits = model(images)
            else:  # log of the mean probability: cross_entropy of it is the averaged prediction's loss
                logits = tta_probabilities(model, images, views, selective).log()
        loss = F.cross_entropy(logits.float(), targets, reduction="sum")
        top1, top5 = correct_counts(logits, targets)
        totals += torch.stack([loss.double(), top1.double(), top5.double(),
                               torch.tensor(len(targets), device=device, dtype=torch.float64)])
    if state.distributed.enabled:
        dist.all_reduce(totals)
    loss_sum, top1, top5, count = totals.tolist()
    count = max(count, 1.0)
    return {"loss": loss_sum / count, "top1": top1 / count, "top5": top5 / count, "images": int(count)}


def skipped_images(state: RunState) -> int:
    """Image files left out so far under bad_images=skip (training and validation splits, every
    DataLoader worker and, under DDP, every rank)."""
    count = datasets.skipped_images(state.bundle.train) + datasets.skipped_images(state.bundle.val)
    if state.distributed.enabled:  # each rank reads its own part of the files
        total = torch.tensor([count], device=state.device, dtype=torch.int64)
        dist.all_reduce(total)
        count = int(total.item())
    return count


def _columns(prefix: str, scores: dict) -> dict:
    return {f"{prefix}_{name}": scores[name] for name in ("loss", "top1", "top5")}


def _epoch_line(row: dict, state: RunState) -> str:
    validation = f"  val loss {row['val_loss']:.3f} top-1 {row['val_top1']:.1%}" if "val_top1" in row else ""
    skipped = f"  skipped steps {state.skipped_steps}" if state.scaler.is_enabled() else ""
    if row.get("skipped_images"):
        skipped += f"  skipped {row['skipped_images']} unreadable image(s) (bad_images=skip; named in the warnings)"
    return (f"epoch {row['epoch']}/{state.config.epochs}: train loss {row['train_loss']:.3f} top-1 "
            f"{row['train_top1']:.1%}{validation}  {row['images_per_second']:.0f} images/s  "
            f"data wait {row['data_wait_fraction']:.0%}{skipped}")


def refuse_one_value_batch_norm(model: torch.nn.Module, config: Config) -> None:
    """With batch_size=1 a BatchNorm layer whose input map is 1x1 has one value per channel, so no
    batch statistics: torch stops the first step with a long traceback. Find such a layer with one
    forward pass on the meta device (shapes only, no compute) and refuse in one line instead."""
    import copy

    if config.batch_size != 1:
        return
    norms = [m for m in model.modules() if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)]
    if not norms:
        return
    probe = copy.deepcopy(model).to("meta").train()
    seen = []  # (layer name, values per channel) of each BatchNorm input, in call order
    for name, module in probe.named_modules():
        if isinstance(module, torch.nn.modules.batchnorm._BatchNorm):
            module.register_forward_pre_hook(lambda module, inputs, name=name: seen.append(
                (name, inputs[0].numel() // max(1, inputs[0].shape[1]))))
    try:
        with torch.no_grad():
            probe(torch.empty(1, 3, config.image_size, config.image_size, device="meta"))
    except (RuntimeError, NotImplementedError, ValueError):
        pass  # torch's own check stops at the first such layer, after its pre-hook recorded it
    single = next((name for name, values in seen if values <= 1), None)
    if single is not None:
        raise ConfigError(f"batch_size=1 leaves the BatchNorm layer {single} of {config.model} at "
                          f"image_size={config.image_size} one value per channel, so it has no batch statistics; "
                          "use batch_size=2 or more, or a larger "
                          "image_size")


def check_outputs(config: Config, is_main: bool = True) -> None:
    """Fail in the first second, not after an epoch (or at the very end): the checkpoint folder
    takes a file and the ledger opens and takes a write (rank 0 writes both)."""
    if is_main:
        paths.check_writable(config.output_dir)
        ledger.check_writable()


def _check_validation_loss(row: dict, state: RunState, epoch: int) -> None:
    """The loss guard sees each loss before its update; the last update of an epoch can still make
    the weights NaN, which the validation loss shows. Stop there, before any checkpoint is written."""
    for column in ("val_loss", "ema_val_loss", "val_tta_loss", "swa_val_loss"):
        if column in row and not np.isfinite(row[column]):
            causes = LossGuard(state.config.accumulation_steps, state.config.lr, state.precision).likely_causes()
            raise NonFiniteLossError(f"the validation loss ({column}) became {row[column]} after epoch {epoch + 1}; "
                                     f"no checkpoint was written for it; likely causes: {'; '.join(causes)}")


def fit(config: Config, *, bundle=None, progress: bool = True, verbose: bool = True,
        model: torch.nn.Module | None = None, teacher=None) -> FitResult:
    """Train `config.model` on `config.dataset` (or on `bundle`, a `data.DataBundle`) and return
    the trained model, the per-epoch history and the checkpoint path. `model` trains a given module
    instead (a pruned one, a wider head); `teacher` (`distillation.Distiller`) distills into it. Every run is recorded in
    the ledger (kind "train"); a non-finite training or validation loss, or non-finite weights at
    a checkpoint, raise NonFiniteLossError and leave the last good checkpoint in place."""
    started = time.perf_counter()
    distributed, device = setup_distributed(config)
    check_outputs(config, distributed.is_main)
    # One run per output folder: a second one refuses here, naming the first one's PID.
    output_lock = paths.OutputLock(config.output_dir).acquire() if distributed.is_main else None
    recorder = RunRecorder(config, distributed.is_main, distributed.world_size, device, started)
    state = monitor = board = monitor_wall_time = None
    failed = False
    try:
        state = prepare(config, bundle, distributed=distributed, device=device, verbose=verbose, model=model,
                        teacher=teacher)
        if config.tensorboard and distributed.is_main:
            board = TensorBoardLog.for_run(paths.resolve_path(config.output_dir) / TENSORBOARD_FOLDER)
            state.log(f"TensorBoard: tensorboard --logdir {board.folder}")
        if config.monitor_interval > 0 and distributed.is_main:  # rank 0 samples its own device and process
            monitor_wall_time = time.time()
            monitor = UtilisationMonitor(config.monitor_interval, device).start()
        stopped_early_after = _run_epochs(state, progress, board)
        monitoring = _finish_monitoring(state, monitor)
        if board is not None and monitor is not None:
            board.utilisation(monitor.samples, monitor_wall_time)
        result = _fit_result(state, started, monitoring, stopped_early_after, board)
        _record_success(recorder, state, result, stopped_early_after, monitoring)
        return result
    except BaseException as error:  # an interrupted run is recorded too, then the error goes on
        failed = True
        recorder.failed(state.history if state else [], state.precision if state else config.precision, error)
        raise
    finally:
        if monitor is not None and monitor.running:  # the sampler stops with the run, whatever ended it
            monitor.stop()
            with contextlib.suppress(OSError):  # a full disk must not hide the error that ended the run
                monitor.write_csv(paths.resolve_path(config.output_dir) / TIMELINE_FILE)
        if board is not None:
            board.close()
        if output_lock is not None:
            output_lock.release()
        # A failed rank of several leaves its group to the process's exit (`ddp_probe.run` says why).
        if distributed.started_here and dist.is_initialized() and not (failed and distributed.enabled):
            dist.destroy_process_group()


def _run_epochs(state: RunState, progress: bool, board: TensorBoardLog | None) -> int | None:
    """The epochs from `state.start_epoch` on; returns the epochs done when early stopping ended the run, else None."""
    config = state.config
    for epoch in range(state.start_epoch, config.epochs):
        if state.tracker.should_stop:  # after `epoch` epochs: no higher validation top-1 for `patience` of them
            state.log(f"early stopping after epoch {epoch}: no higher validation top-1 for "
                      f"{config.early_stopping_patience} epoch(s); best {state.tracker.best_top1:.1%} at epoch "
                      f"{state.tracker.best_epoch}")
            return epoch
        run_epoch(state, epoch, progress=progress, board=board)
    return None


def _record_success(recorder: RunRecorder, state: RunState, result: FitResult, stopped_early_after: int | None,
                    monitoring: dict) -> None:
    """The finished run's ledger row: history, precision, images, classes, checkpoints, early stopping, SWA, monitor."""
    recorder.succeeded(
        state.history, state.precision, skipped_steps=state.skipped_steps, epochs_completed=len(state.history),
        train_images=len(state.bundle.train), classes=list(state.bundle.classes),
        first_epoch_seconds=state.history[0]["epoch_seconds"] if state.history else None,
        checkpoint=str(result.checkpoint_path) if result.checkpoint_path else None, **state.tracker.summary(),
        best_checkpoint=str(result.best_checkpoint_path) if result.best_checkpoint_path else None,
        stopped_early_after=stopped_early_after, swa_snapshots=state.swa.snapshots if state.swa else 0,
        **monitoring["summary"])


def run_epoch(state: RunState, epoch: int, *, progress: bool = True, board: TensorBoardLog | None = None) -> None:
    """Epoch `epoch` (0-based) and what ends it: training, the SWA snapshot, validation of the raw and EMA
    weights (and, after the last epoch, the TTA prediction and the SWA average), the history row, the
    TensorBoard curves, the checkpoint (and best.pt when it improved), and the epoch's log line."""
    config = state.config
    row = train_one_epoch(state, epoch, progress=progress)
    if state.swa is not None:
        state.swa.update(state.raw_model, epoch)  # a snapshot in each of the last swa_epochs epochs
    improved = False
    if state.val_loader is not None:
        scores = validate(state.model, state)
        row.update(_columns("val", scores), val_images=scores["images"])  # the count gives top-1 its interval
        if state.ema is not None:  # the averaged weights, on the same images
            row.update(_columns("ema_val", validate(state.ema.module, state)))
        improved = state.tracker.update(epoch + 1, row["val_top1"])
    last = epoch + 1 == config.epochs or state.tracker.should_stop
    if state.val_loader is not None and last and config.tta_views > 1:  # the recipe's final prediction
        weights = state.ema.module if state.ema is not None else state.model
        tta = validate(weights, state, views=config.tta_views, selective=config.tta_selective)
        row.update(_columns("val_tta", tta))
    if last and state.swa is not None and state.swa.snapshots:
        row.update(_finish_swa(state))
    row["skipped_images"] = skipped_images(state)
    _check_validation_loss(row, state, epoch)
    state.history.append(row)
    if board is not None:  # the curves so far, for a TensorBoard open while the run goes on
        board.steps(state.step_log)
        board.grad_norms(state.grad_norms.rows if state.grad_norms else [])
        board.epoch(row)
    state.checkpoints.save(state, completed_epochs=epoch + 1)  # refuses non-finite weights
    if config.save_best and improved:
        state.checkpoints.keep_best()  # best.pt: this epoch's last.pt, under a second name
    state.log(_epoch_line(row, state))


def _fit_result(state: RunState, started: float, monitoring: dict, stopped_early_after: int | None,
                board: TensorBoardLog | None) -> FitResult:
    """The finished run as `fit` returns it, after its closing log lines (SWA that never began, skipped steps)."""
    config = state.config
    if state.swa is not None and not state.swa.snapshots:  # early stopping came before the averaging began
        state.log(f"SWA: nothing averaged: the run stopped after epoch {stopped_early_after}, before epoch "
                  f"{state.swa.start_epoch + 1}, the first of the last {config.swa_epochs}; swa_model is None")
    if state.skipped_steps:
        state.log(f"GradScaler skipped {state.skipped_steps} optimizer step(s) whose fp16 gradients overflowed")
    return FitResult(
        model=state.raw_model.eval(), history=state.history, classes=list(state.bundle.classes), config=config,
        checkpoint_path=state.checkpoints.written, ema_model=state.ema.module.eval() if state.ema else None,
        precision=state.precision, device=str(state.device), world_size=state.distributed.world_size,
        skipped_steps=state.skipped_steps, duration_seconds=time.perf_counter() - started,
        step_log=state.step_log, monitor=monitoring["monitor"],
        grad_norms=state.grad_norms.rows if state.grad_norms else [], **state.tracker.summary(),
        best_checkpoint_path=state.checkpoints.best_written, stopped_early_after=stopped_early_after,
        swa_model=state.swa.module.eval() if state.swa is not None and state.swa.snapshots else None,
        tensorboard_dir=board.folder if board is not None else None)


def _finish_swa(state: RunState) -> dict:
    """Recompute the weight average's BatchNorm statistics over one epoch of training batches (as the
    loop stages them: the device stage and its augmentation, channels_last), then score it: the
    `swa_val_*` columns (none without a validation split)."""
    from course_lib.data.loaders import DataWaitTimer

    def images():
        for images, targets in _epoch_batches(state, DataWaitTimer()):
            yield stage_batch(state.bundle, images, targets, state.device, train=True,
                              channels_last=state.config.channels_last)[0]

    seed_epoch(state, state.config.epochs)  # an order of its own, after every training epoch's
    model = state.swa.finish(images(), state.distributed.world_size)
    scores = validate(model, state) if state.val_loader is not None else None
    state.log(f"SWA: {state.swa.snapshots} epoch(s) averaged, BatchNorm statistics recomputed"
              + (f"; validation top-1 {scores['top1']:.1%}" if scores else ""))
    return _columns("swa_val", scores) if scores else {}


def _finish_monitoring(state: RunState, monitor: UtilisationMonitor | None) -> dict:
    """Stop the monitor, write its timeline and the gradient-norm log into output_dir (rank 0), log
    one line each; returns {"summary": the ledger row's extra metrics, "monitor": the monitor's summary}.
    A side file that cannot be written (a full disk) is one warning line: the finished run, its checkpoint
    and its ledger row stand."""
    summary, monitor_summary = {}, {}
    folder = paths.resolve_path(state.config.output_dir)  # the project root's runs/, from a notebook too
    if monitor is not None:
        monitor.stop()
        monitor_summary = monitor.summary()
        summary.update(monitor_summary)
        written = _side_file(state, lambda: monitor.write_csv(folder / TIMELINE_FILE), folder / TIMELINE_FILE)
        summary["monitor_file"] = str(written) if written else None
        state.log(f"{summary_line(monitor_summary)}\n  timeline: {summary['monitor_file'] or 'not written'}")
    if state.grad_norms is not None:
        summary.update(state.grad_norms.summary())
        if state.distributed.is_main:
            written = _side_file(state, lambda: state.grad_norms.write_csv(folder / LOG_FILE), folder / LOG_FILE)
            summary["grad_norm_file"] = str(written) if written else None
            state.log(f"{state.grad_norms.summary_line()}\n  log: {summary['grad_norm_file'] or 'not written'}")
    return {"summary": summary, "monitor": monitor_summary}


def _side_file(state: RunState, write: Callable[[], Path], path: Path) -> Path | None:
    """`write()`'s path, or None after one warning line when the disk refuses it (full, read-only): a
    monitoring file must not turn a finished run into a failed one."""
    try:
        return write()
    except OSError as error:
        state.log(f"warning: {path.name} was not written ({error.strerror or error}); the run, its checkpoint "
                  f"{state.checkpoints.written or ''} and its ledger row are kept")
        with contextlib.suppress(OSError):
            path.unlink(missing_ok=True)  # no half-written file left behind
        return None


def results_table(results: dict, epoch: int = -1):
    """One row per labelled FitResult (the given epoch, default the last): the numbers the
    notebooks compare. Returns a pandas DataFrame indexed by label."""
    import pandas as pd

    rows = {}
    for label, result in results.items():
        row = result.history[epoch]
        rows[label] = {"precision": result.precision, "images/s": row["images_per_second"],
                       "data wait": row["data_wait_fraction"], "train loss": row["train_loss"],
                       "val top-1": row.get("val_top1"), "skipped steps": result.skipped_steps,
                       "first epoch s": result.history[0]["epoch_seconds"], "epoch s": row["epoch_seconds"]}
    return pd.DataFrame.from_dict(rows, orient="index")


def recorded_compile_runs(model: str | None = None) -> list[dict]:
    """Earlier compiled runs of this machine's ledger (2+ epochs), newest first, with the first
    compile estimated as first-epoch seconds minus a later epoch's seconds."""
    runs = []
    for row in ledger.Ledger().rows(kind="train"):
        metrics, parameters = row["metrics"], row["parameters"]
        if not parameters.get("compile") or row["status"] != "ok" or (model and row["name"] != model):
            continue
        if (metrics.get("epochs_completed") or 0) < 2 or metrics.get("first_epoch_seconds") is None:
            continue
        runs.append({"model": row["name"], "created_at": row["created_at"], "hardware": machine.describe_hardware(
            row["hardware"]), "first_epoch_seconds": metrics["first_epoch_seconds"],
            "epoch_seconds": metrics["epoch_seconds"],
            "compile_seconds": metrics["first_epoch_seconds"] - metrics["epoch_seconds"]})
    return runs
