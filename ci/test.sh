#!/usr/bin/env bash
# The README's test command: install qconform with its test and upstream extras (bitsandbytes on
# the CPU build of torch, installed first so that pip does not fetch a CUDA build), then run pytest
# with the `ci` hypothesis profile on 2 workers. Works on a fresh machine with Python 3.11 and pip.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
"$PYTHON" -m pip install --quiet --upgrade pip
"$PYTHON" -m pip install --quiet "torch==2.13.0" || \
  "$PYTHON" -m pip install --quiet "torch==2.13.0" --index-url https://download.pytorch.org/whl/cpu
"$PYTHON" -m pip install --quiet ".[test,upstream,upstream-bnb]"
"$PYTHON" -m ruff check src tests
bash ci/compile-kernels.sh
export HYPOTHESIS_PROFILE="${HYPOTHESIS_PROFILE:-ci}"
"$PYTHON" -m pytest -n 2 -p no:cacheprovider "$@" tests
