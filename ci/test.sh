#!/usr/bin/env bash
# The README's test command: install qconform with its test and upstream extras, then run pytest
# with the `ci` hypothesis profile on 2 workers. Works on a fresh machine with Python 3.11 and pip.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
"$PYTHON" -m pip install --quiet --upgrade pip
"$PYTHON" -m pip install --quiet ".[test,upstream]"
"$PYTHON" -m ruff check src tests
bash ci/compile-kernels.sh
export HYPOTHESIS_PROFILE="${HYPOTHESIS_PROFILE:-ci}"
"$PYTHON" -m pytest -n 2 -p no:cacheprovider "$@" tests
