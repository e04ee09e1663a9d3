"""Measuring memory the same way on CPU and GPU.

On CUDA the caching allocator keeps a resettable peak (`torch.cuda.max_memory_allocated`).
torch's CPU allocator keeps no counter, so on CPU the peak is the process's peak resident set
(not resettable: it only grows during a kernel's life). For comparing settings within one process,
`saved_activation_bytes` counts the tensors autograd keeps for backward (the activations that
grow with batch size and shrink with fp16/bf16), via `torch.autograd.graph.saved_tensors_hooks`.
"""
from __future__ import annotations

import resource
import sys

import torch


def reset_peak_memory(device: torch.device) -> None:
    device = torch.device(device)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


def peak_memory_bytes(device: torch.device) -> int:
    """CUDA: peak bytes allocated by tensors since the last reset. CPU: the process's peak RSS."""
    device = torch.device(device)
    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device))
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(peak if sys.platform == "darwin" else peak * 1024)  # Linux reports KiB, macOS bytes


def peak_memory_kind(device: torch.device) -> str:
    return "cuda_max_allocated" if torch.device(device).type == "cuda" else "process_peak_rss"


def saved_activation_bytes(model: torch.nn.Module, images: torch.Tensor, autocast_context=None) -> int:
    """Bytes of the tensors autograd saves for backward in one forward pass of `images`
    (each storage counted once). Parameters saved by reference are excluded."""
    from contextlib import nullcontext

    parameter_storages = {p.untyped_storage().data_ptr() for p in model.parameters()}
    seen: dict[int, int] = {}

    def pack(tensor):
        storage = tensor.untyped_storage()
        pointer = storage.data_ptr()
        if pointer not in parameter_storages:
            seen[pointer] = storage.nbytes()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        with autocast_context or nullcontext():
            output = model(images)
    del output
    return int(sum(seen.values()))
