"""The code the docs pages give a reader runs as written: docs/your_own_data.md's plain PyTorch loop with
the workbook's pieces (issue 50, point 11), on a generated ImageFolder in place of "my_dataset"."""
import re

import pytest
from conftest import ROOT

from course_lib import cli
from course_lib.data import cache


def python_blocks(page: str) -> list[str]:
    """The ```python blocks of docs/`page`, in order."""
    return re.findall(r"```python\n(.*?)```", (ROOT / "docs" / page).read_text(), flags=re.S)


@pytest.mark.slow
def test_your_own_data_loop_trains_on_an_image_folder(tmp_path, monkeypatch, capsys):
    (loop,) = [block for block in python_blocks("your_own_data.md") if "for epoch in range(epochs)" in block]
    assert len(loop.strip().splitlines()) <= 40  # a loop a reader takes in at a glance
    folder = tmp_path / "my_dataset"
    assert cli.main(["data", "make", "--out", str(folder), "--image-size", "32", "--train", "8", "--val", "2",
                     "--test", "0"]) == 0
    monkeypatch.setattr(cache, "project_root", lambda: tmp_path)  # its cache under tmp_path/data_cache/
    first = 'data_dir, image_size, epochs = "my_dataset", 64, 2'
    assert first in loop
    code = loop.replace(first, f'data_dir, image_size, epochs = {str(folder)!r}, 32, 2')
    capsys.readouterr()
    exec(compile(code, "docs/your_own_data.md", "exec"), {"__name__": "docs_example"})
    lines = capsys.readouterr().out.splitlines()
    epochs = [line for line in lines if line.startswith("epoch ")]
    assert [line.split(":")[0] for line in epochs] == ["epoch 1", "epoch 2"], lines
    assert all(re.search(r"loss \d+\.\d{3}, \d+ images/s, MFU \d+\.\d%", line) for line in epochs), epochs
    assert any("precision" in line for line in lines)  # auto_precision's one-line account of its measurement
    assert list((tmp_path / "data_cache" / "predecoded").iterdir())  # the cache was built, once


@pytest.mark.slow
def test_the_hosted_install_cell_runs_offline_on_a_runtime_with_torch_preinstalled(tmp_path):
    """Issue 50 point 12: docs/hosted_notebooks.md's install cell, as far as it goes without the network. The
    runtime is a fresh venv whose preinstalled packages are this test's own (a .pth file, as Colab and Kaggle
    ship torch); its `git clone` clones this repository, and its `pip install -e .` runs offline."""
    import subprocess
    import sys
    import sysconfig

    (cell,) = [block for block in python_blocks("hosted_notebooks.md") if "pip install" in block]
    steps = [line.strip() for line in cell.splitlines() if line.strip() and not line.strip().startswith("#")]
    assert steps[0].startswith("!git clone --depth 1 ") and steps[0].endswith(" workbook")
    assert steps[1:] == ["%cd workbook", "!pip install -q -e .", "!python -m course_lib.measure.install_check",
                         "!workbook doctor --no-measure"]
    runtime = tmp_path / "runtime"
    # without its own pip and setuptools: those come preinstalled too, as a runtime's current ones do
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(runtime)], check=True, timeout=300)
    site = next((runtime / "lib").glob("python*/site-packages"))
    (site / "preinstalled.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    clone = tmp_path / "workbook"
    subprocess.run(["git", "clone", "-q", "--depth", "1", f"file://{ROOT}", str(clone)], check=True, timeout=300)
    env = {"PATH": f"{runtime / 'bin'}:/usr/bin:/bin", "HOME": str(tmp_path), "PIP_DISABLE_PIP_VERSION_CHECK": "1",
           "WORKBOOK_DATA": "none"}
    python = str(runtime / "bin" / "python")
    for step in steps[2:]:
        program, *arguments = step[1:].split()
        if program == "pip":  # offline: the packages are there already, the build uses the runtime's setuptools
            argv = [python, "-m", "pip", *arguments, "--no-index", "--no-build-isolation"]
        else:
            argv = [python if program == "python" else str(runtime / "bin" / program), *arguments]
        done = subprocess.run(argv, cwd=clone, env=env, capture_output=True, text=True, timeout=600)
        assert done.returncode in ((0, 1) if "doctor" in step else (0,)), f"{step}: {done.stdout}\n{done.stderr}"
    assert "problem(s); doctor took" in done.stdout.splitlines()[-1]
