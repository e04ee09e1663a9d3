"""DataLoader factory with the articles' knobs (num_workers, pin_memory, prefetch_factor,
persistent_workers). See https://pytorch.org/docs/stable/data.html#torch.utils.data.DataLoader.
"""
from __future__ import annotations

import torch
from torch.utils.data import DataLoader

from course_lib.config import Config


def make_loader(dataset, config: Config, *, train: bool, sampler=None, drop_last: bool | None = None,
                batch_size: int | None = None) -> DataLoader:
    """One DataLoader built from the config's knobs; `sampler` (e.g. DistributedSampler)
    replaces shuffling. Knobs that only matter with workers are dropped at num_workers=0,
    where torch refuses them."""
    workers = config.num_workers
    generator = torch.Generator().manual_seed(config.seed)
    extra = {}
    if workers > 0:
        extra = dict(prefetch_factor=config.prefetch_factor, persistent_workers=config.persistent_workers)
    return DataLoader(
        dataset,
        batch_size=batch_size or config.batch_size,
        shuffle=train and sampler is None,
        sampler=sampler,
        num_workers=workers,
        pin_memory=config.pin_memory and torch.cuda.is_available(),
        drop_last=train if drop_last is None else drop_last,
        generator=generator,
        **extra,
    )
