"""Every notebook executes in the smoke profile, and every committed notebook follows the house rules."""
import ast
import re
import subprocess
from pathlib import Path

import nbformat
import pytest
from conftest import ROOT

from course_lib import runner
from course_lib.config import FIELD_NAMES

NOTEBOOKS = runner.list_notebooks(ROOT / "notebooks")
IDS = [path.stem for path in NOTEBOOKS]


def _parameters_cell(path):
    notebook = nbformat.read(str(path), as_version=4)
    cells = [c for c in notebook.cells if "parameters" in c.metadata.get("tags", [])]
    return notebook, cells


def _committed_notebook(path):
    """What a commit of `path` holds. With the nbstripout filter `make venv` sets, `git add` strips the
    outputs a JupyterLab save left in the working file, so the staged copy is read; without it (or
    outside a git checkout), the working file itself."""
    try:
        filtered = subprocess.run(["git", "config", "--get", "filter.nbstripout.clean"], cwd=ROOT,
                                  capture_output=True, text=True, timeout=30).returncode == 0
        staged = subprocess.run(["git", "show", f":{path.relative_to(ROOT).as_posix()}"], cwd=ROOT,
                                capture_output=True, text=True, timeout=30) if filtered else None
    except (OSError, subprocess.SubprocessError):  # no git here
        staged = None
    if staged is not None and staged.returncode == 0:
        return nbformat.reads(staged.stdout, as_version=4)
    return nbformat.read(str(path), as_version=4)


def _makefile_clean_command(python: str) -> list[str]:
    """The git filter `make venv` installs (the Makefile's NBSTRIPOUT_CLEAN: scripts/nbstripout_filter.sh with
    the venv and "clean"), run with the venv that holds `python`."""
    line = next(line for line in (ROOT / "Makefile").read_text().splitlines() if line.startswith("NBSTRIPOUT_CLEAN ="))
    assert line.split("=", 1)[1].split() == ["sh", "$(abspath", "scripts/nbstripout_filter.sh)", "$(abspath",
                                             "$(VENV))", "clean"]
    return ["sh", str(ROOT / "scripts" / "nbstripout_filter.sh"), str(Path(python).parents[1]), "clean"]


ALL_NOTEBOOKS = NOTEBOOKS + sorted((ROOT / "notebooks" / "solutions").glob("*.ipynb"))
KERNELSPEC = {"display_name": "Python 3 (ipykernel)", "language": "python", "name": "python3"}  # `make venv`'s


def test_every_notebook_carries_the_metadata_a_jupyterlab_save_keeps():
    """The kernel `make venv` installs, and no language_info (which the filter strips): the file a save
    through the filter gives back (the test below runs it on three of them)."""
    wrong = [path.name for path in ALL_NOTEBOOKS
             if dict(nbformat.read(str(path), as_version=4).metadata) != {"kernelspec": KERNELSPEC}]
    assert not wrong, f"metadata other than the kernelspec {KERNELSPEC}: {wrong}"


@pytest.mark.parametrize("path", [NOTEBOOKS[0], NOTEBOOKS[7], ROOT / "notebooks" / "solutions" / NOTEBOOKS[7].name],
                         ids=lambda path: path.parent.name + "/" + path.stem)
@pytest.mark.slow
def test_a_jupyterlab_save_leaves_the_committed_notebook_unchanged(path):
    """What JupyterLab writes on Run All and save (outputs, execution counts, the running kernel's spec and its
    language_info), passed through the git filter of the Makefile, gives the committed file back byte for byte:
    `git status` stays clean (issue 50)."""
    import sys

    from ipykernel.ipkernel import IPythonKernel
    from jupyter_client.kernelspec import KernelSpecManager

    spec = KernelSpecManager().get_kernel_spec("python3")
    notebook = nbformat.read(str(path), as_version=4)
    notebook.metadata["kernelspec"] = {"display_name": spec.display_name, "language": spec.language,
                                       "name": "python3"}
    notebook.metadata["language_info"] = {**IPythonKernel.language_info, "version": sys.version.split()[0]}
    for number, cell in enumerate(c for c in notebook.cells if c.cell_type == "code"):
        cell.execution_count = number + 1
        cell.outputs = [nbformat.v4.new_output("stream", name="stdout", text="a saved output\n")]
    saved = nbformat.writes(notebook) + "\n"
    cleaned = subprocess.run(_makefile_clean_command(sys.executable), input=saved, capture_output=True, text=True,
                             timeout=120, check=True).stdout
    assert cleaned == path.read_text(), f"{path.name}: a JupyterLab save would show in git status"


