"""Project paths and the one rule for which data a run uses."""
from pathlib import Path

from course_lib import paths


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
