"""The non-finite loss guard names the first bad optimizer step (not the micro-batch) and the
likely causes for the precision in use."""
import pytest
import torch

from course_lib.engine.loss_guard import LossGuard, NonFiniteLossError


def add_steps(guard, steps, accumulation_steps, bad_index=None):
    for index in range(steps * accumulation_steps):
        guard.add(torch.tensor(float("nan") if index == bad_index else 1.0 + index))


def test_finite_losses_come_back_in_order_and_are_forgotten():
    guard = LossGuard(accumulation_steps=2, lr=0.1, precision="off")
    add_steps(guard, 3, 2)
    values = guard.check(epoch=0, step=3)
    assert values.tolist() == [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]
    assert guard.pending == []


@pytest.mark.parametrize("accumulation_steps, bad_index, expected_step", [(1, 0, 4), (1, 3, 7), (2, 4, 6),
                                                                          (2, 5, 6), (4, 7, 5)])
def test_the_message_names_the_optimizer_step_of_the_first_bad_loss(accumulation_steps, bad_index, expected_step):
    guard = LossGuard(accumulation_steps, lr=0.1, precision="off")
    add_steps(guard, 3, accumulation_steps)
    guard.check(epoch=1, step=3)  # steps 1-3 were fine
    add_steps(guard, 4, accumulation_steps, bad_index)  # steps 4-7
    with pytest.raises(NonFiniteLossError, match=rf"loss became nan at epoch 2, step {expected_step};"):
        guard.check(epoch=1, step=7)


@pytest.mark.parametrize("precision, cause", [("off", "exploding gradients (try grad_clip_norm=1.0)"),
                                              ("fp16", "fp16 overflow (try precision=bf16 or off)"),
                                              ("bf16", "fp16/bf16 overflow (try precision=off)")])
def test_the_causes_fit_the_precision(precision, cause):
    guard = LossGuard(1, lr=0.5, precision=precision)
    guard.add(torch.tensor(float("inf")))
    with pytest.raises(NonFiniteLossError) as caught:
        guard.check(epoch=0, step=1)
    message = str(caught.value)
    assert "loss became inf at epoch 1, step 1" in message and "lr=0.5" in message
    assert "not normalized" in message and cause in message
