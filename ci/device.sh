#!/usr/bin/env bash
# The device suite, on a machine with a GPU and CuPy: builds (RawModule JIT, the so: launchers),
# checks (pytest -m device: every kernel through every property, device mutants caught) and times
# (each kernel against the measured copy bandwidth), then prints the tables last.
#   bash ci/device.sh [all|check|time]   # logs and tables under $OUT (default /tmp/qconform-device);
#                                        # check / time: only the checks / only the timings (to split the
#                                        # suite over two device calls of 10 minutes; all ~ 9 minutes on an H200)
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 HYPOTHESIS_PROFILE="${HYPOTHESIS_PROFILE:-ci}"
OUT="${OUT:-/tmp/qconform-device}"
mkdir -p "$OUT"
PY="${PYTHON:-python3}"
STAGE="${1:-all}"
case "$STAGE" in all | check | time) ;; *) echo "usage: ci/device.sh [all|check|time]" >&2; exit 2 ;; esac
status=0

if [ "$STAGE" != time ]; then
  # the mutants run once, below (device_catalogue.py prints their table): not again inside pytest
  "$PY" -m pytest -m device -q -p no:cacheprovider -k "not test_device_mutant" tests/test_device.py \
    >"$OUT/pytest.log" 2>&1 || status=1
  tail -n 3 "$OUT/pytest.log"
  GGML=q8_k_quant,q8_0_quant,q8_k_dequant,q8_0_dequant
  ORT=matmul_nbits,dequantize_nbits,gather_block_quantized,fake_quantize,qswiglu
  "$PY" -m qconform run --ops "$GGML" --coverage 2 --format markdown --out "$OUT/cupy.md" >"$OUT/run-cupy.log" 2>&1 || status=1
  "$PY" -m qconform run --impl cupy --ops "$ORT" --coverage 2 --no-cold --format markdown --out "$OUT/cupy-ort.md" \
    >"$OUT/run-cupy-ort.log" 2>&1 || status=1
  "$PY" -m qconform run --impl cupy:ref --ops q8_k_quant --coverage 2 --format markdown --out "$OUT/cupy-ref.md" \
    >"$OUT/run-cupy-ref.log" 2>&1 || status=1
  "$PY" tests/device_catalogue.py >"$OUT/mutants.md" 2>&1 || status=1
fi
if [ "$STAGE" != check ]; then
  "$PY" -m qconform.bench.device >"$OUT/bench.md" 2>&1 || status=1
fi

echo
show() { echo "== $1 =="; cat "$OUT/$2"; }
if [ "$STAGE" != time ]; then
  show "conformance: qconform run --ops ggml (a GPU found: --impl cupy, coverage 2)" cupy.md
  show "conformance: ONNX Runtime family (--impl cupy, coverage 2, no cold sets; cold u2 GEMV sets in pytest)" cupy-ort.md
  show "conformance: --impl cupy:ref" cupy-ref.md
  show "device mutants and controls" mutants.md
fi
[ "$STAGE" != check ] && show "throughput" bench.md
exit $status
