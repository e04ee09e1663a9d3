"""`measure.topology`: `nvidia-smi topo -m` parsed from recorded fixtures, and the DDP link advice."""
import json
from pathlib import Path

import pytest

from course_lib.measure import topology

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
