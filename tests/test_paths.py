"""Project paths and the one rule for which data a run uses."""
import errno
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT

from course_lib import paths
from course_lib.ledger import LEDGER_ENV


def test_relative_paths_are_relative_to_the_project_root():
    assert paths.resolve_path("runs") == paths.project_root() / "runs"
    assert paths.resolve_path("/tmp/x") == Path("/tmp/x")
    assert (paths.project_root() / paths.SAMPLE_DIR / "train").is_dir()


@pytest.fixture
def project(tmp_path, monkeypatch):
    """An empty project at tmp_path/project (its data_cache/ and ../shared beside it under tmp_path),
    with WORKBOOK_DATA unset: nothing real to find until a test puts it there."""
    root = tmp_path / "project"
    root.mkdir()
    monkeypatch.setattr(paths, "project_root", lambda: root)
    monkeypatch.delenv(paths.DATA_ENV, raising=False)
    return root


def _image_folder(folder: Path) -> Path:
    (folder / "train" / "a").mkdir(parents=True)
    (folder / "valid" / "a").mkdir(parents=True)
    return folder


def _found(profile, *args, **kwargs):
    choice = paths.choose_data(profile, *args, **kwargs)
    return choice.overrides.get("data_dir"), choice.synthetic


def test_choose_data_looks_in_order_env_then_data_cache_then_shared_then_synthetic(project, monkeypatch, tmp_path):
    assert _found("cpu") == (None, True)  # nothing here: the profile's generated landcover-synth
    shared = _image_folder(tmp_path / "shared" / "datasets" / "eurosat_rgb")
    assert _found("cpu") == (str(shared), False)
    (project / "data_cache" / "eurosat").mkdir(parents=True)  # no train/ yet: a download in progress, skipped
    assert _found("gpu") == (str(shared), False)
    imagenette = _image_folder(project / "data_cache" / "imagenette")
    assert _found("gpu") == (str(imagenette), False)
    cifar10 = _image_folder(project / "data_cache" / "cifar10")
    assert _found("cpu") == (str(cifar10), False)  # eurosat, cifar10, imagenette: in that order
    eurosat = _image_folder(project / "data_cache" / "eurosat")
    choice = paths.choose_data("cpu")
    assert (choice.overrides, choice.name) == ({"dataset": "imagefolder", "data_dir": str(eurosat)}, "eurosat")
    assert choice.line == f"data: eurosat ({eurosat}), from data_cache/eurosat/"
    assert paths.eurosat_dir() == eurosat
    assert _found("smoke") == (None, True)  # CI stays on the committed sample
    mine = _image_folder(tmp_path / "mine")
    monkeypatch.setenv(paths.DATA_ENV, str(mine))
    for profile in ("smoke", "cpu", "gpu"):  # a folder named explicitly wins, in smoke too
        assert _found(profile) == (str(mine), False)
    assert paths.choose_data("cpu").line == f"data: mine ({mine}), from {paths.DATA_ENV}={mine}"
    assert _found("cpu", "some/folder") == (str(project / "some" / "folder"), False)  # data_dir wins over everything
    assert paths.choose_data("cpu", dataset="digits").overrides == {"dataset": "digits"}
    monkeypatch.setenv(paths.DATA_ENV, "none")  # hides every real dataset
    assert _found("cpu") == _found("gpu") == _found("smoke") == (None, True)
    assert paths.eurosat_dir() is None and paths.find_real_data() is None
    assert _found("cpu", "some/folder") == (str(project / "some" / "folder"), False)


def test_the_synthetic_fallback_says_what_it_is_and_how_to_get_real_data(project, monkeypatch):
    line = paths.choose_data("cpu").line
    assert line.startswith("data: landcover-synth (SYNTHETIC") and "no real data found" in line
    assert line.endswith("for real data run `workbook data get eurosat`") and "\n" not in line
    monkeypatch.setenv(paths.DATA_ENV, "None")
    assert f"{paths.DATA_ENV}=none hides real data" in paths.choose_data("gpu").line
    smoke = paths.choose_data("smoke")
    assert smoke.overrides == {} and "the committed sample data_samples/landcover-synth" in smoke.line
    sample = paths.choose_data("cpu", str(ROOT / paths.SAMPLE_DIR))  # a landcover-synth folder given by name
    assert sample.synthetic and sample.overrides["dataset"] == "imagefolder"


