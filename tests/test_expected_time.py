"""Before a long cell, the notebook says how long it took on the reference's machine, and its first line gives
the whole notebook's time in the active profile (issue 50, point 5)."""
import json

import nbformat
import pytest

from course_lib.analysis import expected_time, reference


def _reference(root, notebook="07", profile="cpu", hardware="machine A", date="2026-12-05T10:00:00Z", cells=None,
               seconds=389.0, sources=None):
    item = reference.Reference(notebook=notebook, hardware=hardware, date=date, profile=profile,
                               command=f"workbook run --profile {profile} --only {notebook}", parameters={},
                               versions={}, run_id="run-1", claims=[], seconds=seconds,
                               cell_seconds=cells if cells is not None else {"cell0001": 2.0, "cell0002": 250.0},
                               cell_sources={cell_id: reference.source_digest(code)
                                             for cell_id, code in (sources or {}).items()},
                               data="eurosat")
    return reference.save(item, root)


def test_the_notebook_line_and_the_long_cells_line(tmp_path):
    _reference(tmp_path)
    timings = expected_time.Timings.load("cpu", tmp_path)
    assert timings.notebook_line("cell0001") == (
        "expected time: about 6 min 29 s in the cpu profile on eurosat, measured on machine A (2026-12-05; "
        f"reference run run-1); {expected_time.SMOKE_ADVICE}")
    assert timings.cell_line("cell0002").startswith("expected: this cell took 4 min 10 s in the cpu profile on "
                                                    "machine A (2026-12-05)")
    assert timings.cell_line("cell0001") is None and timings.cell_line("unknown") is None  # short, or not measured
    assert expected_time.Timings.load("gpu", tmp_path).notebook_line("cell0001").startswith(
        "expected time: none measured for the gpu profile")


def test_this_machines_reference_wins_over_a_newer_one_elsewhere(tmp_path, monkeypatch):
    from course_lib import machine

    _reference(tmp_path, hardware="machine A", date="2026-12-01T00:00:00Z", cells={"cell0002": 100.0})
    _reference(tmp_path, hardware="machine B", date="2026-12-05T00:00:00Z", cells={"cell0002": 300.0})
    monkeypatch.setattr(machine, "describe_hardware", lambda *args: "machine A")
    assert expected_time.Timings.load("cpu", tmp_path).cells["cell0002"][0] == 100.0


@pytest.mark.parametrize("profile", ["smoke", "rehearsal"])
def test_a_quick_profile_says_under_a_minute(profile, capsys):
    assert expected_time.announce(profile) == f"expected time: under a minute ({profile} profile)"
    assert capsys.readouterr().out.strip() == f"expected time: under a minute ({profile} profile)"


@pytest.mark.slow
def test_in_a_kernel_the_first_line_and_the_long_cell_are_announced(tmp_path):
    """Executed as papermill executes a notebook (nbclient sends no cell id, so each cell is found by its code):
    the setup cell's first line names the notebook's time, the long cell's output starts with its time, a short
    cell says nothing."""
    from nbclient import NotebookClient

    code = f"from course_lib.analysis import expected_time\nexpected_time.announce('cpu', root={str(tmp_path)!r})"
    _reference(tmp_path, cells={"cell0001": 2.0, "cell0002": 250.0, "cell0003": 3.0},
               sources={"cell0001": code, "cell0002": "print('trained')", "cell0003": "print('scored')"})
    notebook = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(code, id="cell0001"),
                                               nbformat.v4.new_code_cell("print('trained')", id="cell0002"),
                                               nbformat.v4.new_code_cell("print('scored')", id="cell0003")])
    NotebookClient(notebook, timeout=120, kernel_name="python3").execute()
    texts = ["".join(output.get("text", "") for output in cell.outputs) for cell in notebook.cells]
    assert texts[0].startswith("expected time: about 6 min 29 s in the cpu profile"), texts
    assert texts[1].startswith("expected: this cell took 4 min 10 s") and texts[1].endswith("trained\n"), texts
    assert texts[2] == "scored\n"


def test_every_chapter_setup_announces_its_time(capsys):
    from course_lib.chapters.setup import ChapterSetup

    ChapterSetup(profile="smoke", hardware="machine A")
    assert capsys.readouterr().out.startswith("expected time: under a minute (smoke profile)")


def test_a_quick_pass_is_kept_beside_the_long_reference_and_its_times_are_read(tmp_path):
    """A cpu run saved over a notebook whose reference is a `reference`-profile run goes beside it: the long
    run stays the chapter's reference, and the cpu pass's cell times still reach the announcement."""
    long_run = _reference(tmp_path, profile="reference", seconds=3383.0, cells={"cell0002": 3000.0})
    quick = _reference(tmp_path, profile="cpu", seconds=389.0)
    assert long_run == tmp_path / "machine-a" / "07.json" and quick == tmp_path / "machine-a" / "cpu" / "07.json"
    assert reference.load(long_run).profile == "reference"  # not replaced
    assert reference.find("07", hardware="machine A", root=tmp_path).profile == "reference"
    assert expected_time.Timings.load("cpu", tmp_path).cells["cell0002"][0] == 250.0
    assert expected_time.Timings.load("reference", tmp_path).cells["cell0002"][0] == 3000.0
    # a second cpu pass replaces the first beside it; a cpu pass where no long run is kept is the reference
    assert _reference(tmp_path, profile="cpu", seconds=400.0) == quick
    assert _reference(tmp_path, notebook="08", profile="cpu") == tmp_path / "machine-a" / "08.json"