def test_there_are_notebooks():
    assert NOTEBOOKS and NOTEBOOKS[0].name == "00_setup_check.ipynb"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=IDS)
def test_committed_without_outputs_and_with_parameters(path):
    _, cells = _parameters_cell(path)
    notebook = _committed_notebook(path)
    assert len(cells) == 1, f"{path.name}: needs exactly one cell tagged 'parameters'"
    with_outputs = [i for i, c in enumerate(notebook.cells) if c.cell_type == "code" and (c.outputs or c.execution_count)]
    assert not with_outputs, f"{path.name}: cells {with_outputs} have outputs; clear them before committing"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=IDS)
def test_parameters_cell_parses_completely(path):
    """papermill silently drops lines it cannot parse (e.g. a comment containing '='); every
    assignment must come through, with a profile and only Config fields or literal defaults."""
    _, (cell,) = _parameters_cell(path)
    assigned = [node.targets[0].id for node in ast.parse(cell.source).body if isinstance(node, ast.Assign)]
    declared = runner.notebook_parameters(path)
    assert list(declared) == assigned
    assert "profile" in declared
    for name, info in declared.items():
        if name not in FIELD_NAMES:
            ast.literal_eval(info["default"])  # notebook-specific knobs have plain literal defaults


@pytest.mark.parametrize("path", NOTEBOOKS, ids=IDS)
def test_notebook_only_parameters_have_typed_defaults(path):
    """Only Config fields may default to None (Config types them). A notebook-only parameter with a
    None default cannot be typed, so `-p run_ddp=false` would reach the notebook as the truthy "false"."""
    for name, parameter in runner.declared_parameters(path).items():
        if name in FIELD_NAMES or name == "profile":
            continue
        assert parameter.default is not None, (f"{path.name}: {name} defaults to None; use \"auto\" (with "
                                               "'# auto | true | false ...'), 0 or [] for an automatic choice")
        assert parameter.problem() is None, parameter.problem()


def test_notebook_parameters_arrive_typed():
    """The parameters issue 10 found untyped, given on the command line to every notebook at once."""
    typed = runner.check_parameters(NOTEBOOKS, [
        "run_ddp=false", "measure_compile=true", "measure_memory=auto", "memory_sweep=cpu", "engine_sweep=no",
        "sweep_workers=[0, 2]", "decode_sizes=[256]", "range_test_steps=8", "source=digits", "target=auto",
        "source_epochs=2", "target_top1=0.5", "source_image_size=128"], profile="smoke")
    merged = {name: value for values in typed.values() for name, value in values.items()}
    assert merged == {"run_ddp": False, "measure_compile": True, "measure_memory": "auto", "memory_sweep": "cpu",
                      "engine_sweep": False, "sweep_workers": [0, 2], "decode_sizes": [256],
                      "range_test_steps": 8, "source": "digits", "target": "auto", "source_epochs": 2,
                      "target_top1": 0.5, "source_image_size": 128}
    assert type(merged["target_top1"]) is float and type(merged["source_epochs"]) is int


SETUP_CELL_MAX_LINES = 10  # issue 29: imports, one `<chapter>.setup(profile, ...)` call and a few prints
# The notebooks whose setup moved into their chapter module (issue 29 point 5): every one.
SETUP_CELLS_DONE = ["00", "01", "02", "03", "04", "05", "06", "07", "08", "09", "10", "11", "12", "13", "14", "15"]
PER_PROFILE_BRANCH = re.compile(r"\bprofile\s*[!=]=|\bif smoke\b|\bsmoke else\b")


def _setup_cell_and_body(path) -> tuple[str, list[str]]:
    """The setup cell (the code cell after the parameters cell) and the code cells after it."""
    notebook = nbformat.read(str(path), as_version=4)
    code = [cell for cell in notebook.cells if cell.cell_type == "code"]
    start = next(i for i, cell in enumerate(code) if "parameters" in cell.metadata.get("tags", []))
    return code[start + 1].source, [cell.source for cell in code[start + 2:]]


@pytest.mark.parametrize("path", [p for p in NOTEBOOKS if p.stem[:2] in SETUP_CELLS_DONE],
                         ids=[p.stem for p in NOTEBOOKS if p.stem[:2] in SETUP_CELLS_DONE])
