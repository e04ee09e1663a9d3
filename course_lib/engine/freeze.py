"""Freezing for fine-tuning: train only the new head first (backbone frozen, its BatchNorm statistics kept), then
everything; and a lower learning rate for the backbone than for the head (Howard & Ruder 2018, "Universal Language Model
Fine-tuning", arXiv:1801.06146, gradual unfreezing and discriminative learning rates).
"""
from __future__ import annotations

import torch

from course_lib.models.factory import backbone_parameters, head_parameters


def set_backbone_trainable(model: torch.nn.Module, trainable: bool) -> None:
    """Switch gradients of every parameter outside the classifier on or off.

    Not `timm.utils.freeze(..., include_bn_running_stats=True)`: it swaps BatchNorm layers for
    FrozenBatchNorm2d and back, which creates new Parameter objects (the optimizer would keep
    updating the old ones) and renames state-dict entries (checkpoints would stop loading)."""
    for parameter in backbone_parameters(model):
        parameter.requires_grad_(trainable)


def freeze_batchnorm(model: torch.nn.Module) -> None:
    """Put the backbone's BatchNorm layers in eval mode; call after every `model.train()` while frozen.

    In train mode BatchNorm normalises with each batch's statistics and overwrites its running
    mean and variance with the new data's, so a backbone with frozen weights would still change
    the features it computes, and at evaluation (running statistics) the head would see other
    features than the ones it was trained on. Eval mode keeps the source task's statistics."""
    head = {id(module) for module in model.get_classifier().modules()}
    for module in model.modules():
        if isinstance(module, torch.nn.modules.batchnorm._BatchNorm) and id(module) not in head:
            module.eval()


def scale_backbone_lr(optimizer: torch.optim.Optimizer, model: torch.nn.Module,
                      scale: float) -> torch.optim.Optimizer:
    """`optimizer` with each parameter group split in place into a head part (learning rate as
    given) and a backbone part (learning rate x `scale`). Call before the first step and before
    building the scheduler, which then decays both parts by the same factor."""
    if scale == 1.0:
        return optimizer
    head = {id(parameter) for parameter in head_parameters(model)}
    groups = []
    for group in optimizer.param_groups:
        options = {key: value for key, value in group.items() if key != "params"}
        head_part = [p for p in group["params"] if id(p) in head]
        backbone_part = [p for p in group["params"] if id(p) not in head]
        groups.append({**options, "params": head_part})
        groups.append({**options, "params": backbone_part, "lr": group["lr"] * scale})
    optimizer.param_groups = []
    for group in groups:  # group 0 stays the head's: the engine logs param_groups[0]["lr"]
        if group["params"]:
            optimizer.add_param_group(group)
    return optimizer


class BackboneFreezer:
    """Gradual unfreezing over a run: the backbone is frozen (weights and BatchNorm statistics) for
    the first `epochs` epochs, and trains with the head afterwards.

        freezer = BackboneFreezer(config.freeze_backbone_epochs)
        freezer.start(raw_model, start_epoch)      # before wrapping in DDP: it registers trainable parameters only
        if freezer.maybe_unfreeze(epoch): ...      # at each epoch's start; True: wrap the model again
        model.train(); freezer.hold_batchnorm()    # a frozen backbone keeps the source's statistics
    """

    def __init__(self, epochs: int):
        self.epochs = epochs  # epochs at the start of the run that train the head only
        self.model: torch.nn.Module | None = None
        self.frozen = False

    def start(self, model: torch.nn.Module, start_epoch: int = 0) -> bool:
        """Freeze `model`'s backbone when the run (re)starts inside the frozen epochs; True if frozen."""
        self.model, self.frozen = model, start_epoch < self.epochs
        if self.frozen:  # the optimizer skips parameters without gradients
            set_backbone_trainable(model, False)
        return self.frozen

    def maybe_unfreeze(self, epoch: int) -> bool:
        """Unfreeze at the first epoch (0-based) past the frozen ones. True when this call unfroze:
        a DistributedDataParallel wrapper built earlier does not see the new trainable parameters."""
        if not self.frozen or epoch < self.epochs:
            return False
        self.frozen = False
        set_backbone_trainable(self.model, True)
        return True

    def hold_batchnorm(self) -> None:
        """Call after every `model.train()`: while frozen, the backbone's BatchNorm stays in eval mode."""
        if self.frozen:
            freeze_batchnorm(self.model)
