import json

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_notebook

from course_lib import ledger, runner
from course_lib.config import ConfigError


def _notebook(path, parameters_source, body_source):
    cell = new_code_cell(parameters_source, metadata={"tags": ["parameters"]})
    nb = new_notebook(cells=[cell, new_code_cell(body_source)],
                      metadata={"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}})
    nbformat.write(nb, str(path))
    return path


@pytest.fixture
def book(tmp_path):
    folder = tmp_path / "notebooks"
    folder.mkdir()
    _notebook(folder / "00_first.ipynb", 'profile = "auto"  # profile\nbatch_size = None  # images\nrepeats = 3  # times',
              "print(profile, batch_size, repeats * 2)")
    _notebook(folder / "01_broken.ipynb", 'profile = "auto"  # profile', "raise ValueError('boom')")
    _notebook(folder / "02_last.ipynb", 'profile = "auto"  # profile', "print('last ran')")
    (folder / "scratch.ipynb").write_text("not a numbered notebook")
    return folder


def test_list_and_only(book):
    assert [p.name for p in runner.list_notebooks(book)] == ["00_first.ipynb", "01_broken.ipynb", "02_last.ipynb"]
    assert [p.name for p in runner.list_notebooks(book, "2,00")] == ["00_first.ipynb", "02_last.ipynb"]
    with pytest.raises(ConfigError, match="no notebook numbered 07"):
        runner.list_notebooks(book, "07")


def test_parameters_are_checked_before_running(book):
    notebooks = runner.list_notebooks(book)
    typed = runner.check_parameters(notebooks, ["batch_size=16", "repeats=5"])
    assert typed[notebooks[0]] == {"batch_size": 16, "repeats": 5} and typed[notebooks[1]] == {}
    with pytest.raises(ConfigError, match="unknown parameter 'bacth_size'.*batch_size"):
        runner.check_parameters(notebooks, ["bacth_size=16"])
    with pytest.raises(ConfigError, match="batch_size must be int"):
        runner.check_parameters(notebooks, ["batch_size=big"])
    with pytest.raises(ConfigError, match="repeats must be int"):
        runner.check_parameters(notebooks, ["repeats=2.5"])


def test_bad_parameter_runs_nothing(book, tmp_path):
    out = tmp_path / "out"
    with pytest.raises(ConfigError):
        runner.run_workbook("smoke", assignments=["nope=1"], out_dir=out, notebooks_folder=book)
    assert not out.exists()


def test_run_continues_past_a_failure(book, tmp_path, isolated_ledger):
    out, results = runner.run_workbook("smoke", assignments=["repeats=4"], out_dir=tmp_path / "out",
                                       notebooks_folder=book, echo=lambda *a: None)
    assert [r.status for r in results] == ["ok", "failed", "ok"]
    assert "ValueError: boom" in results[1].error
    executed = nbformat.read(str(out / "00_first.ipynb"), as_version=4)
    printed = "".join(o.get("text", "") for c in executed.cells for o in c.get("outputs", []))
    assert "smoke None 8" in printed
    index = (out / "index.html").read_text()
    for name in ("00_first.html", "01_broken", "02_last.html", "failed", "ValueError: boom"):
        assert name in index
    summary = json.loads((out / "summary.json").read_text())
    assert summary["profile"] == "smoke" and len(summary["results"]) == 3
    rows = ledger.Ledger(isolated_ledger).rows(kind="notebook")
    assert sorted((r["name"], r["status"]) for r in rows) == [
        ("00_first.ipynb", "ok"), ("01_broken.ipynb", "failed"), ("02_last.ipynb", "ok")]
    assert {r["run_id"] for r in rows} == {summary["run_id"]}


def test_cli_exit_code_names_the_failure(book, tmp_path, monkeypatch, capsys):
    from course_lib import cli

    monkeypatch.setattr(runner, "notebooks_dir", lambda: book)
    assert cli.main(["run", "--profile", "smoke", "--only", "01", "--out", str(tmp_path / "o")]) == 1
    assert "01_broken.ipynb" in capsys.readouterr().err
