import pytest

from course_lib.data import shards
from course_lib.data.datasets import ImageFolderDataset
from course_lib.data.landcover import make_landcover
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


@pytest.fixture
def folder(tmp_path):
    return make_landcover(tmp_path / "set", image_size=32, per_class={"train": 3}) / "train"


def test_raw_read_timing_counts_the_same_bytes_both_ways(folder, tmp_path):
    written = shards.write_shards(folder, tmp_path / "shards", shard_count=2)
    files = [path for path, _ in ImageFolderDataset(folder).samples]
    result = disk.time_raw_reads(files, written.urls, repeats=1)
    assert result["loose_files_per_second"] > 0 and result["shards_files_per_second"] > 0
    ratio = result["loose_megabytes_per_second"] / result["loose_files_per_second"]
    assert ratio == pytest.approx(result["shards_megabytes_per_second"] / result["shards_files_per_second"])


@pytest.mark.parametrize("cold", [False, True])
def test_raw_reads_report_every_repeat_warm_or_cold(folder, tmp_path, cold):
    written = shards.write_shards(folder, tmp_path / "shards", shard_count=2)
    files = [path for path, _ in ImageFolderDataset(folder).samples]
    result = disk.time_raw_reads(files, written.urls, repeats=2, cold=cold)
    assert result["cold"] is cold
    assert len(result["loose_files_per_second_repeats"]) == len(result["shards_files_per_second_repeats"]) == 2
    assert all(rate > 0 for rate in result["shards_files_per_second_repeats"])
