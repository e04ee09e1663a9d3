"""Lookahead (Zhang, Lucas, Hinton & Ba 2019, "Lookahead Optimizer: k steps forward, 1 step back",
arXiv:1907.08610) around any optimizer: every `k` optimizer steps the slow weights move `alpha` of the way to
the fast weights, phi <- phi + alpha (theta - phi), and the fast weights restart from them, theta <- phi.

The slow weights live here, outside the optimizer, so it wraps SGD, AdamW or Muon alike and leaves the
weight EMA and SWA as they are (they read the model after the sync). As airbench's `LookaheadState`
(github.com/KellerJordan/cifar10-airbench, legacy/airbench94.py, from hlb-CIFAR10) does, the floating-point
buffers (BatchNorm's running statistics) follow the same rule as the parameters. At the end of training the
model takes the slow weights (`finish`): the paper's Algorithm 1 returns phi, and airbench ends with
`lookahead_state.update(model, decay=1.0)`, which copies the slow weights into the model.
"""
from __future__ import annotations

import torch


class Lookahead:
    """`step(model, global_step)` after every optimizer step; `finish(model)` when training ends.

        lookahead = Lookahead(model, steps=5, alpha=0.5)
        ...; optimizer.step(); global_step += 1; lookahead.step(model, global_step)
        lookahead.finish(model)    # evaluate and save the slow weights
    """

    def __init__(self, model: torch.nn.Module, steps: int, alpha: float):
        self.steps, self.alpha = steps, alpha
        self.slow = self._snapshot(model)

    @staticmethod
    def _tensors(model: torch.nn.Module) -> dict[str, torch.Tensor]:
        """The model's floating-point state (parameters and running statistics), by name; not batch counters."""
        return {name: tensor for name, tensor in model.state_dict(keep_vars=True).items()
                if tensor.is_floating_point()}

    def _snapshot(self, model: torch.nn.Module) -> dict[str, torch.Tensor]:
        return {name: tensor.detach().clone() for name, tensor in self._tensors(model).items()}

    def reset(self, model: torch.nn.Module) -> None:
        """Slow weights = the model's weights now (a resume from a checkpoint that kept none)."""
        self.slow = self._snapshot(model)

    @torch.no_grad()
    def step(self, model: torch.nn.Module, global_step: int) -> bool:
        """After optimizer step number `global_step` (1-based): on every k-th one, the slow weights move alpha of the
        way to the fast ones and the model restarts from them. Counting the run's steps, not its own calls, makes a
        resumed run sync on the same steps. True when it synced."""
        if global_step % self.steps:
            return False
        for name, fast in self._tensors(model).items():
            self.slow[name].lerp_(fast.detach(), self.alpha)
            fast.data.copy_(self.slow[name])
        return True

    @torch.no_grad()
    def finish(self, model: torch.nn.Module) -> None:
        """The model takes the slow weights: what the run is evaluated and saved with (the fast weights of the steps
        since the last sync are dropped, as in the paper and airbench)."""
        for name, fast in self._tensors(model).items():
            fast.data.copy_(self.slow[name])

    def state_dict(self) -> dict[str, torch.Tensor]:
        return dict(self.slow)

    def load_state_dict(self, slow: dict[str, torch.Tensor]) -> None:
        for name, tensor in slow.items():
            self.slow[name].copy_(tensor)
