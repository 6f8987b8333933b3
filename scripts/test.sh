#!/usr/bin/env bash
# Install from pyproject and run every check CI runs: lint, the CPU tests, and an nvcc compile of every CUDA source.
# The CPU build of torch is installed first: an unpinned torch requirement would pull a multi-GB CUDA build.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m pip install -q torch==2.13.0
python3 -m pip install -q -e ".[test]"
ruff check .
bash scripts/compile_kernels.sh
python3 -m pytest -q -m "not gpu" tests --durations=8
