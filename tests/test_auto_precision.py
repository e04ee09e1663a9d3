"""precision=auto from measured training steps, not from a matmul."""
import json

import pytest
import timm
import torch
from conftest import TensorImages, tiny_config

from course_lib.data.datasets import DataBundle
from course_lib.engine import auto_precision, train


@pytest.mark.parametrize("seconds, expected", [
    ({"off": 1.0, "bf16": 0.5, "fp16": 0.6}, "bf16"),
    ({"off": 1.0, "bf16": 0.95, "fp16": 0.97}, "off"),  # within the 10% margin: not worth the casts
    ({"off": 1.0, "bf16": 0.7, "fp16": 0.4}, "fp16"),  # fp16 clearly faster
    ({"off": 1.0, "bf16": 0.44, "fp16": 0.4}, "bf16"),  # bf16 within 10% of fp16: no GradScaler needed
    ({"off": 1.0, "bf16": None, "fp16": 5.0}, "off"),  # bf16 hopeless, fp16 slower
])
def test_the_rule_on_measured_seconds(seconds, expected):
    assert auto_precision.decide(seconds) == expected


def test_choose_times_the_model_and_caches(monkeypatch):
    model = timm.create_model("test_resnet", num_classes=3)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    auto_precision._cache.clear()
    choice, seconds = auto_precision.choose_precision(model, 32, 3, torch.device("cpu"), batch_size=4)
    assert choice in auto_precision.CANDIDATES and seconds["off"] > 0
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())  # probed on a copy
    calls = []
    monkeypatch.setattr(auto_precision, "step_seconds", lambda *a, **k: calls.append(1))
    assert auto_precision.choose_precision(model, 32, 3, torch.device("cpu"), batch_size=4) == (choice, seconds)
    assert not calls  # the second ask is answered from the cache
    assert "precision auto:" in auto_precision.describe(choice, seconds)


def test_a_hopeless_candidate_is_not_timed_further():
    model = timm.create_model("test_resnet", num_classes=3)
    images, targets = torch.randn(2, 3, 16, 16), torch.tensor([0, 1])
    assert auto_precision.step_seconds(model, images, targets, "off", give_up_after=0.0) is None
    assert auto_precision.step_seconds(model, images, targets, "off", repeats=2) > 0


def test_a_candidate_hopeless_on_two_images_is_never_timed_on_the_probe_batch(monkeypatch):
    """fp16's convolution backward on a Xeon with AVX512-FP16 took 32 s for one step of 32 images at 80 px
    (fp32: 0.25 s), paid by every new decision of the speed-run recipes; a two-image scout finds it."""
    per_image = {"off": 0.01, "bf16": 0.006, "fp16": 1.3}  # seconds a step takes per image, as on that Xeon
    timed = []

    def step_seconds(model, images, targets, precision, **kwargs):
        timed.append((precision, len(images)))
        return per_image[precision] * len(images)

    monkeypatch.setattr(auto_precision, "step_seconds", step_seconds)
    images, targets = torch.randn(32, 3, 16, 16), torch.zeros(32, dtype=torch.long)
    assert auto_precision._candidate_seconds(None, images, targets, "fp16", give_up_after=3.2) is None
    assert ("fp16", 32) not in timed and ("fp16", auto_precision.SCOUT_IMAGES) in timed
    assert auto_precision._candidate_seconds(None, images, targets, "bf16", give_up_after=3.2) == pytest.approx(0.192)
    assert ("bf16", 32) in timed


