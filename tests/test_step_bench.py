"""The step harness: one way to copy a model, build its optimizer, scaler and batch, and time a step."""
import pytest
import timm
import torch

from course_lib.engine import auto_precision
from course_lib.engine.step_bench import StepBench


@pytest.fixture(scope="module")
def tiny():
    torch.manual_seed(0)
    return timm.create_model("test_resnet", num_classes=3)


@pytest.mark.parametrize("precision", ["off", "bf16"])
def test_times_a_tiny_model_and_leaves_its_weights_alone(tiny, precision):
    before = {k: v.clone() for k, v in tiny.state_dict().items()}
    bench = StepBench(tiny, image_size=16, batch_size=4, device="cpu", num_classes=3, lr=0.1)
    timed = bench.variant(precision=precision)
    assert timed.model is not tiny
    timing = timed.time(repeats=3, warmup=1)
    assert len(timing.seconds) == 3 and all(s > 0 for s in timing.seconds)
    assert timing.images_per_second == pytest.approx(4 / timing.median)
    assert timing.best <= timing.median
    after = tiny.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)  # the copy trained, not the original
    assert any(not torch.equal(before[k], v) for k, v in timed.model.state_dict().items())


def test_warmup_steps_are_not_in_the_repeats(tiny, monkeypatch):
    timed = StepBench(tiny, 16, 2, "cpu", 3).variant(channels_last=True)
    assert timed.images.is_contiguous(memory_format=torch.channels_last)
    steps = []
    real = timed.step
    monkeypatch.setattr(timed, "step", lambda **k: steps.append(1) or real(**k))
    timing = timed.time(repeats=2, warmup=3, calls=2)
    assert len(steps) == 3 + 2 * 2 and len(timing.seconds) == 2 and timing.timing.warmup == 3


def test_a_variant_refuses_auto_and_redraws_its_batch(tiny):
    bench = StepBench(tiny, 16, 2, "cpu", 3)
    with pytest.raises(ValueError, match="auto"):
        bench.variant(precision="auto")
    timed = bench.variant()
    assert timed.redraw(5).batch_size == 5 and timed.time(repeats=1, warmup=0).batch_size == 5


@pytest.mark.parametrize("device", ["cpu", "cuda", "mps"])
@pytest.mark.parametrize("precision", ["off", "fp16", "bf16"])
def test_supported_answers_for_each_device_and_precision(device, precision):
    answer = auto_precision.supported(precision, device)
    assert isinstance(answer, bool)
    if precision == "off" or device == "cpu":
        assert answer
    if device == "cuda" and not torch.cuda.is_available():
        assert answer is (precision == "off")
    if device == "mps" and not torch.backends.mps.is_available():
        assert answer is (precision == "off")


def test_supported_refuses_unknown_names():
    with pytest.raises(ValueError, match="not one of"):
        auto_precision.supported("fp8", "cpu")


def test_the_reduced_precision_rule():
    assert auto_precision.reduced_precision("cpu") == "bf16"
    assert auto_precision.reduced_precision("cpu", {"off": 1.0, "bf16": 2.0, "fp16": 1.5}) == "fp16"
    assert auto_precision.reduced_precision("cpu", {"off": 1.0, "bf16": None, "fp16": None}) == "bf16"
