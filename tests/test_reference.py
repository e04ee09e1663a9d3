"""Reference results: made from a finished run's claims, committed per machine, shown beside the reader's
run in `claims.show` and on the scoreboard, never counted as the reader's."""
import json

import pytest

from course_lib import cli, ledger
from course_lib.analysis import claims, reference


def _finished_run(tmp_path, monkeypatch, run_id="20261201-120000-cpu-abcd", profile="cpu", hardware="machine A"):
    """A run folder with its summary.json, and the claims notebook 03 recorded in it."""
    monkeypatch.setenv(ledger.RUN_ID_ENV, run_id)
    claims.record([claims.measured("amp_speedup", 1.8, (1.6, 2.0), "bf16 against fp32, paired", hardware=hardware),
                   claims.not_measurable("amp_memory", "no CUDA device", hardware=hardware)], profile=profile)
    monkeypatch.delenv(ledger.RUN_ID_ENV)
    folder = tmp_path / "runs" / run_id
    folder.mkdir(parents=True)
    (folder / "summary.json").write_text(json.dumps({
        "run_id": run_id, "profile": profile, "state": "finished",
        "results": [{"notebook": "03_mixed_precision_and_compile.ipynb", "status": "ok", "duration_seconds": 129.5,
                     "parameters": {"profile": profile, "repeats": 7}},
                    {"notebook": "04_gradient_accumulation.ipynb", "status": "ok", "parameters": {}}]}))
    return run_id


def test_a_reference_is_made_from_a_finished_run_and_round_trips(tmp_path, monkeypatch):
    run_id = _finished_run(tmp_path, monkeypatch)
    made = reference.from_run(run_id, runs=tmp_path / "runs")
    assert [item.notebook for item in made] == ["03"]  # 04 recorded no claims: no reference for it
    item = made[0]
    assert item.command == "workbook run --profile cpu --only 03 -p repeats=7"
    assert item.parameters == {"profile": "cpu", "repeats": 7} and item.profile == "cpu"
    assert item.hardware == "machine A" and item.versions.get("torch")
    assert {c["key"]: c["verdict"] for c in item.claims} == {"amp_speedup": claims.HOLDS,
                                                             "amp_memory": claims.NOT_MEASURABLE}
    path = reference.save(item, tmp_path / "reference")
    assert path == tmp_path / "reference" / "machine-a" / "03.json"
    again = reference.load(path)
    assert again.claim("amp_speedup")["low"] == pytest.approx(1.6) and again.date == item.date
    assert again.seconds == 129.5 and again.cell_seconds == {}  # no executed notebook in this run folder


def test_a_reference_keeps_each_cells_time_and_the_data_line(tmp_path, monkeypatch):
    """What analysis.expected_time announces: papermill's duration of every cell, by its id."""
    import nbformat

    run_id = _finished_run(tmp_path, monkeypatch)
    cells = [nbformat.v4.new_code_cell("print('data: eurosat, from data_cache/eurosat/')", id="aaaa0001",
                                       outputs=[nbformat.v4.new_output("stream", name="stdout",
                                                                       text="data: eurosat, from data_cache/eurosat/\n")]),
             nbformat.v4.new_code_cell("train()", id="aaaa0002"), nbformat.v4.new_markdown_cell("text", id="aaaa0003")]
    cells[0].metadata["papermill"] = {"duration": 1.23456}
    cells[1].metadata["papermill"] = {"duration": 95.0}
    nbformat.write(nbformat.v4.new_notebook(cells=cells),
                   str(tmp_path / "runs" / run_id / "03_mixed_precision_and_compile.ipynb"))
    (item,) = reference.from_run(run_id, runs=tmp_path / "runs")
    assert item.cell_seconds == {"aaaa0001": 1.235, "aaaa0002": 95.0}
    assert item.data == "eurosat"  # the data's name, never a folder of the machine
    assert reference.load(reference.save(item, tmp_path / "reference")).cell_seconds == item.cell_seconds


def test_a_full_disk_keeps_the_reference_that_was_there_and_leaves_no_temporary(tmp_path, monkeypatch, small_disk):
    """Issue 49 point 13: `reference save` on a full disk left a `.tmp-<pid>` beside the file, and a traceback."""
    from conftest import fill_disk

    from course_lib.data.build_lock import DiskFullError

    item = reference.from_run(_finished_run(tmp_path, monkeypatch), runs=tmp_path / "runs")[0]
    saved = reference.save(item, small_disk)
    before = saved.read_text()
    grown = reference.Reference(**{**{k: v for k, v in vars(item).items() if k != "path"},
                                   "parameters": {"padding": "x" * 2**20}})
    fill_disk(small_disk)
    with pytest.raises(DiskFullError, match=r"no room on the disk for the reference 03\.json: .*workbook reference save"):
        reference.save(grown, small_disk)
    assert saved.read_text() == before and [p.name for p in saved.parent.iterdir()] == [saved.name]


def test_smoke_runs_and_unknown_runs_are_refused_in_one_line(tmp_path, monkeypatch):
    smoke = _finished_run(tmp_path, monkeypatch, run_id="r-smoke", profile="smoke")
    with pytest.raises(reference.ReferenceResultError, match="smoke-profile run: a check"):
        reference.from_run(smoke, runs=tmp_path / "runs")
    with pytest.raises(reference.ReferenceResultError, match="no run nowhere"):
        reference.from_run("nowhere", runs=tmp_path / "runs")


