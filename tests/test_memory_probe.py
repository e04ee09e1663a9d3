"""The measured peak of one training step against the estimate, and the estimate-vs-measured sweep."""
import pytest

from course_lib.measure import memory_probe


def test_estimate_within_25_percent_of_measured_peak_on_cpu():
    # Batches where the activations outweigh a CPU's fixed temporaries: on a 2-core AMD EPYC a step also holds about
    # 5 MB that no shape explains (oneDNN's scratch and weight copies; resnet18 at 32 px measured 1.44x its
    # estimate there), so test_resnet at 32 px, batch 2 read 0.51 while an Intel Xeon read about 1.0. At 64 px,
    # batches 8 and 32: 0.91 and 0.99 on that EPYC.
    rows = memory_probe.compare_estimate_and_peak("test_resnet", 64, [8, 32], optimizer="sgd")
    for row in rows:
        assert row["estimate_over_measured"] == pytest.approx(1.0, abs=0.25), row


def test_the_sweep_measures_every_plan_and_counts_each_step(capsys):
    plans = [dict(model="test_resnet", image_size=32, batch_sizes=[2, 4]),
             dict(model="test_resnet", image_size=16, batch_sizes=[2])]
    rows = memory_probe.run_sweep(plans)
    assert [(r["image_size"], r["batch_size"]) for r in rows] == [(32, 2), (32, 4), (16, 2)]
    assert all(r["measured_peak_bytes"] for r in rows)
    assert "memory sweep: 3/3 steps (100%)" in capsys.readouterr().err  # plain lines when not a terminal
