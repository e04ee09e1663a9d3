import json
import os
import stat
from pathlib import Path

import pytest

from course_lib import cli, devices
from course_lib.measure import doctor, inventory, peak, topology

FIXTURES = Path(__file__).parent / "fixtures" / "topo"


def read_fixture(name):
    return (FIXTURES / name).read_text()


# name -> (GPUs, other devices (NICs), a link to check, CPU affinity of GPU0, NUMA affinity of GPU0)
TOPOLOGIES = {
    "pcie_2gpu_phb.txt": (2, 0, ("GPU0", "GPU1", "PHB"), "0-31", "N/A"),
    "pcie_4gpu_pix_sys.txt": (4, 0, ("GPU1", "GPU2", "SYS"), "0-23,48-71", "0"),
    "nvlink_4gpu_nv1_nv2.txt": (4, 1, ("GPU0", "GPU3", "NV2"), "0-19,40-59", "0"),
    "dgx_a100_8gpu_nv12.txt": (8, 10, ("GPU2", "mlx5_2", "PXB"), "48-63,176-191", "3"),
    "dgx_h100_8gpu_nv18.txt": (8, 12, ("GPU5", "GPU6", "NV18"), "0-55,112-167", "0"),
    "single_gpu.txt": (1, 0, ("GPU0", "GPU0", "X"), "0-7", "0"),
}


@pytest.mark.parametrize("name", sorted(TOPOLOGIES))
def test_parse_topology_fixtures(name):
    gpus, others, (a, b, code), cpu_affinity, numa = TOPOLOGIES[name]
    parsed = topology.parse_topology(read_fixture(name))
    assert len(parsed.gpus) == gpus
    assert len(parsed.devices) == gpus + others
    assert parsed.link(a, b) == code
    assert parsed.cpu_affinity["GPU0"] == cpu_affinity
    assert parsed.numa_affinity["GPU0"] == numa
    matrix = parsed.gpu_matrix()
    assert len(matrix) == gpus and all(len(row) == gpus for row in matrix)
    for i in range(gpus):
        assert matrix[i][i] == "X"
        for j in range(gpus):
            assert matrix[i][j] == matrix[j][i]  # links are symmetric
    assert parsed.legend["PIX"].startswith("Connection traversing at most a single PCIe bridge")
    json.dumps(parsed.to_dict())  # JSON-ready


def test_parse_topology_nic_legend_and_link_helpers():
    parsed = topology.parse_topology(read_fixture("dgx_h100_8gpu_nv18.txt"))
    assert parsed.nic_names["NIC11"] == "mlx5_11"
    assert parsed.link("GPU0", "NIC0") == "PIX"
    assert topology.nvlink_count("NV18") == 18
    assert topology.nvlink_count("PHB") == 0
    assert topology.link_kind(" NV12 ") == "NV"
    assert topology.link_kind(" X ") == "X"


@pytest.mark.parametrize("name, worst, suits, nvlink_pairs", [
    ("dgx_h100_8gpu_nv18.txt", "NV18", True, 28),
    ("nvlink_4gpu_nv1_nv2.txt", "NV1", True, 6),
    ("pcie_4gpu_pix_sys.txt", "SYS", False, 0),
    ("pcie_2gpu_phb.txt", "PHB", False, 0),
    ("single_gpu.txt", None, True, 0),
])
def test_assess_ddp_links(name, worst, suits, nvlink_pairs):
    assessment = topology.assess_ddp_links(topology.parse_topology(read_fixture(name)))
    assert assessment["worst_link"] == worst
    assert assessment["suits_ddp"] is suits
    assert assessment["nvlink_pairs"] == nvlink_pairs


def test_parse_topology_rejects_other_text():
    with pytest.raises(ValueError, match="header"):
        topology.parse_topology("NVIDIA-SMI has failed because it couldn't communicate with the driver.")


@pytest.mark.parametrize("capability, arch_list, covered", [
    ((8, 0), ["sm_75", "sm_80", "sm_90"], True),
    ((8, 6), ["sm_80"], True),  # same major, lower minor binary runs
    ((8, 9), ["sm_90"], False),
    ((12, 0), ["sm_90", "compute_90"], True),  # PTX is JIT-compiled forward
    ((6, 1), ["sm_75", "sm_80"], False),
])
def test_arch_covered(capability, arch_list, covered):
    assert inventory._arch_covered(*capability, arch_list) is covered