@pytest.mark.parametrize("value", ["no/such/folder", "pyproject.toml"])
def test_a_workbook_data_value_that_is_not_a_folder_is_one_line(project, monkeypatch, tmp_path, value):
    monkeypatch.setenv(paths.DATA_ENV, value)
    with pytest.raises(NotADirectoryError) as caught:
        paths.choose_data("cpu")
    message = str(caught.value)
    assert message.startswith(f"{paths.DATA_ENV}={value} is not a folder; set it to an image folder")
    assert "\n" not in message
    assert "none" in message


@pytest.mark.slow
def test_a_bad_workbook_data_stops_the_cli_with_one_line(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT), LEDGER_ENV: str(tmp_path / "ledger.sqlite"),
           paths.DATA_ENV: str(tmp_path / "missing")}
    process = subprocess.run([sys.executable, "-m", "course_lib", "data", "info", "--profile", "cpu"],
                             cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert process.returncode == 2 and process.stdout == ""
    assert process.stderr == (f"workbook data: error: {paths.DATA_ENV}={tmp_path / 'missing'} is not a folder; set it "
                              "to an image folder (train/ and valid/ of class folders), to none for the synthetic "
                              "data, or unset it\n")


def _captured(monkeypatch):
    """Stand-ins for the work each command does, keeping the Config it was handed."""
    from course_lib.data import pipeline
    from course_lib.engine import speedrun, train

    seen = {}

    class Stop(Exception):
        pass

    def keep(name):
        def stand_in(config, *args, **kwargs):
            seen[name] = config
            raise Stop
        return stand_in

    monkeypatch.setattr(train, "fit", keep("train"))
    monkeypatch.setattr(speedrun, "race", keep("speedrun"))
    monkeypatch.setattr(pipeline, "build_datasets", keep("data info"))
    return seen, Stop


@pytest.mark.parametrize("profile", ["smoke", "cpu", "gpu"])
@pytest.mark.parametrize("where", ["env", "data_cache", "shared", "none"])
def test_train_data_info_speedrun_and_ddp_workers_pick_the_same_data(project, monkeypatch, tmp_path, capsys,
                                                                     profile, where):
    from course_lib import cli
    from course_lib.engine import torchrun

    folder = {"env": tmp_path / "mine", "data_cache": project / "data_cache" / "eurosat",
              "shared": tmp_path / "shared" / "datasets" / "eurosat_rgb", "none": None}[where]
    if folder is not None:
        _image_folder(folder)
    if where in ("env", "none"):
        monkeypatch.setenv(paths.DATA_ENV, str(folder) if folder else "none")
    seen, stop = _captured(monkeypatch)
    for argv in (["train"], ["data", "info"], ["speedrun"]):
        with pytest.raises(stop):
            cli.main([*argv, "--profile", profile, "-p", "device=cpu"])
    expected = paths.choose_data(profile)
    lines = capsys.readouterr().out.splitlines()
    assert lines.count(expected.line) == 3  # each command names its data first
    workers = torchrun.resolve_params({"batch_size": 8}, profile)
    for config in (*seen.values(), workers[0], cli.run_config(profile, {})[0]):
        assert (config.dataset, config.data_dir) == (expected.overrides.get("dataset", config.dataset),
                                                    expected.overrides.get("data_dir", config.data_dir))
    assert len({(c.dataset, c.data_dir) for c in seen.values()}) == 1
    real = where == "env" or (profile != "smoke" and where != "none")
    assert (seen["train"].data_dir == str(folder)) is real
    assert workers[1].get("data_dir", "") == workers[0].data_dir  # passed on to every worker, never chosen there
    assert torchrun.config_overrides(seen["train"], profile).get("data_dir", "") == seen["train"].data_dir


def test_outside_any_project_the_root_is_the_project_the_package_came_from(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert paths.project_root() == ROOT
    assert (paths.resolve_path(paths.SAMPLE_DIR) / "train").is_dir()
    project = tmp_path / "my-project"  # inside another project, that project wins
    (project / "course_lib").mkdir(parents=True)
    (project / "pyproject.toml").write_text("[project]\nname = 'x'\n")
    (project / "notebooks").mkdir()
    monkeypatch.chdir(project / "notebooks")
    assert paths.project_root() == project


@pytest.mark.slow
def test_the_cli_finds_the_committed_sample_from_another_folder(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT), LEDGER_ENV: str(tmp_path / "ledger.sqlite")}
    process = subprocess.run([sys.executable, "-m", "course_lib", "data", "info", "--profile", "smoke"],
                             cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert process.returncode == 0, process.stderr
    assert "landcover-synth" in process.stdout and "data_samples" in process.stdout


def test_check_writable_creates_the_folder_and_leaves_nothing(tmp_path):
    target = tmp_path / "a" / "b"
    assert paths.check_writable(target) == target
    assert target.is_dir() and list(target.iterdir()) == []


def test_check_writable_names_the_folder_and_why(tmp_path, monkeypatch):
    blocker = tmp_path / "a-file"
    blocker.write_text("in the way")
    for target, reason in ((blocker, "a file of that name is in the way"),
                           (blocker / "sub", "part of the path is a file")):
        with pytest.raises(paths.NotWritableError, match=reason) as caught:
            paths.check_writable(target)
        assert str(caught.value).startswith(f"cannot write to {target} (") and "\n" not in str(caught.value)

    def read_only(*args, **kwargs):  # as root, chmod would not stop the write: refuse it here
        raise PermissionError(errno.EACCES, "Permission denied")

    monkeypatch.setattr(paths, "open", read_only, raising=False)
    with pytest.raises(paths.NotWritableError, match=r"cannot write to .*\(Permission denied\); choose a folder"):
        paths.check_writable(tmp_path / "read-only")
    # Each command names its own way to another folder (issue 49, point 14: data get, eval and run advised
    # `-p output_dir=...`, which is not their option).
    with pytest.raises(paths.NotWritableError, match=r"choose a folder you can write \(--root another folder\)"):
        paths.check_writable(tmp_path / "read-only", "--root another folder")


def test_an_output_lock_is_free_once_released_even_while_a_forked_child_lives(tmp_path):
    """DataLoader workers forked during a run share the lock's open file: a close alone left the folder
    locked (naming this very process) until the last of them exited, so the next fit here refused."""
    import multiprocessing
    import time

    lock = paths.OutputLock(tmp_path, "first fit").acquire()
    child = multiprocessing.get_context("fork").Process(target=time.sleep, args=(60,))
    child.start()
    try:
        with pytest.raises(paths.FolderInUseError, match=rf"PID {os.getpid()} on .*, first fit, since"):
            paths.OutputLock(tmp_path).acquire()
        lock.release()
        paths.OutputLock(tmp_path, "second fit").acquire().release()
    finally:
        child.kill()
        child.join()


def test_a_lock_file_removed_while_it_was_being_locked_is_locked_anew(tmp_path, monkeypatch):
    """A finishing run removes its lock file; a run that opened it just before holds a lock on a file
    nobody else can see, so it must notice and lock the file that now stands there."""
    import fcntl

    real_flock, removed = fcntl.flock, []

    def flock(handle, operation):
        real_flock(handle, operation)
        if operation & fcntl.LOCK_EX and not removed:  # the previous holder removes the file right now
            removed.append((tmp_path / paths.OutputLock.NAME).unlink())

    monkeypatch.setattr(fcntl, "flock", flock)
    lock = paths.OutputLock(tmp_path).acquire()
    assert removed and f"PID {os.getpid()}" in (tmp_path / paths.OutputLock.NAME).read_text()
    with pytest.raises(paths.FolderInUseError):
        paths.OutputLock(tmp_path).acquire()
    lock.release()
    assert not (tmp_path / paths.OutputLock.NAME).exists()
