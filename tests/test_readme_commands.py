"""Every command the README and docs/*.md show in a code block runs, in the smoke profile, to its last line.

The list is tests/readme_commands.py. The commands run in README order, each in a subprocess, inside
a scratch project (a folder with pyproject.toml and links to course_lib/, benchmarks/ and the
committed sample), so their runs/, data_cache/ and ledger never touch the checkout, and no real data
is found there (the smoke profile's own data, as a fresh clone without ../shared has).
"""
from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from forkserver import forked_argv
from readme_commands import COMMANDS, SETUP

ROOT = Path(__file__).resolve().parents[1]
PROGRAMS = ("make", "workbook", ".venv/bin/python", "python", "torchrun", "docker", "apptainer", "bash")
COMMAND_TIMEOUT_SECONDS = 600  # the slowest smoke command (an int8 export) takes about a minute on 2 cores


def readme_commands(text: str) -> list[str]:
    """Command lines of the README's code blocks (fenced as bash/sh or plain, or indented by four or
    more spaces after a blank line), comments cut and backslash continuations joined."""
    found, fenced, language, in_indented, previous_blank, pending = [], False, "", False, True, ""
    for line in text.splitlines():
        if line.startswith("```"):
            fenced, language = not fenced, line[3:].strip()
            continue
        if not fenced:
            in_indented = line.startswith("    ") and (previous_blank or in_indented)
            previous_blank = not line.strip()
        if not ((fenced and language in ("", "bash", "sh", "shell")) or in_indented):
            continue
        command = pending + re.sub(r"\s+#.*$", "", line.strip())
        if command.endswith("\\"):
            pending = command[:-1].rstrip() + " "
            continue
        pending = ""
        if command.split(" ", 1)[0] in PROGRAMS:
            found.append(command)
    return found


def shown_commands() -> list[str]:
    """The commands of the README and of every docs page it links to (docs/*.md), in that order."""
    return [command for page in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
            for command in readme_commands(page.read_text())]


def test_the_list_holds_exactly_the_readmes_commands():
    shown = shown_commands()
    listed = [command.shown for command in COMMANDS]
    missing = [c for c in shown if c not in listed]
    stale = [c for c in listed if c not in shown]
    assert not missing, f"README and docs/*.md commands not in tests/readme_commands.py: {missing}"
    assert not stale, f"tests/readme_commands.py lists commands neither the README nor docs/*.md shows: {stale}"


def test_the_extractor_reads_fenced_and_indented_blocks():
    text = "Intro\n\n```bash\nmake test   # comment\n```\n\n    workbook doctor  # x\n    workbook train \\\n" \
           "        -p epochs=2\n\n```text\nworkbook run 2026: 12 notebook(s)\n```\n```python\nimport os\n```\n" \
           "- a list item\n    workbook inside-a-paragraph\n"
    assert readme_commands(text) == ["make test", "workbook doctor", "workbook train -p epochs=2"]


ACTIVATE = Path(sys.executable).parent / "activate"  # the venv's activation script (absent outside a venv)


def test_the_readme_says_once_how_to_put_the_environment_on_path():
    """`workbook` is not on a fresh shell's PATH: the README says so once, before its first workbook command."""
    text = (ROOT / "README.md").read_text()
    assert text.count("source .venv/bin/activate") == 1
    assert text.index("source .venv/bin/activate") < text.index("\nworkbook ")


@pytest.fixture(scope="module")
def scratch_project(tmp_path_factory):
    folder = tmp_path_factory.mktemp("project")
    (folder / "pyproject.toml").write_text((ROOT / "pyproject.toml").read_text())
    for name in ("course_lib", "benchmarks", "data_samples", "notebooks"):
        (folder / name).symlink_to(ROOT / name)
    # A fresh shell: PATH without the environment's bin/, which each command gets as the README says
    # (`source .venv/bin/activate`; `_run`), or, where the tests run outside a venv, prepended.
    bin_dir = Path(sys.executable).parent
    path = os.pathsep.join(part for part in os.environ.get("PATH", "").split(os.pathsep)
                           if part and Path(part).resolve() != bin_dir.resolve())
    env = {**os.environ, "PYTHONPATH": str(ROOT), "WORKBOOK_LEDGER": str(folder / "runs" / "ledger.sqlite"),
           "PATH": path if ACTIVATE.exists() else f"{bin_dir}{os.pathsep}{path}", "WORKBOOK_DATA": "none"}
    env.pop("VIRTUAL_ENV", None)
    env.pop("WORKBOOK_RUN_ID", None)
    for command in SETUP:
        _run(command, folder, env)
    return folder, env


def _run(command: str, folder: Path, env: dict, exit_codes=(0,)) -> list[str]:
    """Run `command` as a reader would in a fresh shell after the README's `source .venv/bin/activate`; a `python` or
    `workbook` command as a child of the test process's fork server (tests/forkserver.py), which has imported torch."""
    argv = shlex.split(command)
    if argv[0] == "python":
        argv[0] = sys.executable
    argv = forked_argv(argv, env)
    if ACTIVATE.exists() and argv[0] != "make":
        argv = ["bash", "-c", 'source "$0" && exec "$@"', str(ACTIVATE), *argv]
    done = subprocess.run(argv, cwd=folder, env=env, capture_output=True, text=True,
                          timeout=COMMAND_TIMEOUT_SECONDS, stdin=subprocess.DEVNULL)
    assert done.returncode in exit_codes, f"{command} exited {done.returncode}:\n{done.stdout[-3000:]}\n" \
                                          f"{done.stderr[-3000:]}"
    return [line for line in done.stdout.splitlines() if line.strip()]


def _marks(command) -> list:
    """The slow kinds a command is (for `make test-fast`): it runs notebooks, or starts torchrun."""
    runs_notebooks = any(step.startswith("workbook run") for step in (command.run, *command.before))
    return ([pytest.mark.notebook] if runs_notebooks else []) + \
        ([pytest.mark.torchrun] if "torchrun" in command.run or command.run.startswith("workbook ddp") else [])


@pytest.mark.parametrize("command", [pytest.param(c, marks=_marks(c)) for c in COMMANDS],
                         ids=[c.shown[:60] for c in COMMANDS])
@pytest.mark.slow
def test_each_readme_command_runs_to_its_last_line(command, scratch_project):
    if command.skip:
        pytest.skip(command.skip)
    folder, env = scratch_project
    for step in command.before:
        _run(step, folder, env)
    lines = _run(command.run, folder, env, command.exit_codes)
    assert lines, f"{command.run} printed nothing"
    assert re.search(command.last_line, lines[-1]), f"{command.run}: last line {lines[-1]!r} does not match " \
                                                    f"{command.last_line!r}"
