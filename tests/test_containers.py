"""The container recipes install the project with its own command, agree with pyproject.toml and
environment.yml on Python, and pip resolves the project's dependencies against each base image's committed
pins (containers/pins/); nothing is built here (no container registry in CI)."""
import functools
import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import tomllib
import yaml
from conftest import ROOT
from packaging.specifiers import SpecifierSet

PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
REQUIRES_PYTHON = SpecifierSet(PYPROJECT["project"]["requires-python"])
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
    assert "-m pip install --quiet --no-compile -e '.[$(EXTRAS)]'" in recipe  # what the README and CI install with
    assert re.search(r"^EXTRAS \?= dev,compress$", makefile, re.M)


@pytest.mark.parametrize("name", CONTAINERS)
def test_each_container_installs_with_make_venv_and_runs_make_workbook(name):
    recipe = text(name)
    assert re.search(r"^(RUN |    )make venv VENV=/opt/venv", recipe, re.M), "installs with the Makefile's own command"
    assert "pip install -e '.[dev" in recipe  # says what that command runs
    default = re.search(r'^CMD \[(.*)\]$', recipe, re.M) or re.search(r"^    exec (make .*)$", recipe, re.M)
    assert default and "workbook" in default.group(1) and "make" in default.group(1)
    assert "VENV=/opt/venv" in default.group(1)


def test_the_cpu_image_has_the_environment_yml_python():
    base = re.search(r"^FROM python:(\d+\.\d+)-slim$", text("Dockerfile.cpu"), re.M)
    assert base, "Dockerfile.cpu starts FROM python:X.Y-slim"
    assert base.group(1) == CONDA_PYTHON == "3.11"
    assert REQUIRES_PYTHON.contains(f"{base.group(1)}.0")


def pins_of(name) -> Path:
    """The committed pins file a recipe's `workbook.base.pins` label names."""
    found = re.search(r'workbook\.base\.pins[= ]"?([\w./-]+)"?', text(name))
    assert found, f"{name} names its base image's pins file (a workbook.base.pins label)"
    return ROOT / found.group(1)


def extras_of(name) -> str:
    """The extras a recipe's `make venv` installs: its EXTRAS=..., else the Makefile's default."""
    given = re.search(r"make venv [^\n]*EXTRAS=([\w,]+)", text(name))
    return given.group(1) if given else re.search(r"^EXTRAS \?= ([\w,]+)$", text("Makefile"), re.M).group(1)


def python_of(pins: Path) -> str:
    return re.search(r"^# python: (\d+\.\d+)$", pins.read_text(), re.M).group(1)


# Every manylinux tag a wheel for Ubuntu 24.04 or Debian 13 (glibc 2.39, 2.41) may carry: pip matches them exactly.
PLATFORMS = [f"manylinux_2_{n}_x86_64" for n in (17, 24, 26, 27, 28, 31, 34, 35, 38, 39)] + \
    ["manylinux2014_x86_64", "manylinux1_x86_64", "linux_x86_64", "any"]


def project_requirements(extras: str) -> list[str]:
    """pyproject.toml's dependencies plus those of `extras` ("dev,compress"), comments dropped."""
    chosen = [*PYPROJECT["project"]["dependencies"]]
    for extra in extras.split(","):
        chosen += PYPROJECT["project"]["optional-dependencies"][extra]
    return [requirement.split("#")[0].strip() for requirement in chosen]


@functools.cache
def _index_reachable() -> str | None:
    probe = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
                            "--dest", tempfile.mkdtemp(), "--quiet", "packaging"],
                           capture_output=True, text=True, timeout=120, check=False)
    return None if probe.returncode == 0 else f"no package index answers pip here: {probe.stderr.strip()[-200:]}"


