"""The start-up check that a run fits: free memory within the container's cgroup, the images
storage=device holds, and the one-line refusal."""
import pytest
import torch

from course_lib.measure import memory, memory_fit


@pytest.mark.slow
def test_an_image_size_that_cannot_fit_is_refused_before_the_first_step_naming_one_that_does(tmp_path, capsys,
                                                                                              monkeypatch):
    import re

    from course_lib import cli
    from course_lib.config import ConfigError, make_config

    budget = 2 * 10**9  # bytes "free": a small machine
    monkeypatch.setattr(memory_fit, "free_bytes", lambda device: budget)
    out = tmp_path / "out"
    assert cli.main(["train", "--profile", "smoke", "-p", "model=resnet18", "-p", "image_size=4096", "-p",
                     "batch_size=64", "-p", f"output_dir={out}", "--no-progress"]) == 2
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and "more than the 2.0 GB free on cpu; use image_size=" in error, error
    assert not (out / "last.pt").exists()
    fitting = int(re.search(r"use image_size=(\d+) or less", error).group(1))
    config = make_config("smoke", model="resnet18", image_size=fitting, batch_size=64)
    memory_fit.check_fits(config, budget_bytes=budget)  # the size it names does fit
    with pytest.raises(ConfigError):
        memory_fit.check_fits(config.replace(image_size=fitting * 2), budget_bytes=budget)


def _cgroup(tmp_path, monkeypatch, limit: str, usage: int, inactive_file: int):
    files = [tmp_path / name for name in ("memory.max", "memory.current", "memory.stat")]
    files[0].write_text(limit + "\n")
    files[1].write_text(f"{usage}\n")
    files[2].write_text(f"anon {usage - inactive_file}\ninactive_file {inactive_file}\nactive_file 0\n")
    monkeypatch.setattr(memory_fit, "CGROUP_FILES", (tuple(map(str, files)),))


def test_the_cpu_budget_is_the_containers_memory_limit_where_it_is_lower_than_the_hosts(tmp_path, monkeypatch):
    """Issue 49 point 6: the start-up check read the host's RAM, so a run in a 1 GB container was killed
    without a message although the check had let it through."""
    import psutil

    _cgroup(tmp_path, monkeypatch, str(2**30), usage=600 * 2**20, inactive_file=100 * 2**20)
    assert memory_fit.cgroup_room() == 2**30 - 500 * 2**20  # the page cache it can drop does not count
    assert memory_fit.free_bytes(torch.device("cpu")) == min(psutil.virtual_memory().available, 2**30 - 500 * 2**20)
    _cgroup(tmp_path, monkeypatch, "max", usage=600 * 2**20, inactive_file=0)
    assert memory_fit.cgroup_room() is None  # no limit: the host's RAM
    assert memory_fit.free_bytes(torch.device("cpu")) <= psutil.virtual_memory().total
    monkeypatch.setattr(memory_fit, "CGROUP_FILES", ((str(tmp_path / "none"),) * 3,))
    assert memory_fit.cgroup_room() is None


def test_storage_device_counts_the_images_it_holds_in_the_start_up_check(tmp_path):
    """Issue 49 point 6: storage=device keeps every image in memory all run, which the check left out."""
    from course_lib.config import ConfigError, make_config
    from course_lib.data.landcover import make_landcover

    root = make_landcover(tmp_path / "set", image_size=16, per_class={"train": 10, "val": 5})
    config = make_config("smoke", model="test_resnet", image_size=256, batch_size=4, data_dir=str(root),
                         storage="device", augmentation="device", num_workers=0)
    images = sum(1 for split in ("train", "val") for _ in (root / split).rglob("*.jpg"))
    assert images == 8 * 15
    assert memory_fit.resident_bytes(config) == images * 3 * 256 ** 2
    assert memory_fit.resident_bytes(config.replace(max_train_images=8)) < memory_fit.resident_bytes(config)
    assert memory_fit.resident_bytes(config.replace(storage="cache")) == 0
    step = memory.estimate_training_memory("test_resnet", 4, 256, "off", config.optimizer, config.momentum,
                                           device="meta").total_bytes
    budget = step + memory_fit.resident_bytes(config) // 2  # the step fits, the step and the images do not
    memory_fit.check_fits(config.replace(storage="cache"), budget_bytes=budget)
    with pytest.raises(ConfigError, match=r"GB of images that storage=device holds there, more than the .* free on "
                                          r"cpu; .*or storage=cache \(the images stay on disk, memory-mapped\)"):
        memory_fit.check_fits(config, budget_bytes=budget)
