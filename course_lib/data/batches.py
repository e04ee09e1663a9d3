"""The batches a run draws, wired in one place so the engine makes one trip to the data room: the training
split's sampler, loader and optimizer steps per epoch, the validation split's loader, class_balance's loss
weights and the whitening images, across the three storage kinds (a map-style dataset through a DataLoader,
a stream that splits itself, a split resident on the device). `distributed` is anything with `rank` and
`world_size` (the engine's `Distributed`); DistributedSampler follows https://pytorch.org/docs/stable/data.html.
"""
from __future__ import annotations

import torch
from torch.utils.data import DistributedSampler, Subset

from course_lib.config import Config, ConfigError
from course_lib.data import class_balance
from course_lib.data.loaders import make_loader
from course_lib.data.resident import ResidentBatches, ResidentSplit


def training_batches(dataset, config: Config, distributed, device: torch.device, num_classes: int):
    """(sampler or None, loader, optimizer steps per epoch) for the training split; class_balance=sampler
    draws its images class-balanced (`data.class_balance`)."""
    balanced = config.class_balance == "sampler"
    if isinstance(dataset, ResidentSplit):  # storage=device: batches cut on the device, no DataLoader
        weights = class_balance.sample_weights(dataset.targets, num_classes) if balanced else None
        batches = ResidentBatches(dataset, config.batch_size, device, shuffle=True, drop_last=True,
                                  seed=config.seed, rank=distributed.rank, world_size=distributed.world_size,
                                  sample_weights=weights)
        return batches, batches, _capped(len(batches) // config.accumulation_steps, config)
    if isinstance(dataset, torch.utils.data.IterableDataset):
        if config.class_balance != "none":
            raise ConfigError(f"class_balance={config.class_balance} needs the training labels up front, and "
                              f"{type(dataset).__name__} is a stream; use storage=cache or files")
        # A stream (tar shards) splits itself across ranks and workers: no sampler, and its len()
        # is what this rank's part yields. Its order comes from the stream's own shuffling, not
        # from (seed, epoch), so resuming such a run is not guaranteed to be exact.
        loader = make_loader(dataset, config, train=True)
        return None, loader, _capped(len(dataset) // (config.batch_size * config.accumulation_steps), config)
    # DistributedSampler even for one process, because its order depends only on (seed, epoch),
    # which is what makes resuming exact; the class-balanced sampler draws the same way.
    if balanced:
        sampler = class_balance.ClassBalancedSampler(class_balance.training_targets(dataset), num_classes,
                                                     num_replicas=distributed.world_size, rank=distributed.rank,
                                                     seed=config.seed)
    else:
        sampler = DistributedSampler(dataset, num_replicas=distributed.world_size, rank=distributed.rank,
                                     shuffle=True, seed=config.seed, drop_last=True)
    loader = make_loader(dataset, config, train=True, sampler=sampler)
    return sampler, loader, _capped(len(loader) // config.accumulation_steps, config)


def _capped(steps: int, config: Config) -> int:
    """max_steps caps the optimizer steps per epoch (0: no cap), as `engine.schedule.steps_per_epoch` counts them."""
    return min(steps, config.max_steps) if config.max_steps else steps


def validation_batches(dataset, config: Config, distributed, device: torch.device | None = None):
    """The loader that scores `dataset` (validation or test) on this rank, in order, every image once across
    the ranks; None for a missing or empty split."""
    if dataset is None:
        return None
    if isinstance(dataset, ResidentSplit):
        return ResidentBatches(dataset, config.batch_size, device or dataset.images.device, shuffle=False, drop_last=False,
                               rank=distributed.rank, world_size=distributed.world_size) if len(dataset) else None
    if isinstance(dataset, torch.utils.data.IterableDataset):  # a stream splits itself across ranks
        return make_loader(dataset, config, train=False)
    if not len(dataset):
        return None
    # Each rank evaluates every world_size-th image: no padding, no duplicates.
    part = Subset(dataset, range(distributed.rank, len(dataset), distributed.world_size))
    return make_loader(part, config, train=False)


def loss_weights(dataset, config: Config, num_classes: int, device: torch.device) -> torch.Tensor | None:
    """class_balance=weighted_loss: the inverse-frequency class weights of the training split
    (`data.class_balance.class_weights`) on `device`; None otherwise."""
    if config.class_balance != "weighted_loss":
        return None
    counts = class_balance.class_counts(class_balance.training_targets(dataset), num_classes)
    return class_balance.class_weights(counts).to(device)


def whitening_batches(bundle, config: Config, device: torch.device, limit: int):
    """Batches of up to `limit` training images drawn from (seed), normalised as the model sees them at
    evaluation (`device_stage(train=False)`; a split whose loader augments gives augmented images). A stream
    gives its first images."""
    dataset = bundle.train
    if not isinstance(dataset, torch.utils.data.IterableDataset):
        order = torch.randperm(len(dataset), generator=torch.Generator().manual_seed(config.seed))
        chosen = order[:limit]
        if isinstance(dataset, ResidentSplit):  # already on the device: cut batches there, no loader
            for start in range(0, len(chosen), config.batch_size):
                rows = chosen[start:start + config.batch_size].to(dataset.images.device)
                yield bundle.device_stage(dataset.images.index_select(0, rows), device, train=False)
            return
        dataset = Subset(dataset, chosen.tolist())
    seen = 0
    for images, _ in make_loader(dataset, config, train=False, drop_last=False):
        yield bundle.device_stage(images, device, train=False)[:limit - seen]
        seen += len(images)
        if seen >= limit:
            return