def test_find_prefers_this_machine_then_the_newest(tmp_path, monkeypatch):
    run_id = _finished_run(tmp_path, monkeypatch)
    item = reference.from_run(run_id, runs=tmp_path / "runs")[0]
    root = tmp_path / "reference"
    reference.save(item, root)
    other = reference.Reference(**{**{k: v for k, v in vars(item).items() if k != "path"},
                                   "hardware": "machine B", "date": "2099-01-01 00:00:00"})
    reference.save(other, root)
    assert reference.find("03", hardware="machine A", root=root).hardware == "machine A"
    assert reference.find("03", hardware="machine C", root=root).hardware == "machine B"  # newest elsewhere
    assert reference.find("07", root=root) is None


def test_show_puts_the_reference_beside_the_readers_run(tmp_path, monkeypatch, capsys):
    run_id = _finished_run(tmp_path, monkeypatch)
    root = tmp_path / "reference"
    reference.save(reference.from_run(run_id, runs=tmp_path / "runs")[0], root)
    monkeypatch.setattr(reference, "folder", lambda: root)
    mine = [claims.measured("amp_speedup", 1.1, (0.9, 1.3), "my run", hardware="machine A")]
    table = claims.show(mine, profile="cpu")
    out = capsys.readouterr().out
    assert "(your run)" in out and "reference (not your run): machine A, profile cpu" in out
    assert "workbook run --profile cpu --only 03" in out
    row = table.iloc[0]
    assert row["measured"] == "1.10x" and row["reference measured"] == "1.80x"
    assert row["interval"] == "[0.90x, 1.30x]" and row["reference interval"] == "[1.60x, 2.00x]"
    assert row["verdict"] == claims.REFUTED and row["reference verdict"] == claims.HOLDS
    monkeypatch.setattr(reference, "folder", lambda: tmp_path / "empty")
    assert "reference measured" not in claims.show(mine).columns
    assert "no reference result committed for notebook 03" in capsys.readouterr().out


def test_the_scoreboard_marks_the_reference_and_does_not_count_it(tmp_path, monkeypatch):
    run_id = _finished_run(tmp_path, monkeypatch)
    root = tmp_path / "reference"
    reference.save(reference.from_run(run_id, runs=tmp_path / "runs")[0], root)
    monkeypatch.setattr(reference, "folder", lambda: root)
    fresh = tmp_path / "mine.sqlite"
    monkeypatch.setenv(ledger.LEDGER_ENV, str(fresh))  # the reader has measured nothing yet
    board = claims.scoreboard()
    amp = next(item for item in board if item["key"] == "amp_speedup")
    assert amp["whose"] == "yours" and amp["verdict"] == claims.NOT_MEASURED
    assert amp["reference"]["whose"] == "reference" and amp["reference"]["verdict"] == claims.HOLDS
    assert claims.verdict_counts(board)[claims.HOLDS] == 0  # the reference is not the reader's evidence
    text = claims.format_scoreboard(board)
    assert "reference (not yours): holds, measured 1.80x [1.60x, 2.00x] on machine A, profile cpu" in text


def test_workbook_reference_save_and_list(tmp_path, monkeypatch, capsys):
    run_id = _finished_run(tmp_path, monkeypatch)
    monkeypatch.chdir(tmp_path)  # runs/ is resolved from here
    monkeypatch.setattr(reference.paths, "resolve_path", lambda text: tmp_path / text)
    assert cli.main(["reference", "save", run_id, "--to", str(tmp_path / "reference")]) == 0
    assert "notebook 03, 2 claim(s)" in capsys.readouterr().out
    monkeypatch.setattr(reference, "folder", lambda: tmp_path / "reference")
    assert cli.main(["reference", "list"]) == 0
    assert "03: 2 claim(s), machine A, profile cpu" in capsys.readouterr().out
    assert cli.main(["reference", "save", "no-such-run"]) == 2
    assert "workbook reference: error: no run no-such-run" in capsys.readouterr().err


def test_the_run_report_scoreboard_has_a_reference_column(tmp_path, monkeypatch):
    from course_lib import report

    run_id = _finished_run(tmp_path, monkeypatch)
    root = tmp_path / "reference"
    reference.save(reference.from_run(run_id, runs=tmp_path / "runs")[0], root)
    monkeypatch.setattr(reference, "folder", lambda: root)
    page = report.scoreboard_html()
    assert "<th>reference (not yours)</th>" in page and "holds: 1.80x [1.60x, 2.00x] on machine A" in page


def test_a_damaged_reference_is_one_line_and_the_readers_table_still_shows(tmp_path, monkeypatch, capsys):
    (tmp_path / "reference" / "machine-a").mkdir(parents=True)
    (tmp_path / "reference" / "machine-a" / "03.json").write_text("{ not json")
    monkeypatch.setattr(reference, "folder", lambda: tmp_path / "reference")
    table = claims.show([claims.measured("amp_speedup", 1.8, (1.6, 2.0), "mine", hardware="machine A")])
    assert list(table.verdict) == [claims.HOLDS] and "reference measured" not in table.columns
    assert "03.json cannot be read" in capsys.readouterr().err  # a warning line; the table still shows
