# `make workbook` and `make test` create .venv when missing, install the project, then run.
PYTHON ?= python3
VENV ?= .venv
# --system-site-packages in the NGC container (Dockerfile, containers/workbook.def): the venv sees and
# keeps NVIDIA's own torch build instead of installing one from PyPI.
VENV_FLAGS ?=
# TORCH=cpu: PyTorch's CPU-only wheels (the index Dockerfile.cpu uses) installed before the project, so
# pip keeps them instead of PyPI's default CUDA build; empty (the default): PyPI's torch, as always.
TORCH ?=
# The project's extras: dev (tests, docs, the notebooks' git filter) and compress (torchao: notebook 13's PT2E
# int8, which needs torch >= 2.11). The NGC containers pass EXTRAS=dev: their torch build is older.
EXTRAS ?= dev,compress
TORCH_INDEX_cpu := https://download.pytorch.org/whl/cpu
TORCH_INDEX := $(TORCH_INDEX_$(TORCH))
ifneq ($(TORCH),)
ifeq ($(TORCH_INDEX),)
$(error TORCH=$(TORCH) is not a choice; use TORCH=cpu for the CPU-only wheels, or leave TORCH out)
endif
endif
BIN := $(VENV)/bin
PROFILE ?= auto
STAMP := $(VENV)/.installed
# A new venv needs this much free space where it goes (scripts/check_free_space.sh says so in one line).
VENV_MIN_FREE_GIB ?= 8

.PHONY: workbook test test-fast lab docs venv clean-venv

# The last step makes nbstripout the git filter of *.ipynb (.gitattributes names it): outputs saved in
# JupyterLab stay in the working file and never reach a commit. Outside a git checkout there is nothing to set.
# --keep-id: the cells keep their ids (nbstripout would renumber them 0, 1, ...; `--install` cannot say so).
# --extra-keys metadata.language_info: JupyterLab rewrites it on every save (the Python version, the lexer),
# so a notebook run and saved there leaves `git status` clean; the committed kernelspec is the one `ipykernel
# install` below makes, which JupyterLab writes back unchanged (tests/test_notebooks.py does both and compares).
# scripts/nbstripout_filter.sh runs nbstripout from the venv, and passes notebooks through unchanged (one line
# on stderr) once the venv is gone, so `git diff` keeps working after `make clean-venv`.
NBSTRIPOUT_CLEAN = sh $(abspath scripts/nbstripout_filter.sh) $(abspath $(VENV)) clean
NBSTRIPOUT_DIFF = sh $(abspath scripts/nbstripout_filter.sh) $(abspath $(VENV)) textconv
# --no-compile, then compileall -j 0: pip writes the bytecode of the 17,700 files one at a time (119 s for the whole
# install on a 2-core AMD EPYC, 59 s without it), compileall on every core (32 s there). -x leaves out the packages'
# own test suites (tests/, test/, torch/testing/_internal: 4,350 files nothing here imports; one that is imported is
# compiled then): 21-23 against 32-36 s there. Like pip's own pass, it skips the files in another Python's syntax,
# hence `|| true`; -qq keeps them quiet.
COMPILE_SKIP = '/tests?/|/testing/_internal/'
SITE_PACKAGES = $$($(BIN)/python -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
# course_lib.measure.install_check: the torch and torchvision just installed import together (else one line
# naming the pair and the fix, and no stamp, so the next make tries again).
$(STAMP): pyproject.toml
	test -x $(BIN)/python || sh scripts/check_free_space.sh $(VENV) $(VENV_MIN_FREE_GIB)
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV_FLAGS) $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(if $(TORCH_INDEX),$(BIN)/python -m pip install --quiet torch torchvision --index-url $(TORCH_INDEX))
	$(BIN)/python -m pip install --quiet --no-compile -e '.[$(EXTRAS)]'
	$(BIN)/python -m compileall -qq -j 0 -x $(COMPILE_SKIP) $(SITE_PACKAGES) || true
	$(BIN)/python -m course_lib.measure.install_check
	$(BIN)/python -m ipykernel install --prefix $(VENV) --name python3 > /dev/null
	if command -v git > /dev/null && git rev-parse --git-dir > /dev/null 2>&1; then $(BIN)/nbstripout --install \
	    && git config filter.nbstripout.clean "$(NBSTRIPOUT_CLEAN)" && git config diff.ipynb.textconv "$(NBSTRIPOUT_DIFF)"; fi
	touch $(STAMP)

venv: $(STAMP)

workbook: $(STAMP)
	$(BIN)/workbook run --profile $(PROFILE)

# The suite in TEST_WORKERS pytest-xdist processes (3 on the 2-core machines it is measured on: while one waits on a
# kernel, a subprocess or a sleep, the other two keep both cores busy; 9 min 3 s of pytest against
# 10 min 36 s with 2, docs/development.md); --dist loadfile keeps each test file in one process, in order (the
# README's commands build on each other in their scratch project); --no-loadscope-reorder hands out the files in
# tests/conftest.py's order, the heaviest first (xdist's own puts the files with most tests first).
# TEST_WORKERS=0 runs it all in this one process.
TEST_WORKERS ?= 3
PYTEST_PARALLEL = $(if $(filter 0,$(TEST_WORKERS)),,-n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder)
# PYTHONDONTWRITEBYTECODE= : the tests write bytecode caches even where the environment turns them off (CI images
# often do). Without them every process compiled course_lib, and pytest rewrote every test file, from source again:
# a collection took 20 s against 13 s, in each of the three processes, and each kernel and command paid its share.
PYTEST = PYTHONDONTWRITEBYTECODE= $(BIN)/python -m pytest
test: $(STAMP)
	$(PYTEST) $(PYTEST_PARALLEL)

# Everything but the slow kinds (pytest markers in pyproject.toml): no notebook runs, no browser, no torchrun,
# no unit test of a second or more.
FAST_MARKERS := not notebook and not browser and not torchrun and not slow
test-fast: $(STAMP)
	$(PYTEST) $(PYTEST_PARALLEL) -m "$(FAST_MARKERS)"

lab: $(STAMP)
	$(BIN)/jupyter lab notebooks/

# The executed book: docs pages + a run's executed chapters + the claims scoreboard, into runs/<id>/site/.
# RUN=<id> picks the run (default: the newest; with none, the smoke profile is executed first).
docs: $(STAMP)
	$(BIN)/workbook docs build $(RUN)

clean-venv:
	rm -rf $(VENV)
	@echo "removed $(VENV); until make venv, the notebooks' git filter takes notebooks as they are (git diff still works)"
