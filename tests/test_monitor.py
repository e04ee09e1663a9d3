"""The utilisation monitor takes the expected number of samples for a known duration, stops with the
run (also a failed one), and says why GPU figures are missing on a CPU."""
import threading
import time

import pytest
import torch
from conftest import tiny_config

from course_lib import ledger
from course_lib.engine import train
from course_lib.engine.monitor import (
    TIMELINE_FILE,
    UtilisationMonitor,
    downsample,
    sparkline,
    summary_line,
)


def monitor_threads():
    return [t for t in threading.enumerate() if t.name == "workbook-utilisation-monitor"]


def test_samples_within_one_of_the_duration_over_the_interval():
    interval, duration = 0.05, 0.6
    with UtilisationMonitor(interval, "cpu") as monitor:
        time.sleep(duration)
    expected = duration / interval + 1  # a sample at 0, then one per interval
    assert abs(len(monitor.samples) - expected) <= 1, len(monitor.samples)
    assert not monitor.running and not monitor_threads()
    gaps = [b["seconds"] - a["seconds"] for a, b in zip(monitor.samples, monitor.samples[1:])]
    assert max(gaps) < 3 * interval
    assert all(s["rss_bytes"] > 0 and s["cpu_percent"] >= 0 for s in monitor.samples)


def test_the_summary_names_what_a_cpu_cannot_measure():
    with UtilisationMonitor(0.02, "cpu") as monitor:
        sum(i * i for i in range(200_000))
    summary = monitor.summary()
    assert summary["monitor_gpu_note"].startswith("not measurable here")
    assert 0 <= summary["monitor_overhead_fraction"] < 1 and summary["monitor_peak_rss_bytes"] > 0
    assert "monitor_gpu_utilisation_mean" not in summary
    assert "GPU not measurable here" in summary_line(summary)


def test_a_run_shorter_than_one_interval_reports_no_cpu_share():
    """Issue 49 point 14: a 2 s run with monitor_interval=60 reported "CPU mean 0%" from its start-up sample."""
    with UtilisationMonitor(60, "cpu") as monitor:
        pass
    summary = monitor.summary()
    assert len(monitor.samples) == 1 and "monitor_cpu_percent_mean" not in summary
    assert summary["monitor_cpu_note"].startswith("not measured: the run ended within one interval (60 s)")
    line = summary_line(summary)
    assert "CPU mean" not in line and "CPU share not measured" in line and "peak RSS" in line


@pytest.mark.cuda(reason="NVML needs an NVIDIA GPU")
def test_on_cuda_nvml_gives_utilisation_memory_and_power():
    with UtilisationMonitor(0.05, "cuda") as monitor:
        torch.randn(2048, 2048, device="cuda").matmul(torch.randn(2048, 2048, device="cuda"))
        time.sleep(0.2)
    summary = monitor.summary()
    assert summary["monitor_gpu_peak_memory_bytes"] > 0 and 0 <= summary["monitor_gpu_utilisation_mean"] <= 100
    assert summary["monitor_gpu_power_watts_mean"] > 0


def test_the_engine_writes_the_timeline_and_the_ledger_summary(tmp_path):
    from test_train import tensor_bundle

    train.fit(tiny_config(tmp_path, monitor_interval=0.02, max_steps=3), bundle=tensor_bundle(), progress=False)
    lines = (tmp_path / "checkpoints" / TIMELINE_FILE).read_text().splitlines()
    assert lines[0] == "seconds,cpu_percent,rss_bytes" and len(lines) >= 2
    metrics = ledger.Ledger().rows(kind="train")[-1]["metrics"]
    assert metrics["monitor_samples"] == len(lines) - 1 and metrics["monitor_series"]
    assert not monitor_threads()


def test_the_monitor_stops_when_the_run_fails(tmp_path):
    from test_train import tensor_bundle

    bundle = tensor_bundle()
    bundle.device_stage = lambda images, device, train: images * float("nan")  # NaN inputs: the loss guard stops it
    with pytest.raises(train.NonFiniteLossError):
        train.fit(tiny_config(tmp_path, monitor_interval=0.02, max_steps=2), bundle=bundle, progress=False)
    assert not monitor_threads()
    assert (tmp_path / "checkpoints" / TIMELINE_FILE).exists()


def test_downsample_and_sparkline():
    assert downsample([1.0, 2.0, 3.0], points=5) == [1.0, 2.0, 3.0]
    assert downsample(list(range(10)), points=2) == [2.0, 7.0]
    assert sparkline([0, 1]) == "▁█" and sparkline([]) == ""


def test_a_zero_interval_is_refused():
    with pytest.raises(ValueError, match="above 0 seconds"):
        UtilisationMonitor(0)


@pytest.mark.parametrize("name, value", [("monitor_interval", -1.0), ("monitor_interval", 0.001),
                                         ("monitor_interval", 7200.0), ("vanishing_grad_norm", -1e-3),
                                         ("vanishing_grad_steps", 0), ("exploding_grad_factor", 0.5)])
def test_the_monitoring_switches_refuse_values_outside_their_range_in_one_line(name, value):
    from course_lib.config import ConfigError, make_config

    with pytest.raises(ConfigError) as error:
        make_config("smoke", **{name: value})
    message = str(error.value)
    assert message.startswith(f"{name} must be ") and f"got {value!r}" in message and "\n" not in message


def test_the_monitoring_switches_accept_their_edges_and_off():
    from course_lib.config import MONITOR_INTERVAL_RANGE, make_config

    for interval in (0.0, *MONITOR_INTERVAL_RANGE):
        assert make_config("smoke", monitor_interval=interval).monitor_interval == interval
    assert make_config("smoke", exploding_grad_factor=0.0, vanishing_grad_norm=0.0).exploding_grad_factor == 0.0
