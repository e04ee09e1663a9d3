"""Distributed data parallel setup: read torchrun's environment (WORLD_SIZE, RANK, LOCAL_RANK) and
start the process group, NCCL on GPUs and gloo on CPU. A plain `python` run is world size 1.
Apple's MPS has no collective backend, so DDP workers asked for mps train on the CPU.
See https://pytorch.org/docs/stable/notes/ddp.html.
"""
from __future__ import annotations

import dataclasses
import os

import torch
import torch.distributed as dist

from course_lib.config import Config
from course_lib.devices import resolve_device, unsupported_on


@dataclasses.dataclass
class Distributed:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    started_here: bool = False  # we called init_process_group, so we destroy it at the end

    @property
    def enabled(self) -> bool:
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def setup_distributed(config: Config) -> tuple[Distributed, torch.device]:
    """Read torchrun's environment (WORLD_SIZE, RANK, LOCAL_RANK); start the process group
    with NCCL on GPUs and gloo on CPU. A plain `python` run is world size 1."""
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    if world_size <= 1:
        return Distributed(), resolve_device(config.device)
    rank, local_rank = int(os.environ["RANK"]), int(os.environ.get("LOCAL_RANK", "0"))
    device = resolve_device(config.device, local_rank)
    if device.type == "mps":
        if rank == 0:
            print(f"device=mps under DDP: {unsupported_on(device, 'ddp')}", flush=True)
        device = torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    started_here = False
    if not dist.is_initialized():
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
        started_here = True
    return Distributed(rank, world_size, local_rank, started_here), device
