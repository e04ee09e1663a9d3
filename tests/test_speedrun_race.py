"""The time-to-accuracy race: its clock, its curve and its milestones."""
import time

import pytest
from conftest import TensorImages, tiny_config

from course_lib.data.datasets import DataBundle
from course_lib.engine import speedrun


def test_the_clock_pauses_while_measuring():
    clock = speedrun.Clock()
    with clock.paused():
        time.sleep(0.2)
    assert clock.seconds() < 0.15 and clock.excluded >= 0.2


def test_a_race_records_a_curve_milestones_and_a_ledger_row(tmp_path):
    from course_lib import ledger

    bundle = DataBundle(TensorImages(64, 3, 16), TensorImages(32, 3, 16, seed=1), TensorImages(16, 3, 16, seed=2),
                        ["a", "b", "c"], "tensors")
    result = speedrun.race(tiny_config(tmp_path, epochs=3, batch_size=16, tta_views=2), bundle=bundle,
                           label="tiny", progress=False, verbose=False)
    assert [p["epoch"] for p in result.curve] == [1, 2, 3]
    assert all(b["seconds"] >= a["seconds"] for a, b in zip(result.curve, result.curve[1:]))
    assert 0 <= result.val_top1 <= 1 and result.test_top1 is not None
    first = next((p["seconds"] for p in result.curve if p["val_top1"] >= 0.0), None)
    assert result.time_to(0.0) == first and result.time_to(1.01) is None
    row = ledger.Ledger().rows(kind="speedrun")[0]
    assert row["name"] == "tiny" and len(row["metrics"]["curve"]) == 3


def test_a_budget_stops_at_the_step_that_passes_it(tmp_path):
    bundle = DataBundle(TensorImages(64, 3, 16), TensorImages(32, 3, 16, seed=1), None, ["a", "b", "c"], "tensors")
    config = tiny_config(tmp_path, epochs=5, batch_size=8)
    result = speedrun.race(config, bundle=bundle, budget_seconds=0.0, progress=False, verbose=False, record=False)
    assert len(result.curve) == 1  # a zero budget is spent after the first optimizer step...
    assert result.curve[0]["epoch"] == pytest.approx(1 / (64 // 8))  # ...one eighth of the first epoch
    assert result.row()["epochs"] == 1 and result.row()["s to 97%"] is None
    long = speedrun.race(config, bundle=bundle, budget_seconds=None, progress=False, verbose=False, record=False)
    assert [p["epoch"] for p in long.curve] == [1, 2, 3, 4, 5]


def test_the_race_table_puts_mfu_beside_each_racers_speed(tmp_path, monkeypatch):
    from course_lib.chapters import time_to_accuracy
    from course_lib.measure import flops, peak

    bundle = DataBundle(TensorImages(64, 3, 16), TensorImages(32, 3, 16, seed=1), None, ["a", "b", "c"], "tensors")
    result = speedrun.race(tiny_config(tmp_path, epochs=1), bundle=bundle, progress=False, verbose=False, record=False)
    assert result.num_classes == 3
    monkeypatch.setattr(peak, "peak_flops", lambda device, dtype: 1e12)  # a known peak: 1 TFLOP/s
    table = time_to_accuracy.race_table([result])
    import timm

    per_image = flops.training_flops_per_image(timm.create_model(result.config.model, num_classes=3),
                                               result.config.image_size)
    assert table.loc[result.label, "MFU"] == pytest.approx(per_image * result.images_per_second / 1e12)
