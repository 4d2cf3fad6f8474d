#!/usr/bin/env bash
# The device suite, on a machine with a GPU and CuPy: builds (RawModule JIT, the so: launchers),
# checks (pytest -m device: every kernel through every property; the conformance run of every
# op of the catalogue; the device mutants; the worked user kernels and their wrong twins) and
# times (each kernel against the measured copy bandwidth), then prints the tables last.
#   bash ci/device.sh [all|check|mutants|users|time] [FAMILY]
# check: pytest -m device and the conformance run; mutants: the device mutants and controls;
# users: the worked user kernels with their wrong twins; time: the throughput tables (each part
# well under one 10-minute device call); FAMILY (ggml, ort, ...: `qconform list --families`) limits check, mutants
# and time to one family (the mutants of every family do not fit one call).
# BENCHES (names: gqa gqa-prefill qmoe qmoe-prefill nbits nbits-prefill bnb-gemv bnb-gemv-cpu ggml-gemv throughput) limits the time part
# to those benches: with every family it takes longer than one 10-minute device call.
# QUICK=1 passes --quick to each bench (their smaller shape sets: one device call for all of them).
# MUTANT_SHARDS=S (default 8) runs the mutants in S processes; MUTANT_PART=p/n only part p of n of them.
# Logs and tables land under $OUT (default /tmp/qconform-device).
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 HYPOTHESIS_PROFILE="${HYPOTHESIS_PROFILE:-ci}"
OUT="${OUT:-/tmp/qconform-device}"
mkdir -p "$OUT"
PY="${PYTHON:-python3}"
STAGE="${1:-all}"
FAMILY="${2:-}"
case "$STAGE" in all | check | mutants | users | time) ;; *) echo "usage: ci/device.sh [all|check|mutants|users|time] [FAMILY]" >&2; exit 2 ;; esac
part() { [ "$STAGE" = all ] || [ "$STAGE" = "$1" ]; }
FAMILIES=$("$PY" -m qconform list --families) || exit 2
if [ -n "$FAMILY" ]; then
  case " $FAMILIES " in *" $FAMILY "*) FAMILIES="$FAMILY" ;; *) echo "ci/device.sh: no family $FAMILY (have: $FAMILIES)" >&2; exit 2 ;; esac
fi
status=0
pids=()
bg() {  # bg LOG COMMAND...: COMMAND in the background, its output in LOG; `waitall` collects them
  local log=$1
  shift
  "$@" >"$log" 2>&1 &
  pids+=($!)
}
waitall() {
  for pid in "${pids[@]}"; do wait "$pid" || status=1; done
  pids=()
}

