"""The engine's one entry to the data (`data.batches`): the training split's sampler, loader and steps per
epoch and the validation split's share per rank, for map-style datasets, streams and resident splits."""
from types import SimpleNamespace

import pytest
import torch
from conftest import TensorImages, tiny_config

from course_lib.config import ConfigError
from course_lib.data.batches import training_batches, validation_batches
from course_lib.data.datasets import DataBundle
from course_lib.data.resident import ResidentBatches, ResidentSplit
from course_lib.engine import schedule, train

CLASSES = [f"class{i}" for i in range(4)]


def ranks(world_size):
    """Stand-ins for the engine's Distributed: the data reads only rank and world_size."""
    return [SimpleNamespace(rank=rank, world_size=world_size) for rank in range(world_size)]


@pytest.mark.parametrize("world_size, accumulation_steps, max_steps", [(1, 1, 0), (2, 1, 0), (2, 2, 0), (1, 1, 3)])
def test_steps_per_epoch_follow_the_schedules_rule(tmp_path, world_size, accumulation_steps, max_steps):
    config = tiny_config(tmp_path, batch_size=8, accumulation_steps=accumulation_steps, max_steps=max_steps)
    for distributed in ranks(world_size):
        sampler, loader, steps = training_batches(TensorImages(70), config, distributed, torch.device("cpu"), 4)
        assert isinstance(sampler, torch.utils.data.DistributedSampler) and loader.sampler is sampler
        assert steps == schedule.steps_per_epoch(70, config, world_size)


def test_validation_gives_each_rank_every_world_size_th_image_once(tmp_path):
    config = tiny_config(tmp_path, batch_size=4)
    shares = [[int(target) for _, targets in validation_batches(TensorImages(10, num_classes=10), config, rank)
               for target in targets] for rank in ranks(3)]
    assert shares == [[0, 3, 6, 9], [1, 4, 7], [2, 5, 8]]  # no padding, no duplicates
    assert validation_batches(None, config, ranks(1)[0]) is None
    assert validation_batches(TensorImages(0), config, ranks(1)[0]) is None


def test_a_resident_split_is_its_own_sampler_and_loader(tmp_path):
    split = ResidentSplit(torch.zeros(20, 3, 4, 4, dtype=torch.uint8), torch.arange(20) % 4, CLASSES)
    config = tiny_config(tmp_path, batch_size=4)
    sampler, loader, steps = training_batches(split, config, ranks(2)[1], torch.device("cpu"), 4)
    assert isinstance(loader, ResidentBatches) and sampler is loader and steps == len(loader) == 2
    assert isinstance(validation_batches(split, config, ranks(1)[0]), ResidentBatches)


class StreamOfTensors(torch.utils.data.IterableDataset):
    """A stream with a length (like tar shards): yields `count` images, counting what was read."""

    def __init__(self, count, length=None):
        self.images, self.length, self.reads = TensorImages(count), count if length is None else length, 0

    def __len__(self):
        return self.length

    def __iter__(self):
        for index in range(len(self.images)):
            self.reads += 1
            yield self.images[index]


@pytest.mark.parametrize("accumulation_steps, expected_steps", [(1, 4), (2, 2)])
def test_a_stream_with_a_length_trains_for_len_over_the_batch(tmp_path, accumulation_steps, expected_steps):
    stream = StreamOfTensors(72)  # 72 // (16 x accumulation_steps) steps; the rest is not read
    bundle = DataBundle(stream, TensorImages(16, seed=1), None, CLASSES, "stream")
    config = tiny_config(tmp_path, epochs=2, accumulation_steps=accumulation_steps)
    assert train.prepare(config, bundle, verbose=False).sampler is None  # the stream splits itself
    result = train.fit(config, bundle=bundle, progress=False, verbose=False)
    assert [row["optimizer_steps"] for row in result.history] == [expected_steps] * 2
    assert len(result.step_log) == 2 * expected_steps
    assert stream.reads == 2 * 64  # two epochs of 64 images, each a fresh pass over the stream


def test_a_stream_shorter_than_its_length_is_a_one_line_error(tmp_path):
    bundle = DataBundle(StreamOfTensors(40, length=64), TensorImages(16), None, CLASSES, "short stream")
    with pytest.raises(ConfigError, match="ended after 2 batches of 16; its length \\(64\\) promised 4"):
        train.fit(tiny_config(tmp_path), bundle=bundle, progress=False, verbose=False)
