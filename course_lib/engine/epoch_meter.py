"""The training half of an epoch's metrics row: loss, top-1, images per second, data-wait fraction,
epoch and CPU seconds, counted on the device without a CPU-GPU sync per step and summed across
ranks under DDP at the end of the epoch.

    meter = EpochMeter(device, distributed)
    meter.start()
    ... meter.add(logits, targets)  (every micro-batch)   meter.add_step(lr)  (every optimizer step)
        meter.add_losses(guard.check(epoch, step))        (every few steps: the losses, on the CPU)
    meter.stop()
    row = meter.row()
"""
from __future__ import annotations

import time

import torch
import torch.distributed as dist

from course_lib.data.loaders import DataWaitTimer


def correct_counts(logits: torch.Tensor, targets: torch.Tensor, top: int = 5) -> tuple[torch.Tensor, torch.Tensor]:
    """(top-1 correct, top-k correct) as device tensors: no sync."""
    k = min(top, logits.shape[1])
    hits = logits.topk(k, dim=1).indices == targets[:, None]
    return hits[:, 0].sum(), hits.any(dim=1).sum()


class EpochMeter:
    """Counts one epoch of training. `timer` is the DataWaitTimer to hand to `loaders.timed_batches`.
    `distributed=True` all-reduces images, correct answers, data wait and seconds in `row()`
    (every rank must call it)."""

    def __init__(self, device: torch.device, distributed: bool = False, world_size: int = 1):
        self.device, self.distributed, self.world_size = torch.device(device), distributed, world_size
        self.timer = DataWaitTimer()
        self.correct = torch.zeros((), device=self.device, dtype=torch.long)  # top-1, stays on the device
        self.images = 0
        self.losses: list[torch.Tensor] = []  # CPU tensors of micro-batch losses, in order
        self.learning_rates: list[float] = []  # the lr each optimizer step used
        self.epoch_seconds = self.process_cpu_seconds = 0.0
        self._started = self._cpu_started = 0.0

    def start(self) -> None:
        self._started, self._cpu_started = time.perf_counter(), time.process_time()

    def add(self, logits: torch.Tensor, targets: torch.Tensor) -> None:
        """One micro-batch: its logits and its true class indices (not MixUp's soft targets)."""
        self.correct += correct_counts(logits, targets)[0]
        self.images += len(targets)

    def add_step(self, learning_rate: float) -> None:
        self.learning_rates.append(learning_rate)

    def add_losses(self, values: torch.Tensor) -> None:
        self.losses.append(values)

    def stop(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)  # finish queued work before reading the clock
        self.epoch_seconds = time.perf_counter() - self._started
        self.process_cpu_seconds = time.process_time() - self._cpu_started  # all threads of this process

    def row(self) -> dict:
        """The epoch's training metrics, all ranks together (call after `stop`)."""
        counts = torch.tensor([self.images, self.correct.item(), self.timer.wait_seconds, self.epoch_seconds],
                              dtype=torch.float64, device=self.device)
        if self.distributed:
            dist.all_reduce(counts)
        images, correct, wait_seconds, seconds = counts.tolist()
        world = self.world_size
        return {
            "train_loss": torch.cat(self.losses).mean().item(),  # this rank's micro-batches
            "train_top1": correct / images,
            # All ranks run in lockstep, so global images/s = all images / one rank's time.
            "images_per_second": images / (seconds / world),
            "data_wait_fraction": wait_seconds / seconds,
            "epoch_seconds": seconds / world,
            # CPU time of the training loop (this rank): on a shared CPU, cpu/wall below the thread
            # count means the process was waiting for cores, or for the GPU.
            "process_cpu_seconds": self.process_cpu_seconds,
        }

    def step_rows(self, epoch: int, first_global_step: int, accumulation_steps: int) -> list[dict]:
        """One dict per optimizer step (epoch and step 1-based): the lr it used and the mean loss of
        its micro-batches."""
        per_step = torch.cat(self.losses).view(-1, accumulation_steps).mean(dim=1).tolist()
        return [{"epoch": epoch + 1, "step": first_global_step + i + 1, "lr": rate, "loss": loss}
                for i, (rate, loss) in enumerate(zip(self.learning_rates, per_step))]
