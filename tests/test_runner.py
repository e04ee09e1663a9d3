import io
import json
import os

import nbformat
import pytest
from conftest import ROOT
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
    with pytest.raises(ConfigError, match="repeats must be an integer, got .2.5."):
        runner.check_parameters(notebooks, ["repeats=2.5"])


def test_bad_parameter_runs_nothing(book, tmp_path):
    out = tmp_path / "out"
    with pytest.raises(ConfigError):
        runner.run_workbook("smoke", assignments=["nope=1"], out_dir=out, notebooks_folder=book)
    assert not out.exists()


@pytest.mark.slow
def test_run_continues_past_a_failure(book, tmp_path, isolated_ledger):
    out, results = runner.run_workbook("smoke", assignments=["repeats=4"], out_dir=tmp_path / "out",
                                       notebooks_folder=book, stream=io.StringIO())
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
    # the run's exports (ledger, run id, profile) were for its kernels: the caller's environment is as it was
    assert ledger.RUN_ID_ENV not in os.environ and ledger.PROFILE_ENV not in os.environ


@pytest.mark.slow
def test_cli_exit_code_names_the_failure(book, tmp_path, monkeypatch, capsys):
    from course_lib import cli

    monkeypatch.setattr(runner, "notebooks_dir", lambda: book)
    assert cli.main(["run", "--profile", "smoke", "--only", "01", "--out", str(tmp_path / "o")]) == 1
    assert "01_broken.ipynb" in capsys.readouterr().err


TYPED_CELL = """profile = "auto"  # smoke | cpu | gpu | auto
batch_size = None  # images; None: the profile's value
run_ddp = "auto"  # auto | true | false; auto: when this machine can
source = "auto"  # auto | imagenet | landcover-synth | digits; auto: what is available
sizes = []  # generated sizes in pixels; []: from the profile
choices = [1, 2, 4]  # micro-batches to compare
steps = 0  # optimizer steps; 0: from the profile
rate = 0.5  # a fraction
name = "x"  # free text
flag = False  # a plain switch"""


@pytest.fixture
def typed_book(tmp_path):
    folder = tmp_path / "typed"
    folder.mkdir()
    _notebook(folder / "00_typed.ipynb", TYPED_CELL, "print(run_ddp, source, sizes, choices, steps, rate, name, flag)")
    return folder


def _typed(folder, *assignments):
    notebooks = runner.list_notebooks(folder)
    return runner.check_parameters(notebooks, list(assignments))[notebooks[0]]


def test_parameters_are_typed_by_their_default(typed_book):
    typed = _typed(typed_book, "sizes=[64, 256]", "choices=[8]", "steps=12", "rate=1e-3", "name=false", "flag=no")
    assert typed == {"sizes": [64, 256], "choices": [8], "steps": 12, "rate": 0.001, "name": "false", "flag": False}
    assert type(typed["steps"]) is int and type(typed["rate"]) is float


@pytest.mark.parametrize("text, expected", [("false", False), ("true", True), ("False", False), ("auto", "auto")])
def test_tri_state_parameter_arrives_as_bool_or_auto(typed_book, text, expected):
    value = _typed(typed_book, f"run_ddp={text}")["run_ddp"]
    assert value == expected and type(value) is type(expected)


def test_choice_parameters_accept_only_their_choices(typed_book):
    assert _typed(typed_book, "source=digits")["source"] == "digits"
    with pytest.raises(ConfigError) as refused:
        _typed(typed_book, "run_ddp=maybe")
    assert str(refused.value) == "run_ddp must be auto, true or false, got 'maybe'"
    with pytest.raises(ConfigError, match="source must be auto, imagenet, landcover-synth or digits, got 'true'"):
        _typed(typed_book, "source=true")  # true/false are bools only where the comment lists them


@pytest.mark.parametrize("assignment, message", [
    ("sizes=64,256", "sizes must be a list like \\[1, 2\\], got '64,256'"),
    ("sizes=[64", "sizes must be a list"),
    ("choices=[1, 2.5]", "choices must be a list of int like \\[1, 2, 4\\]"),
    ("steps=auto", "steps must be an integer, got 'auto'"),
    ("steps=2.5", "steps must be an integer"),
    ("rate=half", "rate must be a number, got 'half'"),
    ("flag=maybe", "flag must be true or false, got 'maybe'"),
    ("batch_size=many", "batch_size must be int"),
])
def test_bad_values_are_refused_in_one_line(typed_book, assignment, message):
    with pytest.raises(ConfigError, match=message) as refused:
        _typed(typed_book, assignment)
    assert "\n" not in str(refused.value)


