#!/usr/bin/env bash
# GPU check (see gpu_check.py): run from the repository root on a machine with a large CUDA GPU
# (H200: under 5 minutes, ~45 GB; arguments pass through, e.g. --profile, --models llama-1b).
# Uses .venv if present (a CUDA build of torch is needed there: TORCH_SPEC=torch make setup).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python3 )}
PYTHONPATH=src "$PY" benchmarks/gpu_check.py "$@"
