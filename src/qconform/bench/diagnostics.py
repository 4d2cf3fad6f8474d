"""The bench's diagnostic builds of the MatMulNBits matrix-unit kernel (wrong results, timing only):
patches of the shipped ``ort/nbits_mma.hip`` (qconform.device.patch), loaded in its place through
``qconform.device.ort.source_override`` by ``qconform.bench.device.bench_gemv``. No CuPy here: the
offline compile gate builds them too (``tests/device_catalogue.py --write-sources``)."""

from __future__ import annotations

from qconform.device.patch import Patch
from qconform.device.registry import KERNEL_DIR

MMA_SOURCE = KERNEL_DIR / "ort" / "nbits_mma.hip"

# the loads and a trivial use of them, no arithmetic: the loaded operands feed one accumulator per
# row tile, and the chunk's arithmetic is compiled out
LOADS_ONLY = Patch(
    MMA_SOURCE,
    (
        (
            "                    const qk_u32 ones[4] = {0x3C003C00u, 0x3C003C00u, 0x3C003C00u, 0x3C003C00u};\n",
            "#pragma unroll\n"
            "                    for (int r = 0; r < R; ++r)\n"
            "                        acc[r * T * 4] += (float)(wc[r][0][0] ^ wc[r][1][WPR - 1] ^ szc[r][0] ^"
            " szc[r][1] ^\n"
            "                                                  bf[0][0][0]);\n"
            "                    (void)zconst;\n"
            "#if 0 /* the chunk's arithmetic */\n"
            "                    const qk_u32 ones[4] = {0x3C003C00u, 0x3C003C00u, 0x3C003C00u, 0x3C003C00u};\n",
        ),
        (
            "                                x = fmaf(cc[i >> 1], asum[tg][i & 1], x);\n"
            "                            }\n"
            "                    }\n",
            "                                x = fmaf(cc[i >> 1], asum[tg][i & 1], x);\n"
            "                            }\n"
            "                    }\n"
            "#endif\n",
        ),
    ),
)

# the arithmetic on made-up weights, scale 1: no global loads of weights, scales or zero points
NO_LOADS = Patch(
    MMA_SOURCE,
    (
        (
            "            qk_load_words<BITS>(w[r][h], wrow[r][h], c, t);\n"
            "            sz[r][h] = qk_load_sz(scales, zp, rows[r][h], kb, k_blocks, BITS, zp_bytes, zp_kind);\n",
            "            for (int i = 0; i < BITS / 2; ++i)"
            " w[r][h][i] = (qk_u32)(c * 0x9E3779B9u) ^ (qk_u32)(rows[r][h] + i);\n"
            "            sz[r][h] = 0x3C00u;\n"
            "            (void)kb;\n",
        ),
    ),
)

# (name, what the bench prints, the patch); built with -DQK_MMA_DEFAULT_ONLY (the launcher's shapes)
DIAGNOSTICS: tuple[tuple[str, str, Patch], ...] = (
    ("loads_only", "loads only, no arithmetic", LOADS_ONLY),
    ("no_loads", "no weight loads", NO_LOADS),
)
