#!/usr/bin/env bash
# CI compile gate (no GPU needed): every kernel source compiled offline, warnings as errors, for
#   AMD gfx90a (wave64) with Debian's hipcc (installed here if missing) and to device IR for gfx1030
#   (wave32; below), and NVIDIA sm_90 with nvcc (and sm_90a, a source with code for it);
# the device mutants of tests/device_mutants likewise; the patched copies of shipped kernels that
# tests/device_catalogue.py --write-sources writes and the benches' diagnostic builds through the
# CUDA device front end for sm_90 (they run in the NVIDIA device suite; below);
# the so: launcher examples are also built as shared libraries for both vendors (those whose device code
# is built in full elsewhere here: front end on AMD, device code as PTX at -O0 on NVIDIA), and the
# CUDA-only test launchers for NVIDIA. Facts: docs/device-tooling.md B6 (HIP_PLATFORM=amd is required
# because nvcc is on PATH; Debian's hipcc is 5.2.3 / clang-15).
#   bash ci/compile-kernels.sh [all|shipped|patched]
# shipped: the sources in the repository (no Python package needed: ci/test.sh runs it while pip
# installs); patched: the device mutants' patched copies and the benches' diagnostic builds (they
# need qconform's dependencies installed); all (default): both.
set -euo pipefail
cd "$(dirname "$0")/.."
PART="${1:-all}"
case "$PART" in all | shipped | patched) ;; *) echo "usage: ci/compile-kernels.sh [all|shipped|patched]" >&2; exit 2 ;; esac
part() { [ "$PART" = all ] || [ "$PART" = "$1" ]; }
KERNELS=src/qconform/device/kernels
INCLUDES="-I$KERNELS -I$KERNELS/common"
export HIP_PLATFORM=amd

install_hipcc() {
  command -v hipcc >/dev/null && return 0
  local sudo=""
  [ "$(id -u)" = 0 ] || sudo="sudo -n"
  command -v apt-get >/dev/null || return 1
  $sudo apt-get update -qq >/dev/null && \
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends hipcc libamdhip64-dev >/dev/null
}

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
n=0
amd=1
if part shipped && ! install_hipcc; then
  amd=0
  echo "compile-kernels: WARNING: hipcc is not installed and could not be installed (apt-get as root or sudo): AMD targets NOT compiled" >&2
fi
nv=1
if ! command -v nvcc >/dev/null; then
  nv=0
  echo "compile-kernels: WARNING: nvcc is not installed: NVIDIA targets NOT compiled" >&2
fi

JOBS=$(nproc 2>/dev/null || echo 2)
fail=0
sm90a=0  # 1 once a source was built for sm_90a too
compile() {  # label, command... : run in the background, JOBS at a time, each with its own output file
  local label=$1 a args=()
  shift
  case "$1" in nvcc | nvcc_front) [ "$nv" = 0 ] && return 0 ;; esac
  for a in "$@"; do
    case "$a" in "$tmp"/k.* | "$tmp"/l.*) a="$tmp/job$n.${a##*.}" ;; esac
    args+=("$a")
  done
  (
    if ! "${args[@]}" >"$tmp/job$n.log" 2>&1; then
      echo "compile-kernels: FAILED $label" >&2
      cat "$tmp/job$n.log" >&2
      exit 1
    fi
  ) &
  n=$((n + 1))
  if [ "$(jobs -rp | wc -l)" -ge "$JOBS" ]; then wait -n || fail=1; fi
}

# the CUDA device front end alone (cicc --no_code_gen; see the patched part): a silent run is a clean one
nvcc_front() {
  local log
  log=$(nvcc "$@" 2>&1) && return 0
  [ -z "$log" ] && return 0
  printf '%s\n' "$log"
  return 1
}