def test_a_none_default_is_reported_and_cannot_be_set(tmp_path):
    folder = tmp_path / "untyped"
    folder.mkdir()
    path = _notebook(folder / "00_untyped.ipynb", 'profile = "auto"  # profile\nbatch_size = None  # images\n'
                     'run_ddp = None  # True or False; None: automatic', "print(run_ddp)")
    declared = runner.declared_parameters(path)
    assert declared["batch_size"].problem() is None  # a Config field: None is "the profile's value"
    assert declared["run_ddp"].problem().startswith("00_untyped.ipynb: parameter run_ddp defaults to None")
    with pytest.raises(ConfigError, match='run_ddp defaults to None.*"auto" for a choice'):
        runner.check_parameters([path], ["run_ddp=false"])


def test_declaration_problems(tmp_path):
    folder = tmp_path / "odd"
    folder.mkdir()
    path = _notebook(folder / "00_odd.ipynb", 'profile = "auto"  # profile\nmode = "fast"  # auto | true | false\n'
                     "limit = 2 ** 10  # bytes\npair = (1, 2)  # a tuple", "print(mode)")
    declared = runner.declared_parameters(path)
    assert declared["profile"].problem() is None
    assert "defaults to 'fast', which is not among its choices auto | true | false" in declared["mode"].problem()
    assert "defaults to the expression 2 ** 10" in declared["limit"].problem()
    assert "defaults to a tuple" in declared["pair"].problem()


def _no_kernel(*args, **kwargs):
    raise AssertionError("a notebook was executed although a parameter was refused")


@pytest.mark.parametrize("assignment", ["run_ddp=maybe", "batch_size=0", "steps=lots", "image_size=-3"])
def test_bad_values_run_nothing(typed_book, tmp_path, monkeypatch, assignment):
    monkeypatch.setattr(runner, "execute_notebook", _no_kernel)
    out = tmp_path / "out"
    with pytest.raises(ConfigError):
        runner.run_workbook("smoke", assignments=[assignment], out_dir=out, notebooks_folder=typed_book,
                            stream=io.StringIO())
    assert not out.exists()


def test_config_values_are_checked_up_front(typed_book):
    notebooks = runner.list_notebooks(typed_book)
    assert runner.check_parameters(notebooks, ["batch_size=0"]) == {notebooks[0]: {"batch_size": 0}}  # types only
    with pytest.raises(ConfigError, match="^batch_size must be at least 1, got 0$"):
        runner.check_parameters(notebooks, ["batch_size=0"], profile="smoke")


@pytest.mark.parametrize("assignment", ["lr=inf", "lr=nan", "lr=-1", "epochs=0", "seed=-1", "image_size=99999"])
def test_values_outside_their_range_start_no_kernel(tmp_path, monkeypatch, assignment):
    folder = tmp_path / "ranges"
    folder.mkdir()
    _notebook(folder / "00_ranges.ipynb", 'profile = "auto"  # profile\nlr = None  # peak learning rate\n'
              "epochs = None  # passes\nseed = None  # seed\nimage_size = None  # pixels", "print(lr)")
    monkeypatch.setattr(runner, "execute_notebook", _no_kernel)
    out = tmp_path / "out"
    name = assignment.split("=")[0]
    with pytest.raises(ConfigError, match=f"^{name} must be "):
        runner.run_workbook("smoke", assignments=[assignment], out_dir=out, notebooks_folder=folder,
                            stream=io.StringIO())
    assert not out.exists()


def test_cli_refuses_a_bad_value_in_one_line(typed_book, tmp_path, monkeypatch, capsys):
    from course_lib import cli

    monkeypatch.setattr(runner, "notebooks_dir", lambda: typed_book)
    monkeypatch.setattr(runner, "execute_notebook", _no_kernel)
    assert cli.main(["run", "--profile", "smoke", "-p", "run_ddp=maybe", "--out", str(tmp_path / "o")]) == 2
    captured = capsys.readouterr()
    refusal = "workbook run: error: run_ddp must be auto, true or false, got 'maybe'"
    assert captured.err.strip().splitlines() == [refusal]
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("seconds, text", [(0.04, "0.0 s"), (7.64, "7.6 s"), (59.94, "59.9 s"), (60, "1 min 00 s"),
                                           (185.4, "3 min 05 s"), (3725, "1 h 02 min")])
