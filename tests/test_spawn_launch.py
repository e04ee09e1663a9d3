"""torchrun against `mp.spawn`, and DDP against `nn.DataParallel` (issue 47 point 5): the same probe under both
launchers, the comparison table, and the DataParallel claim that only GPUs can decide."""
import types

import pytest

from course_lib.analysis import claims
from course_lib.chapters import ddp_scaling
from course_lib.engine import ddp, spawn_launch


def probe_rows(seconds_at_two: float) -> list[dict]:
    return [{"mode": "strong", "workers": 1, "per_worker_batch": 32, "global_batch": 32, "step_seconds": 0.1,
             "step_seconds_all": [0.1] * 5},
            {"mode": "strong", "workers": 2, "per_worker_batch": 16, "global_batch": 32,
             "step_seconds": seconds_at_two, "step_seconds_all": [seconds_at_two * (1 + 0.01 * k) for k in range(5)]}]


def fake_report(device="cpu", seconds_at_two=0.08, launch_seconds=12.0):
    launch = types.SimpleNamespace(metrics={"rows": probe_rows(seconds_at_two)}, duration_seconds=launch_seconds)
    return types.SimpleNamespace(launch=launch, device=device)


def test_the_launchers_table_puts_spawn_beside_torchrun_at_the_same_global_batch():
    spawned = {"rows": [{"metrics": {"rows": probe_rows(0.09)}}], "seconds": 9.0}
    table = ddp_scaling.launchers_table(fake_report(), spawned, None, nproc=2, global_batch=32).set_index("how")
    assert list(table.index) == ["DDP, 2 processes started by torchrun", "DDP, 2 processes started by mp.spawn",
                                 "nn.DataParallel, one process over 2 GPUs"]
    assert table.loc["DDP, 2 processes started by torchrun", "images_per_second"] == pytest.approx(32 / 0.08)
    assert table.loc["DDP, 2 processes started by mp.spawn", "launch_seconds"] == 9.0
    assert table["step_seconds"].isna().iloc[-1]  # no DataParallel without GPUs
    failed = ddp_scaling.launchers_table(fake_report(), None, [0.2, 0.2], nproc=2,
                                         global_batch=32)
    assert len(failed) == 2 and failed["images_per_second"].iloc[-1] == pytest.approx(160.0)


def test_dataparallel_is_measured_only_on_gpus_and_its_claim_can_fail():
    assert ddp.dataparallel_steps(object(), 1, 32) is None  # fewer than two GPUs asked for
    on_cpu = ddp_scaling.dataparallel_claim(fake_report(), None, 2)
    assert on_cpu.verdict == claims.NOT_MEASURABLE and "400 images/s" in on_cpu.reason
    slower = [0.12 * (1 + 0.01 * k) for k in range(5)]  # DataParallel 1.5x DDP's step time
    assert ddp_scaling.dataparallel_claim(fake_report("cuda:0"), slower, 2).verdict == claims.HOLDS
    same = [0.08 * (1 + 0.01 * k) for k in range(5)]
    assert ddp_scaling.dataparallel_claim(fake_report("cuda:0"), same, 2).verdict != claims.HOLDS
    faster = [0.05] * 5
    assert ddp_scaling.dataparallel_claim(fake_report("cuda:0"), faster, 2).verdict == claims.REFUTED


def test_the_spawn_launcher_refuses_a_missing_process_count(capsys):
    assert spawn_launch.main([]) == 2 and spawn_launch.main(["two"]) == 2
    assert "usage: python -m course_lib.engine.spawn_launch N" in capsys.readouterr().err


@pytest.mark.torchrun
def test_the_probe_started_by_spawn_records_its_steps_like_torchruns():
    spawned = spawn_launch.launch(2, {"batch_size": 8}, "smoke", args=["--task", "scaling", "--steps", "2",
                                                                      "--warmup", "1", "--profile-steps", "1"])
    assert spawned["returncode"] == 0, spawned["output"]
    (row,) = spawned["rows"]
    assert row["metrics"]["world_size"] == 2 and row["run_id"] == spawned["run_id"]
    assert {(r["mode"], r["workers"]) for r in row["metrics"]["rows"]} >= {("strong", 1), ("strong", 2)}
