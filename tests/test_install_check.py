"""A torch/torchvision pair that does not import together is one line naming the pair and the fix, from
any `workbook` command (`doctor` included), not a 37-line traceback (issue 50, point 7)."""
import os
import subprocess
import sys

import pytest

from course_lib.measure import install_check


@pytest.mark.parametrize("torch_version, line", [("2.14.1", "0.29.*"), ("2.0.0+cu118", "0.15.*"), ("1.13.1", None),
                                                  (None, None), ("nightly", None)])
def test_the_torchvision_line_built_for_a_torch(torch_version, line):
    assert install_check.matching_torchvision(torch_version) == line


@pytest.mark.slow
def test_the_installed_pair_imports_together():
    assert install_check.torch_pair_problem() is None


def _broken_torchvision(folder):
    """A torchvision that fails to import the way one built for another torch does."""
    (folder / "torchvision").mkdir()
    (folder / "torchvision" / "__init__.py").write_text(
        'raise RuntimeError("operator torchvision::nms does not exist")\n')
    return {**os.environ, "PYTHONPATH": str(folder)}


@pytest.mark.slow
def test_a_mismatched_pair_is_one_line_from_doctor(tmp_path):
    done = subprocess.run([sys.executable, "-m", "course_lib", "doctor", "--no-measure"], capture_output=True,
                          text=True, env=_broken_torchvision(tmp_path), timeout=600)
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
    assert lines[0].startswith("workbook: error: torch ") and "do not import together" in lines[0]
    assert "operator torchvision::nms does not exist" in lines[0] and "make clean-venv && make venv" in lines[0]


@pytest.mark.slow
def test_make_venvs_check_fails_on_a_mismatched_pair(tmp_path):
    done = subprocess.run([sys.executable, "-m", "course_lib.measure.install_check"], capture_output=True,
                          text=True, env=_broken_torchvision(tmp_path), timeout=600)
    assert done.returncode == 1 and "do not import together" in done.stderr
    assert subprocess.run([sys.executable, "-m", "course_lib.measure.install_check"], timeout=600).returncode == 0


@pytest.mark.slow
def test_other_errors_are_not_taken_for_a_broken_install(monkeypatch):
    from course_lib import cli

    def fail(argv):
        raise RuntimeError("a bug of the command itself")

    monkeypatch.setattr(cli, "_main", fail)
    with pytest.raises(RuntimeError, match="a bug of the command itself"):
        cli.main(["doctor"])


def test_make_venv_says_when_the_disk_is_too_full(tmp_path):
    """A new venv on a nearly full disk stops before pip, in one line naming the space and the fix (a CI run
    once died half-way through pip with `[Errno 28] No space left on device`), and creates nothing."""
    venv = tmp_path / "deep" / "venv"
    done = subprocess.run(["make", "venv", f"VENV={venv}", "VENV_MIN_FREE_GIB=1000000"], capture_output=True,
                          text=True, timeout=60, cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    assert done.returncode != 0 and not (tmp_path / "deep").exists()
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "GiB free on the filesystem of" in errors[0] and "VENV=" in errors[0], done.stderr
    fits = subprocess.run(["sh", "scripts/check_free_space.sh", str(venv), "0"], capture_output=True, text=True,
                          timeout=60, cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    assert fits.returncode == 0 and fits.stderr == ""
