"""The install files agree: environment.yml names the same packages as pyproject.toml, and the
Makefile and CI call what the README says."""
import functools
import importlib.util
import os
import re
import subprocess
import sys
import tempfile
import types
from pathlib import Path

import pytest
import tomllib
import yaml
from conftest import ROOT


def _name(requirement: str) -> str:
    return re.split(r"[<>=!~\[ ;]", requirement.strip(), maxsplit=1)[0].lower()


def test_environment_yml_matches_pyproject():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    declared = {_name(r) for r in project["dependencies"]}
    environment = yaml.safe_load((ROOT / "environment.yml").read_text())
    pip_section = next(d["pip"] for d in environment["dependencies"] if isinstance(d, dict))
    listed = {_name(r) for r in pip_section if not r.startswith("-e")}
    assert listed == declared
    assert any(r.startswith("-e .") for r in pip_section), "environment.yml must install the project itself"


def test_console_script_and_make_targets():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["scripts"]["workbook"] == "course_lib.cli:main"
    makefile = (ROOT / "Makefile").read_text()
    for target in ("workbook:", "test:", "lab:"):
        assert target in makefile
    assert "make test" in (ROOT / ".ci" / "run").read_text()
    readme = (ROOT / "README.md").read_text()
    first_block = readme.split("```")[1]  # the quick start is the first code block
    assert first_block.splitlines()[1].startswith("make workbook")
    assert "make test" in first_block


SLOW_MARKERS = ("notebook", "browser", "torchrun", "slow")


# Written by a `pytest --collect-only` of the files below: each test's node id and the marks it carries.
MARKS_PLUGIN = """import os


def pytest_collection_finish(session):
    with open(os.environ["WORKBOOK_TEST_MARKS_FILE"], "w") as out:
        for item in session.items:
            out.write(item.nodeid + "\\t" + ",".join(sorted({mark.name for mark in item.iter_markers()})) + "\\n")
"""
MARKED_FILES = ("tests/test_torchrun.py", "tests/test_ddp.py", "tests/test_notebooks.py", "tests/test_readme_commands.py")


@functools.cache
def _marked_files() -> list[str]:
    return sorted({*MARKED_FILES, *(str(path.relative_to(ROOT)) for path in (ROOT / "tests").glob("test_*.py")
                                    if "mark.cuda" in path.read_text())})


def _session_marks(session) -> dict[str, tuple[str, set[str]]] | None:
    """`_marks` read from the running session's own collection, where it holds every test of those files: a whole
    `make test` (each pytest-xdist process collects them all), not filtered by -k, -m or --deselect. That saves a
    collection in a process of its own (13 s of CPU on 2 cores). None otherwise."""
    option = session.config.option
    if option.keyword or option.markexpr or getattr(option, "deselect", None):
        return None
    files = set(_marked_files())
    marks = {item.nodeid: _entry(item.nodeid, [mark.name for mark in item.iter_markers()])
             for item in session.items if item.nodeid.split("::")[0] in files}
    return marks if {node.split("::")[0] for node in marks} == files else None


@pytest.fixture
def marks(request) -> dict[str, tuple[str, set[str]]]:
    """{node id: (test name, its marks)} of MARKED_FILES and every test file that names the cuda mark."""
    return _session_marks(request.session) or _marks()


@functools.cache
def _marks() -> dict[str, tuple[str, set[str]]]:
    """The marks from one collection in a process of its own (each collection imports the files: one instead of four),
    where the running session did not collect them all."""
    folder = Path(tempfile.mkdtemp(prefix="marks-"))
    (folder / "marks_plugin.py").write_text(MARKS_PLUGIN)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(folder), os.environ.get("PYTHONPATH")])),
           "WORKBOOK_TEST_MARKS_FILE": str(folder / "marks.tsv")}
    done = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
                           "-p", "marks_plugin", *_marked_files()],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    lines = [line.split("\t") for line in (folder / "marks.tsv").read_text().splitlines()]
    return {node: _entry(node, marks.split(",")) for node, marks in lines}


def _entry(nodeid: str, marks) -> tuple[str, set[str]]:
    """(test name, its marks) of a node id: the function's name, parameters left out."""
    return nodeid.split("::", 1)[1].split("[")[0], set(filter(None, marks))


