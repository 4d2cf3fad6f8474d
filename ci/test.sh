#!/usr/bin/env bash
# The README's test command: install qconform with its test and upstream extras (bitsandbytes on
# the CPU build of torch, installed first so that pip does not fetch a CUDA build), then run pytest
# with the `ci` hypothesis profile, a worker a core (2 to 8). Works on a fresh machine with Python 3.11 and pip.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
mkdir -p build
# the compile gate's shipped sources need no Python package: compiled while pip installs
bash ci/compile-kernels.sh shipped >build/compile-shipped.log 2>&1 &
shipped_pid=$!
"$PYTHON" -m pip install --quiet --upgrade pip
# --no-compile: no byte-compiling of every installed module at install time (torch's install: ~36 s of
# CPU with it, ~10 s without, here); Python compiles the modules the run imports when it first imports them
"$PYTHON" -m pip install --quiet --no-compile "torch==2.13.0" || \
  "$PYTHON" -m pip install --quiet --no-compile "torch==2.13.0" --index-url https://download.pytorch.org/whl/cpu
"$PYTHON" -m pip install --quiet --no-compile ".[test,upstream,upstream-bnb]"
"$PYTHON" -m ruff check src tests
# the main job (README: `qconform run`, the oracles against the golden sets on a host without a GPU),
# beside the compile gate: it also fills numba's on-disk cache of the oracles' compiled functions
# (cache=True), which the pytest workers then load instead of each compiling them again (about 70 s
# of compilation per process on a fresh install); its verdict is pytest's too (tests/test_readme.py)
"$PYTHON" -m qconform run >build/qconform-run.log 2>&1 &
run_pid=$!
# ggml's own C from a pinned llama-cpp-python sdist (ci/ggml-lib.sh, docs/ggml-formats.md 0), built
# beside them: the C-comparison tests run against it
PYTHON="$PYTHON" bash ci/ggml-lib.sh >build/ggml-lib.log 2>&1 &
ggml_pid=$!
bash ci/compile-kernels.sh patched
shipped_rc=0
wait "$shipped_pid" || shipped_rc=$?
cat build/compile-shipped.log
[ "$shipped_rc" -eq 0 ] || { echo "ci/test.sh: ci/compile-kernels.sh shipped failed (exit $shipped_rc)" >&2; exit 1; }
run_rc=0
wait "$run_pid" || run_rc=$?
echo "ci/test.sh: qconform run (oracles against the golden sets): exit $run_rc; $(tail -n 1 build/qconform-run.log)"
# without ggml's C the C-comparison tests skip: a loud warning here, a failure with CI=true
ggml_rc=0
wait "$ggml_pid" || ggml_rc=$?
cat build/ggml-lib.log
if [ "$ggml_rc" -eq 0 ]; then
  . build/ggml/env.sh
elif [ "${CI:-}" = true ]; then
  echo "ci/test.sh: ci/ggml-lib.sh failed (exit $ggml_rc): CI=true requires ggml's C" >&2
  exit 1
else
  printf '%s\n' "" "!!! WARNING: ci/ggml-lib.sh failed (exit $ggml_rc):" \
    "!!! the ggml C-comparison tests will SKIP (CI=true makes this an error)" "" >&2
fi
export HYPOTHESIS_PROFILE="${HYPOTHESIS_PROFILE:-ci}"
# a worker a core, 2 to 8
workers=$(nproc 2>/dev/null || echo 2)
[ "$workers" -ge 2 ] || workers=2
[ "$workers" -le 8 ] || workers=8
"$PYTHON" -m pytest -n "$workers" -p no:cacheprovider "$@" tests
