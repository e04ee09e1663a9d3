"""The all-reduce sweep (`engine.allreduce`, issue 47 point 3): nccl-tests' bandwidths, where a message turns from
latency- to bandwidth-bound, what a step's gradient costs, the NCCL settings and the NVLink claim, `workbook
doctor`'s line, and a real two-process sweep on gloo."""
import pandas as pd
import pytest

from course_lib import ledger, machine
from course_lib.analysis import claims
from course_lib.chapters import ddp_scaling
from course_lib.engine import allreduce
from course_lib.measure import doctor

MIB = allreduce.MIB


def sweep_metrics(seconds_of, world_size=2, backend="gloo", device="cpu", repeats=3):
    """A sweep's ledger metrics whose one all-reduce of `size` bytes takes `seconds_of(size)` in every repeat."""
    rows = []
    for size in allreduce.SIZES:
        seconds = seconds_of(size)
        algorithm = size / seconds / 1e9
        rows.append({"bytes": size, "seconds": seconds, "algbw_gb_per_s": algorithm,
                     "busbw_gb_per_s": algorithm * allreduce.bus_factor(world_size), "repeats": repeats,
                     "seconds_all": [seconds * (1 + 0.01 * k) for k in range(repeats)]})
    return {"rows": rows, "backend": backend, "device": device, "world_size": world_size}


def link(latency=1e-4, gb_per_s=1.0):
    """An alpha-beta link: a fixed latency plus the bytes at a bandwidth."""
    return lambda size: latency + size / (gb_per_s * 1e9)


def test_bus_bandwidth_is_nccl_tests_ring_factor_and_the_sizes_run_from_1_kib_to_256_mib():
    assert allreduce.bus_factor(2) == 1.0 and allreduce.bus_factor(8) == pytest.approx(1.75)
    assert allreduce.bus_factor(1) == 0.0
    assert allreduce.SIZES[0] == 1024 and allreduce.SIZES[-1] == 256 * MIB
    assert allreduce.sizes_up_to(64 * 1024) == [1024, 4096, 16384, 65536]
    assert allreduce.sizes_up_to(10) == [1024]
    assert [allreduce.human_bytes(n) for n in (512, 1024, 25 * MIB, 46.8 * MIB, 2 ** 30)] == [
        "512 B", "1 KiB", "25 MiB", "46.8 MiB", "1 GiB"]


def test_small_messages_are_latency_bound_and_large_ones_bandwidth_bound():
    report = allreduce.BandwidthReport.from_metrics(sweep_metrics(link()), "machine A", "run-1")
    assert report.peak == pytest.approx(256 * MIB / (1e-4 + 256 * MIB / 1e9) / 1e9)
    # half the peak where the transfer time equals the latency: 1e-4 s x 1 GB/s = 100 kB, so from 256 KiB on
    assert report.knee() == 256 * 1024
    assert report.regime(16 * 1024) == "latency-bound" and report.regime(25 * MIB) == "bandwidth-bound"
    assert report.samples[1024] == pytest.approx([link()(1024) * (1 + 0.01 * k) for k in range(3)])
    assert "bus bandwidth up to 1.00 GB/s" in report.line() and "half of it from 256 KiB on" in report.line()


def test_a_steps_gradient_costs_its_buckets_all_reduces():
    report = allreduce.BandwidthReport.from_metrics(sweep_metrics(link()), "machine A", "run-1")
    assert report.seconds_for(4 * MIB) == pytest.approx(link()(4 * MIB))  # a measured size
    between = report.seconds_for(6 * MIB)  # interpolated on log-log axes between 4 and 16 MiB
    assert link()(4 * MIB) < between < link()(16 * MIB)
    assert report.seconds_for(512 * MIB) == pytest.approx(2 * report.seconds_for(256 * MIB))  # beyond: the last bandwidth
    assert report.seconds_for(10) == report.seconds_for(1024)  # below: the latency
    # 60 MiB of gradients: two full 25 MiB buckets and one of 10 MiB
    assert report.step_seconds(60 * MIB) == pytest.approx(
        2 * report.seconds_for(25 * MIB) + report.seconds_for(10 * MIB))