def _collected(marks: dict, mark: str, *files: str) -> set[str]:
    """The names of the tests `pytest --collect-only -m mark files` selects (`marks`: the fixture's)."""
    return {name for node, (name, names) in marks.items() if node.split("::")[0] in files and mark in names}


def test_a_command_of_its_own_process_freezes_the_collector_on_its_way_out(monkeypatch, capsys):
    """`workbook ...` and `python -m course_lib ...` (argv None: the process's own) end with `gc.freeze()`, so Python's
    collections at exit skip torch's objects; a caller passing arguments (a test, a notebook) keeps its collector."""
    from course_lib import cli

    frozen = []
    monkeypatch.setattr(cli.gc, "freeze", lambda: frozen.append(True))
    command = ["advise", "--model", "resnet18", "--batch-size", "8", "--image-size", "32", "--precision", "bf16"]
    assert cli.main(command) == 0 and frozen == []
    monkeypatch.setattr(sys, "argv", ["workbook", *command])
    assert cli.main() == 0 and frozen == [True]
    monkeypatch.setattr(sys, "argv", ["workbook", "advise", "--model", "no-such-model"])
    assert cli.main() == 2 and frozen == [True, True]  # an error's way out too


@pytest.mark.slow
def test_make_test_fast_skips_the_registered_slow_markers(marks):
    """The three slow kinds are registered markers (unknown ones fail, --strict-markers), `make test-fast`
    deselects exactly them, and they reach the tests that run notebooks, a browser or torchrun."""
    pytest_options = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]
    assert tuple(line.split(":")[0] for line in pytest_options["markers"]) == (*SLOW_MARKERS, "cuda")
    assert "--strict-markers" in pytest_options["addopts"]
    makefile = (ROOT / "Makefile").read_text()
    assert "FAST_MARKERS := " + " and ".join(f"not {name}" for name in SLOW_MARKERS) in makefile
    assert 'test-fast: $(STAMP)\n\t$(PYTEST) $(PYTEST_PARALLEL) -m "$(FAST_MARKERS)"' in makefile
    assert "make test-fast" in (ROOT / "README.md").read_text()
    torchrun = _collected(marks, "torchrun", "tests/test_torchrun.py", "tests/test_ddp.py")
    assert "test_launcher_names_the_failing_rank_with_its_last_lines" in torchrun
    assert "test_two_worker_ddp_equals_one_worker_training_on_gloo" in torchrun
    assert "test_the_rank_log_stream_sorts_lines_by_rank_and_shows_them_as_they_arrive" not in torchrun  # no processes
    assert _collected(marks, "notebook", "tests/test_notebooks.py") == {"test_runs_in_smoke_profile"}
    readme = _collected(marks, "slow", "tests/test_readme_commands.py")
    assert "test_each_readme_command_runs_to_its_last_line" in readme


def test_the_sessions_own_marks_serve_only_a_whole_unfiltered_collection():
    """Where the running session collected every marked file unfiltered its items give the marks (no collection of
    its own); a -k, -m or --deselect run, or one that lacks a file, falls back to `_marks`'s collection."""
    class Item:
        def __init__(self, nodeid, *names):
            self.nodeid, self.names = nodeid, names

        def iter_markers(self):
            return [types.SimpleNamespace(name=name) for name in self.names]

    items = [Item(f"{path}::test_a[x]", "slow") for path in _marked_files()] + [Item("tests/test_other.py::test_b")]
    option = types.SimpleNamespace(keyword="", markexpr="", deselect=[])
    session = types.SimpleNamespace(items=items, config=types.SimpleNamespace(option=option))
    marks = _session_marks(session)
    assert marks == {f"{path}::test_a[x]": ("test_a", {"slow"}) for path in _marked_files()}
    assert _collected(marks, "slow", "tests/test_notebooks.py") == {"test_a"}
    for filtered in ({"keyword": "ddp"}, {"markexpr": "not slow"}, {"deselect": ["tests/test_ddp.py"]}):
        session.config.option = types.SimpleNamespace(**{**vars(option), **filtered})
        assert _session_marks(session) is None, filtered
    session.config.option, session.items = option, items[1:]
    assert _session_marks(session) is None  # a marked file not collected


