"""`sync_batchnorm=True` (issue 47, point 2; article 1, section 4.3): under DDP every BatchNorm layer normalises with
the mean and variance of the whole global batch, every process's images together, instead of its own few. With a per-GPU
batch of 2 to 8 images a process's own statistics are noisy, and so is what the model learns.

On CUDA the engine uses PyTorch's `torch.nn.SyncBatchNorm.convert_sync_batchnorm`. PyTorch's layer refuses CPU tensors
("SyncBatchNorm expected input tensor to be on GPU"), so on CPU (gloo) the engine converts to `CpuSyncBatchNorm`: the
same arithmetic written with a differentiable all-reduce (`torch.distributed.nn.functional.all_reduce`, whose backward
all-reduces the gradients too). Each process sums its images' values and squares per channel; one all-reduce of those
sums and the image count gives the global mean and (biased) variance; the running statistics take the unbiased variance,
as BatchNorm's do. The state dict keeps BatchNorm's keys, so a checkpoint loads into the unconverted model.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.nn.modules.batchnorm import _BatchNorm


def _syncing() -> bool:
    import torch.distributed as dist

    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


class CpuSyncBatchNorm(_BatchNorm):
    """BatchNorm over the global batch of every process (see the module's docstring); in eval mode, or
    without a process group of several processes, plain BatchNorm."""

    def _check_input_dim(self, input):
        if input.dim() < 2:
            raise ValueError(f"expected at least 2D input (got {input.dim()}D input)")

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        self._check_input_dim(input)
        if not (self.training and _syncing()):
            return super().forward(input)
        from torch.distributed.nn.functional import all_reduce

        dims = [0, *range(2, input.dim())]
        values = input.float()  # statistics in fp32 whatever autocast hands over
        count = torch.tensor([input.numel() / input.shape[1]], dtype=torch.float32, device=input.device)
        sums = all_reduce(torch.cat([values.sum(dims), (values * values).sum(dims), count]))
        channels = input.shape[1]
        total = sums[-1]
        mean = sums[:channels] / total
        variance = (sums[channels:2 * channels] / total - mean * mean).clamp_min(0)
        if self.track_running_stats:
            self._update_running(mean.detach(), variance.detach(), float(total))
        shape = (1, channels, *([1] * (input.dim() - 2)))
        out = (values - mean.view(shape)) * torch.rsqrt(variance.view(shape) + self.eps)
        if self.affine:
            out = out * self.weight.view(shape) + self.bias.view(shape)
        return out.to(input.dtype)

    @torch.no_grad()
    def _update_running(self, mean: torch.Tensor, variance: torch.Tensor, count: float) -> None:
        """BatchNorm's update: momentum (or the cumulative average when momentum is None) of the batch mean and
        of its unbiased variance."""
        self.num_batches_tracked += 1
        factor = self.momentum if self.momentum is not None else 1.0 / float(self.num_batches_tracked)
        unbiased = variance * count / max(count - 1, 1.0)
        self.running_mean.mul_(1 - factor).add_(mean.to(self.running_mean.dtype), alpha=factor)
        self.running_var.mul_(1 - factor).add_(unbiased.to(self.running_var.dtype), alpha=factor)


def convert(module: torch.nn.Module, device: torch.device) -> torch.nn.Module:
    """`module` with every BatchNorm layer synchronised across processes: PyTorch's SyncBatchNorm on CUDA,
    `CpuSyncBatchNorm` elsewhere. The layers keep their parameters and buffers (the same tensors)."""
    if torch.device(device).type == "cuda":
        return torch.nn.SyncBatchNorm.convert_sync_batchnorm(module)
    return _convert_cpu(module)


def _convert_cpu(module: torch.nn.Module) -> torch.nn.Module:
    converted = module
    if isinstance(module, _BatchNorm) and not isinstance(module, CpuSyncBatchNorm):
        converted = CpuSyncBatchNorm(module.num_features, module.eps, module.momentum, module.affine,
                                     module.track_running_stats)
        if module.affine:
            converted.weight, converted.bias = module.weight, module.bias
        if module.track_running_stats:
            converted.running_mean, converted.running_var = module.running_mean, module.running_var
            converted.num_batches_tracked = module.num_batches_tracked
        converted.training = module.training
    for name, child in module.named_children():
        converted.add_module(name, _convert_cpu(child))
    return converted


def count_synced(module: torch.nn.Module) -> int:
    """How many layers of `module` normalise over the global batch."""
    return sum(isinstance(layer, (CpuSyncBatchNorm, torch.nn.SyncBatchNorm)) for layer in module.modules())