def test_the_nccl_settings_are_swept_only_where_nccl_ran():
    gloo = allreduce.BandwidthReport.from_metrics(sweep_metrics(link()), "machine A", "run-1")

    def must_not_run(env):
        raise AssertionError("no sweep without NCCL")

    table, reports = ddp_scaling.nccl_settings(gloo, must_not_run)
    assert list(table["variable"]) == ["NCCL_P2P_LEVEL", "NCCL_BUFFSIZE", "NCCL_IB_DISABLE"] and reports == {}
    assert table["peak bus GB/s (default)"].str.startswith("not measurable here: gloo on cpu").all()
    nccl = allreduce.BandwidthReport.from_metrics(sweep_metrics(link(gb_per_s=100.0), backend="nccl", device="cuda:0"),
                                                  "machine B", "run-2")
    tried = []

    def sweep_with(env):
        tried.append(env)
        return allreduce.BandwidthReport.from_metrics(sweep_metrics(link(gb_per_s=20.0), backend="nccl"), "B", "r")

    table, reports = ddp_scaling.nccl_settings(nccl, sweep_with)
    assert tried == [{"NCCL_P2P_LEVEL": "LOC"}, {"NCCL_BUFFSIZE": str(16 * MIB)}] and set(reports) == {
        "NCCL_P2P_LEVEL", "NCCL_BUFFSIZE"}
    assert table.set_index("variable").loc["NCCL_IB_DISABLE", "peak bus GB/s (default)"] == "not measurable on one node"


def test_the_nvlink_claim_is_measured_only_between_gpus_that_nvlink_joins():
    gloo = allreduce.BandwidthReport.from_metrics(sweep_metrics(link()), "machine A", "run-1")
    assert ddp_scaling.nvlink_claim(gloo).verdict == claims.NOT_MEASURABLE
    fast = allreduce.BandwidthReport.from_metrics(sweep_metrics(link(gb_per_s=100.0), backend="nccl"), "B", "r")
    slow = allreduce.BandwidthReport.from_metrics(sweep_metrics(link(gb_per_s=20.0), backend="nccl"), "B", "r")
    same = allreduce.BandwidthReport.from_metrics(sweep_metrics(link(gb_per_s=100.0), backend="nccl"), "B", "r")
    pcie = ddp_scaling.nvlink_claim(fast, slow, "PIX")
    assert pcie.verdict == claims.NOT_MEASURABLE and "joined by PIX, not NVLink" in pcie.reason
    found = ddp_scaling.nvlink_claim(fast, slow, "NV")
    assert found.verdict == claims.HOLDS and found.measured == pytest.approx(4.9, rel=0.05)
    # no difference, or peer-to-peer slower: the claim must not hold
    assert ddp_scaling.nvlink_claim(fast, same, "NV").verdict != claims.HOLDS
    assert ddp_scaling.nvlink_claim(slow, fast, "NV").verdict == claims.REFUTED


def test_doctor_reports_this_machines_newest_sweep_and_how_to_make_one(monkeypatch):
    here = {"name": "machine A"}  # this machine's line; every recorded row was measured on machine A
    monkeypatch.setattr(machine, "describe_hardware", lambda hardware=None: "machine A" if hardware else here["name"])
    assert doctor.allreduce_fact() is None
    assert "`workbook ddp --bandwidth`" in doctor._allreduce_line({"allreduce": None})
    ledger.record("ddp", "bandwidth", metrics=sweep_metrics(link()))
    fact = doctor.allreduce_fact()
    assert fact["backend"] == "gloo" and fact["half_peak_from_bytes"] == 256 * 1024 and fact["world_size"] == 2
    line = doctor._allreduce_line({"allreduce": fact})
    assert line.startswith("  bus bandwidth up to 1.00 GB/s over 2 gloo processes on cpu")
    assert "half of it from 256 KiB messages on" in line
    here["name"] = "another machine"
    assert doctor.allreduce_fact() is None  # another machine's sweep is not this one's


def test_doctor_only_reads_the_ledger_and_survives_a_damaged_one():
    path = ledger.default_path()
    assert not path.exists() and doctor.allreduce_fact() is None and not path.exists()  # nothing created
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"not a database, " * 64)
    assert doctor.allreduce_fact() is None  # `workbook ledger --check` names the damage; doctor goes on


@pytest.mark.torchrun
def test_two_gloo_processes_sweep_and_record_the_row():
    report = allreduce.measure(2, {}, "smoke", max_bytes=16 * 1024, repeats=2, warmup=1, echo=None)
    assert list(report.table["bytes"]) == [1024, 4096, 16384] and report.backend == "gloo"
    assert report.world_size == 2 and (report.table["busbw_gb_per_s"] > 0).all()
    assert (report.table["busbw_gb_per_s"] == report.table["algbw_gb_per_s"]).all()  # 2(n-1)/n = 1 for two
    assert isinstance(report.table, pd.DataFrame) and all(len(times) == 2 for times in report.samples.values())
    assert allreduce.newest().run_id == report.run_id  # the ledger row doctor reads
