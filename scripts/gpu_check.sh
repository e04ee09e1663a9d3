#!/bin/bash
# One command for a GPU lent for a short time: `workbook gpu-check` (at most 8 minutes), results in
# docs/results/<gpu>-<date>/. Runs with the project on PYTHONPATH and whatever python has torch
# (the project's .venv when there is one, else $PYTHON or python3: a slot's image needs no install).
# EuroSAT for the speed-run part: WORKBOOK_DATA, else the subset scripts/pack_eurosat_subset.py
# wrote to data_cache/eurosat_slot/ (carried with the project), else the usual places.
# Without CUDA it prints one line and exits 0. Extra arguments pass through, e.g.
# `scripts/gpu_check.sh --parts precision,memory` or `scripts/gpu_check.sh --cpu-dry-run`.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -x .venv/bin/python ]; then PYTHON=.venv/bin/python; else PYTHON="${PYTHON:-python3}"; fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1  # each part's line as it happens, also through a pipe
if [ -z "${WORKBOOK_DATA:-}" ] && [ -d data_cache/eurosat_slot/train ]; then
    export WORKBOOK_DATA="$PWD/data_cache/eurosat_slot"
fi
# First the CUDA-only tests, exactly those (`pytest -m cuda`, at most 50 s), when CUDA and pytest are
# here and this is not the dry run: their report goes to runs/cuda-tests.txt (commit it beside the
# check's folder). A failing test is reported there and the check still runs.
if [[ " $* " != *" --cpu-dry-run "* ]] && "$PYTHON" -c "import pytest, torch; assert torch.cuda.is_available()" 2>/dev/null; then
    mkdir -p runs
    # Only the files that hold a cuda mark: the others may import what a slot's image lacks (papermill).
    mapfile -t files < <(grep -l "mark\.cuda" tests/test_*.py)
    timeout -k 5 50 "$PYTHON" -m pytest -m cuda -p no:cacheprovider -o addopts="-rA --strict-markers" \
        "${files[@]}" 2>&1 | tee runs/cuda-tests.txt || true
fi
# The check keeps its own 8-minute budget; the outer 9 minutes only stop a call that hangs in CUDA,
# where the budget's alarm cannot reach it.
exec timeout -k 10 540 "$PYTHON" -m course_lib gpu-check "$@"
