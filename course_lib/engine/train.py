"""The training engine shared by every notebook and the CLI: `fit(config)`, `workbook train`,
and `torchrun --nproc-per-node N -m course_lib train -p name=value ...`.

The loop is written out in `fit` (no callbacks): fetch, autocast forward, scaled backward,
an optimizer step every `accumulation_steps` micro-batches, scheduler and EMA after each step.
Distributed data parallel follows https://pytorch.org/docs/stable/notes/ddp.html; mixed
precision, schedules and checkpoints live in `precision.py`, `schedule.py`, `checkpoint.py`.

Randomness is reproducible per epoch: every epoch seeds python, numpy, torch and the data
order from (seed, epoch, rank), so a run resumed at an epoch boundary draws exactly the
random numbers an uninterrupted run draws.
"""
from __future__ import annotations

import dataclasses
import random
import time
from contextlib import nullcontext
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F

from course_lib import ledger, paths
from course_lib.config import Config, ConfigError
from course_lib.data import datasets
from course_lib.engine import freeze
from course_lib.engine.distributed import setup_distributed
from course_lib.engine.precision import autocast, grad_scaler, resolve_precision
from course_lib.engine.schedule import make_optimizer, make_scheduler
from course_lib.measure.memory import (
    peak_memory_bytes,
    peak_memory_kind,
    reset_peak_memory,
)
from course_lib.models import checkpoint, factory
from course_lib.models.factory import build_model

# Reading the loss is a CPU-GPU sync point; do it every this many optimizer steps, not every step.
SYNC_EVERY_STEPS = 25


class NonFiniteLossError(RuntimeError):
    """The loss became NaN or infinite; the message names the step and the likely causes."""


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

    @property
    def final(self) -> dict:
        return self.history[-1] if self.history else {}


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def epoch_seed(seed: int, epoch: int, rank: int = 0) -> int:
    """A seed for one epoch of one process, so epochs (and ranks) draw independent streams
    and any epoch can be replayed without the generators' saved states."""
    return int(np.random.SeedSequence([seed, epoch, rank]).generate_state(1)[0])


def to_device(images: torch.Tensor, device: torch.device, channels_last: bool) -> torch.Tensor:
    memory_format = torch.channels_last if channels_last and images.ndim == 4 else torch.contiguous_format
    return images.to(device, non_blocking=True, memory_format=memory_format)


def correct_counts(logits: torch.Tensor, targets: torch.Tensor, top: int = 5) -> tuple[torch.Tensor, torch.Tensor]:
    """(top-1 correct, top-k correct) as device tensors: no sync."""
    k = min(top, logits.shape[1])
    hits = logits.topk(k, dim=1).indices == targets[:, None]
    return hits[:, 0].sum(), hits.any(dim=1).sum()


@torch.no_grad()
def evaluate(model: torch.nn.Module, loader, device: torch.device, precision: str = "off",
             channels_last: bool = False, distributed: bool = False) -> dict:
    """Mean cross-entropy, top-1 and top-5 accuracy over `loader` (summed across ranks under DDP)."""
    model.eval()
    totals = torch.zeros(4, device=device, dtype=torch.float64)  # loss sum, top-1, top-5, images
    for images, targets in loader:
        images, targets = to_device(images, device, channels_last), targets.to(device, non_blocking=True)
        with autocast(precision, device):
            logits = model(images)
        loss = F.cross_entropy(logits.float(), targets, reduction="sum")
        top1, top5 = correct_counts(logits, targets)
        totals += torch.stack([loss.double(), top1.double(), top5.double(),
                               torch.tensor(len(targets), device=device, dtype=torch.float64)])
    if distributed:
        dist.all_reduce(totals)
    loss_sum, top1, top5, count = totals.tolist()
    count = max(count, 1.0)
    return {"loss": loss_sum / count, "top1": top1 / count, "top5": top5 / count, "images": int(count)}


