"""The container recipes install the project with its own command and agree with pyproject.toml and
environment.yml on Python and torch; nothing is built here (no registry access in CI)."""
import re

import pytest
import tomllib
import yaml
from conftest import ROOT
from packaging.specifiers import SpecifierSet

PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
REQUIRES_PYTHON = SpecifierSet(PYPROJECT["project"]["requires-python"])
TORCH_RANGE = SpecifierSet(next(d for d in PYPROJECT["project"]["dependencies"] if d.startswith("torch>"))[len("torch"):])
ENVIRONMENT = yaml.safe_load((ROOT / "environment.yml").read_text())
CONDA_PYTHON = next(d for d in ENVIRONMENT["dependencies"] if isinstance(d, str) and d.startswith("python="))[len("python="):]
CONTAINERS = ["Dockerfile", "Dockerfile.cpu", "containers/workbook.def"]
NGC = re.compile(r"nvcr\.io/nvidia/pytorch:(\$\{NGC_TAG\}|\d\d\.\d\d)-py3")


def text(name):
    return (ROOT / name).read_text()


def test_the_makefile_venv_target_is_the_install_command():
    makefile = text("Makefile")
    assert re.search(r"^venv: \$\(STAMP\)$", makefile, re.M)
    recipe = makefile[makefile.index("$(STAMP): pyproject.toml"):makefile.index("venv: $(STAMP)")]
    assert "-m venv $(VENV_FLAGS) $(VENV)" in recipe
    assert "-m pip install --quiet -e '.[dev]'" in recipe  # what the README and CI install with


@pytest.mark.parametrize("name", CONTAINERS)
def test_each_container_installs_with_make_venv_and_runs_make_workbook(name):
    recipe = text(name)
    assert re.search(r"^(RUN |    )make venv VENV=/opt/venv", recipe, re.M), "installs with the Makefile's own command"
    assert "pip install -e '.[dev]'" in recipe  # says what that command runs
    default = re.search(r'^CMD \[(.*)\]$', recipe, re.M) or re.search(r"^    exec (make .*)$", recipe, re.M)
    assert default and "workbook" in default.group(1) and "make" in default.group(1)
    assert "VENV=/opt/venv" in default.group(1)


def test_the_cpu_image_has_the_environment_yml_python():
    base = re.search(r"^FROM python:(\d+\.\d+)-slim$", text("Dockerfile.cpu"), re.M)
    assert base, "Dockerfile.cpu starts FROM python:X.Y-slim"
    assert base.group(1) == CONDA_PYTHON == "3.11"
    assert REQUIRES_PYTHON.contains(f"{base.group(1)}.0")


@pytest.mark.parametrize("name", ["Dockerfile", "containers/workbook.def"])
def test_the_ngc_images_python_and_torch_fit_pyproject(name):
    recipe = text(name)
    assert NGC.search(recipe), "an NGC PyTorch base image"
    python = re.search(r"workbook\.base\.python[= ]\"?(\d+\.\d+)", recipe).group(1)
    torch_version = re.search(r"workbook\.base\.torch[= ]\"?(\d+\.\d+)", recipe).group(1)
    assert REQUIRES_PYTHON.contains(f"{python}.0")
    assert TORCH_RANGE.contains(f"{torch_version}.0"), f"torch {torch_version} is outside {TORCH_RANGE}"
    assert "VENV_FLAGS=--system-site-packages" in recipe  # keeps NVIDIA's torch build


def test_docker_and_apptainer_use_the_same_ngc_release():
    tag = re.search(r"^ARG NGC_TAG=(\d\d\.\d\d)$", text("Dockerfile"), re.M).group(1)
    assert f"From: nvcr.io/nvidia/pytorch:{tag}-py3" in text("containers/workbook.def")
    labels = [re.findall(r"workbook\.base\.\w+[= ]\"?([\d.]+)", text(name)) for name in ("Dockerfile", "containers/workbook.def")]
    assert labels[0] == labels[1]


def test_the_build_context_leaves_per_machine_folders_out():
    ignored = set(text(".dockerignore").split())
    assert {".venv", "runs", "data_cache", ".git"} <= ignored


def test_slurm_runs_torchrun_in_the_apptainer_image():
    script = text("docs/slurm_example.sh")
    assert "apptainer build workbook.sif containers/workbook.def" in script
    assert re.search(r'apptainer exec --nv --bind "\$PWD":/workbook .*/opt/venv/bin/python', script)
    assert 'srun --kill-on-bad-exit=1 "${PYTHON[@]}" -m torch.distributed.run' in script
