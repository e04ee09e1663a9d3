"""`workbook gpu-check` as the GPU slot's image runs it: its import graph, and the whole check in its
CPU dry run, under an import blocker that refuses every package that image lacks
(tests/fixtures/gpu_image/sitecustomize.py). A module on that path that imports papermill, jupyter,
webdataset, torchao or torch-pruning at its top fails here before it can waste a slot."""
import json
import os
import subprocess
import sys

import pytest
from conftest import ROOT

BLOCKER = ROOT / "tests" / "fixtures" / "gpu_image"


def under_the_image(code: list[str], tmp_path, **env) -> subprocess.CompletedProcess:
    environment = {**os.environ, "PYTHONPATH": f"{BLOCKER}{os.pathsep}{ROOT}",
                   "WORKBOOK_BLOCKED_LOG": str(tmp_path / "blocked.txt"), **env}
    return subprocess.run([sys.executable, *code], cwd=ROOT, env=environment, capture_output=True, text=True,
                          check=False, timeout=600)


@pytest.mark.parametrize("package", ["papermill", "nbformat", "ipywidgets", "webdataset", "torchao",
                                     "torch_pruning", "jupyter_client"])
def test_the_blocker_refuses_what_the_image_lacks(tmp_path, package):
    result = under_the_image(["-c", f"import {package}"], tmp_path)
    assert result.returncode != 0 and f"No module named '{package}'" in result.stderr
    probe = under_the_image(["-c", f"import importlib.util; print(importlib.util.find_spec({package!r}))"], tmp_path)
    assert probe.stdout.strip() == "None"  # as on a machine without it: optional imports see it absent


@pytest.mark.slow
def test_gpu_checks_import_graph_loads_with_the_images_packages(tmp_path):
    code = ("import course_lib.measure.gpu_check, course_lib.cli, course_lib.engine.speedrun, course_lib.engine.ddp, "
            "course_lib.measure.doctor, course_lib.measure.bench; "
            "import sys; print(sorted(m for m in ('papermill', 'nbformat', 'webdataset', 'torchao', 'torch_pruning') "
            "if m in sys.modules))")
    result = under_the_image(["-c", code], tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip().splitlines()[-1] == "[]"
    help_text = under_the_image(["-m", "course_lib", "gpu-check", "--help"], tmp_path)
    assert help_text.returncode == 0 and "--cpu-dry-run" in help_text.stdout, help_text.stderr[-3000:]


@pytest.mark.slow
def test_the_cpu_dry_run_of_gpu_check_runs_every_part_under_the_blocker(tmp_path):
    """Every part's code, at tiny sizes; the speed-run part on the committed sample (WORKBOOK_DATA)."""
    result = under_the_image(["-m", "course_lib", "gpu-check", "--cpu-dry-run", "--out-root", str(tmp_path)], tmp_path,
                             WORKBOOK_DATA=str(ROOT / "data_samples" / "landcover-synth"))
    assert result.returncode == 0, result.stderr[-3000:]
    (folder,) = [p for p in tmp_path.iterdir() if p.is_dir()]
    report = json.loads((folder / "gpu_check.json").read_text())
    status = {part["name"]: (part["status"], part["error"]) for part in report["parts"]}
    assert status.pop("ddp")[0] == "skipped"
    assert all(state == "ok" for state, _ in status.values()), status
    assert all(part["seconds"] > 0 for part in report["parts"] if part["status"] == "ok")
    parts = {part["name"]: part["result"] for part in report["parts"]}
    assert parts["bandwidth"]["summary"]["gb_per_second"] > 0
    assert any("not measurable on cpu" in note for note in parts["switches"]["notes"])
    text = (folder / "README.md").read_text()
    assert text.startswith("# gpu-check on cpu dry run") and "## Roofline" in text


@pytest.mark.slow
def test_the_runbook_script_finds_the_carried_eurosat_subset(tmp_path):
    """scripts/gpu_check.sh on a machine without CUDA: the one line, with the project on PYTHONPATH."""
    environment = {k: v for k, v in os.environ.items() if k not in ("WORKBOOK_DATA", "PYTHONPATH")}
    environment.update(PYTHON=sys.executable, CUDA_VISIBLE_DEVICES="")
    result = subprocess.run(["bash", str(ROOT / "scripts" / "gpu_check.sh")], cwd=tmp_path, env=environment,
                            capture_output=True, text=True, timeout=300, check=False)
    assert result.returncode == 0 and "nothing to check" in result.stdout, result.stderr[-2000:]


def test_the_eurosat_subset_is_fixed_and_says_which(tmp_path):
    import importlib.util

    spec = importlib.util.spec_from_file_location("pack", ROOT / "scripts" / "pack_eurosat_subset.py")
    pack = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(pack)
    source = tmp_path / "eurosat"
    for split, count in (("train", 5), ("valid", 2)):
        for name in ("Forest", "River"):
            (source / split / name).mkdir(parents=True)
            for number in range(1, count + 1):
                (source / split / name / f"{name}_{number * 10}.jpg").write_bytes(b"x" * number)
    summary = pack.pack(source, tmp_path / "slot", train_per_class=3)
    kept = sorted(p.name for p in (tmp_path / "slot" / "train" / "River").iterdir())
    assert kept == ["River_10.jpg", "River_20.jpg", "River_30.jpg"]  # by number: 10, 20, 30 (not 10, 100 ...)
    assert summary["train_images"] == 6 and summary["valid_images"] == 4
    assert json.loads((tmp_path / "slot" / "SUBSET.json").read_text())["rule"].startswith("the first 3 images")
    with pytest.raises(SystemExit, match="exists; remove it first"):
        pack.pack(source, tmp_path / "slot", train_per_class=3)
    with pytest.raises(SystemExit, match="over --max-mib"):
        pack.pack(source, tmp_path / "other", train_per_class=3, max_mib=1e-6)
