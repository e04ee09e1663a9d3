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
# The check keeps its own 8-minute budget; the outer 9 minutes only stop a call that hangs in CUDA,
# where the budget's alarm cannot reach it.
exec timeout -k 10 540 "$PYTHON" -m course_lib gpu-check "$@"