def check_finite(step_losses: list[torch.Tensor], first_step: int, epoch: int, config: Config,
                 precision: str) -> torch.Tensor:
    """Stop with a message naming the first optimizer step whose loss was NaN/inf.
    `step_losses` holds one loss per micro-batch since step `first_step` (1-based, in this epoch)."""
    values = torch.stack(step_losses).float().cpu()  # note: a CPU-GPU sync point
    bad = (~torch.isfinite(values)).nonzero()
    if len(bad):
        index = int(bad[0])
        step = first_step + index // config.accumulation_steps
        causes = [f"a learning rate too high for this model and batch (lr={config.lr:g}; try 10x lower or "
                  "warmup_epochs>0)", "inputs that are not normalized or contain NaN/inf",
                  "fp16 overflow (try precision=bf16 or off)" if precision == "fp16" else
                  "fp16/bf16 overflow (try precision=off)" if precision != "off" else "exploding gradients "
                  "(try grad_clip_norm=1.0)"]
        raise NonFiniteLossError(f"loss became {values[index].item()} at epoch {epoch + 1}, step {step}; "
                                 f"likely causes: {'; '.join(causes)}")
    return values


def _make_mixup(config: Config, num_classes: int):
    """timm's MixUp/CutMix (Zhang et al. 2018, arXiv:1710.09412; Yun et al. 2019, arXiv:1905.04899),
    which also applies label smoothing to the mixed targets; None when both alphas are 0."""
    if config.mixup_alpha <= 0 and config.cutmix_alpha <= 0:
        return None
    from timm.data import Mixup

    if config.batch_size % 2:
        raise ConfigError(f"mixup/cutmix pair images within a batch: batch_size must be even, got {config.batch_size}")
    return Mixup(mixup_alpha=config.mixup_alpha, cutmix_alpha=config.cutmix_alpha,
                 label_smoothing=config.label_smoothing, num_classes=num_classes)


def _record(config, distributed, status, started, history, extra_metrics, precision, device):
    if not distributed.is_main:
        return None
    metrics = {**(history[-1] if history else {}), **extra_metrics}
    parameters = {**config.to_dict(), "precision_used": precision, "device_used": str(device),
                  "world_size": distributed.world_size}
    return ledger.record("train", config.model, status=status, duration_seconds=time.perf_counter() - started,
                         parameters=parameters, metrics=metrics)


