"""Stochastic weight averaging (Izmailov et al. 2018, "Averaging Weights Leads to Wider Optima and
Better Generalization", arXiv:1803.05407) with `torch.optim.swa_utils`: over the last `swa_epochs`
epochs the learning rate is held constant (the value the run's schedule has when SWA begins: the
paper's constant-learning-rate phase, here without a second learning-rate field), the weights at the
end of each of those epochs are averaged with equal weight (`AveragedModel.update_parameters`), and
at the end `update_bn` recomputes the BatchNorm statistics of the average with one pass over the
training batches (averaged weights do not match any run's running statistics). The engine scores
the average beside the last weights and their EMA (`swa_val_*` columns).

    swa = WeightAverager(raw_model, epochs=10, swa_epochs=3)
    swa.holds_lr(epoch)                 # True in the last 3 epochs: the loop stops stepping the schedule
    swa.update(raw_model, epoch)        # after each epoch: a snapshot when epoch is one of the last 3
    swa.finish(training_images)         # update_bn over an iterable of image batches; returns the module
"""
from __future__ import annotations

from typing import Iterable

import torch
import torch.distributed as dist


class WeightAverager:
    """An equal-weight average of the end-of-epoch weights of epochs `epochs - swa_epochs` .. `epochs - 1`
    (0-based). `module` is the averaged network; `snapshots` how many epochs it holds."""

    def __init__(self, model: torch.nn.Module, epochs: int, swa_epochs: int):
        from torch.optim.swa_utils import AveragedModel

        if not 1 <= swa_epochs < epochs:
            raise ValueError(f"swa_epochs must be 1 to epochs - 1 ({epochs - 1}), got {swa_epochs}")
        self.start_epoch = epochs - swa_epochs  # the first averaged epoch, 0-based
        self.averaged = AveragedModel(model)  # a deep copy on the model's device; replaced by the first snapshot

    @property
    def module(self) -> torch.nn.Module:
        return self.averaged.module

    @property
    def snapshots(self) -> int:
        return int(self.averaged.n_averaged)

    def holds_lr(self, epoch: int) -> bool:
        """Whether epoch `epoch` (0-based) is one of the averaged ones, trained at a constant learning rate."""
        return epoch >= self.start_epoch

    def update(self, model: torch.nn.Module, epoch: int) -> bool:
        """Add `model`'s weights (the unwrapped module) after epoch `epoch` when it is an averaged one."""
        if not self.holds_lr(epoch):
            return False
        self.averaged.update_parameters(model)
        return True

    @torch.no_grad()
    def finish(self, images: Iterable[torch.Tensor], world_size: int = 1) -> torch.nn.Module:
        """Recompute the average's BatchNorm statistics over `images` (batches as the model takes them)
        with `update_bn`, averaged over the processes under DDP (each saw its share); returns the
        averaged module in eval mode."""
        from torch.optim.swa_utils import update_bn

        update_bn(images, self.averaged)
        if world_size > 1:
            for layer in self.module.modules():
                if isinstance(layer, torch.nn.modules.batchnorm._BatchNorm) and layer.running_mean is not None:
                    for buffer in (layer.running_mean, layer.running_var):
                        dist.all_reduce(buffer)
                        buffer.div_(world_size)
        return self.module.eval()

    def state_dict(self) -> dict:
        return self.averaged.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.averaged.load_state_dict(state)
