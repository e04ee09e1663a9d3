"""storage=device: a whole split held as one uint8 tensor on the training device, batched there by
indexing with a shuffled permutation, with no DataLoader and no worker (airbench's loader, Keller
Jordan, arXiv:2404.00498; FFCV's in-memory mode, Leclerc et al. 2023). EuroSAT at 64 px is
27,000 x 3 x 64 x 64 bytes, about 330 MB: it fits in any GPU. The pixels come from the pre-decoded
cache (`cache.py`), so decoding happens once; augmentation then runs on whole batches on the same
device (`device_augment.DeviceAugment`). On a CPU the tensors stay resident in memory, which is the
same code path, tested there.
"""
from __future__ import annotations

import numpy as np
import torch


class ResidentSplit(torch.utils.data.Dataset):
    """A split as `images` (N, 3, H, W) uint8 and `targets` (N,) int64, kept on one device at a time
    (`on(device)` moves it once). It is also an ordinary map-style dataset (uint8 image, label), so
    evaluation code that builds its own DataLoader reads it unchanged."""

    def __init__(self, images: torch.Tensor, targets: torch.Tensor, classes: list):
        if images.dtype != torch.uint8 or images.ndim != 4 or images.shape[1] != 3:
            raise ValueError(f"a resident split holds uint8 (N, 3, H, W) images, got {images.dtype} {tuple(images.shape)}")
        self.images, self.targets_tensor, self.classes = images, targets.long(), list(classes)
        self.targets = self.targets_tensor.tolist()

    @classmethod
    def from_dataset(cls, dataset, classes: list) -> "ResidentSplit":
        """The uint8 images of a cached split (a `cache.PreDecodedDataset`, or a subset of one by
        rows) copied into one tensor: a single gather from the memmap, not one read per image."""
        from course_lib.data.cache import PreDecodedDataset

        rows = None
        while not isinstance(dataset, PreDecodedDataset):
            if not hasattr(dataset, "indices") or not hasattr(dataset, "dataset"):
                raise TypeError(f"storage=device reads the pre-decoded cache, not {type(dataset).__name__}")
            rows = np.asarray(dataset.indices) if rows is None else np.asarray(dataset.indices)[rows]
            dataset = dataset.dataset
        # One copy out of the read-only memmap into memory torch owns (fancy indexing copies too).
        pixels = np.array(dataset.pixels) if rows is None else dataset.pixels[rows]
        images = torch.from_numpy(pixels).permute(0, 3, 1, 2)
        labels = np.asarray(dataset.targets) if rows is None else np.asarray(dataset.targets)[rows]
        return cls(images.contiguous(), torch.as_tensor(labels), classes)

    def on(self, device: torch.device) -> "ResidentSplit":
        if self.images.device != torch.device(device):
            self.images, self.targets_tensor = self.images.to(device), self.targets_tensor.to(device)
        return self

    @property
    def nbytes(self) -> int:
        return self.images.numel() * self.images.element_size()

    def __len__(self) -> int:
        return len(self.targets)

    def __getitem__(self, index: int):
        return self.images[index], self.targets[index]


class ResidentBatches:
    """Batches of a ResidentSplit on `device`: each epoch (`set_epoch`) a permutation drawn from (seed, epoch) on the
    CPU (every rank and device agrees), this rank's every world_size-th share, batches by indexing. `sample_weights`
    (class_balance=sampler) replace the permutation by a draw with replacement (`class_balance.balanced_order`)."""

    generator = None  # the engine reseeds a DataLoader's generator each epoch; the order here is (seed, epoch)

    def __init__(self, split: ResidentSplit, batch_size: int, device, *, shuffle: bool, drop_last: bool,
                 seed: int = 0, rank: int = 0, world_size: int = 1, sample_weights: torch.Tensor | None = None):
        if sample_weights is not None and len(sample_weights) != len(split):
            raise ValueError(f"sample_weights has {len(sample_weights)} entries for {len(split)} images")
        self.split, self.batch_size, self.device = split.on(device), batch_size, torch.device(device)
        self.sample_weights = sample_weights
        self.shuffle, self.drop_last, self.seed, self.rank, self.world_size = shuffle, drop_last, seed, rank, world_size
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def _indices(self) -> torch.Tensor:
        count = len(self.split)
        if self.shuffle and self.sample_weights is not None:
            from course_lib.data.class_balance import balanced_order

            order = balanced_order(self.sample_weights, count, self.seed, self.epoch)
        elif self.shuffle:
            order = torch.randperm(count, generator=torch.Generator().manual_seed(self.seed + self.epoch))
        else:
            order = torch.arange(count)
        if self.drop_last and self.world_size > 1:
            order = order[: count // self.world_size * self.world_size]  # every rank the same number of images
        return order[self.rank::self.world_size]

    def __len__(self) -> int:
        images = len(self._indices())
        return images // self.batch_size if self.drop_last else -(-images // self.batch_size)

    def __iter__(self):
        indices = self._indices().to(self.device)
        stop = len(self) * self.batch_size
        for start in range(0, min(stop, len(indices)), self.batch_size):
            chosen = indices[start:start + self.batch_size]
            yield self.split.images.index_select(0, chosen), self.split.targets_tensor.index_select(0, chosen)