def test_the_engine_logs_the_measurement_and_trains_in_the_choice(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(auto_precision, "choose_precision", lambda *a, **k: ("off", {"off": 0.1, "bf16": 0.2,
                                                                                      "fp16": None}))
    bundle = DataBundle(TensorImages(64, 3, 16), TensorImages(16, 3, 16, seed=1), None, ["a", "b", "c"], "tensors")
    result = train.fit(tiny_config(tmp_path, precision="auto", batch_size=8, max_steps=1), bundle=bundle,
                       progress=False)
    assert result.precision == "off"
    assert "precision auto: fp32 (one training step: fp32 100 ms, bf16 200 ms, fp16 too slow" in capsys.readouterr().out


def test_auto_is_decided_once_per_machine_and_said_so(tmp_path, monkeypatch):
    """Issue 49 point 14: two identical runs started together on a busy machine timed their steps under
    different loads and trained in different precisions. The first decision is kept on disk; the next process
    (here: an emptied memory cache) reads it back instead of timing again, and its log line says when it was made
    and how to measure again. A damaged file is measured afresh."""
    model = timm.create_model("test_resnet", num_classes=3)
    timings = iter([0.10, 0.05, 0.20, 0.10])  # fp32, bf16, fp16, fp32 again: bf16 is twice as fast
    monkeypatch.setattr(auto_precision, "step_seconds", lambda *a, **k: next(timings))
    monkeypatch.setattr(auto_precision, "_candidate_seconds", lambda *a, **k: next(timings))
    auto_precision._cache.clear()
    auto_precision._decided.clear()
    assert auto_precision.choose_precision(model, 32, 3, torch.device("cpu"), batch_size=4)[0] == "bf16"
    saved = json.loads(auto_precision.decisions_path().read_text())
    assert [entry["choice"] for entry in saved.values()] == ["bf16"]
    auto_precision._cache.clear()  # a new process: only the file remembers
    monkeypatch.setattr(auto_precision, "step_seconds", lambda *a, **k: pytest.fail("timed again"))
    assert auto_precision.choose_precision(model, 32, 3, torch.device("cpu"), batch_size=4)[0] == "bf16"
    lines = []
    auto_precision.resolve("auto", model, 32, 3, "cpu", batch_size=4, log=lines.append)
    assert "precision auto: bf16" in lines[0] and "decided on this machine" in lines[0] and "delete it" in lines[0]
    auto_precision._cache.clear()
    auto_precision.decisions_path().write_text("{not json")
    timings = iter([0.10, 0.20, 0.20, 0.10])  # now fp32 wins
    monkeypatch.setattr(auto_precision, "step_seconds", lambda *a, **k: next(timings))
    monkeypatch.setattr(auto_precision, "_candidate_seconds", lambda *a, **k: next(timings))
    assert auto_precision.choose_precision(model, 32, 3, torch.device("cpu"), batch_size=4)[0] == "off"


def test_a_decision_timed_on_a_busy_machine_is_timed_again_once_it_is_quiet(tmp_path, monkeypatch):
    """A decision timed under a load of 5-11 on 2 cores kept a quiet machine in fp32 where bf16 ran 1.78x as fast:
    it is kept for runs as crowded as it was, and measured again (and replaced) by the first run on a quiet one."""
    model = timm.create_model("test_resnet", num_classes=3)
    monkeypatch.setattr("course_lib.devices.usable_cores", lambda: 2)
    loads = iter([(9.0, 0, 0), (7.0, 0, 0), (1.0, 0, 0), (1.0, 0, 0)])
    monkeypatch.setattr("os.getloadavg", lambda: next(loads))
    timings = iter([0.10, 0.10, 0.20, 0.10, 0.10, 0.05, 0.20, 0.10])  # busy: a tie, fp32; quiet: bf16 twice as fast
    monkeypatch.setattr(auto_precision, "step_seconds", lambda *a, **k: next(timings))
    monkeypatch.setattr(auto_precision, "_candidate_seconds", lambda *a, **k: next(timings))
    auto_precision._cache.clear()
    auto_precision._decided.clear()
    assert auto_precision.choose_precision(model, 32, 3, torch.device("cpu"), batch_size=4)[0] == "off"
    assert [entry["busy_load"] for entry in json.loads(auto_precision.decisions_path().read_text()).values()] == [9.0]
    auto_precision._cache.clear()  # a new process, as crowded: the busy decision is read back, and said so
    assert auto_precision.choose_precision(model, 32, 3, torch.device("cpu"), batch_size=4)[0] == "off"
    assert "under a load average of 9.0" in next(iter(auto_precision._decided.values()))
    auto_precision._cache.clear()  # a new process on a quiet machine: timed again, and the file says so
    assert auto_precision.choose_precision(model, 32, 3, torch.device("cpu"), batch_size=4)[0] == "bf16"
    saved = list(json.loads(auto_precision.decisions_path().read_text()).values())
    assert [(entry["choice"], entry["busy_load"]) for entry in saved] == [("bf16", None)]
    auto_precision._cache.clear()  # and from then on read back
    monkeypatch.setattr(auto_precision, "step_seconds", lambda *a, **k: pytest.fail("timed again"))
    assert auto_precision.choose_precision(model, 32, 3, torch.device("cpu"), batch_size=4)[0] == "bf16"
