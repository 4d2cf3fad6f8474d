#!/usr/bin/env bash
# Builds ggml's own C reference code into two small shared libraries for the C-comparison tests
# (tests/test_upstream_ggml_c.py, tests/test_ggml_formats_kquants.py), from a pinned source package that
# PyPI serves: the llama-cpp-python sdist, which vendors llama.cpp (and so ggml) whole.
#
#   build/ggml/libggml-ref.so      ggml/src/ggml-quants.c and ggml/src/ggml-cpu/quants.c, no -march
#                                  flags: on x86-64 no FMA instruction, so no contraction, as ggml-base
#                                  is built (ggml/src/CMakeLists.txt gives it no ARCH_FLAGS)
#   build/ggml/libggml-ref-fma.so  the same ggml-quants.c object (ggml-base), and ggml-cpu/quants.c
#                                  with the flags that ggml/src/ggml-cpu/CMakeLists.txt gives the CPU
#                                  backend on x86-64 with GGML_NATIVE=OFF and the default options
#                                  (-msse4.2 -mf16c -mfma -mbmi2 -mavx -mavx2): GCC's default
#                                  -ffp-contract=fast then fuses a*b+c in the *_generic vec_dots
#
# Both are -O3 -DNDEBUG -std=gnu11 -D_GNU_SOURCE, as a CMake Release build of ggml compiles C (the
# sdist's scikit-build-core build is Release; ggml/CMakeLists.txt sets C_STANDARD 11 with extensions;
# ggml/src/CMakeLists.txt defines _GNU_SOURCE on Linux). What the two files need from the rest of
# ggml (ggml_abort, ggml_row_size, the CPU backend's fp16 tables) is in ci/ggml-stubs.c.
#
# On success writes build/ggml/env.sh, which exports QCONFORM_GGML_LIB and (where this CPU has
# AVX2/FMA/F16C/BMI2) QCONFORM_GGML_LIB_FMA; ci/test.sh sources it. Skips the build when both
# libraries exist and build/ggml/STAMP matches the pinned version and this script and the stubs.
# Exit status: 0 built (or cached), 2 the download failed, anything else the build failed.
set -euo pipefail
cd "$(dirname "$0")/.."

# llama-cpp-python 0.3.36 vendors ggml-org/llama.cpp@0c1e57098 (its CHANGELOG.md), ggml 0.25.3
# (vendor/llama.cpp/ggml/CMakeLists.txt). The sha256 is the sdist's on PyPI.
VERSION=0.3.36
SHA256=832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e
PYTHON="${PYTHON:-python3}"
CC="${CC:-gcc}"
OUT=build/ggml
SRC="$OUT/llama_cpp_python-$VERSION/vendor/llama.cpp/ggml"

stamp() {
  echo "llama-cpp-python==$VERSION sha256:$SHA256 cc:$("$CC" -dumpfullversion 2>/dev/null || "$CC" -dumpversion)"
  sha256sum ci/ggml-lib.sh ci/ggml-stubs.c
}

write_env() {
  local root
  root="$(pwd)"
  {
    echo "export QCONFORM_GGML_LIB=$root/$OUT/libggml-ref.so"
    # the FMA library executes AVX2/FMA/F16C/BMI2 instructions: only where the CPU has them
    if grep -qw avx2 /proc/cpuinfo && grep -qw fma /proc/cpuinfo && grep -qw f16c /proc/cpuinfo \
      && grep -qw bmi2 /proc/cpuinfo; then
      echo "export QCONFORM_GGML_LIB_FMA=$root/$OUT/libggml-ref-fma.so"
    else
      echo "ci/ggml-lib.sh: this CPU lacks AVX2/FMA/F16C/BMI2: QCONFORM_GGML_LIB_FMA is not set" >&2
    fi
  } >"$OUT/env.sh"
}

if [ "$(uname -m)" != x86_64 ]; then
  # the flags below and the no-FMA claim are x86-64 facts; AArch64 has FMA in its baseline
  echo "ci/ggml-lib.sh: x86-64 only (this machine is $(uname -m))" >&2
  exit 1
fi

if [ -f "$OUT/libggml-ref.so" ] && [ -f "$OUT/libggml-ref-fma.so" ] && [ -f "$OUT/STAMP" ] \
  && [ "$(stamp)" = "$(cat "$OUT/STAMP")" ]; then
  write_env
  echo "ci/ggml-lib.sh: cached ggml C libraries from llama-cpp-python $VERSION in $OUT"
  exit 0
fi

start=$(date +%s)
rm -rf "$OUT"
mkdir -p "$OUT/obj"
sdist="$OUT/llama_cpp_python-$VERSION.tar.gz"
# --no-binary names the package, not :all:, which would apply to the build requirements that pip
# installs to read the sdist's metadata too: scikit-build-core asks for cmake and ninja where the
# machine has none, and from source they fail to build (checked without cmake on PATH)
if ! "$PYTHON" -m pip download --quiet --no-deps --no-binary llama-cpp-python --dest "$OUT" \
  "llama-cpp-python==$VERSION" || [ ! -f "$sdist" ]; then
  echo "ci/ggml-lib.sh: pip download of llama-cpp-python==$VERSION (sdist) failed" >&2
  exit 2