if part check; then
  # the pytest suite (pytest-xdist workers where installed) and each conformance run side by side:
  # checks, not timings, so they may share the GPU; each family's run in CHECK_WORKERS shards
  # the mutants and the user kernels run in their own part (their scripts print tables): not in pytest
  filter="not test_device_mutant and not test_user_kernel"
  # each own-kernel test carries its op's family as a keyword (tests/conftest.py, own_kernel_family)
  [ -n "$FAMILY" ] && filter="$filter and ($FAMILY or not own_kernel)"
  workers=()
  "$PY" -c "import xdist" 2>/dev/null && workers=(-n "${DEVICE_WORKERS:-8}")
  bg "$OUT/pytest.log" "$PY" -m pytest -m device -q -p no:cacheprovider "${workers[@]}" -k "$filter" tests/test_device.py
  for fam in $FAMILIES; do  # every op of the catalogue with qconform's kernels, coverage 2
    ops=$("$PY" -m qconform list --names --with-kernels --family "$fam")
    if [ -z "$ops" ]; then echo "family $fam: no device kernels of ours yet (oracle only)" >"$OUT/cupy-$fam.md"; continue; fi
    bg "$OUT/run-cupy-$fam.log" "$PY" -m qconform run --impl cupy --ops "$ops" --coverage 2 --no-cold \
      --workers "${CHECK_WORKERS:-3}" --format markdown --out "$OUT/cupy-$fam.md"
  done
  if [ -z "$FAMILY" ] || [ "$FAMILY" = bnb ]; then
    # the cuda reading's reciprocal table, measured here; the bnb launchers with a second reading:
    # bitsandbytes' CUDA kernels
    bg "$OUT/rcp.md" "$PY" -m qconform.device.bnb.rcp --out "$OUT/rcp-table.npz"
    ops=$("$PY" -c "from qconform.device.bnb import DEVICE_FUNCTIONS as F; from qconform.impls.device import takes_variant; print(','.join(k for k, f in F.items() if takes_variant(f)))")
    bg "$OUT/run-cupy-bnb-cuda.log" "$PY" -m qconform run --impl cupy --contract variant=cuda --ops "$ops" --coverage 2 \
      --no-cold --format markdown --out "$OUT/cupy-bnb-cuda.md"
  fi
  if [ -z "$FAMILY" ] || [ "$FAMILY" = ggml ]; then  # the other Q8_K quantize kernels (cupy runs coop)
    for v in ref w32; do
      bg "$OUT/run-cupy-$v.log" "$PY" -m qconform run --impl "cupy:$v" --ops q8_k_quant --coverage 2 --format markdown \
        --out "$OUT/cupy-$v.md"
    done
  fi
  waitall
  tail -n 3 "$OUT/pytest.log"
fi
if part mutants; then
  # MUTANT_SHARDS processes side by side (each builds its own rows), one table after; MUTANT_PART=p/n
  # runs part p of n (shards (p - 1) S + 1 .. p S of n S), so one family's rows can span n device calls
  shards="${MUTANT_SHARDS:-8}"
  mpart="${MUTANT_PART:-1/1}"
  if ! [[ "$mpart" =~ ^([1-9][0-9]*)/([1-9][0-9]*)$ ]] || [ "${BASH_REMATCH[1]}" -gt "${BASH_REMATCH[2]}" ]; then
    echo "ci/device.sh: MUTANT_PART must be p/n with 1 <= p <= n, not $mpart" >&2
    exit 2
  fi
  first=$(((BASH_REMATCH[1] - 1) * shards)) total=$((BASH_REMATCH[2] * shards))
  for ((i = 1; i <= shards; i++)); do
    bg "$OUT/mutants-$i.log" "$PY" tests/device_catalogue.py --shard "$((first + i))/$total" ${FAMILY:+--family "$FAMILY"}
  done
  waitall
  {
    head -n 2 "$OUT/mutants-1.log"
    for ((i = 1; i <= shards; i++)); do grep -v '^| device mutant\|^|---\|^mutants and controls' "$OUT/mutants-$i.log"; done
    for ((i = 1; i <= shards; i++)); do cat "$OUT/mutants-$i.log"; done | awk -F'[ /]' '/^mutants and controls as expected/ {ok += $(NF-1); n += $NF}
      END {printf "mutants and controls as expected: %d/%d\n", ok, n}'
  } >"$OUT/mutants.md"
fi
if part users; then
  "$PY" tests/user_kernels.py >"$OUT/user-kernels.md" 2>&1 || status=1
