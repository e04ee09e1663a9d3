#!/bin/bash
# One command for a GPU lent for a short time: `workbook gpu-check` (at most 8 minutes), results in
# docs/results/<gpu>-<date>/. Without CUDA it prints one line and exits 0. Extra arguments pass
# through, e.g. `scripts/gpu_check.sh --parts precision,memory`.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -x .venv/bin/python ]; then PYTHON=.venv/bin/python; else PYTHON="${PYTHON:-python3}"; fi
exec "$PYTHON" -m course_lib gpu-check "$@"