@functools.cache
def resolve(pins_text: str, extras: str) -> subprocess.CompletedProcess:
    """`pip install --dry-run` of the project's requirements with `extras`, for the pins' Python on x86-64
    Linux, constrained by the pins: what `make venv` would ask pip inside that image, resolved from the index
    without installing anything. Cached: the Dockerfile and the Apptainer recipe share their pins. fast-deps: pip
    reads each candidate wheel's METADATA through HTTP range requests (where the index gives no PEP 658 metadata, as
    the registry here does not) instead of downloading the whole wheel, torch's 916 MB included; the resolver and its
    answer are the same, and pip downloads the whole wheel where a server refuses ranges. The Dockerfile's resolution
    took 25.9 s (24.4 s of CPU) without it, 18.3-21.3 s (12.0-14.4 s) with it, on a 2-core AMD EPYC."""
    reason = _index_reachable()
    if reason:
        pytest.skip(reason)
    folder = Path(tempfile.mkdtemp(prefix="resolve-"))
    (folder / "pins.txt").write_text(pins_text)
    (folder / "requirements.txt").write_text("\n".join(project_requirements(extras)) + "\n")
    platforms = [option for platform in PLATFORMS for option in ("--platform", platform)]
    return subprocess.run([sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--quiet",
                           "--use-feature=fast-deps",
                           "--report", str(folder / "report.json"), "--only-binary=:all:", "--implementation", "cp",
                           "--python-version", python_of(folder / "pins.txt"), *platforms,
                           "-c", str(folder / "pins.txt"), "-r", str(folder / "requirements.txt")],
                          capture_output=True, text=True, timeout=600, check=False)


def resolved_versions(result: subprocess.CompletedProcess) -> dict[str, str]:
    report = json.loads(Path(result.args[result.args.index("--report") + 1]).read_text())
    return {item["metadata"]["name"].lower(): item["metadata"]["version"] for item in report["install"]}


@pytest.mark.parametrize("name", CONTAINERS)
@pytest.mark.slow
def test_pip_resolves_the_projects_dependencies_against_each_base_images_pins(name):
    """The real check that a label comparison could not make: the NGC image's torch (2.10) under every
    requirement of what its `make venv` installs, Python included; the CPU image with every extra."""
    pins = pins_of(name)
    assert REQUIRES_PYTHON.contains(f"{python_of(pins)}.0")
    result = resolve(pins.read_text(), extras_of(name))
    assert result.returncode == 0, f"{name}: pip cannot resolve the project against {pins.name}:\n{result.stderr[-3000:]}"
    pinned = dict(re.findall(r"^([\w-]+)==([\w.]+)$", pins.read_text(), re.M))
    versions = resolved_versions(result)
    assert all(versions[package] == version for package, version in pinned.items()), (pinned, versions)
    assert "torchao" not in versions or "compress" in extras_of(name)


@pytest.mark.slow
def test_the_resolution_fails_on_a_planted_impossible_pin_and_on_torchao_in_the_ngc_image():
    ngc = pins_of("Dockerfile").read_text()
    planted = resolve(re.sub(r"^torch==.*$", "torch==2.3.0", ngc, flags=re.M), extras_of("Dockerfile"))
    assert planted.returncode != 0 and "Cannot install torch>=2.4" in planted.stderr, planted.stderr[-2000:]
    # The reason the NGC recipes leave the compress extra out: torchao 0.18 needs torch >= 2.11.
    with_torchao = resolve(ngc, "dev,compress")
    assert with_torchao.returncode != 0 and "torch>=2.11" in with_torchao.stderr, with_torchao.stderr[-2000:]


def test_docker_and_apptainer_use_the_same_ngc_release_and_pins():
    tag = re.search(r"^ARG NGC_TAG=(\d\d\.\d\d)$", text("Dockerfile"), re.M).group(1)
    assert f"From: nvcr.io/nvidia/pytorch:{tag}-py3" in text("containers/workbook.def")
    assert pins_of("Dockerfile") == pins_of("containers/workbook.def") == ROOT / f"containers/pins/ngc-pytorch-{tag}.txt"
    assert f"pytorch-release-notes/rel-{tag.replace('.', '-')}.html" in pins_of("Dockerfile").read_text()
    assert extras_of("Dockerfile") == extras_of("containers/workbook.def") == "dev"
    assert "VENV_FLAGS=--system-site-packages" in text("Dockerfile")  # keeps NVIDIA's torch build


def test_the_build_context_leaves_per_machine_folders_out():
    ignored = set(text(".dockerignore").split())
    assert {".venv", "runs", "data_cache", ".git"} <= ignored


def test_slurm_runs_torchrun_in_the_apptainer_image():
    script = text("docs/slurm_example.sh")
    assert "apptainer build workbook.sif containers/workbook.def" in script
    assert re.search(r'apptainer exec --nv --bind "\$PWD":/workbook .*/opt/venv/bin/python', script)
    assert 'srun --kill-on-bad-exit=1 "${PYTHON[@]}" -m torch.distributed.run' in script
