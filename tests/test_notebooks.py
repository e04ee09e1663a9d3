"""Every notebook executes in the smoke profile, and every committed notebook follows the house rules."""
import ast

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


def test_there_are_notebooks():
    assert NOTEBOOKS and NOTEBOOKS[0].name == "00_setup_check.ipynb"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=IDS)
def test_committed_without_outputs_and_with_parameters(path):
    notebook, cells = _parameters_cell(path)
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
def test_runs_in_smoke_profile(path, tmp_path):
    result = runner.execute_notebook(path, tmp_path / path.name, {"profile": "smoke"})
    assert result.status == "ok", f"{path.name} failed: {result.error}"
