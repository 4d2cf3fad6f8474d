// The few ggml symbols that ggml/src/ggml-quants.c and ggml/src/ggml-cpu/quants.c need from the rest
// of ggml, so that ci/ggml-lib.sh can build those two files alone into a test library.
// Compiled without -march flags (as ggml-base is); every definition mirrors the upstream one named
// in its comment, in the ggml vendored by the pinned llama-cpp-python sdist.

#define GGML_COMMON_DECL_C
#include "ggml-common.h"

#include "ggml-impl.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

// ggml/src/ggml.c ggml_abort: print "file:line: message" to stderr, then abort() (no backtrace here)
void ggml_abort(const char * file, int line, const char * fmt, ...) {
    fflush(stdout);
    fprintf(stderr, "%s:%d: ", file, line);
    va_list args;
    va_start(args, fmt);
    vfprintf(stderr, fmt, args);
    va_end(args);
    fputc('\n', stderr);
    abort();
}

// ggml/src/ggml.c type_traits: blck_size and type_size of the types ggml-quants.c asks about
// (ggml_row_size in the quantize_* chunk functions, ggml_type_size in ggml_validate_row_data)
static int64_t blck_size(enum ggml_type type) {
    switch (type) {
        case GGML_TYPE_Q4_0: return QK4_0;
        case GGML_TYPE_Q4_1: return QK4_1;
        case GGML_TYPE_Q5_0: return QK5_0;
        case GGML_TYPE_Q5_1: return QK5_1;
        case GGML_TYPE_Q8_0: return QK8_0;
        case GGML_TYPE_Q8_1: return QK8_1;
        case GGML_TYPE_Q1_0: return QK1_0;
        case GGML_TYPE_Q2_0: return QK2_0;
        case GGML_TYPE_MXFP4: return QK_MXFP4;
        case GGML_TYPE_NVFP4: return QK_NVFP4;
        case GGML_TYPE_IQ4_NL: return QK4_NL;
        case GGML_TYPE_Q2_K: case GGML_TYPE_Q3_K: case GGML_TYPE_Q4_K: case GGML_TYPE_Q5_K:
        case GGML_TYPE_Q6_K: case GGML_TYPE_Q8_K: case GGML_TYPE_IQ2_XXS: case GGML_TYPE_IQ2_XS:
        case GGML_TYPE_IQ2_S: case GGML_TYPE_IQ3_XXS: case GGML_TYPE_IQ3_S: case GGML_TYPE_IQ1_S:
        case GGML_TYPE_IQ1_M: case GGML_TYPE_IQ4_XS: case GGML_TYPE_TQ1_0: case GGML_TYPE_TQ2_0:
            return QK_K;
        default: return 1;
    }
}

size_t ggml_type_size(enum ggml_type type) {
    switch (type) {
        case GGML_TYPE_F32: return sizeof(float);
        case GGML_TYPE_F16: return sizeof(ggml_half);
        case GGML_TYPE_BF16: return sizeof(uint16_t);
        case GGML_TYPE_Q4_0: return sizeof(block_q4_0);
        case GGML_TYPE_Q4_1: return sizeof(block_q4_1);
        case GGML_TYPE_Q5_0: return sizeof(block_q5_0);
        case GGML_TYPE_Q5_1: return sizeof(block_q5_1);
        case GGML_TYPE_Q8_0: return sizeof(block_q8_0);
        case GGML_TYPE_Q8_1: return sizeof(block_q8_1);
        case GGML_TYPE_Q1_0: return sizeof(block_q1_0);
        case GGML_TYPE_Q2_0: return sizeof(block_q2_0);
        case GGML_TYPE_MXFP4: return sizeof(block_mxfp4);
        case GGML_TYPE_NVFP4: return sizeof(block_nvfp4);
        case GGML_TYPE_Q2_K: return sizeof(block_q2_K);
        case GGML_TYPE_Q3_K: return sizeof(block_q3_K);
        case GGML_TYPE_Q4_K: return sizeof(block_q4_K);
        case GGML_TYPE_Q5_K: return sizeof(block_q5_K);
        case GGML_TYPE_Q6_K: return sizeof(block_q6_K);
        case GGML_TYPE_Q8_K: return sizeof(block_q8_K);
        case GGML_TYPE_IQ2_XXS: return sizeof(block_iq2_xxs);
        case GGML_TYPE_IQ2_XS: return sizeof(block_iq2_xs);
        case GGML_TYPE_IQ2_S: return sizeof(block_iq2_s);
        case GGML_TYPE_IQ3_XXS: return sizeof(block_iq3_xxs);
        case GGML_TYPE_IQ3_S: return sizeof(block_iq3_s);
        case GGML_TYPE_IQ1_S: return sizeof(block_iq1_s);
        case GGML_TYPE_IQ1_M: return sizeof(block_iq1_m);
        case GGML_TYPE_IQ4_NL: return sizeof(block_iq4_nl);
        case GGML_TYPE_IQ4_XS: return sizeof(block_iq4_xs);
        case GGML_TYPE_TQ1_0: return sizeof(block_tq1_0);
        case GGML_TYPE_TQ2_0: return sizeof(block_tq2_0);
        default: ggml_abort(__FILE__, __LINE__, "ggml-stubs.c: no type_size for type %d", (int) type);
    }
    return 0;
}

// ggml/src/ggml.c ggml_row_size: type_size*ne/blck_size
size_t ggml_row_size(enum ggml_type type, int64_t ne) {
    return ggml_type_size(type) * ne / blck_size(type);
}

// ggml/src/ggml.c ggml_type_name reads type_traits[type].type_name; only error messages use it here
const char * ggml_type_name(enum ggml_type type) {
    static char name[32];
    snprintf(name, sizeof(name), "ggml type %d", (int) type);
    return name;
}

// ggml/src/ggml-cpu/ggml-cpu.c: the CPU backend's tables, filled by ggml_cpu_init as below. quants.c
// reads ggml_table_f32_f16 where the build has no F16C (the no-FMA library), and the E8M0/UE4M3
// tables (MXFP4/NVFP4 only) where it has AVX.
float ggml_table_f32_f16[1 << 16];
float ggml_table_f32_e8m0_half[1 << 8];
float ggml_table_f32_ue4m3[1 << 8];

__attribute__((constructor)) static void qconform_ggml_stub_init(void) {
    for (int i = 0; i < (1 << 16); ++i) {
        union {
            uint16_t u16;
            ggml_fp16_t fp16;
        } u = {(uint16_t) i};
        ggml_table_f32_f16[i] = GGML_COMPUTE_FP16_TO_FP32(u.fp16);
    }
    for (int i = 0; i < (1 << 8); ++i) {
        ggml_table_f32_e8m0_half[i] = GGML_E8M0_TO_FP32_HALF(i);
        ggml_table_f32_ue4m3[i] = ggml_ue4m3_to_fp32((uint8_t) i);
    }
}