CUDA_ONLY_TESTS = {"test_every_decoder_gives_pils_pixels_within_jpeg_tolerance",  # its nvjpeg cases
                   "test_corrupt_bytes_raise_bad_image_error_naming_the_source", "test_device_augment_runs_on_cuda",
                   "test_on_cuda_nvml_gives_utilisation_memory_and_power", "test_nvjpeg_builds_a_cache",
                   "test_on_cuda_the_snapshot_is_written_for_memory_viz"}


@pytest.mark.slow
def test_pytest_m_cuda_collects_every_cuda_only_test_and_nothing_else(marks):
    """One mark, `cuda`, names the CUDA-only tests (a GPU run is `pytest -m cuda`); no test skips on CUDA's
    absence any other way, so none can hide from that run."""
    own_skip = re.compile(r"skip(if)?\(\s*not\s+torch\.cuda\.is_available\(\)")
    own_skips = [f"{path.name}:{number}" for path in sorted((ROOT / "tests").glob("test_*.py"))
                 for number, line in enumerate(path.read_text().splitlines(), 1) if own_skip.search(line)]
    assert not own_skips, f"CUDA-only tests that skip on their own instead of @pytest.mark.cuda: {own_skips}"
    files = sorted(str(path.relative_to(ROOT)) for path in (ROOT / "tests").glob("test_*.py")
                   if "mark.cuda" in path.read_text())
    assert _collected(marks, "cuda", *files) == CUDA_ONLY_TESTS
    assert 'pytest -m cuda' in (ROOT / "scripts" / "gpu_check.sh").read_text()


# --- make venv: PyTorch's CPU-only wheels on request, nbstripout as the notebooks' git filter ---------

def _make_dry_run(tmp_path, *variables):
    """The commands `make venv` would run for a venv that does not exist yet (make -n runs none of them)."""
    return subprocess.run(["make", "-n", "venv", f"VENV={tmp_path / 'venv'}", *variables], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)


def test_make_venv_torch_cpu_installs_the_cpu_wheels_first_and_the_default_does_not(tmp_path):
    default = _make_dry_run(tmp_path)
    assert default.returncode == 0, default.stderr
    assert "download.pytorch.org" not in default.stdout  # CI's `make test` installs exactly as before
    cpu = _make_dry_run(tmp_path, "TORCH=cpu")
    assert cpu.returncode == 0, cpu.stderr
    commands = cpu.stdout.splitlines()
    wheels = next(i for i, line in enumerate(commands) if "--index-url https://download.pytorch.org/whl/cpu" in line)
    project = next(i for i, line in enumerate(commands) if "pip install --quiet --no-compile -e '.[dev,compress]'" in line)
    assert "torch torchvision" in commands[wheels] and wheels < project  # pip then keeps the CPU build
    assert [line for line in commands if line not in default.stdout.splitlines()] == [commands[wheels]]


def test_make_venv_compiles_the_bytecode_on_every_core_after_a_no_compile_install(tmp_path):
    """pip's own bytecode pass is one file at a time (half of a fresh venv's two minutes on 2 cores): it is
    switched off and compileall -j 0 does it instead; with PYTHONDONTWRITEBYTECODE set (as on CI machines) a
    package without bytecode would be compiled again by every process that imports it."""
    commands = _make_dry_run(tmp_path).stdout.splitlines()
    install = next(i for i, line in enumerate(commands) if "pip install --quiet --no-compile -e" in line)
    compiled = next(i for i, line in enumerate(commands) if " -m compileall -qq -j 0 " in line)
    assert install < compiled and "purelib" in commands[compiled]
    timm = importlib.util.find_spec("timm").origin  # installed by `make venv`: compiled whatever the environment says
    assert Path(importlib.util.cache_from_source(timm)).exists(), timm
    # The packages' own test suites are left out; what the project imports is not.
    skip = re.compile(re.search(r"-x '([^']+)'", commands[compiled]).group(1))
    assert skip.search("site-packages/pandas/tests/frame/test_api.py")
    assert skip.search("site-packages/torch/testing/_internal/common_utils.py")
    assert not any(skip.search(importlib.util.find_spec(name).origin) for name in
                   ("torch.testing", "numpy.testing", "sklearn.utils._testing", "timm.layers", "course_lib.engine.train"))


def test_make_venv_refuses_an_unknown_torch_choice_in_one_line(tmp_path):
    done = _make_dry_run(tmp_path, "TORCH=cuda")
    assert done.returncode != 0
    assert "TORCH=cuda is not a choice; use TORCH=cpu" in done.stderr


