"""Pruning a trained model, two ways, and what each does to speed.

- Unstructured magnitude pruning (`torch.nn.utils.prune.global_unstructured` with L1 magnitude,
  Han et al. 2015, arXiv:1506.02626): the smallest weights of every convolution and linear layer
  become zero. The tensors keep their shape, so dense kernels do exactly the same work: no speed-up
  without a sparse kernel, only a smaller file once compressed.
- Structured channel pruning (Li et al. 2017, "Pruning Filters for Efficient ConvNets",
  arXiv:1608.08710): whole output channels with the smallest L1 norm go, and every layer that reads
  them shrinks with them. The residual additions tie channels across layers; Torch-Pruning's
  dependency graph (Fang et al. 2023, "DepGraph", arXiv:2301.12900) finds those groups, so the result
  is a smaller dense model that runs faster on any kernel.
Both are followed by fine-tuning (`engine.train.fit(config, model=pruned)`).
"""
from __future__ import annotations

import torch


def prunable_layers(model: torch.nn.Module) -> list[tuple[torch.nn.Module, str]]:
    """(module, "weight") for every convolution and linear layer."""
    return [(module, "weight") for module in model.modules() if isinstance(module, (torch.nn.Conv2d, torch.nn.Linear))]


def prune_unstructured(model: torch.nn.Module, sparsity: float) -> torch.nn.Module:
    """Zero, in place, the `sparsity` fraction of convolution and linear weights of smallest magnitude across all
    layers (global L1); they stay zero during fine-tuning (a mask multiplied in), `make_permanent` folds the masks."""
    import torch.nn.utils.prune as prune

    if not 0.0 <= sparsity < 1.0:
        raise ValueError(f"sparsity must be in [0, 1), got {sparsity}")
    if sparsity > 0:
        for module, name in prunable_layers(model):  # channels_last weights cannot be flattened by view()
            getattr(module, name).data = getattr(module, name).data.contiguous()
        prune.global_unstructured(prunable_layers(model), pruning_method=prune.L1Unstructured, amount=sparsity)
    return model


def make_permanent(model: torch.nn.Module) -> torch.nn.Module:
    """Fold pruning masks into the weights (`weight = weight_orig * weight_mask`), leaving plain
    parameters that any exporter or optimizer understands."""
    import torch.nn.utils.prune as prune

    for module, name in prunable_layers(model):
        if prune.is_pruned(module) and hasattr(module, f"{name}_mask"):
            prune.remove(module, name)
    return model


def weight_sparsity(model: torch.nn.Module) -> float:
    """Fraction of convolution and linear weights that are exactly zero."""
    weights = [getattr(module, name) for module, name in prunable_layers(model)]
    return sum(int((weight == 0).sum()) for weight in weights) / max(sum(weight.numel() for weight in weights), 1)


def prune_channels(model: torch.nn.Module, ratio: float, example_inputs: torch.Tensor) -> torch.nn.Module:
    """Remove, in place, the `ratio` fraction of output channels of smallest L1 norm in every prunable group (Torch-
    Pruning traces `example_inputs` to find them), keeping the classifier's outputs: a smaller, faster dense model."""
    import torch_pruning

    if not 0.0 <= ratio < 1.0:
        raise ValueError(f"channel pruning ratio must be in [0, 1), got {ratio}")
    if ratio == 0:
        return model
    was_training = model.training
    model.eval()
    pruner = torch_pruning.pruner.MagnitudePruner(
        model, example_inputs, importance=torch_pruning.importance.MagnitudeImportance(p=1), pruning_ratio=ratio,
        ignored_layers=[model.get_classifier()] if hasattr(model, "get_classifier") else [])
    pruner.step()
    return model.train(was_training)
