"""The one training step: `training_step` + `optimizer_step` equal a hand-written step exactly,
with and without accumulation and clipping; GradScaler's skipped steps are reported; inner
micro-batches run under DDP's no_sync()."""
import contextlib
import copy

import pytest
import torch
import torch.nn.functional as F

from course_lib.engine.precision import grad_scaler
from course_lib.engine.step import optimizer_step, training_step


def small_model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.BatchNorm2d(8), torch.nn.ReLU(),
                               torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(8, 4))


def batch(count=8, seed=1):
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(count, 3, 8, 8, generator=generator), torch.randint(0, 4, (count,), generator=generator)


@pytest.mark.parametrize("accumulation_steps, clip_norm", [(1, 0.0), (2, 0.0), (4, 0.05)])
def test_training_step_equals_a_hand_written_step_exactly(accumulation_steps, clip_norm):
    by_hand, library = small_model(), small_model()
    hand_optimizer = torch.optim.SGD(by_hand.parameters(), lr=0.1, momentum=0.9)
    optimizer = torch.optim.SGD(library.parameters(), lr=0.1, momentum=0.9)
    scaler = grad_scaler("off", "cpu")
    for seed in range(3):  # three optimizer steps, so momentum is in play
        images, targets = batch(seed=seed)
        hand_losses = []
        for micro_images, micro_targets in zip(images.chunk(accumulation_steps), targets.chunk(accumulation_steps)):
            loss = F.cross_entropy(by_hand(micro_images), micro_targets)
            (loss / accumulation_steps).backward()
            hand_losses.append(loss.detach())
        if clip_norm:
            torch.nn.utils.clip_grad_norm_(by_hand.parameters(), clip_norm)
        hand_optimizer.step()
        hand_optimizer.zero_grad(set_to_none=True)

        losses = []
        for micro_images, micro_targets in zip(images.chunk(accumulation_steps), targets.chunk(accumulation_steps)):
            loss, logits = training_step(library, micro_images, micro_targets, F.cross_entropy, scaler,
                                         accumulation_steps=accumulation_steps)
            assert not loss.requires_grad and logits.shape == (len(micro_targets), 4)
            losses.append(loss)
        assert optimizer_step(optimizer, scaler, clip_norm=clip_norm) is False
        assert torch.equal(torch.stack(losses), torch.stack(hand_losses))
        assert all(p.grad is None for p in library.parameters())  # zero_grad(set_to_none=True)
    for (name, expected), actual in zip(by_hand.state_dict().items(), library.state_dict().values()):
        assert torch.equal(expected, actual), name


def test_optimizer_step_reports_a_step_gradscaler_skipped():
    model = small_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 8)  # enabled, as fp16 has it
    images, targets = batch()
    training_step(model, images, targets, F.cross_entropy, scaler)
    before = copy.deepcopy(model.state_dict())
    next(model.parameters()).grad[0] = float("inf")  # an overflowed gradient
    assert optimizer_step(optimizer, scaler) is True
    assert scaler.get_scale() == 2.0 ** 7  # halved after the skip
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())  # weights untouched
    training_step(model, images, targets, F.cross_entropy, scaler)
    assert optimizer_step(optimizer, scaler) is False


class CountingNoSync(torch.nn.Module):
    """Stands in for DistributedDataParallel: counts the backward passes run under no_sync()."""

    def __init__(self, module):
        super().__init__()
        self.module, self.unsynced = module, 0

    def forward(self, images):
        return self.module(images)

    @contextlib.contextmanager
    def no_sync(self):
        self.unsynced += 1
        yield


def test_only_unsynchronised_micro_steps_use_no_sync():
    model = CountingNoSync(small_model())
    scaler = grad_scaler("off", "cpu")
    images, targets = batch()
    training_step(model, images, targets, F.cross_entropy, scaler, sync_gradients=True)
    assert model.unsynced == 0
    training_step(model, images, targets, F.cross_entropy, scaler, sync_gradients=False)
    assert model.unsynced == 1