def test_format_duration(seconds, text):
    assert runner.format_duration(seconds) == text


class FakeClock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


def test_progress_when_piped_prints_a_line_at_most_every_interval(tmp_path):
    stream, clock = io.StringIO(), FakeClock()
    progress = runner.NotebookProgress(tmp_path / "03_mixed.ipynb", 40, stream, interactive=False, interval=30,
                                       clock=clock)
    progress.start(ticking=False)
    progress.on_cell(1)
    clock.now += 31
    progress.on_cell(12)
    clock.now += 10
    progress.on_cell(13)  # 10 s after the last line: silent
    progress.tick()
    clock.now += 25
    progress.tick()  # a long cell still gets a line once the interval has passed
    progress.finish("ok", 75.0)
    lines = stream.getvalue().splitlines()
    assert lines[0].startswith("[03] 03_mixed: started at ") and lines[0].endswith(", 40 code cells")
    assert lines[1:] == ["[03] 03_mixed: cell 12/40, 31.0 s", "[03] 03_mixed: cell 13/40, 1 min 06 s",
                         "[03] 03_mixed: ok in 1 min 15 s"]
    assert "\r" not in stream.getvalue()


def test_progress_when_piped_with_interval_zero_prints_every_cell(tmp_path):
    stream = io.StringIO()
    progress = runner.NotebookProgress(tmp_path / "01_x.ipynb", 2, stream, interactive=False, interval=0,
                                       clock=FakeClock())
    progress.start(ticking=False)
    progress.on_cell(1)
    progress.tick()
    progress.on_cell(2)
    progress.finish("failed", 3.0, "cell 2: ValueError: boom")
    assert stream.getvalue().splitlines()[1:] == ["[01] 01_x: cell 1/2, 0.0 s", "[01] 01_x: cell 2/2, 0.0 s",
                                                  "[01] 01_x: failed in 3.0 s: cell 2: ValueError: boom"]


def test_progress_on_a_terminal_rewrites_one_line(tmp_path):
    stream, clock = io.StringIO(), FakeClock()
    progress = runner.NotebookProgress(tmp_path / "07_regularization.ipynb", 30, stream, interactive=True,
                                       clock=clock)
    progress.start(ticking=False)
    progress.on_cell(1)
    clock.now += 2
    progress.tick()
    progress.on_cell(2)
    progress.finish("ok", 2.5)
    text = stream.getvalue()
    start, rest = text.split("\n", 1)
    assert start.startswith("[07] 07_regularization: started at ")
    erase = runner.CLEAR_TO_END_OF_LINE
    tag = "\r[07] 07_regularization"
    assert rest == (f"{tag}: cell 1/30, 0.0 s{erase}{tag}: cell 1/30, 2.0 s{erase}"
                    f"{tag}: cell 2/30, 2.0 s{erase}{tag}: ok in 2.5 s{erase}\n")


def test_ticker_thread_stops_at_finish(tmp_path):
    progress = runner.NotebookProgress(tmp_path / "00_a.ipynb", 1, io.StringIO(), interactive=False)
    progress.start()
    assert progress._ticker.is_alive()
    progress.finish("ok", 0.1)
    assert not progress._ticker.is_alive()


def test_code_cell_count_includes_the_injected_parameters_cell(book):
    assert runner.code_cell_count(book / "00_first.ipynb") == 3


@pytest.mark.notebook
def test_smoke_run_prints_start_counter_and_duration_only(tmp_path, capfd):
    """The real 00 notebook: per notebook a start line, one counter line per cell (interval 0) and the
    status with the duration. The kernel shares this process's stderr, so capfd also sees its warnings."""
    _, results = runner.run_workbook("smoke", only="00", out_dir=tmp_path / "out",
                                     notebooks_folder=ROOT / "notebooks", progress_interval=0)
    assert [r.status for r in results] == ["ok"], results[0].error
    captured = capfd.readouterr()
    assert "without encryption" not in captured.out + captured.err
    assert captured.err == ""
    header, started, *counters, finished = captured.out.splitlines()
    assert header.startswith("workbook run ") and "1 notebook, profile smoke" in header
    cells = runner.code_cell_count(ROOT / "notebooks" / "00_setup_check.ipynb")
    assert started.startswith("[00] 00_setup_check: started at ") and started.endswith(f", {cells} code cells")
    assert [line.split(",")[0] for line in counters] == [f"[00] 00_setup_check: cell {n}/{cells}"
                                                         for n in range(1, cells + 1)]
    assert finished.startswith("[00] 00_setup_check: ok in ") and finished.endswith(" s")


