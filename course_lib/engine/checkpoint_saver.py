"""Checkpointing a run: after every epoch rank 0 writes `output_dir/last.pt` (model, EMA, Lookahead's slow weights,
optimizer, scheduler, GradScaler, counters, config, classes, history) through `models.checkpoint`, which writes
atomically and reads with `torch.load(weights_only=True)`; `resume=True` restores all of it, so with the per-epoch
seeding in `train` a resumed run ends with the uninterrupted weights. Resume means "the same run": a checkpoint trained
with other values for a field that changes the training (lr, optimizer, batch_size, augmentation, seed ...) is refused
in one line listing what differs. Only `epochs` may grow or shrink (and switches that change speed, not results): the
cosine decay then ends at the new last step, continuing from the current learning rate. Weights holding NaN or inf are
never written: the save raises NonFiniteLossError instead, and the checkpoint a save replaces stays beside it as
`prev.pt` (a hard link, so no extra disk until then). With save_best, `keep_best()` after an epoch with a new best
validation top-1 gives that epoch's last.pt a second name, `best.pt` (a hard link, as prev.pt), so best.pt is a whole
checkpoint of the best epoch: `checkpoint=best.pt` and `workbook eval` read it like last.pt. See
https://pytorch.org/tutorials/recipes/recipes/saving_and_loading_a_general_checkpoint.html.
"""
from __future__ import annotations

import os
import shutil
from pathlib import Path

from course_lib import paths
from course_lib.config import ConfigError
from course_lib.engine.loss_guard import LossGuard, NonFiniteLossError
from course_lib.models import checkpoint

# Fields a resumed run may change: bookkeeping, where things are, and switches that change speed,
# not what is learned. Every other field (a new one included) must match the checkpoint's.
MAY_CHANGE_ON_RESUME = frozenset({
    "epochs",  # extending a run is what resume is for; the schedule follows the new length
    "resume", "output_dir", "checkpoint", "pretrained", "download",  # the starting weights come from last.pt
    "data_dir", "device", "decoder", "storage", "bad_images", "recipe",  # recipe: its values are compared
    "num_workers", "pin_memory", "prefetch_factor", "persistent_workers", "compile", "channels_last",
    "tta_views", "tta_selective",  # evaluation only
    "save_best", "early_stopping_patience",  # which epoch is kept and when the run ends, not what a step learns
})


def changed_training_fields(saved: dict, config) -> list[str]:
    """`name: old -> new` for each field of `config` that differs from the checkpoint's stored
    config `saved` and is not in MAY_CHANGE_ON_RESUME; precision only when both are explicit."""
    changes = []
    for name, new in config.to_dict().items():
        if name in MAY_CHANGE_ON_RESUME or name not in saved:  # a field newer than the checkpoint
            continue
        old = saved[name]
        if name == "precision" and "auto" in (old, new):
            continue
        if old != new:
            changes.append(f"{name}: {old} -> {new}")
    return changes


