"""Notebook 14's chapter module: the trace of the engine's step parses and holds its forward and backward
regions, activation checkpointing lowers the measured peak, and the claims say why a CPU cannot score
GPU utilisation."""
import json

import pandas as pd
import pytest
import torch
from conftest import tiny_config

from course_lib.analysis import claims as claim_records
from course_lib.chapters import profiling
from course_lib.config import ConfigError
from course_lib.engine import train
from course_lib.models import factory


@pytest.fixture(scope="module")
def epoch_profile(tmp_path_factory):
    folder = tmp_path_factory.mktemp("profile")
    return profiling.profile_epoch(tiny_config(folder, max_steps=3), folder, "files", monitor_interval=0.05)


def test_the_trace_parses_and_holds_each_steps_forward_and_backward(epoch_profile):
    trace = json.loads(epoch_profile.trace_path.read_text())  # valid JSON: what Perfetto and chrome://tracing read
    names = [event.get("name") for event in trace["traceEvents"]]
    assert names.count("forward") == 3 and names.count("backward") == 3 and names.count("optimizer") == 3
    events = profiling.phase_events(epoch_profile.trace_path)
    assert set(events["phase"]) == set(profiling.PHASES)
    assert (events["duration ms"] > 0).all() and events["start ms"].is_monotonic_increasing
    # each step's forward comes before its backward
    forward, backward = (events[events["phase"] == p]["start ms"].to_numpy() for p in ("forward", "backward"))
    assert (forward < backward).all()


def test_the_phase_table_counts_each_region_once_per_step_and_adds_up_to_the_epoch(epoch_profile):
    phases = epoch_profile.phases
    assert phases.loc[["forward", "backward", "optimizer"], "calls"].tolist() == [3, 3, 3]
    assert phases["share of epoch"].sum() == pytest.approx(1.0, abs=0.05)
    assert not epoch_profile.operators.empty and epoch_profile.monitor["monitor_samples"] >= 1


def test_a_trace_without_the_engines_regions_is_refused(tmp_path):
    path = tmp_path / "other.json"
    path.write_text(json.dumps({"traceEvents": [{"ph": "X", "name": "aten::mm", "ts": 0, "dur": 1}]}))
    with pytest.raises(ValueError, match="none of the regions"):
        profiling.phase_events(path)


def test_checkpointing_lowers_the_measured_peak(tmp_path):
    config = tiny_config(tmp_path, image_size=32, batch_size=16)
    table = profiling.checkpointing_table(config, 4, "cpu", repeats=1)
    assert table.loc["on", "step peak MiB"] < table.loc["off", "step peak MiB"]
    assert table.loc["off", "peak vs off"] == 1.0 and table.loc["on", "time vs off"] > 0


def test_a_model_without_checkpointing_is_named(tmp_path):
    config = tiny_config(tmp_path, model="speedrun_resnet_tiny")  # the workbook's own net: no timm checkpointing switch
    assert not hasattr(factory.build_model(config, 4), "set_grad_checkpointing")
    with pytest.raises(ConfigError, match="has no set_grad_checkpointing"):
        profiling.checkpointing_table(config, 4, "cpu", repeats=1)


def test_claims_on_a_cpu(tmp_path):
    comparison = pd.DataFrame({"data wait share": [0.30, 0.05], "GPU utilisation % mean": [None, None]},
                              index=["storage=files", "storage=cache"])
    fitted = train.FitResult(model=torch.nn.Identity(), history=[], classes=[], config=tiny_config(tmp_path),
                             checkpoint_path=None,
                             grad_norms=[{"epoch": 1, "step": s, "global_step": s, "grad_norm": 1.0} for s in (1, 2)])
    records = {c.key: c for c in profiling.claims(comparison, fitted, "cpu")}
    assert records["untuned_utilisation"].verdict == claim_records.NOT_MEASURABLE
    assert "NVML" in records["tuned_utilisation"].reason
    assert records["data_wait_stand_in"].verdict == claim_records.HOLDS
    assert records["data_wait_stand_in"].measured == pytest.approx(25.0)
    assert records["watch_gradient_norms"].verdict == claim_records.HOLDS
    exploding = dataclasses_replace(fitted, grad_norms=fitted.grad_norms + [
        {"epoch": 1, "step": 3, "global_step": 3, "grad_norm": 100.0}])
    assert {c.key: c for c in profiling.claims(comparison, exploding, "cpu")}["watch_gradient_norms"].verdict \
        == claim_records.NOT_SHOWN  # an unhealthy run cannot show the detectors staying quiet


def dataclasses_replace(result, **changes):
    import dataclasses

    return dataclasses.replace(result, **changes)


def test_the_cuda_memory_snapshot_is_cudas_only(tmp_path):
    config = tiny_config(tmp_path, max_steps=2)
    assert profiling.cuda_memory_snapshot(config, tmp_path / "cpu.pickle") is None
    assert not (tmp_path / "cpu.pickle").exists()


@pytest.mark.cuda(reason="the allocator history is CUDA's")
def test_on_cuda_the_snapshot_is_written_for_memory_viz(tmp_path):
    import pickle

    path = profiling.cuda_memory_snapshot(tiny_config(tmp_path, device="cuda", max_steps=2), tmp_path / "s.pickle")
    snapshot = pickle.loads(path.read_bytes())
    assert snapshot["segments"] and snapshot["device_traces"]


def test_a_region_opens_only_while_a_profiler_runs():
    from contextlib import nullcontext

    from torch.profiler import profile, record_function

    from course_lib.engine.step import region

    assert isinstance(region("forward"), nullcontext)
    with profile():
        assert isinstance(region("forward"), record_function)