def test_make_venv_installs_nbstripout_as_the_notebooks_git_filter(tmp_path):
    assert "nbstripout" in _make_dry_run(tmp_path).stdout
    assert "*.ipynb filter=nbstripout" in (ROOT / ".gitattributes").read_text().splitlines()
    dev = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]["dev"]
    assert "nbstripout" in {_name(r) for r in dev}


@pytest.mark.slow
def test_the_committed_notebooks_are_what_the_filter_would_commit(tmp_path):
    """The clean filter `make venv` sets (nbstripout --keep-id) changes nothing a committed notebook says:
    no output, count or volatile metadata to strip and every cell id kept, so installing the filter
    leaves the notebooks as they are (nbformat's reader: a source as one string or as lines is the same)."""
    import shutil

    import nbformat

    makefile = (ROOT / "Makefile").read_text()
    assert "NBSTRIPOUT_CLEAN = sh $(abspath scripts/nbstripout_filter.sh) $(abspath $(VENV)) clean" in makefile
    assert 'git config filter.nbstripout.clean "$(NBSTRIPOUT_CLEAN)"' in makefile
    assert "-m nbstripout --keep-id --extra-keys metadata.language_info" in \
        (ROOT / "scripts" / "nbstripout_filter.sh").read_text()
    committed = sorted((ROOT / "notebooks").glob("*.ipynb"))
    copies = [shutil.copy(path, tmp_path / path.name) for path in committed]
    subprocess.run([sys.executable, "-m", "nbstripout", "--keep-id", *map(str, copies)], check=True, timeout=300)
    for path in committed:
        cleaned = nbformat.reads((tmp_path / path.name).read_text(), as_version=nbformat.NO_CONVERT)
        assert cleaned == nbformat.reads(path.read_text(), as_version=nbformat.NO_CONVERT), \
            f"{path.name} has outputs or metadata to strip"


@pytest.mark.slow
def test_with_the_filter_a_saved_notebooks_outputs_stay_out_of_the_commit(tmp_path):
    """The filter as `make venv` sets it, in a scratch repository: a notebook saved with outputs (as
    JupyterLab does) is staged without them, with its cell ids kept, while the working file keeps them."""
    import shutil

    import nbformat
    from nbformat.v4 import new_code_cell, new_notebook, new_output

    def git(*args):
        return subprocess.run(["git", *args], cwd=tmp_path, capture_output=True, text=True, timeout=60, check=True)

    git("init", "-q")
    shutil.copy(ROOT / ".gitattributes", tmp_path / ".gitattributes")
    git("config", "filter.nbstripout.clean", f"{sys.executable} -m nbstripout --keep-id")
    git("config", "filter.nbstripout.smudge", "cat")
    git("config", "filter.nbstripout.required", "true")
    cell = new_code_cell("print(1)", id="c00-01", execution_count=3,
                         outputs=[new_output("stream", name="stdout", text="1\n")])
    nbformat.write(new_notebook(cells=[cell]), str(tmp_path / "00_saved.ipynb"))
    git("add", "00_saved.ipynb")
    staged = nbformat.reads(git("show", ":00_saved.ipynb").stdout, as_version=4)
    assert staged.cells[0].outputs == [] and staged.cells[0].execution_count is None
    assert staged.cells[0].id == "c00-01" and staged.cells[0].source == "print(1)"
    assert nbformat.read(str(tmp_path / "00_saved.ipynb"), as_version=4).cells[0].outputs  # the working file keeps them