def fit(config: Config, *, bundle=None, progress: bool = True, verbose: bool = True) -> FitResult:
    """Train `config.model` on `config.dataset` (or on `bundle`, a `data.DataBundle`) and return
    the trained model, the per-epoch history and the checkpoint path. Every run is recorded in
    the ledger (kind "train"); a non-finite loss raises NonFiniteLossError."""
    from timm.loss import SoftTargetCrossEntropy
    from timm.utils import ModelEmaV3
    from torch.utils.data import DistributedSampler, Subset
    from tqdm.auto import tqdm

    from course_lib.data.loaders import DataWaitTimer, make_loader, timed_batches

    started = time.perf_counter()
    distributed, device = setup_distributed(config)
    log = print if (verbose and distributed.is_main) else (lambda *args, **kwargs: None)
    history: list[dict] = []
    step_log: list[dict] = []
    precision = config.precision
    try:
        precision = resolve_precision(config.precision, device)
        seed_everything(config.seed)  # the same initial weights on every rank
        bundle = bundle or datasets.build_datasets(config)
        num_classes = len(bundle.classes)

        # Data: DistributedSampler even for one process, because its order depends only on
        # (seed, epoch), which is what makes resuming exact.
        sampler = DistributedSampler(bundle.train, num_replicas=distributed.world_size, rank=distributed.rank,
                                     shuffle=True, seed=config.seed, drop_last=True)
        train_loader = make_loader(bundle.train, config, train=True, sampler=sampler)
        val_loader = None
        if bundle.val is not None and len(bundle.val):
            # Each rank evaluates every world_size-th image: no padding, no duplicates.
            val_part = Subset(bundle.val, range(distributed.rank, len(bundle.val), distributed.world_size))
            val_loader = make_loader(val_part, config, train=False)
        steps_per_epoch = len(train_loader) // config.accumulation_steps
        if config.max_steps:
            steps_per_epoch = min(steps_per_epoch, config.max_steps)
        global_batch = config.batch_size * config.accumulation_steps * distributed.world_size
        if steps_per_epoch < 1:
            raise ConfigError(f"the training split has {len(bundle.train)} images, fewer than one optimizer step "
                              f"({global_batch} = batch_size x accumulation_steps x processes); "
                              "lower batch_size or accumulation_steps")

        # Model, optimizer, schedule, scaler, EMA.
        raw_model = build_model(config, num_classes, bundle.classes)
        raw_model = raw_model.to(device, memory_format=torch.channels_last if config.channels_last
                                 else torch.preserve_format)
        # Built while every parameter is trainable, so it holds the backbone for after unfreezing.
        optimizer = freeze.scale_backbone_lr(make_optimizer(raw_model, config), raw_model, config.backbone_lr_scale)
        scheduler = make_scheduler(optimizer, config, steps_per_epoch)
        scaler = grad_scaler(precision, device)
        ema = ModelEmaV3(raw_model, decay=config.ema_decay) if config.ema_decay > 0 else None

        output_dir = paths.resolve_path(config.output_dir)
        checkpoint_path = output_dir / checkpoint.LAST_NAME
        start_epoch, global_step, skipped_steps = 0, 0, 0
        if config.resume and checkpoint_path.exists():
            state = checkpoint.load_checkpoint(checkpoint_path, map_location=device)
            if state["config"].get("model") != config.model or list(state["classes"]) != list(bundle.classes):
                raise ConfigError(f"{checkpoint_path} was trained as {state['config'].get('model')} on classes "
                                  f"{state['classes'][:4]}...; resume needs the same model and dataset "
                                  "(or another output_dir)")
            raw_model.load_state_dict(state["model"])
            optimizer.load_state_dict(state["optimizer"])
            scheduler.load_state_dict(state["scheduler"])
            scaler.load_state_dict(state["scaler"])
            if ema is not None and state.get("ema") is not None:
                ema.module.load_state_dict(state["ema"])
            start_epoch, global_step = state["epoch"], state["global_step"]
            skipped_steps, history = state.get("skipped_steps", 0), list(state.get("history", []))
            log(f"resuming from {checkpoint_path}: {start_epoch} of {config.epochs} epochs done")
        elif config.resume:
            log(f"resume: no checkpoint at {checkpoint_path} yet; starting from scratch")

        def wrap(module):
            if distributed.enabled:  # DDP registers the parameters that require grad when it is built
                module = torch.nn.parallel.DistributedDataParallel(
                    module, device_ids=[device.index] if device.type == "cuda" else None)
            if config.compile:
                module = torch.compile(module)  # compiles on the first step (slow once; see notebook 03)
            return module

        backbone_frozen = start_epoch < config.freeze_backbone_epochs
        if backbone_frozen:  # the optimizer skips parameters without gradients
            freeze.set_backbone_trainable(raw_model, False)
            log(f"backbone frozen for epochs 1-{config.freeze_backbone_epochs}: training the head only "
                f"({factory.count_parameters(raw_model, trainable_only=True):,} of "
                f"{factory.count_parameters(raw_model):,} parameters)")
        model = wrap(raw_model)

        mixup = _make_mixup(config, num_classes)
        criterion = SoftTargetCrossEntropy() if mixup else torch.nn.CrossEntropyLoss(
            label_smoothing=config.label_smoothing)
        eraser = None
        if config.random_erasing > 0:
            from timm.data.random_erasing import RandomErasing

            # Erases on the normalized batch, on the training device (Zhong et al. 2020, arXiv:1708.04896).
            eraser = RandomErasing(probability=config.random_erasing, mode="pixel", device=str(device))

        log(f"training {config.model} on {len(bundle.train)} images ({num_classes} classes) for {config.epochs} "
            f"epoch(s) x {steps_per_epoch} steps, global batch {global_batch}, precision {precision}, "
            f"device {device} x {distributed.world_size}; {ledger.describe_hardware()}")
        written_checkpoint = checkpoint_path if (config.resume and checkpoint_path.exists()) else None

        for epoch in range(start_epoch, config.epochs):
            # Every random draw of this epoch (order, augmentation, mixup, workers) follows from
            # (seed, epoch, rank).
            seed_everything(epoch_seed(config.seed, epoch, distributed.rank))
            sampler.set_epoch(epoch)
            if train_loader.generator is not None:
                train_loader.generator.manual_seed(epoch_seed(config.seed, epoch, distributed.rank))
            if backbone_frozen and epoch >= config.freeze_backbone_epochs:
                backbone_frozen = False
                freeze.set_backbone_trainable(raw_model, True)
                model = wrap(raw_model)  # a new DDP wrapper, which sees the newly trainable parameters
                log(f"epoch {epoch + 1}: backbone unfrozen, training all parameters")
            model.train()
            if backbone_frozen:
                freeze.freeze_batchnorm(raw_model)  # keep the source's statistics (see the docstring)
            reset_peak_memory(device)
            step_losses, losses, step_learning_rates = [], [], []
            correct = torch.zeros((), device=device, dtype=torch.long)
            images_seen, timer = 0, DataWaitTimer()
            bar = tqdm(total=steps_per_epoch, desc=f"epoch {epoch + 1}/{config.epochs}", leave=False,
                       disable=not (progress and distributed.is_main), dynamic_ncols=True)
            # No device sync per batch: the wait is host time blocked in next(loader).
            batches = timed_batches(train_loader, timer)
            epoch_started, cpu_started = time.perf_counter(), time.process_time()
            for step in range(steps_per_epoch):
                for micro_step in range(config.accumulation_steps):
                    images, targets = next(batches)
                    images = to_device(images, device, config.channels_last)
                    targets = targets.to(device, non_blocking=True)
                    hard_targets = targets
                    if mixup is not None:
                        images, targets = mixup(images, targets)
                    if eraser is not None:
                        images = eraser(images)
                    # DDP all-reduces gradients in every backward; on all but the last micro-batch
                    # that traffic is wasted, so skip it (gradients still add up locally).
                    last_micro_step = micro_step == config.accumulation_steps - 1
                    sync = model.no_sync() if distributed.enabled and not last_micro_step else nullcontext()
                    with sync:
                        with autocast(precision, device):
                            logits = model(images)
                            loss = criterion(logits, targets)
                        # Divide so that N accumulated micro-batches give the mean gradient of the big batch.
                        scaler.scale(loss / config.accumulation_steps).backward()
                    step_losses.append(loss.detach())
                    correct += correct_counts(logits.detach(), hard_targets)[0]
                    images_seen += len(hard_targets)

                if config.grad_clip_norm > 0:
                    scaler.unscale_(optimizer)  # clip the true gradients, not the scaled ones
                    torch.nn.utils.clip_grad_norm_(raw_model.parameters(), config.grad_clip_norm)
                scale_before = scaler.get_scale() if scaler.is_enabled() else 0.0  # sync, fp16 only
                scaler.step(optimizer)  # skips the step when fp16 gradients overflowed
                scaler.update()
                optimizer.zero_grad(set_to_none=True)
                if scaler.is_enabled() and scaler.get_scale() < scale_before:
                    skipped_steps += 1  # the scale only shrinks after a skipped step
                step_learning_rates.append(optimizer.param_groups[0]["lr"])  # the lr this step used
                scheduler.step()
                global_step += 1
                if ema is not None:
                    ema.update(raw_model, step=global_step)

                if (step + 1) % SYNC_EVERY_STEPS == 0 or step + 1 == steps_per_epoch:
                    first_step = step + 2 - len(step_losses) // config.accumulation_steps
                    values = check_finite(step_losses, first_step, epoch, config, precision)
                    losses.append(values)
                    step_losses = []
                    bar.set_postfix(loss=f"{values.mean().item():.3f}", lr=f"{optimizer.param_groups[0]['lr']:.3g}")
                bar.update(1)
            bar.close()
            if device.type == "cuda":
                torch.cuda.synchronize(device)  # finish queued work before reading the clock
            epoch_seconds = time.perf_counter() - epoch_started
            process_cpu_seconds = time.process_time() - cpu_started  # all threads of this process
            batches.close()  # shut down this epoch's workers before evaluating

            epoch_losses = torch.cat(losses)
            train_loss = epoch_losses.mean().item()
            per_step = epoch_losses.view(steps_per_epoch, config.accumulation_steps).mean(dim=1).tolist()
            first_global_step = global_step - steps_per_epoch
            step_log += [{"epoch": epoch + 1, "step": first_global_step + i + 1, "lr": step_learning_rates[i],
                          "loss": per_step[i]} for i in range(steps_per_epoch)]
            counts = torch.tensor([images_seen, correct.item(), timer.wait_seconds, epoch_seconds],
                                  dtype=torch.float64, device=device)
            if distributed.enabled:
                dist.all_reduce(counts)
            total_images, total_correct, total_wait, total_seconds = counts.tolist()
            world = distributed.world_size
            row = {
                "epoch": epoch + 1,
                "lr": optimizer.param_groups[0]["lr"],
                "train_loss": train_loss,
                "train_top1": total_correct / total_images,
                # All ranks run in lockstep, so global images/s = all images / one rank's time.
                "images_per_second": total_images / (total_seconds / world),
                "data_wait_fraction": total_wait / total_seconds,
                "epoch_seconds": total_seconds / world,
                # CPU time of the training loop (rank 0): on a shared CPU, cpu/wall below the thread
                # count means the process was waiting for cores, or for the GPU.
                "process_cpu_seconds": process_cpu_seconds,
                "peak_memory_bytes": peak_memory_bytes(device),
                "peak_memory_kind": peak_memory_kind(device),
                "optimizer_steps": steps_per_epoch,
                "skipped_steps": skipped_steps,
                "world_size": world,
                "global_batch_size": global_batch,
            }
            if val_loader is not None:
                scores = evaluate(model, val_loader, device, precision, config.channels_last, distributed.enabled)
                row.update(val_loss=scores["loss"], val_top1=scores["top1"], val_top5=scores["top5"])
                if ema is not None:
                    scores = evaluate(ema.module, val_loader, device, precision, config.channels_last,
                                      distributed.enabled)
                    row.update(ema_val_loss=scores["loss"], ema_val_top1=scores["top1"], ema_val_top5=scores["top5"])
            history.append(row)
            if distributed.is_main:
                written_checkpoint = checkpoint.save_checkpoint({
                    "model": raw_model.state_dict(),
                    "ema": ema.module.state_dict() if ema is not None else None,
                    "optimizer": optimizer.state_dict(),
                    "scheduler": scheduler.state_dict(),
                    "scaler": scaler.state_dict(),
                    "epoch": epoch + 1,  # completed epochs
                    "global_step": global_step,
                    "skipped_steps": skipped_steps,
                    "config": config.to_dict(),
                    "classes": list(bundle.classes),
                    "history": history,
                }, checkpoint_path)
            val_text = f"  val loss {row['val_loss']:.3f} top-1 {row['val_top1']:.1%}" if "val_top1" in row else ""
            log(f"epoch {epoch + 1}/{config.epochs}: train loss {train_loss:.3f} top-1 {row['train_top1']:.1%}"
                f"{val_text}  {row['images_per_second']:.0f} images/s  data wait {row['data_wait_fraction']:.0%}"
                + (f"  skipped steps {skipped_steps}" if scaler.is_enabled() else ""))
        if skipped_steps:
            log(f"GradScaler skipped {skipped_steps} optimizer step(s) whose fp16 gradients overflowed")

        raw_model.eval()
        result = FitResult(model=raw_model, history=history, classes=list(bundle.classes), config=config,
                           checkpoint_path=written_checkpoint, ema_model=ema.module.eval() if ema else None,
                           precision=precision, device=str(device), world_size=distributed.world_size,
                           skipped_steps=skipped_steps, duration_seconds=time.perf_counter() - started,
                           step_log=step_log)
        _record(config, distributed, "ok", started, history,
                {"skipped_steps": skipped_steps, "epochs_completed": len(history),
                 "first_epoch_seconds": history[0]["epoch_seconds"] if history else None,
                 "checkpoint": str(written_checkpoint) if written_checkpoint else None}, precision, device)
        return result
    except BaseException as error:  # an interrupted run is recorded too, then the error goes on
        _record(config, distributed, "failed", started, history,
                {"error": f"{type(error).__name__}: {error}"[:500]}, precision, device)
        raise
    finally:
        if distributed.started_here and dist.is_initialized():
            dist.destroy_process_group()


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
        runs.append({"model": row["name"], "created_at": row["created_at"], "hardware": ledger.describe_hardware(
            row["hardware"]), "first_epoch_seconds": metrics["first_epoch_seconds"],
            "epoch_seconds": metrics["epoch_seconds"],
            "compile_seconds": metrics["first_epoch_seconds"] - metrics["epoch_seconds"]})
    return runs
