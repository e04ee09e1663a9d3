"""`workbook doctor` (`measure.doctor`): its JSON, a machine without GPU tools, the topology it reads,
one-line errors."""
import json
import os
import stat
from pathlib import Path

import pytest

from course_lib import cli
from course_lib.measure import doctor

FIXTURES = Path(__file__).parent / "fixtures" / "topo"


def _fake_nvidia_smi(folder: Path, topology_fixture: str) -> None:
    script = folder / "nvidia-smi"
    script.write_text("#!/bin/sh\n"
                      f'if [ "$1" = "topo" ]; then cat "{FIXTURES / topology_fixture}"; exit 0; fi\n'
                      'echo "470.57.02"\n')
    script.chmod(script.stat().st_mode | stat.S_IEXEC)


@pytest.mark.slow
def test_doctor_json_keys_and_types(tmp_path, capsys, monkeypatch):
    data = tmp_path / "data"
    data.mkdir()
    for index in range(5):
        (data / f"{index}.jpg").write_bytes(os.urandom(5000))
    monkeypatch.setenv("PATH", str(tmp_path / "empty") + os.pathsep + os.environ["PATH"])
    code = cli.main(["doctor", "--json", "--data-dir", str(data)])
    facts = json.loads(capsys.readouterr().out)
    assert code in (0, 1)
    expected = {"cpu": dict, "disk": dict, "versions": dict, "gpus": list, "matmul": list,
                "recommendations": list, "problems": list, "recommended_precision": dict, "hardware": str,
                "torch_cuda_available": bool, "seconds": float}
    for key, kind in expected.items():
        assert isinstance(facts[key], kind), key
    assert isinstance(facts["cpu"]["physical_cores"], int) and facts["cpu"]["physical_cores"] >= 1
    assert isinstance(facts["cpu"]["ram_bytes"], int)
    assert isinstance(facts["disk"]["free_bytes"], int)
    assert isinstance(facts["disk"]["read_sequential_mb_per_s"], float)
    for name in ("python", "torch", "torchvision", "timm", "cuda_runtime", "cudnn", "nccl", "driver"):
        assert name in facts["versions"]
    rows = {(row["device"], row["dtype"]): row for row in facts["matmul"]}
    assert isinstance(rows[("cpu", "fp32")]["tflops"], float)
    assert set(facts["recommended_precision"].values()) <= {"off", "fp16", "bf16"}
    for item in facts["recommendations"]:
        assert set(item) == {"topic", "severity", "advice", "reason"}
        assert item["severity"] in ("ok", "warn", "problem")
    assert facts["problems"] == [r["advice"] for r in facts["recommendations"] if r["severity"] == "problem"]
    assert code == (1 if facts["problems"] else 0)


def test_doctor_without_gpu_tools_reports_and_never_crashes(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))  # no nvidia-smi anywhere
    code = cli.main(["doctor", "--no-measure"])
    out = capsys.readouterr().out
    assert "Recommendations" in out and "GPU topology: not available" in out
    assert code in (0, 1)


def test_doctor_reads_topology_from_nvidia_smi(tmp_path, monkeypatch):
    _fake_nvidia_smi(tmp_path, "dgx_a100_8gpu_nv12.txt")
    monkeypatch.setenv("PATH", str(tmp_path) + os.pathsep + os.environ["PATH"])
    facts = doctor.collect_facts(measure=False)
    assert facts["topology"]["gpu_matrix"][0][7] == "NV12"
    assert facts["ddp_links"]["suits_ddp"] is True
    assert "GPU7" in doctor.format_report(facts)


def test_old_driver_is_a_problem():
    facts = doctor.collect_facts(measure=False)
    facts["versions"] = {**facts["versions"], "cuda_runtime": "12.4", "driver": "470.57.02"}
    items = doctor.recommendations(facts)
    build = [item for item in items if item["topic"] == "torch build"][0]
    assert build["severity"] == "problem" and "CUDA 11.x" in build["advice"]


def test_doctor_bad_data_dir_is_one_line_error(tmp_path, capsys):
    assert cli.main(["doctor", "--data-dir", str(tmp_path / "nope")]) == 2
    assert "is not a folder" in capsys.readouterr().err