class CheckpointSaver:
    """`restore(state)` once before training, `save(state, completed_epochs)` after every epoch.
    `state` is a `train.RunState`; `written` is the last checkpoint this run wrote or resumed from."""

    def __init__(self, output_dir: str, is_main: bool = True):
        self.path = paths.resolve_path(output_dir) / checkpoint.LAST_NAME
        self.is_main = is_main  # under DDP every rank holds the same weights: rank 0 writes them
        self.written: Path | None = None
        self.best_written: Path | None = None  # best.pt, once keep_best has put it there

    def restore(self, state) -> bool:
        """Load `last.pt` into `state` (weights, optimizer, schedule, scaler, EMA, epoch and step
        counters, history); False when there is no checkpoint yet. A checkpoint of another model or
        class list is refused: it would load (or half-load) into the wrong network."""
        if not self.path.exists():
            return False
        saved = checkpoint.load_checkpoint(self.path, map_location=state.device)
        if saved["config"].get("model") != state.config.model or list(saved["classes"]) != list(state.bundle.classes):
            raise ConfigError(f"{self.path} was trained as {saved['config'].get('model')} on classes "
                              f"{saved['classes'][:4]}...; resume needs the same model and dataset "
                              "(or another output_dir)")
        changes = changed_training_fields(saved["config"], state.config)
        if changes:
            raise ConfigError(f"resume continues the same run, but {self.path} was trained with other values "
                              f"({'; '.join(changes)}); use the same values, another output_dir for a new run, "
                              "or resume=false to start over")
        planned = saved["config"].get("epochs", state.config.epochs)
        if planned != state.config.epochs:
            state.log(f"resume: epochs {planned} -> {state.config.epochs}: the cosine decay now ends at epoch "
                      f"{state.config.epochs}, continuing from the current learning rate")
        state.raw_model.load_state_dict(saved["model"])
        state.optimizer.load_state_dict(saved["optimizer"])
        cosine_lengths = _cosine_lengths(state.scheduler)  # this run's, from its epochs
        state.scheduler.load_state_dict(saved["scheduler"])
        for scheduler, length in cosine_lengths.items():  # the saved ones would end at the old last step
            scheduler.T_max = length
        state.scaler.load_state_dict(saved["scaler"])
        if state.ema is not None and saved.get("ema") is not None:
            state.ema.module.load_state_dict(saved["ema"])
        if state.swa is not None and saved.get("swa") is not None:
            state.swa.load_state_dict(saved["swa"])
        _restore_lookahead(state, saved)
        state.start_epoch, state.global_step = saved["epoch"], saved["global_step"]
        state.skipped_steps, state.history = saved.get("skipped_steps", 0), list(saved.get("history", []))
        self.written = self.path
        best = self.path.with_name(checkpoint.BEST_NAME)
        if state.config.save_best and best.exists():  # the earlier part of the run kept its best epoch
            self.best_written = best
        return True

    def save(self, state, completed_epochs: int) -> Path | None:
        """Write the run as it stands after `completed_epochs` epochs (rank 0 only), keeping the
        checkpoint it replaces as `prev.pt`. Non-finite weights raise NonFiniteLossError on every
        rank (they hold the same weights) and write nothing: last.pt stays the last good one."""
        weights = {"model": state.raw_model.state_dict(),
                   "ema": state.ema.module.state_dict() if state.ema is not None else None,
                   "swa": state.swa.state_dict() if state.swa is not None else None,
                   "lookahead": state.lookahead.state_dict() if state.lookahead is not None else None}
        bad = checkpoint.first_non_finite(weights)
        if bad is not None:
            name, count, size = bad
            kept = f"{self.path} still holds the last good weights" if self.path.exists() else "nothing was written"
            causes = LossGuard(state.config.accumulation_steps, state.config.lr, state.precision).likely_causes()
            raise NonFiniteLossError(f"the weights became non-finite by the end of epoch {completed_epochs} "
                                     f"(tensor {name}: {count} of {size} values NaN or inf), so no checkpoint was "
                                     f"written and {kept}; likely causes: {'; '.join(causes)}")
        if not self.is_main:
            return None
        self._keep_previous()
        self.written = checkpoint.save_checkpoint({
            **weights,
            "optimizer": state.optimizer.state_dict(),
            "scheduler": state.scheduler.state_dict(),
            "scaler": state.scaler.state_dict(),
            "epoch": completed_epochs,
            "global_step": state.global_step,
            "skipped_steps": state.skipped_steps,
            "config": state.config.to_dict(),
            "classes": list(state.bundle.classes),
            "history": state.history,
        }, self.path)
        return self.written

    def keep_best(self) -> Path | None:
        """Make best.pt the checkpoint `save` has just written (rank 0; a hard link, or a copy where the
        filesystem has none, put in place by an atomic rename). Call it after an epoch's save."""
        if not self.is_main or self.written is None:
            return None
        self.best_written = self._link(self.written, self.path.with_name(checkpoint.BEST_NAME))
        return self.best_written

    @staticmethod
    def _link(source: Path, target: Path) -> Path:
        """`target` becomes another name for `source`'s file, atomically."""
        temporary = checkpoint.temporary_path(target)  # cleared with the others if a kill leaves it
        try:
            try:
                os.link(source, temporary)
            except OSError:
                shutil.copyfile(source, temporary)
            os.replace(temporary, target)
        except OSError as error:
            raise checkpoint.CheckpointError(f"cannot write {target} ({error}); "
                                             "set output_dir to a folder you can write") from None
        finally:
            temporary.unlink(missing_ok=True)
        return target

    def _keep_previous(self) -> None:
        """Make `prev.pt` the current last.pt before a new one is renamed over it. last.pt never
        goes missing: prev.pt is a new name for the same file (a hard link, or a copy where the
        filesystem has none), put in place by an atomic rename."""
        if not self.path.exists():
            return
        self._link(self.path, self.path.with_name(checkpoint.PREVIOUS_NAME))


def _restore_lookahead(state, saved: dict) -> None:
    """Lookahead's slow weights from the checkpoint; one saved without them (written before the field existed)
    starts them from the restored weights, as a fresh run starts them from its first."""
    if state.lookahead is None:
        return
    if saved.get("lookahead") is not None:
        state.lookahead.load_state_dict(saved["lookahead"])
    else:
        state.lookahead.reset(state.raw_model)


def _cosine_lengths(scheduler) -> dict:
    """Each cosine part of `scheduler` (alone or inside SequentialLR) with its length in steps.
    CosineAnnealingLR computes each step from the previous learning rate, so restoring a new
    length after loading makes the decay continue from the current rate to min_lr at the new end."""
    from torch.optim.lr_scheduler import CosineAnnealingLR

    parts = getattr(scheduler, "_schedulers", [scheduler])
    return {part: part.T_max for part in parts if isinstance(part, CosineAnnealingLR)}