@pytest.mark.notebook
def test_what_the_kernel_process_writes_outside_the_notebook_goes_to_its_log_not_the_terminal(tmp_path, capfd):
    """C libraries and forked workers write to the kernel's file descriptors (libzmq's abort at a kernel's
    shutdown once broke CI this way): `workbook run` keeps that in <notebook>.kernel.log and names it."""
    folder = tmp_path / "notebooks"
    folder.mkdir()
    _notebook(folder / "00_noisy.ipynb", 'profile = "auto"  # profile',
              "import os\nos.write(2, b'from the kernel fd 2\\n')\nos.write(1, b'from the kernel fd 1\\n')\n"
              "pid = os.fork()\nif pid == 0:\n    os.write(2, b'from a forked child\\n')\n    os._exit(0)\n"
              "os.waitpid(pid, 0)\nprint('in the notebook')")
    _notebook(folder / "01_quiet.ipynb", 'profile = "auto"  # profile', "print('quiet')")
    out, results = runner.run_workbook("smoke", out_dir=tmp_path / "out", notebooks_folder=folder, progress_interval=0)
    assert [r.status for r in results] == ["ok", "ok"]
    captured = capfd.readouterr()
    assert "from" not in captured.err + "".join(l for l in captured.out.splitlines() if "kernel.log" not in l)
    assert results[0].kernel_log == "00_noisy.kernel.log" and results[1].kernel_log is None
    log = (out / "00_noisy.kernel.log").read_text()
    assert all(text in log for text in ("from the kernel fd 2", "from the kernel fd 1", "from a forked child"))
    assert not (out / "01_quiet.kernel.log").exists()
    assert f"[00] 00_noisy: its kernel process also wrote outside the notebook: {out / '00_noisy.kernel.log'}" \
        in captured.out
    executed = nbformat.read(str(out / "00_noisy.ipynb"), as_version=4)
    assert "in the notebook" in json.dumps(executed.cells[-1].outputs)


# --- nothing lost, nothing late: broken notebooks, unwritable folders, Ctrl-C ------------------------

