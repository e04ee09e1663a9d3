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


def test_choose_data_prefers_an_explicit_folder_then_eurosat_outside_smoke(monkeypatch, tmp_path):
    monkeypatch.setattr(paths, "eurosat_shared_dir", lambda: tmp_path)
    assert paths.choose_data("cpu", "some/folder") == {"dataset": "imagefolder", "data_dir": "some/folder"}
    assert paths.choose_data("cpu") == {"dataset": "imagefolder", "data_dir": str(tmp_path)}
    assert paths.choose_data("smoke") == {}  # CI stays on the committed sample
    monkeypatch.setattr(paths, "eurosat_shared_dir", lambda: None)
    assert paths.choose_data("gpu") == {}


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
