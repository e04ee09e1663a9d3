"""The exercise solutions (notebooks/solutions/NN_*.ipynb, one per chapter): each answers every exercise of its
chapter in order, is committed without outputs with a `parameters` cell, and executes in the smoke profile."""
import re

import nbformat
import pytest
from conftest import ROOT
from test_notebooks import _committed_notebook

from course_lib import runner

CHAPTERS = runner.list_notebooks(ROOT / "notebooks")
SOLUTIONS_DIR = ROOT / "notebooks" / "solutions"
SOLUTIONS = sorted(SOLUTIONS_DIR.glob("*.ipynb"))
# Chapter 05's solutions launch torchrun (DDP workers): marked like the other torchrun tests too.
RUNS = [pytest.param(p, marks=pytest.mark.torchrun) if p.stem.startswith("05") else p for p in SOLUTIONS]
# Chapters whose solutions are still to be written; the list may only shrink (a test fails on a stale entry).
PENDING: set[str] = set()


def exercises(path) -> list[str]:
    """The numbered items of a chapter's "## Exercises" section."""
    for cell in nbformat.read(str(path), as_version=4).cells:
        if cell.cell_type == "markdown" and "## Exercises" in cell.source:
            section = cell.source[cell.source.index("## Exercises"):]
            return re.findall(r"^\d+\. (.+)$", section, re.M)
    return []


def test_every_chapter_has_its_solutions_or_is_pending():
    solved = {path.name for path in SOLUTIONS}
    missing = [c.name for c in CHAPTERS if c.name not in solved and c.stem[:2] not in PENDING]
    stale = sorted(n for n in PENDING if any(name.startswith(n) for name in solved))
    assert not missing, f"chapters without notebooks/solutions/<same name>: {missing}"
    assert not stale, f"PENDING lists chapters that have solutions now: {stale}"
    assert {path.name for path in SOLUTIONS} <= {c.name for c in CHAPTERS}, "a solution notebook names no chapter"


@pytest.mark.parametrize("path", SOLUTIONS, ids=[p.stem for p in SOLUTIONS])
def test_one_section_per_exercise_in_order_and_no_outputs(path):
    chapter = ROOT / "notebooks" / path.name
    asked = exercises(chapter)
    assert asked, f"{chapter.name} has no '## Exercises' section"
    notebook = _committed_notebook(path)
    headings = [cell.source for cell in notebook.cells if cell.cell_type == "markdown"
                and cell.source.startswith("## Exercise ")]
    assert [h.splitlines()[0] for h in headings] == [f"## Exercise {n}" for n in range(1, len(asked) + 1)]
    for heading, first_line in zip(headings, asked):
        assert first_line[:40] in heading.replace("\n> ", " "), f"{path.name}: exercise text out of step: {first_line}"
    assert [c for c in notebook.cells if "parameters" in c.metadata.get("tags", [])], f"{path.name}: no parameters cell"
    assert not [c for c in notebook.cells if c.cell_type == "code" and (c.outputs or c.execution_count)], \
        f"{path.name}: committed with outputs"


def test_each_chapter_points_to_its_solutions():
    for path in SOLUTIONS:
        text = (ROOT / "notebooks" / path.name).read_text()
        assert f"solutions/{path.name}" in text, f"{path.name}: its chapter's Exercises do not link the solutions"


@pytest.mark.notebook
@pytest.mark.parametrize("path", RUNS, ids=[p.stem for p in SOLUTIONS])
def test_solutions_run_in_smoke_profile(path, tmp_path, notebooks_home):
    path = notebooks_home / "solutions" / path.name  # the checkout's, or this pytest-xdist process's own copy
    before = set(notebooks_home.rglob("*"))
    result = runner.execute_notebook(path, tmp_path / path.name, {"profile": "smoke"})
    assert result.status == "ok", f"{path.name} failed: {result.error}"
    stray = sorted(str(p.relative_to(notebooks_home.parent)) for p in set(notebooks_home.rglob("*")) - before)
    assert not stray, f"{path.name} wrote into notebooks/: {stray[:5]}"