def test_a_notebook_with_broken_json_is_named_before_anything_runs(book, tmp_path, monkeypatch, capsys):
    from course_lib import cli

    text = (book / "01_broken.ipynb").read_text()
    (book / "01_broken.ipynb").write_text(text.replace('"cells": [', '"cells": [,', 1))  # a bad merge
    out = tmp_path / "out"
    with pytest.raises(ConfigError, match=r"01_broken.ipynb is not valid JSON \(line 2 column \d+: "):
        runner.run_workbook("smoke", out_dir=out, notebooks_folder=book)
    assert not out.exists()  # nothing ran, nothing was written
    monkeypatch.setattr(runner, "notebooks_dir", lambda: book)
    assert cli.main(["run", "--profile", "smoke", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "01_broken.ipynb is not valid JSON" in err
    (book / "01_broken.ipynb").write_text('{"cells": 3}')
    with pytest.raises(ConfigError, match="01_broken.ipynb is JSON but not a notebook"):
        runner.run_workbook("smoke", out_dir=out, notebooks_folder=book)


def test_an_output_folder_that_cannot_be_written_is_one_line_before_any_kernel(book, tmp_path, monkeypatch, capsys):
    from course_lib import cli

    blocker = tmp_path / "a-file"
    blocker.write_text("in the way")
    monkeypatch.setattr(runner, "notebooks_dir", lambda: book)
    monkeypatch.setattr(runner, "execute_notebook", lambda *args, **kwargs: pytest.fail("a notebook ran"))
    assert cli.main(["run", "--profile", "smoke", "--only", "00", "--out", str(blocker / "out")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and f"cannot write to {blocker / 'out'}" in err
    assert "(--out another folder)" in err and "output_dir" not in err  # its own option (issue 49, point 14)


@pytest.fixture
def ctrl_c_raises():
    """Python's own Ctrl-C handler while the test runs: a pytest started in the background by a
    non-interactive shell (`make test &`) inherits SIGINT ignored, and the kernel's SIGINT would never
    reach the runner (the tests below would then fail for the launcher's sake, not the runner's)."""
    import signal

    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


@pytest.mark.slow
def test_ctrl_c_leaves_an_index_of_what_ran_and_marks_the_interrupted_notebook(tmp_path, isolated_ledger, capsys,
                                                                               ctrl_c_raises):

    folder = tmp_path / "notebooks"
    folder.mkdir()
    out = tmp_path / "out"
    _notebook(folder / "00_first.ipynb", 'profile = "auto"  # profile', "print('first ran')")
    # While 01 runs, the index already lists 00; then Ctrl-C reaches the runner (not the kernel,
    # which jupyter_client starts in its own session, as a terminal's Ctrl-C would).
    _notebook(folder / "01_stopped.ipynb", 'profile = "auto"  # profile',
              "import os, pathlib, signal, time\n"
              f"index = pathlib.Path({str(out / 'index.html')!r}).read_text()\n"
              "assert '00_first.html' in index and 'not run' in index\n"
              f"os.kill({os.getpid()}, signal.SIGINT)\n"
              "time.sleep(60)")
    _notebook(folder / "02_never.ipynb", 'profile = "auto"  # profile', "print('never')")
    with pytest.raises(runner.RunInterrupted) as caught:
        runner.run_workbook("smoke", out_dir=out, notebooks_folder=folder, stream=io.StringIO())
    assert [r.status for r in caught.value.results] == ["ok", "interrupted"]
    index = (out / "index.html").read_text()
    assert "00_first.html" in index and "interrupted" in index and "02_never.ipynb" in index and "not run" in index
    summary = json.loads((out / "summary.json").read_text())
    assert summary["state"] == "interrupted" and summary["not_run"] == ["02_never.ipynb"]
    assert [r["status"] for r in summary["results"]] == ["ok", "interrupted"]
    rows = ledger.Ledger(isolated_ledger).rows(kind="notebook")
    assert sorted((r["name"], r["status"]) for r in rows) == [("00_first.ipynb", "ok"), ("01_stopped.ipynb", "failed")]
    assert "interrupted" in str(caught.value)


def test_cli_reports_an_interrupted_run_in_one_line(tmp_path, monkeypatch, capsys):
    from course_lib import cli

    def interrupted(*args, **kwargs):
        raise runner.RunInterrupted(tmp_path, [])

    monkeypatch.setattr(runner, "run_workbook", interrupted)
    assert cli.main(["run", "--profile", "smoke"]) == 130
    err = capsys.readouterr().err.strip()
    assert err == f"workbook run: interrupted; the notebooks run so far are listed in {tmp_path / 'index.html'}"


def test_kernels_see_the_notebooks_profile_so_their_claims_record_it(monkeypatch):
    monkeypatch.setenv(ledger.PROFILE_ENV, "cpu")
    with runner.profile_for_kernels("smoke"):
        assert ledger.make_row("claim", "amp_speedup")["profile"] == "smoke"
    assert ledger.make_row("claim", "amp_speedup")["profile"] == "cpu"  # restored after the notebook
    monkeypatch.delenv(ledger.PROFILE_ENV)
    with runner.profile_for_kernels(None):
        assert ledger.make_row("claim", "amp_speedup")["profile"] is None  # no profile given: "unknown" later


@pytest.mark.parametrize("assignment, message", [
    ('counts=["a"]', "counts must be a list of int like \\[1, 2\\], got"),
    ("counts=[True]", "counts must be a list of int"),  # True is an int to isinstance, not a count
    ("counts=[1.5]", "counts must be a list of int"),
    ("choices=[2, False]", "choices must be a list of int like \\[1, 2, 4\\]"),
    ("steps=\u0663", "steps must be an integer, got"),  # an Arabic-Indic 3: int() takes it, we do not
    ("steps=1", "-p steps is given twice \\('1', then '2'\\); give each parameter once"),
])
def test_list_items_duplicates_and_non_ascii_digits_are_refused_before_any_kernel(tmp_path, monkeypatch, assignment,
                                                                                   message):
    folder = tmp_path / "lists"
    folder.mkdir()
    _notebook(folder / "00_lists.ipynb", 'profile = "auto"  # profile\ncounts = []  # list of int: sizes; []: auto\n'
              "choices = [1, 2, 4]  # to compare\nsteps = 0  # steps", "print(counts)")
    monkeypatch.setattr(runner, "execute_notebook", _no_kernel)
    assignments = [assignment, "steps=2"] if assignment == "steps=1" else [assignment]
    with pytest.raises(ConfigError, match=message):
        runner.run_workbook("smoke", assignments=assignments, out_dir=tmp_path / "out", notebooks_folder=folder,
                            stream=io.StringIO())
    assert not (tmp_path / "out").exists()
    assert runner.check_parameters(runner.list_notebooks(folder), ["counts=[64, 128]"])[
        runner.list_notebooks(folder)[0]] == {"counts": [64, 128]}


def test_every_empty_list_parameter_of_the_notebooks_names_its_item_type():
    for path in runner.list_notebooks():
        for parameter in runner.declared_parameters(path).values():
            if not parameter.is_config_field and parameter.default == []:
                assert parameter.element_type is not None, f"{path.name}: {parameter.name} needs `# list of int: ...`"


def _stopping_book(tmp_path, stop_code):
    """00 runs; while 01 runs, its kernel sends the runner `stop_code` (Python source); 02 never runs."""
    folder = tmp_path / "notebooks"
    folder.mkdir()
    _notebook(folder / "00_first.ipynb", 'profile = "auto"  # profile', "print('first ran')")
    _notebook(folder / "01_stopped.ipynb", 'profile = "auto"  # profile',
              f"import os, signal, time\n{stop_code}\ntime.sleep(60)")
    _notebook(folder / "02_never.ipynb", 'profile = "auto"  # profile', "print('never')")
    return folder


def _assert_reported_as_interrupted(out, results, isolated_ledger, reason):
    assert [(r.status, r.error) for r in results] == [("ok", None), ("interrupted", results[1].error)]
    assert reason in results[1].error
    summary = json.loads((out / "summary.json").read_text())
    assert summary["state"] == "interrupted" and summary["not_run"] == ["02_never.ipynb"]
    assert [r["status"] for r in summary["results"]] == ["ok", "interrupted"]
    rows = ledger.Ledger(isolated_ledger).rows(kind="notebook")
    assert sorted((r["name"], r["status"]) for r in rows) == [("00_first.ipynb", "ok"), ("01_stopped.ipynb", "failed")]


@pytest.mark.parametrize("name, exit_code", [("SIGTERM", 143), ("SIGHUP", 129)])
@pytest.mark.slow
def test_sigterm_and_sighup_mark_the_run_interrupted_not_running(tmp_path, isolated_ledger, name, exit_code):
    out = tmp_path / "out"
    folder = _stopping_book(tmp_path, f"os.kill({os.getpid()}, signal.{name})")
    with pytest.raises(runner.RunInterrupted) as caught:
        runner.run_workbook("smoke", out_dir=out, notebooks_folder=folder, stream=io.StringIO())
    assert caught.value.exit_code == exit_code and f"stopped by {name}" in str(caught.value)
    _assert_reported_as_interrupted(out, caught.value.results, isolated_ledger, f"stopped by {name}")


@pytest.mark.slow
def test_a_second_ctrl_c_while_the_report_is_written_is_noted_not_a_traceback(tmp_path, isolated_ledger,
                                                                             monkeypatch, ctrl_c_raises):
    import os
    import signal

    out = tmp_path / "out"
    folder = _stopping_book(tmp_path, f"os.kill({os.getpid()}, signal.SIGINT)")
    real_to_html = runner.to_html

    def impatient_to_html(path):  # the user presses Ctrl-C again while the interrupted notebook is rendered
        if path.name == "01_stopped.ipynb":
            os.kill(os.getpid(), signal.SIGINT)
        return real_to_html(path)

    monkeypatch.setattr(runner, "to_html", impatient_to_html)
    stream = io.StringIO()
    with pytest.raises(runner.RunInterrupted) as caught:
        runner.run_workbook("smoke", out_dir=out, notebooks_folder=folder, stream=stream)
    assert caught.value.exit_code == 130
    assert "SIGINT again; already stopping, writing the report first" in stream.getvalue()
    _assert_reported_as_interrupted(out, caught.value.results, isolated_ledger, "interrupted (Ctrl-C)")
    assert (out / "01_stopped.html").exists()


def test_only_with_no_numbers_is_refused_in_one_line(book, monkeypatch, capsys):
    from course_lib import cli

    with pytest.raises(ConfigError, match="--only '' names no notebook"):
        runner.list_notebooks(book, "")
    monkeypatch.setattr(runner, "notebooks_dir", lambda: book)
    monkeypatch.setattr(runner, "execute_notebook", _no_kernel)
    for only in ("", " , "):
        assert cli.main(["run", "--profile", "smoke", "--only", only]) == 2
        error = capsys.readouterr().err
        assert error.count("\n") == 1 and "names no notebook; give numbers like 00,03" in error


@pytest.mark.slow
def test_a_full_disk_in_the_html_step_keeps_the_finished_notebook(tmp_path, isolated_ledger, monkeypatch, capsys):
    import errno

    from course_lib import paths

    folder = tmp_path / "notebooks"
    folder.mkdir()
    _notebook(folder / "00_done.ipynb", 'profile = "auto"  # profile', "print('done')")
    real_write = paths.write_atomically

    def full_for_html(path, text):
        if path.suffix == ".html" and path.name != "index.html":
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_write(path, text)

    monkeypatch.setattr(paths, "write_atomically", full_for_html)
    out, results = runner.run_workbook("smoke", out_dir=tmp_path / "out", notebooks_folder=folder,
                                       stream=io.StringIO())
    assert [(r.notebook, r.status, r.html) for r in results] == [("00_done.ipynb", "ok", None)]
    assert json.loads((out / "summary.json").read_text())["results"][0]["status"] == "ok"
    assert [r["status"] for r in ledger.Ledger(isolated_ledger).rows(kind="notebook")] == ["ok"]
    assert "00_done.html was not written (No space left on device)" in capsys.readouterr().err
    assert not list(out.glob(".*.tmp"))


@pytest.mark.parametrize("content", ['{"run_id": "x", "profile": "smoke", "resu', "", '["not", "a", "summary"]'])
def test_report_on_a_truncated_summary_is_one_line(tmp_path, capsys, content):
    from course_lib import cli

    (tmp_path / "summary.json").write_text(content)
    assert cli.main(["report", str(tmp_path)]) == 2
    error = capsys.readouterr().err
    assert error.count("\n") == 1, error
    assert f"{tmp_path / 'summary.json'} cannot be read" in error or f"{tmp_path / 'summary.json'} is not a run " \
        "summary (it holds a JSON list" in error, error


# --- a cell that prints nothing for a long time is named --------------------------------------------

def test_a_silent_cell_is_named_once_per_silent_stretch(tmp_path):
    stream, clock = io.StringIO(), FakeClock()
    progress = runner.NotebookProgress(tmp_path / "12_time.ipynb", 5, stream, interactive=False, interval=0,
                                       clock=clock, silence=60)
    progress.start(ticking=False)
    progress.on_cell(3, "# the ablation\nresults = study.ablation(config)\nresults")
    clock.now += 59
    progress.tick()  # not yet
    clock.now += 2
    progress.tick()
    clock.now += 30
    progress.tick()  # the same stretch: warned once
    progress.on_output()
    clock.now += 61
    progress.tick()  # output, then silent again: a second warning
    warnings = [line for line in stream.getvalue().splitlines() if "warning" in line]
    assert warnings == ["[12] 12_time: warning: cell 3/5 (results = study.ablation(config)) has printed nothing "
                        "for 1 min 01 s; it is still running (Ctrl-C stops the run)"] * 2


def test_no_silence_warning_with_silence_zero(tmp_path):
    stream, clock = io.StringIO(), FakeClock()
    progress = runner.NotebookProgress(tmp_path / "00_a.ipynb", 1, stream, interactive=False, interval=0,
                                       clock=clock, silence=0)
    progress.start(ticking=False)
    progress.on_cell(1, "work()")
    clock.now += 3600
    progress.tick()
    assert "warning" not in stream.getvalue()


@pytest.mark.slow
def test_workbook_run_warns_about_a_silent_cell_but_not_a_talking_one(tmp_path, capfd):
    """Real kernels: a cell that sleeps 7 s without output is named (threshold 4 s); a cell that prints
    every 0.3 s for as long is not, so the watch sees the kernel's output messages (`watching_engine`).
    The threshold is over ten times the gap between prints: on a loaded 2-core CI machine a print took 1.7 s
    to reach the client (a 1.5 s threshold failed there). An all-ok run leaves nothing on the terminal's
    stderr (no kernel ERROR line from the shutdown's interrupt)."""
    folder = tmp_path / "notebooks"
    folder.mkdir()
    _notebook(folder / "00_quiet.ipynb", 'profile = "auto"  # profile', "import time\ntime.sleep(7)")
    _notebook(folder / "01_talking.ipynb", 'profile = "auto"  # profile',
              "import time\nfor i in range(24):\n    print(i, flush=True)\n    time.sleep(0.3)")
    stream = io.StringIO()
    _, results = runner.run_workbook("smoke", out_dir=tmp_path / "out", notebooks_folder=folder, stream=stream,
                                     silence_seconds=4)
    assert [r.status for r in results] == ["ok", "ok"], [r.error for r in results]
    warnings = [line for line in stream.getvalue().splitlines() if "warning" in line]
    assert len(warnings) == 1, stream.getvalue()
    # cells: the parameters cell, the one papermill injects, then the sleeping one
    assert warnings[0].startswith("[00] 00_quiet: warning: cell 3/3 (import time) has printed nothing for ")
    assert capfd.readouterr().err == ""


def test_a_negative_silence_threshold_is_refused_in_one_line(book):
    with pytest.raises(ConfigError, match="--silent-cell-warning must be a number of seconds"):
        runner.run_workbook("smoke", notebooks_folder=book, silence_seconds=-1)


def test_the_reference_profile_runs_the_notebooks_that_offer_it_and_refuses_the_others_by_name(tmp_path, monkeypatch):
    folder = tmp_path / "notebooks"
    folder.mkdir()
    _notebook(folder / "00_quick.ipynb", 'profile = "auto"  # smoke | cpu | gpu | auto', "print(1)")
    _notebook(folder / "07_long.ipynb", 'profile = "auto"  # smoke | cpu | gpu | auto | reference', "print(2)")
    found = runner.list_notebooks(folder, None)
    assert [p.name for p in runner.reference_notebooks(found, chosen=False)] == ["07_long.ipynb"]
    with pytest.raises(ConfigError, match=r"notebook\(s\) 00 have no reference sizes .*runs 07; use --profile cpu"):
        runner.reference_notebooks(found, chosen=True)
    with pytest.raises(ConfigError, match="none of the selected notebooks offers the reference profile"):
        runner.reference_notebooks(found[:1], chosen=False)
    monkeypatch.setattr(runner, "execute_notebook", _no_kernel)  # refused before any kernel starts
    with pytest.raises(ConfigError, match="have no reference sizes"):
        runner.run_workbook("reference", only="00,07", out_dir=tmp_path / "out", notebooks_folder=folder)
    timeouts = []

    def executed(path, output, parameters, cell_timeout, **hooks):
        timeouts.append((path.name, parameters["profile"], cell_timeout))
        return runner.NotebookResult(path.name, "ok", 0.1, output.name, parameters=parameters)

    monkeypatch.setattr(runner, "execute_notebook", executed)
    runner.run_workbook("reference", out_dir=tmp_path / "run", notebooks_folder=folder, stream=io.StringIO())
    runner.run_workbook("reference", out_dir=tmp_path / "run2", notebooks_folder=folder, stream=io.StringIO(),
                        cell_timeout=60)
    # 07's variant loop outlasts the 30 minutes of a cell: the first reference run stopped there
    assert timeouts == [("07_long.ipynb", "reference", runner.REFERENCE_CELL_TIMEOUT_SECONDS),
                        ("07_long.ipynb", "reference", 60)]


def test_the_chapters_that_offer_the_reference_profile():
    """03, 07, 13 and 15 so far (issue 51): the others' reference is their cpu run."""
    offering = [p.name[:2] for p in runner.list_notebooks(ROOT / "notebooks", None) if runner.offers_reference(p)]
    assert offering == ["03", "07", "13", "15"]