fi
if part time; then
  # the kernels changed most recently first (a cut call keeps their tables); each bench's seconds
  # in time-part.txt
  : >"$OUT/time-part.txt"
  timed() {  # timed NAME FAMILY MODULE [ARGS...]: python -m MODULE ARGS --json into bench-NAME.{json,md},
    # when FAMILY is selected and NAME is in BENCHES (default: every bench)
    local start=$SECONDS name=$1 family=$2 module=$3
    shift 3
    if { [ -z "$FAMILY" ] || [ "$FAMILY" = "$family" ]; } && { [ -z "${BENCHES:-}" ] || [[ " $BENCHES " == *" $name "* ]]; }; then
      "$PY" -m "$module" "$@" ${QUICK:+--quick} --json "$OUT/bench-$name.json" >"$OUT/bench-$name.md" 2>&1 || status=1
    else
      echo "(not selected: FAMILY=$FAMILY BENCHES=${BENCHES:-})" >"$OUT/bench-$name.md"
    fi
    echo "$name: $((SECONDS - start)) s" >>"$OUT/time-part.txt"
  }
  timed gqa ort qconform.bench.gqa
  timed gqa-prefill ort qconform.bench.gqa_prefill
  timed qmoe ort qconform.bench.qmoe
  timed qmoe-prefill ort qconform.bench.qmoe --prefill
  timed nbits ort qconform.bench.nbits
  timed nbits-prefill ort qconform.bench.nbits --prefill
  timed bnb-gemv bnb qconform.bench.bnb_gemv
  timed bnb-gemv-cpu bnb qconform.bench.bnb_gemv --variants cpu
  timed ggml-gemv ggml qconform.bench.ggml_gemv
  start=$SECONDS
  if [ -z "${BENCHES:-}" ] || [[ " $BENCHES " == *" throughput "* ]]; then
    "$PY" -m qconform.bench.device >"$OUT/bench.md" 2>&1 || status=1
  else
    echo "(not selected: BENCHES=$BENCHES)" >"$OUT/bench.md"
  fi
  echo "throughput: $((SECONDS - start)) s" >>"$OUT/time-part.txt"
fi

echo
show() { echo "== $1 =="; cat "$OUT/$2"; }
if part check; then
  for fam in $FAMILIES; do
    show "conformance: family $fam (--impl cupy, coverage 2; cold sets in pytest)" "cupy-$fam.md"
  done
  if [ -z "$FAMILY" ] || [ "$FAMILY" = bnb ]; then
    show "conformance: bnb --impl cupy --contract variant=cuda" cupy-bnb-cuda.md
  fi
  if [ -z "$FAMILY" ] || [ "$FAMILY" = ggml ]; then
    for v in ref w32; do show "conformance: --impl cupy:$v" "cupy-$v.md"; done
  fi
  { [ -z "$FAMILY" ] || [ "$FAMILY" = bnb ]; } && show "bitsandbytes cuda reading: the device's reciprocal table" rcp.md
fi
part mutants && show "device mutants and controls" mutants.md
if part users; then
  show "worked user kernels (hip:, so:, device py:) and their wrong twins" user-kernels.md
fi
if part time; then
  show "throughput" bench.md
  show "MatMulNBits decode against its baselines (records: bench-nbits.json)" bench-nbits.md
  show "MatMulNBits prefill GEMM against cuBLAS (records: bench-nbits-prefill.json)" bench-nbits-prefill.md
  show "GroupQueryAttention decode against its baselines (records: bench-gqa.json)" bench-gqa.md
  show "GroupQueryAttention flash prefill against SDPA's flash backend (records: bench-gqa-prefill.json)" bench-gqa-prefill.md
  show "QMoE decode against its baselines (records: bench-qmoe.json)" bench-qmoe.md
  show "QMoE ragged prefill (grouped GEMM, storage=fp16) against PyTorch (records: bench-qmoe-prefill.json)" bench-qmoe-prefill.md
  show "ggml keep-quant GEMV against its baselines (records: bench-ggml-gemv.json)" bench-ggml-gemv.md
  show "bitsandbytes fused 4-bit GEMV against its baselines (records: bench-bnb-gemv.json)" bench-bnb-gemv.md
  show "bitsandbytes gemm_4bit, the cpu reading: SIMT and matrix-unit kernels (records: bench-bnb-gemv-cpu.json)" bench-bnb-gemv-cpu.md
  echo "seconds per bench:" $(cat "$OUT/time-part.txt")
fi
exit $status