def test_setup_cell_is_a_few_lines_and_the_body_has_no_profile_branches(path):
    setup, body = _setup_cell_and_body(path)
    # imports and comments say what the notebook uses and why; the rule is about the logic
    lines = [line for line in setup.splitlines() if line.strip() and not line.lstrip().startswith(("import ", "from ", "#"))]
    assert len(lines) <= SETUP_CELL_MAX_LINES, (f"{path.name}: the setup cell has {len(lines)} lines besides imports; "
                                                f"move sizes and choices into the chapter's setup (at most "
                                                f"{SETUP_CELL_MAX_LINES})")
    assert re.search(r"\w*setup\(profile", setup), \
        f"{path.name}: the setup cell must call its chapter's setup(profile, ...)"
    branches = [line.strip() for source in body for line in source.splitlines() if PER_PROFILE_BRANCH.search(line)]
    assert not branches, f"{path.name}: per-profile branches outside the setup cell: {branches}"


def test_setup_cells_done_names_existing_notebooks():
    assert set(SETUP_CELLS_DONE) <= {path.stem[:2] for path in NOTEBOOKS}


CLAIMS_CELL_MAX_LINES = 8  # issue 14: the claims section is a few lines calling course_lib.analysis.claims


def _claims_code(path) -> list[str]:
    """The code cells of a notebook's "What we measured vs. what the article claims" section."""
    notebook = nbformat.read(str(path), as_version=4)
    start = next(i for i, cell in enumerate(notebook.cells) if cell.cell_type == "markdown"
                 and "what we measured vs" in cell.source.lower())
    code = []
    for cell in notebook.cells[start + 1:]:
        if cell.cell_type == "markdown" and cell.source.lstrip().startswith("## "):
            break
        if cell.cell_type == "code":
            code.append(cell.source)
    return code


@pytest.mark.parametrize("path", NOTEBOOKS, ids=IDS)
def test_claims_section_is_a_few_lines_of_claims_calls(path):
    code = _claims_code(path)
    lines = [line for source in code for line in source.splitlines() if line.strip()]
    assert len(lines) <= CLAIMS_CELL_MAX_LINES, (f"{path.name}: the claims cells have {len(lines)} lines; move the "
                                                 f"logic into the chapter module (at most {CLAIMS_CELL_MAX_LINES})")
    assert "claims.show(" in "\n".join(code) or "claims(" in "\n".join(code), \
        f"{path.name}: the claims section must show Claim records (course_lib.analysis.claims.show)"


def _speed_tables_without_mfu(notebook) -> list[list[str]]:
    """Headers of the HTML tables an executed notebook shows that have an images/s column but no MFU."""
    from course_lib.report import _TableParser

    missing = []
    for cell in notebook.cells:
        for output in cell.get("outputs", []):
            table = output.get("data", {}).get("text/html", "")
            if "<table" not in table:
                continue
            parser = _TableParser()
            parser.feed(table)
            header = [name.lower() for name in parser.header]
            if any("images/s" in name or "images per second" in name for name in header) \
                    and not any("mfu" in name or "decode limit" in name for name in header):
                missing.append(parser.header)
    return missing


@pytest.mark.notebook
@pytest.mark.parametrize("path", NOTEBOOKS, ids=IDS)
def test_runs_in_smoke_profile(path, tmp_path, capfd, notebooks_home):
    path = notebooks_home / path.name  # the checkout's, or this pytest-xdist process's own copy (tests/conftest.py)
    before = set(path.parent.rglob("*"))
    result = runner.execute_notebook(path, tmp_path / path.name, {"profile": "smoke"})
    assert result.status == "ok", f"{path.name} failed: {result.error}"
    # Every file a notebook writes goes under runs/ or data_cache/ at the project root (paths.resolve_path):
    # one written relative to the kernel's working folder would land in notebooks/, beside the sources.
    stray = sorted(str(p.relative_to(path.parent)) for p in set(path.parent.rglob("*")) - before)
    assert not stray, f"{path.name} wrote into notebooks/: {stray[:5]}"
    executed = nbformat.read(str(tmp_path / path.name), as_version=4)
    assert not _speed_tables_without_mfu(executed), \
        f"{path.name}: speed tables without an MFU column: {_speed_tables_without_mfu(executed)}"
    # The kernel and its subprocesses share this process's stdout and stderr: whatever they write
    # there would interleave with `workbook run`'s progress lines.
    leaked = capfd.readouterr()
    assert leaked.out + leaked.err == "", f"{path.name} wrote outside the notebook: {(leaked.out + leaked.err)[:300]!r}"