def test_cudnn_text():
    assert inventory.cudnn_text(92400) == "9.24.0"
    assert inventory.cudnn_text(8902) == "8.9.2"
    assert inventory.cudnn_text(None) is None


@pytest.mark.parametrize("speeds, expected", [
    ({"fp32": 20.0, "fp16": 1.0, "bf16": 9.0}, "off"),  # a CPU: reduced precision is slower
    ({"fp32": 19.5, "fp16": 250.0, "bf16": 245.0}, "bf16"),  # Ampere: bf16 as fast, no scaler needed
    ({"fp32": 15.0, "fp16": 110.0, "bf16": None}, "fp16"),  # Volta: no bf16
    ({"fp32": 30.0, "fp16": 200.0, "bf16": 100.0}, "fp16"),  # bf16 clearly slower than fp16
])
def test_recommended_precision_follows_measured_speed(monkeypatch, speeds, expected):
    monkeypatch.setattr(peak, "measure_matmul_tflops", lambda device, dtype: speeds[dtype])
    peak._recommended_precision.cache_clear()
    try:
        assert peak._recommended_precision("cuda:7") == expected
    finally:
        peak._recommended_precision.cache_clear()


def test_matmul_probe_on_cpu():
    assert peak.measure_matmul_tflops("cpu", "fp32") > 0
    assert peak.measure_matmul_tflops("cpu", "tf32") is None  # a CUDA mode
    assert peak.peak_flops("cpu", "fp32") == pytest.approx(peak.measure_matmul_tflops("cpu", "fp32") * 1e12)
    assert peak.recommended_precision("cpu") in ("off", "fp16", "bf16")
    with pytest.raises(ValueError, match="unknown dtype"):
        peak.dtype_supported("cpu", "fp8")


def test_peak_is_the_fastest_repeat_and_typical_the_median():
    # A disturbance only slows a repeat down: 1 s is the clean one, 4 s and 9 s were disturbed.
    best, typical = peak.peak_and_typical([2.0, 1.0, 9.0, 4.0, 2.5], flops_per_matmul=10.0)
    assert best == pytest.approx(10.0) and typical == pytest.approx(10.0 / 2.5)


def test_matmul_probe_warms_up_repeats_and_reports_best_and_median():
    result = peak.matmul_probe("cpu", "fp32", budget_seconds=0.1)  # own cache entry: short on purpose
    assert result["size"] >= peak.MATMUL_START_SIZE
    assert peak.MATMUL_MIN_REPEATS <= result["repeats"] <= peak.MATMUL_MAX_REPEATS
    assert result["tflops"] >= result["tflops_median"] > 0
    assert result["tflops"] == pytest.approx(2 * result["size"] ** 3 / result["seconds_per_matmul"] / 1e12)
    assert peak.matmul_budget_seconds("cpu", "fp32") > peak.matmul_budget_seconds("cpu", "bf16")


def test_disk_probe_is_bounded(tmp_path):
    for index in range(20):
        (tmp_path / f"file{index}.bin").write_bytes(os.urandom(100_000))
    result = inventory.measure_disk_read(tmp_path, max_bytes=1_000_000, max_seconds=1.0)
    assert result["files_found"] == 20
    assert 0 < result["sequential_bytes"] <= 1_000_000 // 2 + 100_000  # stops after the file that crosses half
    assert result["sequential_mb_per_s"] > 0 and result["random_reads_per_s"] > 0
    assert inventory.measure_disk_read(tmp_path / "missing")["sequential_mb_per_s"] is None


def test_recommended_num_workers_is_one_rule():
    assert devices.recommended_num_workers(1, cores=32) == 16  # half the physical cores
    assert devices.recommended_num_workers(4, cores=32) == 4  # shared by four GPU processes
    assert devices.recommended_num_workers(0, cores=1) == 1
    assert devices.resolve_num_workers(-1) == devices.recommended_num_workers()  # Config's "auto"
    assert devices.resolve_num_workers(3) == 3
    physical, logical = devices.machine_cores()
    assert 1 <= devices.physical_cores() <= physical <= logical


def _fake_nvidia_smi(folder: Path, topology_fixture: str) -> None:
    script = folder / "nvidia-smi"
    script.write_text("#!/bin/sh\n"
                      f'if [ "$1" = "topo" ]; then cat "{FIXTURES / topology_fixture}"; exit 0; fi\n'
                      'echo "470.57.02"\n')
    script.chmod(script.stat().st_mode | stat.S_IEXEC)


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
