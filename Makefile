# `make workbook` and `make test` create .venv when missing, install the project, then run.
PYTHON ?= python3
VENV ?= .venv
# --system-site-packages in the NGC container (Dockerfile, containers/workbook.def): the venv sees and
# keeps NVIDIA's own torch build instead of installing one from PyPI.
VENV_FLAGS ?=
BIN := $(VENV)/bin
PROFILE ?= auto
STAMP := $(VENV)/.installed

.PHONY: workbook test test-fast lab venv clean-venv

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV_FLAGS) $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	$(BIN)/python -m ipykernel install --prefix $(VENV) --name python3 > /dev/null
	touch $(STAMP)

venv: $(STAMP)

workbook: $(STAMP)
	$(BIN)/workbook run --profile $(PROFILE)

test: $(STAMP)
	$(BIN)/python -m pytest

# Everything but the slow kinds (pytest markers in pyproject.toml): no notebook runs, no browser, no torchrun.
FAST_MARKERS := not notebook and not browser and not torchrun
test-fast: $(STAMP)
	$(BIN)/python -m pytest -m "$(FAST_MARKERS)"

lab: $(STAMP)
	$(BIN)/jupyter lab notebooks/

clean-venv:
	rm -rf $(VENV)