@pytest.mark.slow
def test_after_clean_venv_git_diff_and_add_still_work(tmp_path):
    """Issue 50 point 8: the filter `make venv` sets names the venv; once `make clean-venv` removed it, git
    diff, status and add go on, the notebook taken as it is with one line saying so; with the venv the
    same filter strips outputs."""
    import shutil

    import nbformat
    from nbformat.v4 import new_code_cell, new_notebook, new_output

    makefile = (ROOT / "Makefile").read_text()
    assert 'git config diff.ipynb.textconv "$(NBSTRIPOUT_DIFF)"' in makefile
    assert "NBSTRIPOUT_DIFF = sh $(abspath scripts/nbstripout_filter.sh) $(abspath $(VENV)) textconv" in makefile
    repository = tmp_path / "repository"
    repository.mkdir()

    def git(*args, check=True):
        return subprocess.run(["git", *args], cwd=repository, capture_output=True, text=True, timeout=60, check=check)

    def configure(venv):
        script = ROOT / "scripts" / "nbstripout_filter.sh"
        git("config", "filter.nbstripout.clean", f"sh {script} {venv} clean")
        git("config", "filter.nbstripout.smudge", "cat")
        git("config", "filter.nbstripout.required", "true")
        git("config", "diff.ipynb.textconv", f"sh {script} {venv} textconv")

    git("init", "-q")
    git("config", "user.email", "test@example.org")
    git("config", "user.name", "test")
    shutil.copy(ROOT / ".gitattributes", repository / ".gitattributes")
    configure(Path(sys.executable).parents[1])  # the venv running the tests: the filter strips
    cell = new_code_cell("print(1)", id="c00-01", outputs=[new_output("stream", name="stdout", text="1\n")])
    nbformat.write(new_notebook(cells=[cell]), str(repository / "00_saved.ipynb"))
    git("add", "00_saved.ipynb")
    assert nbformat.reads(git("show", ":00_saved.ipynb").stdout, as_version=4).cells[0].outputs == []
    git("commit", "-q", "-m", "first")
    configure(tmp_path / "removed-venv")  # as after `make clean-venv`
    cell.source = "print(2)"
    nbformat.write(new_notebook(cells=[cell]), str(repository / "00_saved.ipynb"))
    diff = git("diff", check=False)
    assert diff.returncode == 0 and "print(2)" in diff.stdout, diff.stderr
    assert "has no nbstripout, the notebook is taken as it is (make venv restores the filter)" in diff.stderr
    assert git("status", "--short", check=False).returncode == 0
    assert git("add", "00_saved.ipynb", check=False).returncode == 0


def test_every_run_ends_with_where_its_time_went():
    """Issue 46: `make test` prints the seconds per kind of test and the slowest test files."""
    from conftest import time_table

    lines = time_table({"unit": 30.0, "notebook": 90.0}, {"unit": 100, "notebook": 4},
                       {"tests/test_a.py": 5.0, "tests/test_notebooks.py": 90.0, "tests/test_b.py": 25.0}, files=2)
    assert lines[1].split() == ["notebook", "90.0", "s", "75.0%", "4", "test(s)"]
    assert lines[2].split()[:2] == ["unit", "30.0"]
    assert lines[3] == "the 2 slowest test files:" and lines[4].endswith("tests/test_notebooks.py")
    assert lines[5].endswith("tests/test_b.py") and len(lines) == 6
    two = time_table({"unit": 30.0}, {"unit": 100}, {"tests/test_a.py": 30.0},
                     by_process={"gw1": (14.0, 61.8), "gw0": (16.0, 70.2)})
    assert two[-1] == "per process: gw0 16.0 s of tests, its last at 70 s; gw1 14.0 s of tests, its last at 62 s"


def test_the_heaviest_test_files_are_handed_out_first():
    """Issue 46: files ordered by the budget's seconds per test of each kind, whole files only, ties in their order;
    `make test` keeps that order (xdist's own would put the files with most tests first)."""
    import time_budget

    files = [("tests/test_a.py", ["unit"] * 200), ("tests/test_book.py", ["notebook", "unit"]),
             ("tests/test_b.py", ["unit"] * 2), ("tests/test_c.py", ["unit", "unit"]),
             ("tests/test_notebooks.py", ["notebook"] * 3)]
    assert time_budget.heaviest_files_first(files, BUDGET) == [
        "tests/test_notebooks.py", "tests/test_a.py", "tests/test_book.py", "tests/test_b.py", "tests/test_c.py"]
    assert "--dist loadfile --no-loadscope-reorder" in (ROOT / "Makefile").read_text()


BUDGET = {"machine": "a 2-core test machine", "workers": 2, "calibration_seconds": 0.5,
          "kinds": {"unit": {"seconds": 100.0, "tests": 1000}, "notebook": {"seconds": 400.0, "tests": 40}}}


