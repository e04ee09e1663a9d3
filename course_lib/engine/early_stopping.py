"""The best epoch and early stopping, both read from validation top-1 (Prechelt 1998, "Early Stopping
- But When?", in Neural Networks: Tricks of the Trade, doi:10.1007/3-540-49430-8_3): the best epoch is
the first one with the highest validation top-1 (`save_best` keeps its checkpoint as best.pt), and
training stops after `patience` epochs in a row without a strictly higher top-1
(`early_stopping_patience`). The state follows from the history alone, so a resumed run rebuilds it
(`from_history`) and stops where an uninterrupted one would.

    tracker = ValidationTracker(patience=3)
    improved = tracker.update(epoch=1, top1=0.62)   # after each epoch's validation
    tracker.should_stop, tracker.best_epoch, tracker.best_top1
"""
from __future__ import annotations

import math


class ValidationTracker:
    """The best validation top-1 so far, its epoch (1-based) and the epochs since; `patience` 0 never stops."""

    def __init__(self, patience: int = 0):
        if patience < 0:
            raise ValueError(f"patience must be 0 (off) or more epochs, got {patience}")
        self.patience = patience
        self.best_epoch: int | None = None
        self.best_top1 = -math.inf
        self.stale_epochs = 0  # epochs since the best one

    def update(self, epoch: int, top1: float) -> bool:
        """Record epoch `epoch`'s validation top-1; True when it is a new best (strictly higher)."""
        if top1 > self.best_top1:
            self.best_epoch, self.best_top1, self.stale_epochs = epoch, float(top1), 0
            return True
        self.stale_epochs += 1
        return False

    @property
    def should_stop(self) -> bool:
        return self.patience > 0 and self.stale_epochs >= self.patience

    @classmethod
    def from_history(cls, history: list[dict], patience: int = 0) -> "ValidationTracker":
        """The tracker after the epochs of `history` (rows with "epoch" and "val_top1"; rows without
        a validation score are skipped)."""
        tracker = cls(patience)
        for row in history:
            if "val_top1" in row:
                tracker.update(row["epoch"], row["val_top1"])
        return tracker

    def summary(self) -> dict:
        return {"best_epoch": self.best_epoch, "best_val_top1": self.best_top1 if self.best_epoch else None}
