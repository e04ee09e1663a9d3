"""The install files agree: environment.yml names the same packages as pyproject.toml, and the
Makefile and CI call what the README says."""
import re

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