fi
echo "$SHA256  $sdist" | sha256sum --check --quiet

# only the files that the two libraries compile from (about 1 MB of the 77 MB sdist)
vendored="llama_cpp_python-$VERSION/vendor/llama.cpp"
tar -xzf "$sdist" -C "$OUT" "$vendored/LICENSE" "$vendored/ggml/include" \
  "$vendored/ggml/src/"{ggml-quants.c,ggml-quants.h,ggml-common.h,ggml-impl.h} \
  "$vendored/ggml/src/ggml-cpu/"{quants.c,quants.h,ggml-cpu-impl.h,simd-mappings.h,arch-fallback.h}
rm -f "$sdist"

cflags=(-std=gnu11 -O3 -DNDEBUG -D_GNU_SOURCE -fPIC -I"$SRC/include" -I"$SRC/src" -I"$SRC/src/ggml-cpu")
# ggml/src/ggml-cpu/CMakeLists.txt, x86, GGML_NATIVE=OFF: GGML_SSE42, F16C, FMA, BMI2, AVX, AVX2 (each
# defaults to ON in ggml/CMakeLists.txt when not native), each a -m flag and a GGML_* definition
cpu_flags=(-msse4.2 -mf16c -mfma -mbmi2 -mavx -mavx2
  -DGGML_SSE42 -DGGML_F16C -DGGML_FMA -DGGML_BMI2 -DGGML_AVX -DGGML_AVX2)
o="$OUT/obj"
"$CC" "${cflags[@]}" -c "$SRC/src/ggml-quants.c" -o "$o/ggml-quants.o" &
"$CC" "${cflags[@]}" -c "$SRC/src/ggml-cpu/quants.c" -o "$o/cpu-quants.o" &
"$CC" "${cflags[@]}" "${cpu_flags[@]}" -c "$SRC/src/ggml-cpu/quants.c" -o "$o/cpu-quants-fma.o" &
"$CC" "${cflags[@]}" -Wall -Wextra -Wno-unused-function -c ci/ggml-stubs.c -o "$o/stubs.o" &
for job in $(jobs -p); do wait "$job"; done

# -z defs: every symbol resolved here, so that dlopen cannot fail on one later
"$CC" -shared -Wl,-z,defs -o "$OUT/libggml-ref.so" "$o/ggml-quants.o" "$o/cpu-quants.o" "$o/stubs.o" -lm
"$CC" -shared -Wl,-z,defs -o "$OUT/libggml-ref-fma.so" "$o/ggml-quants.o" "$o/cpu-quants-fma.o" "$o/stubs.o" -lm

# what the tests call must be exported (nm -D), in both libraries
pairs="q4_0_q8_0 q4_1_q8_1 q5_0_q8_0 q5_1_q8_1 q8_0_q8_0 iq4_nl_q8_0 iq4_xs_q8_K q2_K_q8_K q3_K_q8_K"
pairs="$pairs q4_K_q8_K q5_K_q8_K q6_K_q8_K"
want=(quantize_iq4_nl quantize_iq4_xs)
for t in q4_0 q4_1 q5_0 q5_1 q8_0 q8_1 q8_K q2_K q3_K q4_K q5_K q6_K iq4_nl iq4_xs; do
  want+=("quantize_row_${t}_ref")
  [ "$t" = q8_1 ] || want+=("dequantize_row_$t")  # ggml has no dequantize_row_q8_1
done
for p in $pairs; do want+=("ggml_vec_dot_${p}_generic"); done
for lib in "$OUT/libggml-ref.so" "$OUT/libggml-ref-fma.so"; do
  exported="$(nm -D --defined-only "$lib" | awk '$2 == "T" {print $3}')"
  for sym in "${want[@]}"; do
    if ! grep -qx "$sym" <<<"$exported"; then
      echo "ci/ggml-lib.sh: $lib does not export $sym" >&2
      exit 1
    fi
  done
done

# the point of two libraries: FMA instructions in the -mfma vec_dots, none anywhere in the other
fma_count() { objdump -d "$1" | grep -c 'vfn\?m\(add\|sub\)[0-9]*[ps]s' || true; }
if [ "$(fma_count "$OUT/libggml-ref.so")" -ne 0 ]; then
  echo "ci/ggml-lib.sh: libggml-ref.so contains FMA instructions (does $CC default to -march=x86-64-v3?)" >&2
  exit 1
fi
if [ "$(fma_count "$o/cpu-quants-fma.o")" -eq 0 ]; then
  echo "ci/ggml-lib.sh: the -mfma build of ggml-cpu/quants.c has no FMA instruction" >&2
  exit 1
fi

rm -rf "$o"
stamp >"$OUT/STAMP"
write_env
echo "ci/ggml-lib.sh: built ggml C libraries from llama-cpp-python $VERSION in $OUT ($(( $(date +%s) - start )) s," \
  "${#want[@]} symbols each, $(fma_count "$OUT/libggml-ref-fma.so") FMA instructions in the FMA library)"
