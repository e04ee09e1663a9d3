import pytest

from course_lib.measure import disk


@pytest.mark.parametrize("name, rotational, kind", [
    ("nvme0n1", False, "nvme"), ("sda", False, "ssd"), ("sdb", True, "hdd"), ("vda", True, "virtual"),
    ("xvda", True, "virtual"), ("loop0", False, "memory or file-backed"), ("mmcblk0", False, "unknown"),
])
def test_disk_kind_from_name_and_rotational_flag(name, rotational, kind):
    assert disk.disk_kind(name, rotational)["kind"] == kind


def test_describe_disk_never_fails(tmp_path):
    info = disk.describe_disk(tmp_path / "missing" / "folder")
    assert set(info) >= {"device", "kind", "rotational", "model", "interface"}


def test_cold_reads_measure_a_temporary_file_and_remove_it(tmp_path):
    probe = disk.measure_cold_reads(tmp_path, size_bytes=2 * disk.MiB, repeats=2, random_reads=50)
    assert len(probe["sequential_mb_per_s"]) == 2 and all(v > 0 for v in probe["sequential_mb_per_s"])
    assert len(probe["random_reads_per_s"]) == 2 and all(v > 0 for v in probe["random_reads_per_s"])
    assert list(tmp_path.iterdir()) == []  # the probe file is gone
    line = disk.describe_reads(probe)
    assert "MB/s" in line and "IOPS" in line


def test_sequential_read_reads_the_whole_file(tmp_path):
    path = disk.write_probe_file(tmp_path, 3 * disk.MiB)
    assert disk.cold_sequential_read(path, block_bytes=disk.MiB)["bytes"] == 3 * disk.MiB
    assert disk.cold_random_reads(path, reads=10)["reads"] == 10
