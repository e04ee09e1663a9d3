"""`measure.inventory`: CUDA architectures covered, the cuDNN line, the bounded disk probe."""
import os

import pytest

from course_lib.measure import inventory


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


def test_disk_probe_is_bounded(tmp_path):
    for index in range(20):
        (tmp_path / f"file{index}.bin").write_bytes(os.urandom(100_000))
    result = inventory.measure_disk_read(tmp_path, max_bytes=1_000_000, max_seconds=1.0)
    assert result["files_found"] == 20
    assert 0 < result["sequential_bytes"] <= 1_000_000 // 2 + 100_000  # stops after the file that crosses half
    assert result["sequential_mb_per_s"] > 0 and result["random_reads_per_s"] > 0
    assert inventory.measure_disk_read(tmp_path / "missing")["sequential_mb_per_s"] is None
