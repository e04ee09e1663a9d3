"""summary.json is read and checked in one place: a file cut short or of another shape is one line for the
report, the docs site, compare and reference save (issue 49, point 13)."""
import json

import pytest

from course_lib import cli, run_summary


@pytest.mark.parametrize("content, problem", [
    ("[1, 2]", "it holds a JSON list, not an object"),
    ('{"run_id": "r", "profile": "cpu"}', "it lacks results"),
    ('{"run_id": "r", "profile": "cpu", "results": "abc"}', "its results must be a list of objects"),
    ('{"run_id": "r", "profile": "cpu", "results": [{"status": "ok"}]}', "each naming its notebook"),
    ('{"run_id": 3, "profile": "cpu", "results": []}', "its run_id and profile must be text"),
    ('{"run_id": "r", "profile": "cpu", "results": [], "not_run": "x"}', "its not_run must be a list"),
    ('{"run_id": "r", "pro', "cannot be read (JSONDecodeError"),
])
def test_an_unusable_summary_is_one_line_for_every_reader(tmp_path, monkeypatch, capsys, content, problem):
    monkeypatch.setattr("course_lib.paths.project_root", lambda: tmp_path)
    run = tmp_path / "runs" / "20261201-000000-cpu-abcd"
    run.mkdir(parents=True)
    (run / "summary.json").write_text(content)
    with pytest.raises(run_summary.SummaryError, match=problem.replace("(", r"\(")):
        run_summary.read(run)
    assert run_summary.read_or_empty(run) == {}
    for argv in (["report", str(run)], ["reference", "save", run.name]):
        assert cli.main(argv) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and "Traceback" not in err and "summary.json" in err, err
        assert "is not a run summary" in err or "cannot be read" in err


def test_a_good_summary_reads_and_a_missing_one_says_where_to_look(tmp_path):
    (tmp_path / "summary.json").write_text(json.dumps({"run_id": "r", "profile": "cpu", "results": [
        {"notebook": "00_setup_check.ipynb", "status": "ok"}], "not_run": ["01_x.ipynb"]}))
    assert run_summary.read(tmp_path)["results"][0]["notebook"] == "00_setup_check.ipynb"
    with pytest.raises(run_summary.SummaryError, match="holds no summary.json; `ls runs/` lists the runs"):
        run_summary.read(tmp_path / "nowhere")