# gfx1030 (wave32) to device IR: clang's front end and its code generation for the target, at -O0 and
# without the backend (every wave32 path parsed and instantiated under the target's macros, warnings as
# errors, each builtin's target features checked: an instruction gfx1030 lacks is an error here); the
# optimizer and the backend run for gfx90a (wave64). A full gfx1030 build of the sources took ~190 s of
# CPU (nbits_mma.hip alone 60 s), this ~3 s a source. (-O0 through the backend is not an option: there
# ROCm's device library leaves a wave64-only DPP shift in qmoe.hip's gfx1030 code, dead at -O3.)
amd_kernel() {  # source, defines...: built for gfx90a, to device IR for gfx1030
  local src=$1
  shift
  compile "$src for gfx90a" hipcc --genco --offload-arch=gfx90a -Werror -Wall -Wno-pass-failed $INCLUDES "$@" \
    -o "$tmp/k.co" "$src"
  compile "$src for gfx1030 (device IR)" hipcc -c --cuda-device-only -emit-llvm -O0 --offload-arch=gfx1030 -Werror \
    -Wall -Wno-pass-failed $INCLUDES "$@" -o "$tmp/k.bc" "$src"
}

if part shipped; then
  # -Wno-pass-failed: on AMD the matrix-unit GEMM runs qk_mma_16816's shuffle form, and clang may
  # decline to fully unroll the prefill shape's loop nest (code size): a speed matter, not a wrong result.
  # AMD builds take -DQK_MMA_DEFAULT_ONLY: the MatMulNBits bench's other decode candidates run on
  # NVIDIA only (sm_90 builds them; on AMD they were half of this gate's longest compiles).
  # the so: launchers first. One whose device code is built in full elsewhere in this gate, a WRONG TWIN
  # (*_wrong.cu: its launcher's device code, only its host code differs) or a launcher that includes a
  # shipped kernel source whole (q8_k_launcher.cu, qmoe_launcher.cu: the source is compiled below), goes
  # through the front end alone on AMD (-fsyntax-only: host and device parsed and checked, ~3 s against
  # ~42 s for qmoe_launcher.cu) and is built and linked with its device code as PTX at -O0 on NVIDIA (no
  # ptxas, no NVVM optimizer: ~5 s against ~33 s); the others (gather_block_quantized_launcher.cu: device
  # code of its own) are built as shared libraries for both vendors.
  for src in examples/so_launcher/*.cu; do
    whole=1
    case "$src" in *_wrong.cu) whole=0 ;; esac
    grep -q '^#include "[a-z]*/[a-z0-9_]*\.hip"' "$src" && whole=0
    if [ "$amd" = 1 ]; then
      if [ "$whole" = 0 ]; then
        compile "$src (front end) for gfx90a" hipcc -c -fsyntax-only --offload-arch=gfx90a -x hip -Werror $INCLUDES "$src"
      else
        compile "$src (shared library) for gfx90a" hipcc -shared -fPIC --offload-arch=gfx90a -x hip -Werror \
          $INCLUDES -o "$tmp/l.so" "$src"
      fi
    fi
    if [ "$whole" = 0 ]; then
      compile "$src (shared library, device code as PTX at -O0) for sm_90" nvcc --cudart shared -shared \
        -Xcompiler -fPIC -gencode arch=compute_90,code=compute_90 -Xcicc -O0 -Werror all-warnings $INCLUDES \
        -o "$tmp/l.so" "$src"
    else
      compile "$src (shared library) for sm_90" nvcc --cudart shared -shared -Xcompiler -fPIC -arch=sm_90 \
        -Werror all-warnings $INCLUDES -o "$tmp/l.so" "$src"
    fi
  done
  # then the kernels, the largest source first (the longest compiles: fewer idle cores at the end); for
  # sm_90 too the full build takes -DQK_MMA_DEFAULT_ONLY, and the bench-only candidates it leaves out go
  # through the device front end (ort/nbits_mma.hip: ~20 s + ~1 s against ~64 s for the full build)
  for src in $(ls -S "$KERNELS"/*/*.hip) tests/device_mutants/*.hip; do
    [ "$amd" = 1 ] && amd_kernel "$src" -DQK_MMA_DEFAULT_ONLY
    compile "$src for sm_90" nvcc -cubin -arch=sm_90 -Werror all-warnings $INCLUDES -DQK_MMA_DEFAULT_ONLY -x cu \
      -o "$tmp/k.cubin" "$src"
    if grep -q QK_MMA_DEFAULT_ONLY "$src"; then
      compile "$src for sm_90 (front end, every candidate)" nvcc_front -ptx -arch=sm_90 -Xcicc --no_code_gen \
        -Werror all-warnings $INCLUDES -x cu -o "$tmp/k.ptx" "$src"
    fi
    # a source with sm_90a code (wgmma, behind __CUDA_ARCH_FEAT_SM90_ALL; loader.arch_specific_options) for it too
    if grep -q __CUDA_ARCH_FEAT_SM90_ALL "$src"; then
      compile "$src for sm_90a" nvcc -cubin -arch=sm_90a -Werror all-warnings $INCLUDES -x cu -o "$tmp/k.cubin" "$src"
      sm90a=1
    fi
  done
  for src in tests/device_mutants/*.cu; do  # CUDA-only test launchers
    compile "$src (shared library) for sm_90" nvcc --cudart shared -shared -Xcompiler -fPIC -arch=sm_90 \
      -Werror all-warnings $INCLUDES -o "$tmp/l.so" "$src"
  done
  for src in examples/hip_kernel/*.hip; do  # the worked user hip: kernels (tests/user_kernels.py), like the kernels
    [ "$amd" = 1 ] && amd_kernel "$src"
    compile "$src for sm_90" nvcc -cubin -arch=sm_90 -Werror all-warnings $INCLUDES -x cu -o "$tmp/k.cubin" "$src"
  done
fi
if part patched; then
  # patched sources: tmp/patched/<mutant>/<file>, beside copies of the headers of the shipped file's folder;
  # built as the suite and the bench load them: the launcher's MatMulNBits shapes only (-DQK_MMA_DEFAULT_ONLY)
  PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" python3 tests/device_catalogue.py --write-sources "$tmp/patched" \
    >/dev/null
  # patched copies (the device mutants) and the benches' diagnostic builds differ from a shipped source by
  # a few lines or a -D option and run only on NVIDIA: each goes through the CUDA device front end for
  # sm_90 alone (cicc --no_code_gen: the parse, every template the kernels instantiate, the warnings as
  # errors; no PTX), which is what a few-line patch can break; NVVM, the optimizer and ptxas run on the
  # shipped sources above (but for the MatMulNBits bench-only candidates: front end). Full builds of the ~100 copies took ~7 of this gate's ~10 minutes on 2 cores,
  # PTX at -O0 ~110 s (~220 s of CPU), the front end ~36 s (~72 s of CPU). With --no_code_gen nvcc
  # exits 1 on the PTX file it then finds missing, printing nothing, while any diagnostic is printed:
  # so a silent run is a clean one (nvcc 13.0).
  front() {  # label, defines..., source (for sm_90a where it has sm_90a code, as the suite builds it)
    local label=$1 src=${*: -1} defs=("${@:2:$#-2}") arch=sm_90
    if grep -q __CUDA_ARCH_FEAT_SM90_ALL "$src"; then arch=sm_90a; sm90a=1; fi
    compile "$label" nvcc_front -ptx -arch=$arch -Xcicc --no_code_gen -Werror all-warnings $INCLUDES "${defs[@]}" \
      -x cu -o "$tmp/k.ptx" "$src"
  }
  for src in "$tmp"/patched/*/*.hip; do  # with the row's -D options (its options file) as the suite builds it
    read -ra row_defs <"$(dirname "$src")/options"
    front "$src for sm_90 (front end)" -DQK_MMA_DEFAULT_ONLY "${row_defs[@]}" "$src"
  done
  # the benches' diagnostic builds, sm_90 only (the benches run on NVIDIA): the session-7 attention kernels of
  # ort/gqa.hip (-DQK_GQA_LEGACY; bench.gqa --variants flash,legacy); the session-3 zero-point arithmetic of
  # the fp16-A matrix-unit kernels (-DQK_NBITS_ZP_SUM_V1; bench.nbits --variants and the device mutant "mma
  # GEMV fp16 A: zero point through sum(a)") and the ring decode's strided (both widths), contiguous (both
  # widths), four-shared-reads, no-tail-test, unit-staging (u4) and loads-only builds (-DQK_NBITS_RING_STRIDED,
  # -DQK_NBITS_RING_CONTIGUOUS, -DQK_NBITS_RING_LDS, -DQK_NBITS_RING_TAIL_SPLIT, -DQK_NBITS_STAGE_BATCH=1,
  # -DQK_NBITS_RING_LOADS_ONLY; bench.nbits --variants ring); the flash prefill's
  # session-8 kernels (-DQK_GQA_PREFILL_V1; bench.gqa_prefill --variants); the keep-quant fast GEMV's round 1
  # (-DQK_KQ_FAST_V1), its first weight loads
  # before its wait for the quantize (-DQK_KF_LOADS_FIRST), its M = 1 Q4_K / Q5_K call as two launches
  # (-DQK_KF_TWO_LAUNCH), its one launch without the waiting CTAs' prefetch (-DQK_KF_ONE_PREFETCH=0) or
  # with its first trip loaded after the wait (-DQK_KF_FIRST_AFTER_WAIT=1, 3) and
  # Q6_K / Q8_0 staged as before the bulk copy (-DQK_KF_STAGED), or its ring with 2 slots
  # (-DQK_KF_BULK_STAGES=2; bench.ggml_gemv); every
  # programmatic-launch trigger dropped (-DQK_PDL_TRIGGER_AT_EXIT; bench.ggml_gemv's trigger_at_exit); the bnb
  # matrix-unit GEMM with its table filled before the ring's first loads (-DQK_BNBM_FILL_FIRST) and with
  # activation pieces loaded a step ahead (-DQK_BNBM_A_AHEAD=1, 2), and the diagnostic without the table's
  # reads (-DQK_BNBM_NO_TABLE_READS) or with its loads alone (-DQK_BNBM_LOADS_ONLY; bench.bnb_gemv --variants mma)
  front "$KERNELS/ort/gqa.hip -DQK_GQA_LEGACY" -DQK_GQA_LEGACY "$KERNELS/ort/gqa.hip"
  for def in -DQK_NBITS_ZP_SUM_V1 -DQK_NBITS_RING_STRIDED -DQK_NBITS_RING_CONTIGUOUS -DQK_NBITS_RING_LDS \
    -DQK_NBITS_RING_TAIL_SPLIT -DQK_NBITS_STAGE_BATCH=1 -DQK_NBITS_RING_LOADS_ONLY; do
    front "$KERNELS/ort/nbits_mma.hip $def" "$def" "$KERNELS/ort/nbits_mma.hip"
  done
  front "$KERNELS/ort/gqa_flash.hip -DQK_GQA_PREFILL_V1" -DQK_GQA_PREFILL_V1 "$KERNELS/ort/gqa_flash.hip"
  front "$KERNELS/ggml/q8_quant.hip -DQK_PDL_TRIGGER_AT_EXIT" -DQK_PDL_TRIGGER_AT_EXIT "$KERNELS/ggml/q8_quant.hip"
  for def in -DQK_BNBM_FILL_FIRST -DQK_BNBM_A_AHEAD=1 -DQK_BNBM_A_AHEAD=2 -DQK_BNBM_NO_TABLE_READS \
    -DQK_BNBM_LOADS_ONLY; do
    front "$KERNELS/bnb/gemm_mma.hip $def" "$def" "$KERNELS/bnb/gemm_mma.hip"
  done
  for def in -DQK_KQ_FAST_V1 -DQK_KF_LOADS_FIRST -DQK_KF_TWO_LAUNCH -DQK_KF_ONE_PREFETCH=0 -DQK_KF_STAGED -DQK_PHASES; do
    front "$KERNELS/ggml/keep_quant_fast.hip $def" "$def" "$KERNELS/ggml/keep_quant_fast.hip"
  done
  front "$KERNELS/ggml/keep_quant_fast.hip -DQK_PHASES -DQK_KF_LOADS_FIRST" -DQK_PHASES -DQK_KF_LOADS_FIRST \
    "$KERNELS/ggml/keep_quant_fast.hip"
  front "$KERNELS/ggml/keep_quant_fast.hip -DQK_KF_BULK_STAGES=2" -DQK_KF_BULK_STAGES=2 "$KERNELS/ggml/keep_quant_fast.hip"
  for def in -DQK_KF_FIRST_AFTER_WAIT=1 -DQK_KF_FIRST_AFTER_WAIT=3; do
    front "$KERNELS/ggml/keep_quant_fast.hip $def" "$def" "$KERNELS/ggml/keep_quant_fast.hip"
  done
  # the other builds the benches and the device mutants' controls load (each option a kernel reads: tests/
  # test_build_options.py): the portable mma's shuffle form on NVIDIA (-DQK_MMA_EMULATE), bnb's 16-copy
  # table (-DQK_BNBM_TAB16), its cpu reading on the SIMT kernel (-DQK_BNB_CPU_SIMT) and session 7's SIMT
  # GEMM (-DQK_BNB_GEMM_V1), GQA's session-9 flash decode (-DQK_GQA_FLASH_V1), int8 transposed cache as
  # uint8 (-DQK_GQA_I8T_U8), the mma decode's append's reads issued first (-DQK_GQA_APPEND_LOADS_FIRST),
  # QMoE's session-3 decode (-DQK_MOE_DECODE_V1), round 1's grouped GEMM (-DQK_MOE_GEMM_V1), its matrix-unit
  # decode reading the biases after the sums (-DQK_MOE_BIAS_AT_END), the phase
  # stamps of both decodes and of the keep-quant GEMV (-DQK_PHASES, the last also with its loads first),
  # MatMulNBits prefill without wgmma (-DQK_NBITS_NO_WGMMA)
  front "$KERNELS/bnb/gemm_mma.hip -DQK_MMA_EMULATE -DQK_BNBM_TAB16" -DQK_MMA_EMULATE -DQK_BNBM_TAB16 \
    "$KERNELS/bnb/gemm_mma.hip"
  front "$KERNELS/bnb/gemm_mma.hip -DQK_BNB_CPU_SIMT" -DQK_BNB_CPU_SIMT "$KERNELS/bnb/gemm_mma.hip"
  front "$KERNELS/bnb/gemm_simt.hip -DQK_BNB_GEMM_V1" -DQK_BNB_GEMM_V1 "$KERNELS/bnb/gemm_simt.hip"
  for def in -DQK_GQA_FLASH_V1 -DQK_GQA_I8T_U8 -DQK_PHASES -DQK_GQA_APPEND_LOADS_FIRST -DQK_MMA_EMULATE; do
    front "$KERNELS/ort/gqa.hip $def" "$def" "$KERNELS/ort/gqa.hip"
  done
  for def in -DQK_MOE_DECODE_V1 -DQK_MOE_GEMM_V1 -DQK_PHASES -DQK_MMA_EMULATE -DQK_MOE_BIAS_AT_END; do
    front "$KERNELS/ort/qmoe.hip $def" "$def" "$KERNELS/ort/qmoe.hip"
  done
  front "$KERNELS/ort/gqa_flash.hip -DQK_MMA_EMULATE" -DQK_MMA_EMULATE "$KERNELS/ort/gqa_flash.hip"
  front "$KERNELS/ort/nbits_mma.hip -DQK_MMA_EMULATE" -DQK_MMA_EMULATE -DQK_MMA_DEFAULT_ONLY "$KERNELS/ort/nbits_mma.hip"
  front "$KERNELS/ort/nbits_wgmma.hip -DQK_NBITS_NO_WGMMA" -DQK_NBITS_NO_WGMMA "$KERNELS/ort/nbits_wgmma.hip"
fi
for pid in $(jobs -p); do wait "$pid" || fail=1; done
[ "$fail" = 0 ] || { echo "compile-kernels: a compile FAILED (log above)" >&2; exit 1; }
targets=""
[ "$amd" = 1 ] && part shipped && targets="gfx90a, gfx1030"
if [ "$nv" = 1 ]; then targets="${targets:+$targets and }sm_90"; fi
if [ "$nv" = 1 ] && [ "$sm90a" = 1 ]; then targets="$targets (and sm_90a)"; fi
skipped=""
[ "$amd" = 0 ] && skipped="$skipped; AMD SKIPPED"
if [ "$nv" = 0 ]; then skipped="$skipped; NVIDIA SKIPPED"; fi
echo "compile-kernels ($PART): $n compiles passed (${targets:-no compiler: nothing compiled}$skipped)"
