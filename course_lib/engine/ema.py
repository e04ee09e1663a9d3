"""An exponential moving average of the weights, with timm's `ModelEmaV3`: after every optimizer
step, ema = decay * ema + (1 - decay) * weights, so the copy averages roughly the last
1 / (1 - decay) steps. Averaging the iterates of SGD (Polyak & Juditsky 1992, "Acceleration of
Stochastic Approximation by Averaging", doi:10.1137/0330046) gives weights that often score better
than the last ones; the engine evaluates both.

    ema = make_ema(raw_model, config)
    ema.update(raw_model, step=global_step)    # after each optimizer step
    ema.module                                 # the averaged copy, to evaluate or save
"""
from __future__ import annotations

import torch

from course_lib.config import Config


def make_ema(model: torch.nn.Module, config: Config):
    """timm's ModelEmaV3 of `model` (a deep copy, on the model's device) with `config.ema_decay`
    per optimizer step, or None when ema_decay is 0. Pass the unwrapped model (not DDP or
    compiled), so the copy's state-dict names match the checkpoint's."""
    if config.ema_decay <= 0:
        return None
    from timm.utils import ModelEmaV3

    return ModelEmaV3(model, decay=config.ema_decay)
