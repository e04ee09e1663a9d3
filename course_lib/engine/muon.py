"""Muon for the convolution weights, SGD for everything else, in one optimizer (`optimizer=muon`).

Muon (Keller Jordan et al. 2024, "Muon: An optimizer for hidden layers in neural networks",
https://kellerjordan.github.io/posts/muon/) runs SGD with Nesterov momentum and replaces each weight matrix's update by
the nearest semi-orthogonal matrix (U V^T of the update's SVD, approximated by a quintic Newton-Schulz iteration), so
every direction of the update moves by the same amount. A conv kernel is the matrix out_channels x (in_channels x kh x
kw). Written after airbench94_muon.py (github.com/KellerJordan/cifar10-airbench, the CIFAR-10 record that uses it):
momentum buffer `m = momentum m + g`, Nesterov `g + momentum m`, each kernel rescaled to Frobenius norm
sqrt(out_channels) before its step (every conv here feeds a BatchNorm, so the scale is free and the normalisation stands
in for weight decay), no other scaling of the update. As the Muon repository's MuonWithAuxAdam
(github.com/KellerJordan/Muon) does, one optimizer holds both kinds of parameter group, flagged `muon`; its README: "use
Muon to optimize all the convolutional filters except the first one". So the first conv (the stem, which sees pixels),
biases, BatchNorm and the classifier head keep the recipe's SGD (heavy-ball momentum, L2 weight decay:
`torch.optim.SGD`'s update), and the schedule scales both kinds of group.
"""
from __future__ import annotations

import torch

# The quintic's coefficients (airbench94_muon, the Muon repository): chosen to raise small singular values
# fast, so after 5 steps they land in a band around 1 (about 0.7-1.2) rather than exactly on 1. 5 steps: the Muon
# repository's default; airbench94_muon calls it with 3, cheaper (on 2 CPU cores in fp32, 5 steps over the small
# speed-run net's kernels took about 40 ms per optimizer step on one thread, a training step at batch 128 about 50 ms;
# one rough timing on a 2-core AMD EPYC shared with other work, not a measurement: notebook 12's ablation times it).
NEWTON_SCHULZ_COEFFICIENTS = (3.4445, -4.7750, 2.0315)
NEWTON_SCHULZ_STEPS = 5


def zeropower_newton_schulz(update: torch.Tensor, steps: int = NEWTON_SCHULZ_STEPS, eps: float = 1e-7) -> torch.Tensor:
    """The orthogonalised form of a 2-D `update` (about U V^T of its SVD U S V^T) by `steps` quintic Newton-Schulz
    iterations, in bf16 on CUDA (the reference's precision: tensor cores) and fp32 elsewhere (a CPU's bf16 matmul
    gains little here), returned in the input's dtype."""
    a, b, c = NEWTON_SCHULZ_COEFFICIENTS
    x = update.to(torch.bfloat16 if update.is_cuda else torch.float32)
    x = x / (x.norm() + eps)  # the Frobenius norm bounds the spectral norm: every singular value <= 1
    tall = update.size(0) > update.size(1)
    if tall:  # iterate on the wide side: X X^T is then the smaller square
        x = x.T
    for _ in range(steps):
        gram = x @ x.T
        x = a * x + (b * gram + c * gram @ gram) @ x
    return (x.T if tall else x).to(update.dtype)


def muon_parameters(model: torch.nn.Module) -> list[torch.nn.Parameter]:
    """The parameters Muon trains: every trainable convolution kernel (4-D) but the first one in the model's order
    (the stem)."""
    kernels = [p for p in model.parameters() if p.requires_grad and p.ndim == 4]
    return kernels[1:]


class Muon(torch.optim.Optimizer):
    """Muon on the groups whose `muon` flag is set, SGD (heavy-ball momentum, L2 weight decay) on the others.

        optimizer = Muon([{"params": kernels, "muon": True, "lr": 0.015},
                          {"params": rest, "muon": False, "weight_decay": 5e-4}], lr=0.2, momentum=0.9)
    """

    def __init__(self, params, lr: float, momentum: float = 0.9, weight_decay: float = 0.0,
                 normalize_weights: bool = True, ns_steps: int = NEWTON_SCHULZ_STEPS):
        defaults = dict(lr=lr, momentum=momentum, weight_decay=weight_decay, muon=False,
                        normalize_weights=normalize_weights, ns_steps=ns_steps)
        super().__init__(params, defaults)

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            for parameter in group["params"]:
                if parameter.grad is None:
                    continue
                if group["muon"]:
                    self._muon_step(parameter, group)
                else:
                    self._sgd_step(parameter, group)
        return loss

    def _muon_step(self, parameter: torch.Tensor, group: dict) -> None:
        """airbench94_muon's update: Nesterov momentum, the kernel renormalised, the orthogonalised step."""
        state = self.state[parameter]
        if "momentum_buffer" not in state:
            state["momentum_buffer"] = torch.zeros_like(parameter)
        buffer = state["momentum_buffer"].mul_(group["momentum"]).add_(parameter.grad)
        update = parameter.grad.add(buffer, alpha=group["momentum"])  # Nesterov: look one momentum step ahead
        if group["normalize_weights"]:  # scale-free behind BatchNorm: fixing the norm fixes the effective step
            parameter.mul_(len(parameter) ** 0.5 / (parameter.norm() + 1e-12))
        orthogonal = zeropower_newton_schulz(update.reshape(len(update), -1), group["ns_steps"]).view_as(parameter)
        parameter.add_(orthogonal, alpha=-group["lr"])

    def _sgd_step(self, parameter: torch.Tensor, group: dict) -> None:
        """torch.optim.SGD's update (no dampening, no Nesterov): the first buffer is the gradient itself."""
        gradient = parameter.grad.add(parameter, alpha=group["weight_decay"]) if group["weight_decay"] \
            else parameter.grad
        state = self.state[parameter]
        if group["momentum"]:
            if "momentum_buffer" not in state:
                state["momentum_buffer"] = gradient.clone()
            else:
                state["momentum_buffer"].mul_(group["momentum"]).add_(gradient)
            gradient = state["momentum_buffer"]
        parameter.add_(gradient, alpha=-group["lr"])
