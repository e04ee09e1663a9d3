"""Machine identity: the hardware line printed beside every number, and the facts stored with every ledger row."""
import re

from course_lib import machine


def test_the_hardware_line_names_the_cpu_its_cores_and_the_gpus():
    hardware = {"cpu": "Some CPU", "physical_cores": 8, "gpus": []}
    assert machine.describe_hardware(hardware) == "Some CPU (8 cores), no GPU"
    hardware["gpus"] = ["GPU A", "GPU B"]
    assert machine.describe_hardware(hardware) == "Some CPU (8 cores), GPU A, GPU B"


def test_this_machines_summary_and_versions_hold_what_every_row_stores():
    summary = machine.hardware_summary()
    assert {"host", "cpu", "physical_cores", "logical_cores", "ram_bytes", "gpus"} <= set(summary)
    assert summary["logical_cores"] >= summary["physical_cores"] >= 1 and summary["ram_bytes"] > 0
    assert machine.describe_hardware() == machine.describe_hardware(summary)
    versions = machine.runtime_versions()
    assert versions["torch"] and versions["python"] and "cuda_runtime" in versions and "driver" in versions


def test_the_cpu_model_falls_back_to_what_platform_reports(monkeypatch, tmp_path):
    assert machine.cpu_model()
    monkeypatch.setattr(machine, "Path", lambda _: tmp_path / "no-cpuinfo")
    monkeypatch.setattr(machine.platform, "processor", lambda: "")
    monkeypatch.setattr(machine.platform, "machine", lambda: "x86_64")
    assert machine.cpu_model() == "x86_64"


def test_the_git_commit_is_a_short_hash_or_none():
    commit = machine.git_commit()
    assert commit is None or re.fullmatch(r"[0-9a-f]{12}", commit)
