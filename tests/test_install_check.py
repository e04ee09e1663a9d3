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


def test_the_installed_pair_imports_together():
    assert install_check.torch_pair_problem() is None


def _broken_torchvision(folder):
    """A torchvision that fails to import the way one built for another torch does."""
    (folder / "torchvision").mkdir()
    (folder / "torchvision" / "__init__.py").write_text(
        'raise RuntimeError("operator torchvision::nms does not exist")\n')
    return {**os.environ, "PYTHONPATH": str(folder)}


def test_a_mismatched_pair_is_one_line_from_doctor(tmp_path):
    done = subprocess.run([sys.executable, "-m", "course_lib", "doctor", "--no-measure"], capture_output=True,
                          text=True, env=_broken_torchvision(tmp_path), timeout=600)
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
    assert lines[0].startswith("workbook: error: torch ") and "do not import together" in lines[0]
    assert "operator torchvision::nms does not exist" in lines[0] and "make clean-venv && make venv" in lines[0]


def test_make_venvs_check_fails_on_a_mismatched_pair(tmp_path):
    done = subprocess.run([sys.executable, "-m", "course_lib.measure.install_check"], capture_output=True,
                          text=True, env=_broken_torchvision(tmp_path), timeout=600)
    assert done.returncode == 1 and "do not import together" in done.stderr
    assert subprocess.run([sys.executable, "-m", "course_lib.measure.install_check"], timeout=600).returncode == 0


def test_other_errors_are_not_taken_for_a_broken_install(monkeypatch):
    from course_lib import cli

    def fail(argv):
        raise RuntimeError("a bug of the command itself")

    monkeypatch.setattr(cli, "_main", fail)
    with pytest.raises(RuntimeError, match="a bug of the command itself"):
        cli.main(["doctor"])