def test_a_kind_past_one_and_a_half_times_its_budget_fails_the_run():
    """Issue 46: the budget per kind, scaled by this machine's calibration time, fails a kind past 1.5x."""
    import time_budget

    lines, failed = time_budget.check({"unit": 140.0, "notebook": 700.0}, {"unit": 1000, "notebook": 40}, BUDGET,
                                      seconds_here=0.5, workers=2)
    assert failed and "OVER: 1.75x its budget" in lines[2] and lines[1].split()[:2] == ["unit", "140.0"]
    assert "ok: 1.40x its budget" in lines[1]


def test_a_slower_machine_gets_a_proportionally_larger_budget():
    import time_budget

    lines, failed = time_budget.check({"unit": 250.0, "notebook": 1000.0}, {"unit": 1000, "notebook": 40}, BUDGET,
                                      seconds_here=1.0, workers=2)  # half as fast: 200 s and 800 s allowed
    assert not failed and "x 2.00" in lines[0]
    assert lines[1].split()[:5] == ["unit", "250.0", "s", "of", "200.0"] and "ok: 1.25x" in lines[1]


def test_the_machine_is_calibrated_only_when_a_kind_can_be_checked():
    """calibrate() starts three torch processes: a run of a few tests, or with another worker count, skips it."""
    import time_budget

    assert time_budget.checkable({"unit": 900, "notebook": 3}, BUDGET, workers=2)
    assert not time_budget.checkable({"unit": 899, "notebook": 35}, BUDGET, workers=2)
    assert not time_budget.checkable({"unit": 1000, "notebook": 40}, BUDGET, workers=1)
    lines, failed = time_budget.check({"unit": 5.0}, {"unit": 10}, BUDGET, seconds_here=None, workers=2)
    assert not failed and "not calibrated" in lines[0] and "not checked: 10 of its 1000 tests ran" in lines[1]


def test_a_partial_run_or_another_worker_count_is_not_checked():
    import time_budget

    lines, failed = time_budget.check({"unit": 120.0, "notebook": 9000.0}, {"unit": 1000, "notebook": 3}, BUDGET,
                                      seconds_here=0.5, workers=2)
    assert not failed and "not checked: 3 of its 40 tests ran" in lines[2]
    lines, failed = time_budget.check({"unit": 900.0}, {"unit": 1000}, BUDGET, seconds_here=0.5, workers=1)
    assert not failed and lines[1] == "  not checked: this run has 1 worker(s), the budget was measured with 2"


def test_the_committed_budget_names_its_machine_and_every_kind():
    import time_budget
    from conftest import SLOW_KINDS

    budget = time_budget.load()
    assert set(budget["kinds"]) == {*SLOW_KINDS, "unit"} and "core" in budget["machine"] and budget["workers"] >= 1
    assert all(kind["seconds"] > 0 and kind["tests"] > 0 for kind in budget["kinds"].values())
    assert budget["calibration_seconds"] > 0


@pytest.mark.slow
def test_the_calibration_is_a_fixed_workload_timed_by_its_fastest_repeat():
    import time_budget

    assert 0 < time_budget.calibrate(repeats=1) < 30  # the whole run's check calls it with three repeats


def test_make_test_runs_three_processes_a_file_to_each_and_the_notebooks_from_their_own_projects(notebooks_home):
    """`make test` runs three pytest-xdist processes, each test file in one of them, in order (the README's commands
    build on each other); the chapters and solutions run from each process's own copy of the project."""
    makefile = (ROOT / "Makefile").read_text()
    assert "TEST_WORKERS ?= 3" in makefile and "-n $(TEST_WORKERS) --dist loadfile" in makefile
    assert "test: $(STAMP)\n\t$(PYTEST) $(PYTEST_PARALLEL)\n" in makefile
    assert "PYTEST = PYTHONDONTWRITEBYTECODE= $(BIN)/python -m pytest\n" in makefile  # caches on, whatever the shell says
    if os.environ.get("PYTEST_XDIST_WORKER") is None:
        assert notebooks_home == ROOT / "notebooks"
    else:
        project = notebooks_home.parent
        assert project != ROOT and (project / "course_lib").resolve() == ROOT / "course_lib"
        assert not (project / "runs").is_symlink() and not (project / "data_cache").is_symlink()
        assert sorted(p.name for p in notebooks_home.glob("*.ipynb")) == \
            sorted(p.name for p in (ROOT / "notebooks").glob("*.ipynb"))
