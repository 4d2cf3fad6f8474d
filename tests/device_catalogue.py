"""The device mutants and the control kernels beside them, one row each: what is loaded, which
op it runs, and the property that must catch it (None: a control that must pass). Used by
tests/test_device.py and by ci/device.sh (``python3 tests/device_catalogue.py`` prints the
caught/missed table).

A mutant is a test source in tests/device_mutants, or a shipped kernel with ``edits``: a text patch
(each exact original snippet occurring once in the shipped source, and its broken replacement,
qconform.device.patch) written at test time as a complete file into a temporary folder; the
shipped kernels carry no mutant hooks. ``python3 tests/device_catalogue.py --write-sources DIR``
writes every patched source (and the bench's diagnostic builds) for the offline compile gate
(ci/compile-kernels.sh)."""

from __future__ import annotations

import contextlib
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Iterator

from qconform.errors import CompileError

if TYPE_CHECKING:
    from qconform.device.patch import Patch

HERE = Path(__file__).parent
MUTANT_DIR = HERE / "device_mutants"
REPO = HERE.parent
Q8_QUANT = "src/qconform/device/kernels/ggml/q8_quant.hip"
DEQUANT = "src/qconform/device/kernels/ggml/dequant.hip"
Edits = tuple[tuple[str, str], ...]  # (exact original snippet, its replacement), in order
OWN_FAMILIES = ("ort", "ggml", "bnb")  # kernels/<family>/: the function launchers' sources


@dataclass(frozen=True)
class DeviceMutant:
    name: str
    source: str  # file in tests/device_mutants, a repo path, or "ort/nbits_mma.hip" (a function launcher's)
    symbol: str
    options: str  # the hip: geometry suffix; -D build options of an ORT kernel; "" for so: launchers
    op: str
    caught_by: str | None  # the property that must fail; None for a control that must pass
    warning: bool = False  # a control whose pending-error outcome must carry a warning
    leaf: str | None = None  # None: the op's first leaf
    coverage: int = 1
    edits: Edits = ()  # a patch of ``source`` (a shipped kernel): the mutant is the patched copy
    contract: str = ""  # the implementation's numeric contract (--contract), e.g. variant=cuda
    # other shipped kernels of the same call patched with the row, (kernels/ name, edits): e.g. the
    # kernel launched before ``source``'s, delayed so that a missing wait shows
    beside: tuple[tuple[str, Edits], ...] = ()

    @property
    def is_so(self) -> bool:
        return self.source.endswith(".cu")

    @property
    def is_own(self) -> bool:
        """A kernel of qconform's function launchers (``"ort/nbits_mma.hip"``, ``"ggml/..."``: --impl
        cupy) compiled with ``options`` (-D build options), ``source`` loaded from its patched copy
        when the row has ``edits``."""
        return self.source.split("/")[0] in OWN_FAMILIES

    @property
    def slug(self) -> str:
        return re.sub(r"[^a-z0-9]+", "-", self.name.lower()).strip("-")

    def path(self) -> Path:
        """The source file (for a patched mutant, the shipped kernel it patches: the one the
        imported qconform runs, in a source checkout or an installed wheel alike)."""
        from qconform.device.registry import KERNEL_DIR

        if self.is_own:
            return KERNEL_DIR / self.source
        if self.source.startswith(Q8_QUANT.rsplit("ggml/", 1)[0]):
            return KERNEL_DIR / self.source.removeprefix(Q8_QUANT.rsplit("ggml/", 1)[0])
        return (REPO / self.source) if "/" in self.source else MUTANT_DIR / self.source

    def patch(self) -> Patch | None:
        from qconform.device.patch import Patch

        return Patch(self.path(), self.edits) if self.edits else None

    def beside_patches(self) -> list[tuple[str, Patch]]:
        """(kernels/ name, patch) of each other source the row patches (``beside``)."""
        from qconform.device.patch import Patch
        from qconform.device.registry import KERNEL_DIR

        return [(name, Patch(KERNEL_DIR / name, edits)) for name, edits in self.beside]

    @contextlib.contextmanager
    def loaded_source(self) -> Iterator[Path]:
        """The file the suite loads for this row inside the block: the patched copy (in a
        temporary folder) or ``path()`` itself."""
        patch = self.patch()
        if patch is None:
            yield self.path()
            return
        with patch.materialised() as path:
            yield path


# ggml's nearest_int (half to even) replaced by roundf (half away from zero); NaN gives 0
Q8K_TIES_AWAY: Edits = (
    ("int q = qk_nearest_int_x86(p, x);", "int q = fabsf(p) < 1073741824.0f ? (int)roundf(p) : 0;"),
)
# the cooperative amax reduction breaks equal-|x| ties toward the higher index, so the sign of d
# flips when the largest |x| occurs with both signs in different lanes
Q8K_COOP_TIES_HIGH: Edits = (("(oa == amax && oi < idx)", "(oa == amax && oi > idx)"),)
# Q4_K: sub-blocks 4..7 take the low 4 bits of their scale from the min's nibble of s[j+8]
# (get_scale_min_k4's j >= 4 branch reading the wrong half)
Q4K_SCALE_WRONG_HALF: Edits = (("r.sc_hi = (c & 0xF) | ((a >> 6) << 4);", "r.sc_hi = (c >> 4) | ((a >> 6) << 4);"),)
# Q4_0: values 0..15 from the high nibbles and 16..31 from the low ones
Q40_NIBBLES_SWAPPED: Edits = (
    (
        "y[l] = qk_q4_0_four(d, q);\n    y[l + 4] = qk_q4_0_four(d, q >> 4);",
        "y[l] = qk_q4_0_four(d, q >> 4);\n    y[l + 4] = qk_q4_0_four(d, q);",
    ),
)
# Q6_K: the 6-bit code offset by 31 instead of 32
Q6K_OFFSET_31: Edits = (("& 0x3Fu) - 32)", "& 0x3Fu) - 31)"),)
# Q6_K: the two high bits of value k taken from qh bits 2k+1, 2k+2 (one bit too high)
Q6K_QH_SHIFT: Edits = (("(((qh >> (2 * k)) & 0x03030303u) << 4)", "(((qh >> (2 * k + 1)) & 0x03030303u) << 4)"),)


HIP_MUTANTS = (
    DeviceMutant(
        "ties away from zero",
        Q8_QUANT,
        "qk_q8_k_quant_coop",
        ":lanes=8",
        "q8_k_quant",
        "matches_oracle",
        edits=Q8K_TIES_AWAY,
    ),
    DeviceMutant(
        "coop ties to the higher index",
        Q8_QUANT,
        "qk_q8_k_quant_coop",
        ":lanes=8",
        "q8_k_quant",
        "matches_oracle",
        edits=Q8K_COOP_TIES_HIGH,
    ),
    DeviceMutant(
        "coop amax race (no barrier)",
        "q8_k_smem_amax.hip",
        "mutant_q8k_smem_amax_race",
        ":lanes=8",
        "q8_k_quant",
        "matches_oracle",
    ),
    DeviceMutant(
        "last partial grid block skipped",
        "q8_k_skip_last_block.hip",
        "mutant_q8_k_skip_last",
        ":lanes=8",
        "q8_k_quant",
        "writes_every_output",
    ),
    DeviceMutant(
        "w32 ties to the higher index",
        Q8_QUANT,
        "qk_q8_k_quant_w32",
        ":lanes=32:threads=64",
        "q8_k_quant",
        "matches_oracle",
        edits=Q8K_COOP_TIES_HIGH,
    ),
    DeviceMutant(
        "w32 lane-major loads (lane l reads float4 2l, 2l + 1)",
        Q8_QUANT,
        "qk_q8_k_quant_w32",
        ":lanes=32:threads=64",
        "q8_k_quant",
        "matches_oracle",
        edits=(("v[k] = src[LANES * k + l];", "v[k] = src[NV * l + k];"),),
    ),
    DeviceMutant(
        "control: smem amax with barrier", "q8_k_smem_amax.hip", "q8k_smem_amax", ":lanes=8", "q8_k_quant", None
    ),
    DeviceMutant(
        "control: coop kernel, 64-thread CTAs",
        Q8_QUANT,
        "qk_q8_k_quant_coop",
        ":lanes=8:threads=64",
        "q8_k_quant",
        None,
    ),
    *(
        DeviceMutant(
            name, DEQUANT, f"qk_{t}_dequant", f":lanes={lanes}", f"{t}_dequant", "matches_oracle", leaf=leaf, edits=e
        )
        for name, t, lanes, leaf, e in (
            (
                "Q4_K dequant: scale of sub-blocks 4..7 from the min's nibble",
                "q4_k",
                32,
                "Xq4_K_Yfp32",
                Q4K_SCALE_WRONG_HALF,
            ),
            ("Q4_0 dequant: nibbles swapped", "q4_0", 4, "Xq4_0_Yfp32", Q40_NIBBLES_SWAPPED),
            ("Q6_K dequant: offset 31", "q6_k", 32, "Xq6_K_Yfp32", Q6K_OFFSET_31),
            ("Q6_K dequant: high bits one qh bit too high", "q6_k", 32, "Xq6_K_Yfp32", Q6K_QH_SHIFT),
        )
    ),
    DeviceMutant(
        "control: Q4_K dequant kernel as a hip: kernel",
        DEQUANT,
        "qk_q4_k_dequant",
        ":lanes=32:threads=256",
        "q4_k_dequant",
        None,
        leaf="Xq4_K_Yfp32",
    ),
)
SO_MUTANTS = (
    DeviceMutant(
        "so: returns cudaGetLastError()",
        "so_returns_last_error.cu",
        "qk_q8_k_quantize",
        "",
        "q8_k_quant",
        "survives_pending_error",
    ),
    DeviceMutant(
        "so: reports a failed launch as 0",
        "so_ignores_status.cu",
        "qk_q8_k_quantize",
        "",
        "q8_k_quant",
        "survives_pending_error",
    ),
    DeviceMutant(
        "so: clears the error on entry (by design)",
        "so_clears_on_entry.cu",
        "qk_q8_k_quantize",
        "",
        "q8_k_quant",
        None,
        warning=True,
    ),
    DeviceMutant(
        "so: worked example (examples/so_launcher)",
        "examples/so_launcher/q8_k_launcher.cu",
        "qk_q8_k_quantize",
        "",
        "q8_k_quant",
        None,
    ),
)


def _mma(
    name: str, caught_by: str | None, edits: Edits = (), define: str = "", leaf: str = "Xfp16_Wu2_Yfp16"
) -> DeviceMutant:
    # the launcher's shapes only (a faster build); qk_nbits_gemm at every M (no wgmma: its rows' edits
    # need the GEMM on the catalogue's M 130 and 136 cases)
    options = f"{define} -DQK_MMA_DEFAULT_ONLY -DQK_NBITS_NO_WGMMA".strip()
    return DeviceMutant(
        name, "ort/nbits_mma.hip", "", options, "matmul_nbits", caught_by, leaf=leaf, coverage=2, edits=edits
    )


# the last chunk reads the previous block's scale and zero point
MMA_LAST_SCALE: Edits = (
    (
        "int qk_chunk_block(int c, int cpb_shift, int n_chunks) {\n",
        "int qk_chunk_block(int c, int cpb_shift, int n_chunks) {\n"
        "    if (c == n_chunks - 1 && (c >> cpb_shift) > 0) return (c >> cpb_shift) - 1;\n",
    ),
)
# the activation pair of register P in the other order than the weights'
MMA_SLOT_SWAP: Edits = (
    (
        "bf[tg][m][0] = qk_act_pair(act[tg], p[0], p[1]);",
        "bf[tg][m][0] = qk_act_pair(act[tg], p[1], p[0]);",
    ),
)
# the last K split's partial sums never added
MMA_DROP_LAST_WARP: Edits = (
    (
        "for (int k = 1; k < wk_n; ++k) v += red[",
        "for (int k = 1; k < wk_n - 1; ++k) v += red[",
    ),
)

# the ring decode kernel (qk_nbits_mmaa, default zero point, M <= 8): the last chunk of each
# superchunk scaled by the previous chunk's scale (rows g of each tile)
RING_SCALE: Edits = (
    (
        "const qk_u32 w0 = QK_SHFL(sc16[r][0], cc, 4)",
        "const qk_u32 w0 = QK_SHFL(sc16[r][0], cc == SC - 1 ? cc - 1 : cc, 4)",
    ),
)
# the activation pair of register P in the other order than the weights' (paired when staged and
# when read from A)
RING_SLOT_SWAP: Edits = (
    ("o[2 * m] = qk_act_pair(h, pp[0], pp[1]);", "o[2 * m] = qk_act_pair(h, pp[1], pp[0]);"),
    ("act[2 * m] : qk_act_pair(act, pp[0], pp[1]);", "act[2 * m] : qk_act_pair(act, pp[1], pp[0]);"),
)
# the quad's transposed words read from the ring without the XOR swizzle the copies were written with
RING_TRANSPOSE: Edits = (
    (
        "return stage[(r * 2 + h) * 128 + (tr ^ (4 * c))];",
        "return stage[(r * 2 + h) * 128 + 16 * (lane >> 2) + 4 * c + (lane & 3)];",
    ),
    (  # the same slip in the ldmatrix read CUDA builds take (sm_75+): rows at slot 4 g + c, unswizzled
        "4 * qk_ring_slot(lane & 7, lane >> 3));",
        "4 * (4 * (lane & 7) + (lane >> 3)));",
    ),
)
# the last K split's partial sums never added
RING_DROP_LAST_WARP: Edits = (
    ("for (int k = 1; k < wk_n; ++k) v += qk_red[", "for (int k = 1; k < wk_n - 1; ++k) v += qk_red["),
)

# the unchecked chunks (every superchunk but a row's last) read every token's activations from
# token 0's row
RING_FULL_TOKEN: Edits = (("const int tok_row = min(g, n_tok - 1);", "const int tok_row = 0;"),)
# the last CTA reads its rows shifted down to end at N but stores them at the unshifted rows
RING_SHIFT_STORE: Edits = (
    ("const int n = rbase + 16 * r + 8 * (i >> 1) + g;", "const int n = row0 + 16 * r + 8 * (i >> 1) + g;"),
    ("if (n < row0 || tok >= M) continue;", "if (n >= N || tok >= M) continue;"),
)
# u4's batched staging (qk_stage_act_paired, NB > 1): each batch's units all stored at its first unit's place
RING_STAGE_BATCH: Edits = (
    (
        "if (i < all) qk_store_act_paired<BITS>(sA + 16 * i, h[b]);",
        "if (i < all) qk_store_act_paired<BITS>(sA + 16 * i0, h[b]);",
    ),
)

# the prefill GEMM (qk_nbits_gemm, default or packed zero points, M >= 16): the last K chunk never computed;
# each row's scale taken from the half of its scale word that block 0 uses (wrong where k_blocks is
# odd: every other block of every other row); the last token row never stored; every token tile
# reading the first tile's activations; packed zero points read at the field of the first block of
# their word, not their own block's
GEMM_LAST_CHUNK: Edits = (
    (
        "for (int c = 0; c < n_chunks; ++c) {\n        qk_cp_async_wait<S - 2>();",
        "for (int c = 0; c < n_chunks - 1; ++c) {\n        qk_cp_async_wait<S - 2>();",
    ),
)
GEMM_SCALE_HALF: Edits = (("(sS[lr] >> (16 * ((rowbits[r][h] ^ kb) & 1)))", "(sS[lr] >> (16 * (rowbits[r][h] & 1)))"),)
GEMM_ZP_BLOCK: Edits = (("(((rowbits[r][h] & 0x18) + kb * BITS) & 31)", "((rowbits[r][h] & 0x18) & 31)"),)
GEMM_LAST_TOKEN: Edits = (("if (tok >= M || n >= N) continue;", "if (tok >= M - 1 || n >= N) continue;"),)
GEMM_TOKEN_TILE: Edits = (("const int r0 = tok0 + (tid >> 3);", "const int r0 = tid >> 3;"),)

# the wgmma prefill GEMM (qk_nbits_wgmma, default or packed zero points, M >= WGMMA_MIN_M on sm_90):
# the converted weights stored without the 128-byte swizzle ((w_row & 7) >> 3 is 0: wgmma then reads
# another row's K pieces); chunk c - 1's sums scaled by chunk c's scales (wrong across a block
# boundary); the pending sums of the last whole group of 4 chunks never added
WGMMA_UNSWIZZLED: Edits = (
    (
        "b_off[i] = w_row * 128 + (((4 * w_half + i) ^ (w_row & 7)) << 4);",
        "b_off[i] = w_row * 128 + (((4 * w_half + i) ^ ((w_row & 7) >> 3)) << 4);",
    ),
)
WGMMA_NEXT_SCALE: Edits = (("if (u > 0) scale_add(dp, c0 + u - 1);", "if (u > 0) scale_add(dp, c0 + u);"),)
WGMMA_GROUP_TAIL: Edits = (("        scale_add(d1, c0 + 3);\n", ""),)
# packed zero points read at the field of the word's first block, not their own block's
WGMMA_ZP_BLOCK: Edits = (
    ("(word >> ((z_bit + (c >> cpb_shift) * BITS) & 31))", "(word >> ((z_bit + 0 * (c >> cpb_shift) * BITS) & 31))"),
)


# its storage=fp16 form (qk_nbits_wgmma_fold, M >= WGMMA_FOLD_MIN_M under that contract: the catalogue's
# M 264 and 272 cases): both fragment rows scaled by the first row's scale; u4 words 2 s and 2 s + 1
# in each other's K slots; packed zero points of the word's first block; the last of the chunks left over
# after the last whole iteration of 3 never computed (17 and 10 chunks: 2 and 1 left over; skipping the
# last step, not an earlier one, keeps the stage counters of the steps after it and so cannot hang)
FOLD_ROW_SCALE: Edits = (
    (
        "const qk_u32 sw = *(const qk_u32*)(gbase + sc_off + st * L::ROWS * 4 + 32 * h);",
        "const qk_u32 sw = *(const qk_u32*)(gbase + sc_off + st * L::ROWS * 4 + 0 * h);",
    ),
)
FOLD_K_SLOTS: Edits = (("f[4 * (j >> 1) + 2 * (j & 1) + h]", "f[4 * (j >> 1) + 2 * (1 - (j & 1)) + h]"),)
FOLD_ZP_BLOCK: Edits = (("const int bit = zbit[h] + blk * BITS;", "const int bit = zbit[h] + 0 * blk * BITS;"),)
FOLD_LEFT_OVER: Edits = (
    (
        "        if (c + u < n_chunks) step(c + u, st, ph, fr[u], fr[(u + 1) % (D + 1)]);",
        "        if (c + u < n_chunks - 1) step(c + u, st, ph, fr[u], fr[(u + 1) % (D + 1)]);",
    ),
)

# the tail split (the catalogue's few tiles each split over K parts, qk_nbits_wgmma_fold_split): the CTA that
# sums a split tile leaves its last part out
FOLD_LAST_PART: Edits = (("    for (int k = 0; k < n_parts; ++k) {", "    for (int k = 0; k < n_parts - 1; ++k) {"),)


def _wgmma(name: str, edits: Edits, leaf: str = "Xfp16_Wu2_Yfp16", contract: str = "") -> DeviceMutant:
    return DeviceMutant(
        name,
        "ort/nbits_wgmma.hip",
        "",
        "",
        "matmul_nbits",
        "matches_oracle",
        leaf=leaf,
        coverage=2,
        edits=edits,
        contract=contract,
    )


F32_U4 = "Xfp32_Wu4_Yfp32"
# the fp32-activation ring kernel (qk_nbits_mmaf, activations split into fp16 hi + lo): the lo
# parts never added; lo scaled back by 2^-e (the 2^12 of the split forgotten); every token group
# reading group 0's rows
RING_F32_NO_LO: Edits = (
    ("v = fmaf(acc[r * 4 + i + 1], inv[2 * tok + 1], QK_FMUL(v, inv[2 * tok]));", "v = QK_FMUL(v, inv[2 * tok]);"),
)
RING_F32_LO_SCALE: Edits = (
    ("inv[2 * m + 1] = qk_float((qk_u32)(127 - e - 12) << 23);", "inv[2 * m + 1] = qk_float((qk_u32)(127 - e) << 23);"),
)
RING_F32_GROUP: Edits = (("if (F32) A += (qk_i64)grp * 8 * Kp;", "if (F32) A += 0;"),)
# the split never flags a token: the ring kernel takes every group, also a row whose small
# activations fp16 hi + lo cannot carry (the spike case: 1e30 on weights q = z beside normal ones)
RING_F32_NO_FLAG: Edits = (("flags[m] = fabsf(qk_ftz(QK_FMUL(amin, scale))) < QK_SPLIT_FLOOR;", "flags[m] = 0;"),)
# every token's sums scaled back by the exponent of its group's first token (the outlier case of
# rows 3 or 4 powers of two apart)
RING_F32_FIRST_E: Edits = (
    (
        "v = fmaf(acc[r * 4 + i + 1], inv[2 * tok + 1], QK_FMUL(v, inv[2 * tok]));",
        "v = fmaf(acc[r * 4 + i + 1], inv[8 * grp + 1], QK_FMUL(v, inv[8 * grp]));",
    ),
)
# each CTA of the split takes the exponent of its own K slice's maximum, not the row's (the outlier
# case: the row's maximum in the last slice)
RING_F32_SLICE_MAX: Edits = (
    (
        "#pragma unroll 4\n    for (int k = 4 * tid; k < K; k += 4 * nt) {",
        "const int sl = 4 * ((Kp / 4 + (int)gridDim.x - 1) / (int)gridDim.x);\n"
        "#pragma unroll 4\n"
        "    for (int k = (int)blockIdx.x * sl + 4 * tid; k < min(K, ((int)blockIdx.x + 1) * sl); k += 4 * nt) {",
    ),
)
# the ring kernel, launched as a programmatic dependent of the split, reads the split's rows and flags
# without waiting for it. The split as shipped does not trigger (the ring kernel starts as its CTAs
# exit), so both rows make it trigger first and then delay its writes by ~1 ms: without the wait the
# ring kernel reads rows not yet written; with it (the control) the answers are right. Measured on the
# H200 (session 28, the trigger then shipped first): caught by the check of every output written (its
# call's split buffer comes from the pool holding that check's poison, so the sums come out
# unwritten-looking), while the matches-oracle calls, same inputs as the call before, read the previous
# call's rows, which are right
SPLIT_DELAYED: Edits = (
    (
        "    __shared__ float red[2][16]; /* per 32-lane group: max |a|, min nonzero |a| */\n",
        "    __shared__ float red[2][16]; /* per 32-lane group: max |a|, min nonzero |a| */\n"
        "    QK_LAUNCH_DEPENDENTS();\n"
        "    for (const long long t0 = clock64(); clock64() - t0 < 2000000;) {\n    }\n",
    ),
)
RING_F32_NO_WAIT: Edits = (*SPLIT_DELAYED, ("        QK_WAIT_PRIOR_GRID();\n", ""))

# the per-output kernel's word path with the zero point applied through sum(a) (a q s - a z s per
# element): a 1e30 activation on weights q = z wipes the lane's sum (the spike case, packed zero points)
GEMV_SUM_A_FORM: Edits = (
    (
        "acc = fmaf(av, qk_weight(b, (int)((v >> (8 * by)) & 0xFFu)), acc);",
        "acc = fmaf(av, QK_FMUL((float)((v >> (8 * by)) & 0xFFu), b.s), acc);\n"
        "                        acc = fmaf(-av, QK_FMUL(b.z, b.s), acc);",
    ),
)

ORT_MUTANTS = (
    _mma("mma GEMV: last chunk reads the previous block's scale", "matches_oracle", edits=MMA_LAST_SCALE),
    _mma("mma GEMV: activation pairs in swapped K slots", "matches_oracle", edits=MMA_SLOT_SWAP),
    _mma("mma GEMV: last K split not added", "matches_oracle", edits=MMA_DROP_LAST_WARP, leaf="Xfp16_Wu4_Yfp16"),
    _mma("ring GEMV: a superchunk's last chunk takes the previous scale", "matches_oracle", edits=RING_SCALE),
    _mma("ring GEMV: activation pairs in swapped K slots", "matches_oracle", edits=RING_SLOT_SWAP),
    _mma("ring GEMV: the quad transpose reads unswizzled slots", "matches_oracle", edits=RING_TRANSPOSE),
    _mma("ring GEMV: last K split not added", "matches_oracle", edits=RING_DROP_LAST_WARP, leaf="Xfp16_Wu4_Yfp16"),
    _mma("ring GEMV: unchecked chunks read token 0's activations", "matches_oracle", edits=RING_FULL_TOKEN),
    _mma("ring GEMV: the last CTA's shifted rows stored unshifted", "matches_oracle", edits=RING_SHIFT_STORE),
    _mma("ring GEMV: staged batch at its first unit", "matches_oracle", edits=RING_STAGE_BATCH, leaf="Xfp16_Wu4_Yfp16"),
    _mma("prefill GEMM: the last K chunk not computed", "matches_oracle", edits=GEMM_LAST_CHUNK),
    _mma("prefill GEMM: scales from block 0's half", "matches_oracle", edits=GEMM_SCALE_HALF, leaf="Xfp16_Wu4_Yfp16"),
    _mma("prefill GEMM: packed zero points of the word's first block", "matches_oracle", edits=GEMM_ZP_BLOCK),
    _mma("prefill GEMM: the last token row not stored", "writes_every_output", edits=GEMM_LAST_TOKEN),
    _mma("prefill GEMM: all token tiles read tile 0", "matches_oracle", edits=GEMM_TOKEN_TILE, leaf="Xfp16_Wu4_Yfp16"),
    _wgmma("wgmma GEMM: converted weights not swizzled", WGMMA_UNSWIZZLED),
    _wgmma("wgmma GEMM: a chunk's sums scaled by the next chunk's scales", WGMMA_NEXT_SCALE, leaf="Xfp16_Wu4_Yfp16"),
    _wgmma("wgmma GEMM: a group's last sums never added", WGMMA_GROUP_TAIL),
    _wgmma("wgmma GEMM: packed zero points of the word's first block", WGMMA_ZP_BLOCK),
    _wgmma("wgmma fold: both rows take the first row's scale", FOLD_ROW_SCALE, contract="storage=fp16"),
    _wgmma("wgmma fold: u4 words in each other's K slots", FOLD_K_SLOTS, "Xfp16_Wu4_Yfp16", "storage=fp16"),
    _wgmma("wgmma fold: packed zero points of the word's first block", FOLD_ZP_BLOCK, contract="storage=fp16"),
    _wgmma("wgmma fold: the last chunk left over never computed", FOLD_LEFT_OVER, "Xfp16_Wu4_Yfp16", "storage=fp16"),
    _wgmma("wgmma fold tail split: a split tile's last part never added", FOLD_LAST_PART, "Xfp16_Wu4_Yfp16",
           "storage=fp16"),
    _mma("ring GEMV fp32 A: the lo parts not added", "matches_oracle", edits=RING_F32_NO_LO, leaf="Xfp32_Wu2_Yfp32"),
    _mma("ring GEMV fp32 A: lo scaled back by 2^-e", "matches_oracle", edits=RING_F32_LO_SCALE, leaf="Xfp32_Wu4_Yfp32"),
    _mma("ring GEMV fp32 A: group 1 reads group 0", "matches_oracle", edits=RING_F32_GROUP, leaf="Xfp32_Wu2_Yfp32"),
    _mma("ring GEMV fp32 A: no token flagged", "matches_oracle", edits=RING_F32_NO_FLAG, leaf="Xfp32_Wu2_Yfp32"),
    _mma("ring GEMV fp32 A: exponent of a K slice", "matches_oracle", edits=RING_F32_SLICE_MAX, leaf="Xfp32_Wu4_Yfp32"),
    _mma("ring GEMV fp32 A: group's first exponent", "matches_oracle", edits=RING_F32_FIRST_E, leaf="Xfp32_Wu2_Yfp32"),
    _mma("ring GEMV fp32 A: delayed split not waited for", "writes_every_output", edits=RING_F32_NO_WAIT, leaf=F32_U4),
    _mma("control: ring GEMV fp32 A waits for a delayed split", None, edits=SPLIT_DELAYED, leaf=F32_U4),
    DeviceMutant(
        "per-output GEMV: zero point through sum(a)",
        "ort/nbits_gemv.hip",
        "",
        "",
        "matmul_nbits",
        "matches_oracle",
        leaf="Xfp32_Wu2_Yfp32",
        coverage=2,
        edits=GEMV_SUM_A_FORM,
    ),
    # the session-3 zero-point arithmetic (build option): s sum(a q) + fp32(-s z) sum(a) per chunk,
    # which cancels on the fp16 spike cases (65504 on weights q = z beside activations ~1e-3)
    _mma("mma GEMV fp16 A: zero point through sum(a)", "matches_oracle", define="-DQK_NBITS_ZP_SUM_V1"),
    _mma("control: portable mma (shuffles), u2", None, define="-DQK_MMA_EMULATE"),
    _mma("control: portable mma (shuffles), GEMV fp32 A u4", None, define="-DQK_MMA_EMULATE", leaf="Xfp32_Wu4_Yfp32"),
    _mma("control: portable mma (shuffles), u4", None, define="-DQK_MMA_EMULATE", leaf="Xfp16_Wu4_Yfp16"),
)

# ort/qmoe.hip (qmoe_decode, qmoe_ragged_mm; --impl cupy). Coverage 1 has a ties case (an unselected
# logit equal to the k-th largest), SwiGLU with gpt-oss's alpha / beta / limit 7 and with a limit of
# 0.5 inside unit-size activations, router_weights renormalized and plain softmax routing.
# a tuner that samples the product's form on the first 100 calls of the process (fc2 counts the
# calls): one call in three multiplies and adds unfused, so the bits change call to call
QMOE_TUNER_SAMPLES: Edits = (
    ("#define QK_MOE_SKIP 1e-8f", "__device__ unsigned int qk_moe_calls = 0u;\n#define QK_MOE_SKIP 1e-8f"),
    (
        "    const qk_i64 t = blockIdx.y;\n    const int n0 = (int)blockIdx.x * tile;\n",
        "    const qk_i64 t = blockIdx.y;\n    const int n0 = (int)blockIdx.x * tile;\n"
        "    if (blockIdx.x == 0 && t == 0 && threadIdx.x == 0) qk_moe_calls += 1u;\n",
    ),
    (
        "        acc = fmaf(xv[i], w, acc);\n    }\n    return acc;",
        "        acc = qk_moe_calls <= 100u && qk_moe_calls % 3u == 1u ? QK_FADD(acc, QK_FMUL(xv[i], w))\n"
        "                                                            : fmaf(xv[i], w, acc);\n    }\n    return acc;",
    ),
)
# equal logits ranked toward the lower expert index (ORT's CUDA rule; its CPU takes the higher)
QMOE_TIES_LOWER: Edits = (("return v > bv || (v == bv && e > be);", "return v > bv || (v == bv && e < be);"),)
# normalize_routing_weights=0 honoured: the full softmax's probabilities of the selected experts
QMOE_NORMALIZE_HONOURED: Edits = (
    (
        "            float sum = 0.0f;\n"
        "            for (int j = 0; j < k; ++j) sum = qk_ftz(QK_FADD(sum, s_w[j]));",
        "            float sum = 0.0f;\n"
        "            if (!has_rw && !normalize) {\n"
        "                const float top = s_logit[s_sel[0]];\n"
        "                for (int e = 0; e < E; ++e)\n"
        "                    sum = qk_ftz(QK_FADD(sum, qk_ftz(expf(qk_ftz(QK_FADD(s_logit[e], -top))))));\n"
        "            } else {\n"
        "                for (int j = 0; j < k; ++j) sum = qk_ftz(QK_FADD(sum, s_w[j]));\n"
        "            }",
    ),
)
# SwiGLU's gate and linear halves read as fc1's first and second half (ORT interleaves them)
QMOE_SWIGLU_CONCATENATED: Edits = (
    ("rows[r] = glu ? 2 * unit + half : unit;", "rows[r] = glu ? unit + half * units : unit;"),
)
# activation_beta dropped: g sigmoid(alpha g) l
QMOE_MISSING_BETA: Edits = (("qk_ftz(QK_FMUL(swish, qk_ftz(QK_FADD(l, beta))))", "qk_ftz(QK_FMUL(swish, l))"),)
# swiglu_limit clamps the linear half only (ORT also caps the gate)
QMOE_LIMIT_LINEAR_ONLY: Edits = (("    g = limit < g ? limit : g;", "    /* the gate left uncapped */"),)

# the dp4a product (block-wise 8-bit, accuracy_level 4) without the zero point's correction: codes
# times q - 2^(bits-1) where ORT takes q - z
QMOE_INT8_NO_ZP: Edits = (
    (
        "            const int d = dot[r] + (mid - z) * xsum; /* the exact integer dot with q - z */\n",
        "            const int d = dot[r];\n            (void)z;\n",
    ),
)
# the routing butterfly keeps a lane's own pick whenever it has one: each pick is lane 0's best (the
# scanning routing: coverage 2's router of 256 experts)
QMOE_ROUTE_NO_COMPARE: Edits = (
    ("if (oe >= 0 && (be < 0 || qk_moe_above(ov, oe, bv, be))) {", "if (oe >= 0 && be < 0) {"),
)
# the ranking routing counts equal logits as above either way: tied experts share a rank, a rank is
# left unset (the ties cases)
QMOE_RANK_TIES: Edits = (
    (
        "for (int o = part; o < E; o += tpe) rank += qk_moe_above(s_logit[o], o, v, e);",
        "for (int o = part; o < E; o += tpe) rank += o != e && s_logit[o] >= v;",
    ),
)
# the ranking routing takes one thread's share of the count (the tpe threads' counts not added)
QMOE_RANK_PARTIAL: Edits = (
    ("for (int off = 1; off < tpe; off *= 2) rank += ", "for (int off = 1; off < 1; off *= 2) rank += "),
)
# the 16-byte load's words taken in the wrong order (the second and third swapped)
QMOE_VEC_WORDS_SWAPPED: Edits = (
    ("        out[1] = q.y;\n        out[2] = q.z;\n", "        out[1] = q.z;\n        out[2] = q.y;\n"),
)
# fc1's output stored in row order while fc2 reads it chunk-transposed (coverage 2: fc2 rows of up to
# 112 chunks; coverage 1's are one chunk, where both orders agree)
QMOE_A_ROW_ORDER: Edits = (("A[p * units + (at ? qk_moe_apos(u, at, units) : u)]", "A[p * units + u]"),)
# the staged input read without the swizzle it was stored with (coverage 2: hidden sizes >= 64; at 32
# the 8 units are one group, which the swizzle leaves in place)
QMOE_STAGED_UNSWIZZLED: Edits = (("xs[qk_moe_swz(vi >> 2)]", "xs[vi >> 2]"),)

# qk_moe_fc1m (fc1 of an fp16 input on the matrix units): the second segment of each lane's step put in
# the first's accumulator column, so it is scaled with the scale of a segment 128 values before it
# (coverage 2: hidden sizes above 128 values; coverage 1's fc1 rows are one step's first half)
QMOE_M_COLUMN: Edits = (("const bool mine = g == t + 4 * h;", "const bool mine = g == t;"),)
# the staged input left in value order: B pairs (x0 x1) against the weights' (v0 v4)
QMOE_M_XPAIRS: Edits = (
    (
        "    return make_uint4(QK_BYTE_PERM(q.x, q.z, 0x5410u),",
        "    return q;\n    return make_uint4(QK_BYTE_PERM(q.x, q.z, 0x5410u),",
    ),
)
# row g + 8 converted with row g's zero point (coverage 1 has packed zero points per block and per row)
QMOE_M_ZERO_ROW: Edits = (
    (
        "if (ZP) z = qk_moe_zero_of(f, e, R.rr[r], R.row[r], seg < nseg ? seg : 0, bsh);",
        "if (ZP) z = qk_moe_zero_of(f, e, R.rr[0], R.row[0], seg < nseg ? seg : 0, bsh);",
    ),
)

# qk_moe_fc2m (fc2 of an fp16 layer on the matrix units, fc1's fp32 output as three bf16 parts): the input
# carried by its first bf16 part alone (8 significant bits, far outside the strict bound)
QMOE_F2_ONE_PART: Edits = (("for (int p = 0; p < 3; ++p) {", "for (int p = 0; p < 1; ++p) {"),)
# every slot's warps reading slot 0's staged rows of fc1's output
QMOE_F2_SLOT0: Edits = (("(const uint2*)(qk_moe_xw + 3 * j * words)", "(const uint2*)qk_moe_xw"),)
# the odd fields of a weight word (values 1 5, 3 7) converted from the even ones
QMOE_F2_FIELD: Edits = (
    ("qk_moe_bf_pair(w0, 2 * half + 1, st.ze[0][h]),", "qk_moe_bf_pair(w0, 2 * half, st.ze[0][h]),"),
)

# the grouped GEMMs (qmoe_ragged_mm under --contract storage=fp16). The scatter's order within an
# expert does not reach the output (each pair's row is its own; fc2 stores by pair, the sum runs in
# selection order), so an unstable scatter is an equivalent mutant: the rows below break what does.
# the expert's last, partial tile of pairs not counted (floor instead of ceil): its pairs never computed
QMOE_G_PARTIAL_TILE: Edits = (
    ("        tl += (counts[i] + QK_MOE_GM - 1) / QK_MOE_GM;", "        tl += counts[i] / QK_MOE_GM;"),
    (
        "            tiles[E] = tl + (mine + QK_MOE_GM - 1) / QK_MOE_GM;",
        "            tiles[E] = tl + mine / QK_MOE_GM;",
    ),
)
# every chunk scaled by its row's first block scale (coverage 2: rows of 2..8 blocks)
QMOE_G_ROW_SCALE: Edits = (("qk_load_f(f.s, srow + sblk, f.s16)", "qk_load_f(f.s, srow + 0 * sblk, f.s16)"),)
# a block's fp32 partial sum not restarted after its fold (only the first chunk's mma from zero): each
# block's scale also multiplies the earlier blocks'
QMOE_G_PART_KEPT: Edits = (("const bool fresh = ci == 0;", "const bool fresh = kk == 0;"),)
# a tile's expert searched with < : an expert's first tile taken as the previous expert's, past its
# pairs (so nothing is computed for it; every read stays in bounds)
QMOE_G_TILE_SEARCH: Edits = (("        if (tiles[mid] <= i) lo = mid;", "        if (tiles[mid] < i) lo = mid;"),)
# the weight codes enter as q (the zero point not subtracted: q - 0)
QMOE_G_NO_ZP: Edits = (
    ("0xE400u | (in ? (qk_u32)z : 0u);", "0xE400u | (in ? 0u * (qk_u32)z : 0u);"),
)
# SwiGLU's gate and linear rows swapped in fc1's epilogue
QMOE_G_GLU_SWAPPED: Edits = (
    (
        "A[(qk_i64)m * Ap + c / 2] = qk_fp16_bits(qk_moe_act(act, h0, l, alpha, beta, limit));",
        "A[(qk_i64)m * Ap + c / 2] = qk_fp16_bits(qk_moe_act(act, l, h0, alpha, beta, limit));",
    ),
)

# the matrix-unit kernels' biases read ahead (session 52): fc1m's row g + 8 given row g's bias; fc2m's every slot
# given slot 0's bias
QMOE_M_BIAS_ROW: Edits = (
    (
        "for (int r = 0; r < 2; ++r) bias[r] = qk_moe_bias_of(f, R.rr[r]);",
        "for (int r = 0; r < 2; ++r) bias[r] = qk_moe_bias_of(f, R.rr[0]);",
    ),
)
QMOE_F2_BIAS_SLOT: Edits = (
    ("const float y = qk_moe_plus_bias(d, f, s_bias[j][c]);", "const float y = qk_moe_plus_bias(d, f, s_bias[0][c]);"),
)


def _qmoe(
    name: str,
    caught_by: str | None,
    op: str,
    leaf: str,
    edits: Edits = (),
    define: str = "",
    coverage: int = 1,
    contract: str = "",
) -> DeviceMutant:
    return DeviceMutant(
        name, "ort/qmoe.hip", "", define, op, caught_by, leaf=leaf, coverage=coverage, edits=edits, contract=contract
    )


def _qmoe_g(name: str, caught_by: str | None, leaf: str, edits: Edits = (), define: str = "", coverage: int = 1):
    return _qmoe(name, caught_by, "qmoe_ragged_mm", leaf, edits, define, coverage, contract="storage=fp16")


QMOE_MUTANTS = (
    _qmoe("QMoE: a tuner samples fused or unfused products on the first calls", "repeatable", "qmoe_decode",
          "Xfp32_Wu4_Yfp32", QMOE_TUNER_SAMPLES),
    _qmoe("QMoE: ties to the lower expert index", "matches_oracle", "qmoe_ragged_mm", "Xfp16_Wu4_Yfp16",
          QMOE_TIES_LOWER),
    _qmoe("QMoE: normalize_routing_weights honoured", "matches_oracle", "qmoe_decode", "Xfp32_Wu4_Yfp32",
          QMOE_NORMALIZE_HONOURED),
    _qmoe("QMoE: SwiGLU halves concatenated", "matches_oracle", "qmoe_decode", "Xfp16_Wu8_Yfp16",
          QMOE_SWIGLU_CONCATENATED),
    _qmoe("QMoE: SwiGLU without + beta", "matches_oracle", "qmoe_ragged_mm", "Xfp32_Wu4_Yfp32", QMOE_MISSING_BETA),
    _qmoe("QMoE: limit on the linear half only", "matches_oracle", "qmoe_decode", "Xfp16_Wu4_Yfp16",
          QMOE_LIMIT_LINEAR_ONLY),
    _qmoe("QMoE dp4a: zero points ignored", "matches_oracle", "qmoe_decode", "Xfp16_Wu8_Yfp16", QMOE_INT8_NO_ZP),
    _qmoe("QMoE decode: routing butterfly without the comparison", "matches_oracle", "qmoe_ragged_mm",
          "Xfp32_Wu4_Yfp32", QMOE_ROUTE_NO_COMPARE, coverage=2),
    _qmoe("QMoE decode: ranked routing counts ties as above", "matches_oracle", "qmoe_decode", "Xfp16_Wu4_Yfp16",
          QMOE_RANK_TIES),
    _qmoe("QMoE decode: ranked routing from one thread's share", "matches_oracle", "qmoe_decode", "Xfp32_Wu4_Yfp32",
          QMOE_RANK_PARTIAL),
    _qmoe("QMoE decode: 16-byte weight load's words swapped", "matches_oracle", "qmoe_decode", "Xfp32_Wu4_Yfp32",
          QMOE_VEC_WORDS_SWAPPED),
    _qmoe("QMoE decode: fc1's output in row order, read chunk-transposed", "matches_oracle", "qmoe_decode",
          "Xfp16_Wu4_Yfp16", QMOE_A_ROW_ORDER, coverage=2),
    _qmoe("QMoE decode: staged input read unswizzled", "matches_oracle", "qmoe_decode", "Xfp32_Wu4_Yfp32",
          QMOE_STAGED_UNSWIZZLED, coverage=2),
    _qmoe("control: QMoE legacy kernels (route, fc1, fc2), u4", None, "qmoe_decode", "Xfp16_Wu4_Yfp16",
          define="-DQK_MOE_LEGACY"),
    _qmoe("QMoE fc1 mma: a step's second segments in the first's columns", "matches_oracle", "qmoe_decode",
          "Xfp16_Wu4_Yfp16", QMOE_M_COLUMN, coverage=2),
    _qmoe("QMoE fc1 mma: staged input in value order", "matches_oracle", "qmoe_decode", "Xfp16_Wu4_Yfp16",
          QMOE_M_XPAIRS),
    _qmoe("QMoE fc1 mma: row g + 8 with row g's zero point", "matches_oracle", "qmoe_decode", "Xfp16_Wu4_Yfp16",
          QMOE_M_ZERO_ROW),
    _qmoe("QMoE fc1 mma: row g + 8 with row g's bias", "matches_oracle", "qmoe_decode", "Xfp16_Wu4_Yfp16",
          QMOE_M_BIAS_ROW),
    _qmoe("QMoE fc2 mma: every slot with slot 0's bias", "matches_oracle", "qmoe_decode", "Xfp16_Wu4_Yfp16",
          QMOE_F2_BIAS_SLOT),
    _qmoe("control: QMoE biases read at the end (-DQK_MOE_BIAS_AT_END)", None, "qmoe_decode", "Xfp16_Wu4_Yfp16",
          define="-DQK_MOE_BIAS_AT_END"),
    _qmoe("control: QMoE fc1 of an fp16 input on qk_moe_fc1v (-DQK_MOE_FC1_SIMT)", None, "qmoe_decode",
          "Xfp16_Wu4_Yfp16", define="-DQK_MOE_FC1_SIMT"),
    _qmoe("QMoE fc2 mma: the input as one bf16 part", "matches_oracle", "qmoe_decode", "Xfp16_Wu4_Yfp16",
          QMOE_F2_ONE_PART),
    _qmoe("QMoE fc2 mma: every slot reads slot 0's staged rows", "matches_oracle", "qmoe_decode", "Xfp16_Wu4_Yfp16",
          QMOE_F2_SLOT0),
    _qmoe("QMoE fc2 mma: a word's odd fields from its even ones", "matches_oracle", "qmoe_decode", "Xfp16_Wu4_Yfp16",
          QMOE_F2_FIELD),
    _qmoe("control: QMoE fc2 of an fp16 layer on qk_moe_fc2v (-DQK_MOE_FC2_SIMT)", None, "qmoe_decode",
          "Xfp16_Wu4_Yfp16", define="-DQK_MOE_FC2_SIMT"),
    _qmoe("control: QMoE legacy kernels (route, fc1, fc2), u8 ragged", None, "qmoe_ragged_mm", "Xfp16_Wu8_Yfp16",
          define="-DQK_MOE_LEGACY"),
    _qmoe_g("QMoE grouped: last partial tile dropped", "matches_oracle", "Xfp16_Wu4_Yfp16", QMOE_G_PARTIAL_TILE),
    _qmoe_g("QMoE grouped: block scale applied per row", "matches_oracle", "Xfp16_Wu4_Yfp16", QMOE_G_ROW_SCALE,
            coverage=2),
    _qmoe_g("QMoE grouped: block partial sum not reset", "matches_oracle", "Xfp32_Wu4_Yfp32", QMOE_G_PART_KEPT,
            coverage=2),
    _qmoe_g("QMoE grouped: an expert's first tile found as the previous expert's", "matches_oracle",
            "Xfp16_Wu8_Yfp16", QMOE_G_TILE_SEARCH),
    _qmoe_g("QMoE grouped: zero points ignored", "matches_oracle", "Xfp16_Wu8_Yfp16", QMOE_G_NO_ZP),
    _qmoe_g("QMoE grouped: SwiGLU gate and linear swapped", "matches_oracle", "Xfp32_Wu4_Yfp32", QMOE_G_GLU_SWAPPED),
    _qmoe_g("control: QMoE grouped path off (-DQK_MOE_RAGGED_V1: per token) under storage=fp16", None,
            "Xfp16_Wu4_Yfp16", define="-DQK_MOE_RAGGED_V1"),
    _qmoe_g("control: QMoE grouped on the portable mma (shuffles), u8", None, "Xfp16_Wu8_Yfp16",
            define="-DQK_MMA_EMULATE", coverage=2),
    _qmoe_g("control: QMoE grouped, round 1's tile loop (-DQK_MOE_GEMM_V1), u4", None, "Xfp16_Wu4_Yfp16",
            define="-DQK_MOE_GEMM_V1", coverage=2),
)  # fmt: skip

# bnb/decode.hip (nf4_decode, fp4_decode; --impl cupy). Coverage 1 has random codes in every case,
# an odd width (3 x 333) and a blocksize that does not divide n (999 values in blocks of 128).
# element 2j read from the low nibble and 2j + 1 from the high one
BNB_NIBBLES_SWAPPED: Edits = (
    ("(i & 1) ? (int)(byte & 0x0Fu) : (int)(byte >> 4)", "(i & 1) ? (int)(byte >> 4) : (int)(byte & 0x0Fu)"),
)
# a partial last block scaled by the previous block's absmax
BNB_LAST_BLOCK_SCALE: Edits = (
    (
        "const qk_i64 blk = i / blocksize;",
        "const qk_i64 blk = i / blocksize\n"
        "        - (i >= blocksize && n % blocksize != 0 && i / blocksize == (n - 1) / blocksize);",
    ),
)
# fp16 output rounded toward zero instead of to nearest even
BNB_FP16_TRUNCATED: Edits = (("qk_fp16_bits(qk_float(v))", "__half_as_ushort(__float2half_rz(qk_float(v)))"),)


def _bnb(name: str, op: str, leaf: str, edits: Edits) -> DeviceMutant:
    return DeviceMutant(name, "bnb/decode.hip", "", "", op, "matches_oracle", leaf=leaf, edits=edits)


# bnb/quantize.hip (nf4_quantize; --impl cupy): the coverage-1 case of pattern "midpoints" (float32
# leaf) puts 167 scaled values exactly on the CPU path's midpoints and 43 on the 4 NF4 midpoints the
# CUDA literals miss by one ulp.
# the CPU reading counts the midpoints <= s: a tie goes to the upper code
BNB_TIES_UPPER: Edits = (
    ("q += (double)qk_float(bounds[k]) < s ? 1 : 0;", "q += (double)qk_float(bounds[k]) <= s ? 1 : 0;"),
)
# the CUDA reading's NF4 thresholds at the float32 midpoints instead of the literals (k = 0, 8, 12, 14)
BNB_NF4_MIDPOINTS: Edits = (
    (
        "    0xBF591CD9u, 0xBF1C5270u, 0xBEEB8480u, 0xBEADEA76u, 0xBE703CECu, 0xBE0D38BCu, 0xBD3A7871u, 0x3D22FAFFu,\n"
        "    0x3DF64863u, 0x3E5067E0u, 0x3E9582D4u, 0x3EC753F9u, 0x3F006D03u, 0x3F248DAFu, 0x3F5C89D9u,",
        "    0xBF591CD8u, 0xBF1C5270u, 0xBEEB8480u, 0xBEADEA76u, 0xBE703CECu, 0xBE0D38BCu, 0xBD3A7871u, 0x3D22FAFFu,\n"
        "    0x3DF64862u, 0x3E5067E0u, 0x3E9582D4u, 0x3EC753F9u, 0x3F006D04u, 0x3F248DAFu, 0x3F5C89DAu,",
    ),
)
# bnb/gemm_simt.hip (gemm_4bit; --impl cupy): element 2j read from the low nibble and 2j + 1 from the
# high one, in both decodes (the float32 centroid table's nibble shifts: the cpu reading and the fp32
# SIMT reading; the fp16 / bf16 SIMT reading's pair table); the bias added to the output already
# rounded to T (bitsandbytes <= 0.49's out += bias: two roundings; the coverage-1 biased cases
# (1 x 256 x 16, 4 x 256 x 16) have outputs the bias nearly cancels, where the first rounding exceeds
# the bound; checked offline on the oracle's readings)
BNB_GEMV_LOW_NIBBLE_FIRST: Edits = (
    ("((e & 1) ? 0 : 4)", "((e & 1) ? 4 : 0)"),
    ("cen_t[e >> 4] | (cen_t[e & 15] << 16)", "cen_t[e & 15] | (cen_t[e >> 4] << 16)"),
)
BNB_GEMV_BIAS_AFTER_ROUNDING: Edits = (
    ("if (bias != 0) v = qk_bnb_add(v, bv);", "if (bias != 0) v = qk_bnb_add(qk_gemm_round<DT>(v), bv);"),
)


# bnb/nested.hip (nested_absmax; --impl cupy): the offset added to the 8-bit code before the
# dequantization, fl32(fl32(code8[q] + offset) * absmax2) (coverage 1: the "quantized" and "random"
# cases have an offset; "special" has 0)
BNB_NESTED_OFFSET_FIRST: Edits = (
    (
        "const float prod = qk_ftz(QK_FMUL(c, a));\n"
        "    y[j] = qk_float(qk_f32_bits_of(__dadd_rn(qk_f64_of(prod), qk_f64_of(offset))));",
        "y[j] = qk_ftz(QK_FMUL(qk_ftz(QK_FADD(c, offset)), a));",
    ),
)


def _bnb_kernel(
    name: str, source: str, op: str, leaf: str, edits: Edits, contract: str = "", coverage: int = 1,
    options: str = "", caught_by: str | None = "matches_oracle",
) -> DeviceMutant:  # fmt: skip
    return DeviceMutant(
        name, source, "", options, op, caught_by, leaf=leaf, edits=edits, contract=contract, coverage=coverage
    )


# bnb/gemm_mma.hip (gemm_4bit's cpu reading, fp16 / bf16, M <= 16; --impl cupy): the pair table's
# nibbles swapped (element 2j decoded from the low nibble); each lane's absmax from the previous block
# of its row's flattening (the first block keeps its own); the second n-tile of tokens (8..15) never
# multiplied (its outputs left at the bias: coverage 2 has M 12 and 16). Controls: the portable
# mma (qk_portable.h's shuffle form) with the 16-copy table (-DQK_BNBM_TAB16): what AMD runs; and
# the SIMT kernel's cpu reading (-DQK_BNB_CPU_SIMT, session 8). The four mutants, modelled, fail
# tests/bnb_mma_model.py.
BNB_MMA_NIBBLES_SWAPPED: Edits = (
    (
        "tab[i] = make_float2(qk_float(bits[e >> 4]), qk_float(bits[e & 15]));",
        "tab[i] = make_float2(qk_float(bits[e & 15]), qk_float(bits[e >> 4]));",
    ),
)
BNB_MMA_PREVIOUS_BLOCK: Edits = (
    (
        "sc[0] = absmax[(r0 * K + k) >> bs_shift];",
        "sc[0] = absmax[((r0 * K + k) >> bs_shift) - (((r0 * K + k) >> bs_shift) > 0)];",
    ),
    (
        "sc[1] = absmax[(r1 * K + k) >> bs_shift];",
        "sc[1] = absmax[((r1 * K + k) >> bs_shift) - (((r1 * K + k) >> bs_shift) > 0)];",
    ),
)
BNB_MMA_SECOND_HALF_DROPPED: Edits = (
    ("qk_bnbm_mma<DT>(d[rt][nt], a, b);", "if (nt == 0) qk_bnbm_mma<DT>(d[rt][nt], a, b);"),
)
# the CUDA build's table offset (one PRMT) takes the other byte of the half-word: each 16-bit word's
# two weight pairs swapped
BNB_MMA_PRMT_BYTE: Edits = (
    ("__byte_perm(w, low, 0x5504u | ((qk_u32)j << 4))", "__byte_perm(w, low, 0x5504u | ((qk_u32)(j ^ 1) << 4))"),
)
TAB16 = "-DQK_BNBM_TAB16"  # qconform.device.bnb.gemm.TAB16_OPTION: the 16-copy table, as HIP builds it
CPU_SIMT = "-DQK_BNB_CPU_SIMT"  # qconform.device.bnb.gemm.CPU_SIMT_OPTION


BNB_MUTANTS = (
    _bnb("nf4 decode: nibbles swapped", "nf4_decode", "Xnf4_Yfp32", BNB_NIBBLES_SWAPPED),
    _bnb("fp4 decode: partial last block takes the previous scale", "fp4_decode", "Xfp4_Yfp32", BNB_LAST_BLOCK_SCALE),
    _bnb("nf4 decode: fp16 by truncation", "nf4_decode", "Xnf4_Yfp16", BNB_FP16_TRUNCATED),
    _bnb_kernel(
        "nf4 quantize: ties to the upper code (cpu)", "bnb/quantize.hip", "nf4_quantize", "Xfp32_Ynf4", BNB_TIES_UPPER
    ),
    _bnb_kernel(
        "nf4 quantize: thresholds at the float32 midpoints (cuda)",
        "bnb/quantize.hip",
        "nf4_quantize",
        "Xfp32_Ynf4",
        BNB_NF4_MIDPOINTS,
        "variant=cuda",
    ),
    _bnb_kernel(
        "nested absmax: offset added before the 8-bit dequantization",
        "bnb/nested.hip",
        "nested_absmax",
        "Xu8_Yfp32",
        BNB_NESTED_OFFSET_FIRST,
    ),
    _bnb_kernel(
        "4-bit GEMV: low nibble first",
        "bnb/gemm_simt.hip",
        "gemm_4bit",
        "Xfp16_W4_Yfp16",
        BNB_GEMV_LOW_NIBBLE_FIRST,
        options=CPU_SIMT,
    ),
    _bnb_kernel(
        "4-bit GEMV: bias added after rounding to fp16",
        "bnb/gemm_simt.hip",
        "gemm_4bit",
        "Xfp16_W4_Yfp16",
        BNB_GEMV_BIAS_AFTER_ROUNDING,
        options=CPU_SIMT,
    ),
    _bnb_kernel("bnb mma: nibbles swapped", "bnb/gemm_mma.hip", "gemm_4bit", "Xfp16_W4_Yfp16", BNB_MMA_NIBBLES_SWAPPED),
    _bnb_kernel(
        "bnb mma: absmax of the previous block",
        "bnb/gemm_mma.hip",
        "gemm_4bit",
        "Xbf16_W4_Ybf16",
        BNB_MMA_PREVIOUS_BLOCK,
    ),
    _bnb_kernel(
        "bnb mma: token tile's second n-half dropped",
        "bnb/gemm_mma.hip",
        "gemm_4bit",
        "Xfp16_W4_Yfp16",
        BNB_MMA_SECOND_HALF_DROPPED,
        coverage=2,
    ),
    _bnb_kernel(
        "bnb mma: PRMT offset of the byte beside", "bnb/gemm_mma.hip", "gemm_4bit", "Xfp16_W4_Yfp16", BNB_MMA_PRMT_BYTE
    ),
    _bnb_kernel(
        "control: bnb mma, portable mma (shuffles) and the 16-copy table, bf16",
        "bnb/gemm_mma.hip",
        "gemm_4bit",
        "Xbf16_W4_Ybf16",
        (),
        coverage=2,
        options=f"-DQK_MMA_EMULATE {TAB16}",
        caught_by=None,
    ),
    _bnb_kernel(
        "control: gemm_4bit cpu reading on the SIMT kernel (-DQK_BNB_CPU_SIMT)",
        "bnb/gemm_simt.hip",
        "gemm_4bit",
        "Xbf16_W4_Ybf16",
        (),
        coverage=2,
        options=CPU_SIMT,
        caught_by=None,
    ),
    _bnb_kernel(
        "4-bit GEMV (simt): bias added after rounding to bf16",
        "bnb/gemm_simt.hip",
        "gemm_4bit",
        "Xbf16_W4_Ybf16",
        BNB_GEMV_BIAS_AFTER_ROUNDING,
        "variant=cuda",
    ),
    _bnb_kernel(
        "4-bit GEMV (simt): low nibble first",
        "bnb/gemm_simt.hip",
        "gemm_4bit",
        "Xfp32_W4_Yfp32",
        BNB_GEMV_LOW_NIBBLE_FIRST,
        "variant=cuda",
    ),
    _bnb_kernel(
        "4-bit GEMV (simt): low nibble first in the fp16 pairs",
        "bnb/gemm_simt.hip",
        "gemm_4bit",
        "Xfp16_W4_Yfp16",
        BNB_GEMV_LOW_NIBBLE_FIRST,
        "variant=cuda",
    ),
)
# ggml/fused.hip (rms_norm_q8_k, silu_mul_q8_k; --impl cupy)
# the fused epilogue quantizes the fp32 value instead of the bfloat16 value it stored
FUSED_Q8K_OF_FP32: Edits = (("back = qk_float((qk_u32)h << 16);", "back = v;"),)
# RMSNorm's sum of squares accumulated in fp32 (each thread's terms and the CTA's reduction); at
# coverage 2: coverage 1's rows are 256 wide, one term per thread and a tree that often rounds
# to the same mean
RMS_SUM_FP32: Edits = (("p.sum = __dadd_rn(p.sum, sum);", "p.sum = (double)QK_FADD((float)p.sum, (float)sum);"),)


# ggml/keep_quant.hip (matmul_bt_quant; --impl cupy): the generic order's lane sum reversed; a
# Q6_K segment's two half scales swapped; sums[l] += d * aux as one fmaf (the strict contract is
# fma=off)
KQ_LANES_REVERSED: Edits = (("y = QK_FADD(y, QK_SHFL(sums[m], k, 8));", "y = QK_FADD(y, QK_SHFL(sums[m], 7 - k, 8));"),)
KQ_Q6_SCALE: Edits = (
    (
        "aux[m][l] += sc0 * qk_dp4a(q & 0x0000FFFF, (int)a[l], 0);",
        "aux[m][l] += sc1 * qk_dp4a(q & 0x0000FFFF, (int)a[l], 0);",
    ),
    (
        "aux[m][l] += sc1 * qk_dp4a((int)((qk_u32)q & 0xFFFF0000u), (int)a[l], 0);",
        "aux[m][l] += sc0 * qk_dp4a((int)((qk_u32)q & 0xFFFF0000u), (int)a[l], 0);",
    ),
)
KQ_LANE_FMA: Edits = (
    (
        "sums[m] = QK_FADD(sums[m], QK_FMUL(d, __int2float_rn(sm.u.red.aux[m][fr][fl][jj])));",
        "sums[m] = fmaf(d, __int2float_rn(sm.u.red.aux[m][fr][fl][jj]), sums[m]);",
    ),
)

# the one-chain and Q3_K kernels: Q4_1's min term m * s subtracted instead of added; Q3_K's high-bit
# mask inverted (4 subtracted where the bit is set); IQ4_NL's table indexed by the other nibble;
# Q8_1's s from the fp16-rounded d instead of the fp32 d of quantize_row_q8_1_ref
KQ_Q4_1_MIN_SIGN: Edits = (
    (
        "else term = QK_FADD(QK_FMUL(QK_FMUL(dx, dy), fi), QK_FMUL(mx, sy));",
        "else term = QK_FADD(QK_FMUL(QK_FMUL(dx, dy), fi), -QK_FMUL(mx, sy));",
    ),
)
KQ_Q3_HMASK: Edits = (("high = (hc[l] >> s) & 0x01010101u;", "high = ~(hc[l] >> s) & 0x01010101u;"),)
KQ_IQ4_NL_NIBBLE: Edits = (
    (
        "lo[v] = kq_iq4_lookup(lo[v]);\n            hi[v] = kq_iq4_lookup(hi[v]);",
        "const qk_u32 lo4 = lo[v];\n            lo[v] = kq_iq4_lookup(hi[v]);\n            hi[v] = kq_iq4_lookup(lo4);",
    ),
)
KQ_Q8_1_S_FP16_D: Edits = (
    (
        "const float d = qk_ftz(QK_FDIV(amax, 127.0f));",
        "const float d = qk_fp16_to_float(qk_fp16_bits(qk_ftz(QK_FDIV(amax, 127.0f))));",
    ),
)


def _fused(name: str, op: str, leaf: str, edits: Edits, coverage: int = 1) -> DeviceMutant:
    return DeviceMutant(name, "ggml/fused.hip", "", "", op, "matches_oracle", leaf=leaf, coverage=coverage, edits=edits)


GGML_FN_MUTANTS = (
    _fused(
        "fused epilogue: Q8_K of the fp32 value, not the stored bf16",
        "silu_mul_q8_k",
        "Xfp32_Ybf16_Aq8_K",
        FUSED_Q8K_OF_FP32,
    ),
    _fused("rms_norm_q8_k: sum of squares in fp32", "rms_norm_q8_k", "Xfp32_Yfp32_Aq8_K", RMS_SUM_FP32, 2),
    *(
        DeviceMutant(name, "ggml/keep_quant.hip", "", "", "matmul_bt_quant", "matches_oracle", leaf=leaf, edits=edits)
        for name, leaf, edits in (
            ("keep-quant GEMV: the 8 fp32 lanes added in reverse order", "Wq4_K_Aq8_K_Yfp32", KQ_LANES_REVERSED),
            ("keep-quant GEMV: Q6_K's half-segment scales swapped", "Wq6_K_Aq8_K_Yfp32", KQ_Q6_SCALE),
            ("keep-quant GEMV: the lane chain contracted into an FMA", "Wq5_K_Aq8_K_Yfp32", KQ_LANE_FMA),
            ("keep-quant GEMV: Q4_1's min term subtracted", "Wq4_1_Aq8_1_Yfp32", KQ_Q4_1_MIN_SIGN),
            ("keep-quant GEMV: Q3_K's high-bit mask inverted", "Wq3_K_Aq8_K_Yfp32", KQ_Q3_HMASK),
            ("keep-quant GEMV: IQ4_NL's table indexed by the other nibble", "Wiq4_nl_Aq8_0_Yfp32", KQ_IQ4_NL_NIBBLE),
            ("keep-quant GEMV: Q8_1's s from the fp16 d (Q5_1)", "Wq5_1_Aq8_1_Yfp32", KQ_Q8_1_S_FP16_D),
        )
    ),
)
# ggml/keep_quant_fast.hip (matmul_bt_quant under --contract order=any: each output within its bound;
# coverage 1: 256- and 512-value rows, one block of Q4_K..Q6_K per row, 8 / 16 of Q8_0)
# Q4_K / Q5_K: each sub-block's min applied to the other half's bsum
KF_MIN_WRONG_HALF: Edits = (
    (
        "const int imin = m0 * kf_half(bs[0], half) + m1 * kf_half(bs[1], half);",
        "const int imin = m1 * kf_half(bs[0], half) + m0 * kf_half(bs[1], half);",
    ),
)
# Q6_K: the high nibbles' two high bits from qh bits 2k + 2, 2k + 3 (shifted by 2 too few)
KF_Q6_HIGH_SHIFT: Edits = (
    ("(((qh[v] >> (2 * k + 4)) & 0x03030303u) << 4)", "(((qh[v] >> (2 * k + 2)) & 0x03030303u) << 4)"),
)
# Q5_K: the high nibbles' fifth bit from bit 2g of qh (the low nibbles' bit)
KF_Q5_HIGH_BIT: Edits = (
    ("hi[k] |= ((r[(8 + k) % KF_WR(KIND)] >> (2 * g + 1))", "hi[k] |= ((r[(8 + k) % KF_WR(KIND)] >> (2 * g))"),
)
# Q6_K / Q8_0: a slice 2 bytes past a word read from the word below it (no realignment)
KF_NO_REALIGN: Edits = (
    (
        "const qk_u32 sel = ((unsigned long long)p & 2u) ? 0x5432u : 0x3210u;",
        "const qk_u32 sel = 0x3210u;",
    ),
)
# Q6_K's staged block without its last word (d stale in shared memory)
KF_Q6_STAGE_NO_D: Edits = (("if (c < 5) stg[48 + c] = v[6];", "if (c < 4) stg[48 + c] = v[6];"),)
# the partial rows of the CTA's first group (blocks 0, 4, ...) left out of the output
KF_GROUP0_DROPPED: Edits = (("float y = part[0][rr][m];", "float y = 0.0f;"),)


def _fast(name: str, leaf: str, edits: Edits, define: str = "") -> DeviceMutant:
    caught = "matches_oracle" if edits else None
    source, op = "ggml/keep_quant_fast.hip", "matmul_bt_quant"
    return DeviceMutant(name, source, "", define, op, caught, leaf=leaf, edits=edits, contract="order=any")


# bench-only -DQK_KF_LOADS_FIRST (the GEMV's first weight loads before its wait for the activations'
# quantize): both rows delay the quantize's writes by ~1 ms after its trigger (qk_q8_k_quant_w32, the
# kernel before in the call), so the GEMV's CTAs reach their activation reads long before the bytes are
# there; the mutant drops the wait. Caught, by analogy with the ring GEMV's delayed split above, by the
# check of every output written (the quantize's output comes from the pool holding that check's poison)
KQ_QUANT_DELAYED: Edits = (
    (
        "    QK_LAUNCH_DEPENDENTS(); /* the keep-quant GEMV after it may start: it waits for these bytes */\n",
        "    QK_LAUNCH_DEPENDENTS(); /* the keep-quant GEMV after it may start: it waits for these bytes */\n"
        "    for (const long long t0 = clock64(); clock64() - t0 < 2000000;) {\n    }\n",
    ),
)
KF_LOADS_FIRST_NO_WAIT: Edits = (
    ("        if (first) QK_WAIT_PRIOR_GRID();  \\\n", "        (void)(first);            \\\n"),
)
LOADS_FIRST = "-DQK_KF_LOADS_FIRST"
TWO_LAUNCH = "-DQK_KF_TWO_LAUNCH"  # bench-only: Q4_K / Q5_K at M = 1 as the quantize and the GEMV


def _fast_delayed(name: str, edits: Edits) -> DeviceMutant:
    """A row of the -DQK_KF_LOADS_FIRST build's two launches (-DQK_KF_TWO_LAUNCH: at M = 1 Q4_K is one launch
    otherwise) with the activations' quantize delayed (KQ_QUANT_DELAYED)."""
    caught = "writes_every_output" if edits else None
    beside = (("ggml/keep_quant_fast.hip", edits),) if edits else ()
    return DeviceMutant(name, "ggml/q8_quant.hip", "", f"{LOADS_FIRST} {TWO_LAUNCH}", "matmul_bt_quant", caught,
                        leaf="Wq4_K_Aq8_K_Yfp32", edits=KQ_QUANT_DELAYED, contract="order=any", beside=beside)


# Q6_K / Q8_0 at M = 1 through shared memory (qk_kq_bulk_<t>, for nb a multiple of 8: coverage 2's M = 1
# cases; Q6_K in one launch, qk_kq_one_bulk_q6_k; run on the host too, tests/test_keep_quant_fast_host.py):
# a stage's rows read at the full stage's stride (wrong only on a row's last, shorter stage: Q6_K at K =
# 14336, nb % 16 = 8), the sums not reset after a row group (a CTA's second group carries its first's:
# N = 8192 has more groups than resident CTAs); Q6_K's quantizing CTAs delayed ~1 ms with the others' wait
# for them dropped (mutant) or kept (control)
KB_ROW_STRIDE: Edits = (
    ("            const qk_u8* blk = st + (rr * cnt + kc) * TS;\n            const int mis",
     "            const qk_u8* blk = st + (rr * KB_CB(6) + kc) * TS;\n            const int mis"),
)
KB_NO_RESET: Edits = (("                acc[rr] = 0.0f;\n            }\n", "            }\n"),)


def _bulk(
    name: str, edits: Edits, leaf: str = "Wq6_K_Aq8_K_Yfp32", control: bool = False, define: str = ""
) -> DeviceMutant:
    caught = None if control else "matches_oracle"
    return DeviceMutant(name, "ggml/keep_quant_fast.hip", "", define, "matmul_bt_quant", caught, leaf=leaf, coverage=2,
                        edits=edits, contract="order=any")


# the M = 1 Q4_K / Q5_K call in one launch (qk_kq_one_<t>, its first CTAs quantizing the row for the
# others; tests/test_keep_quant_fast_host.py runs it on the host too): each super-block's quants read in
# another order than qk_q8_k_quant_w32's (lane l's second float4 its neighbour's); each row-group CTA's
# first group skipped (its outputs never written); the quantizing CTAs delayed ~1 ms before they start,
# with the others' wait for them dropped (mutant) or kept (control)
ONE_LANE_ORDER: Edits = (("x4[ib * (QK_K / 4) + 32 * k + l]", "x4[ib * (QK_K / 4) + 32 * k + (l ^ (k & 1))]"),)
ONE_FIRST_GROUP_SKIPPED: Edits = (
    ("(W, act, Y, N, nb, c * KF_ROWS, consumers", "(W, act, Y, N, nb, (c + consumers) * KF_ROWS, consumers"),
)
ONE_PRODUCERS_DELAYED: Edits = (
    (
        "        kf_quantize_pass(X, act, nb, blockIdx.x);\n",
        "        for (const long long t0 = clock64(); clock64() - t0 < 2000000;) {\n        }\n"
        "        kf_quantize_pass(X, act, nb, blockIdx.x);\n",
    ),
)
ONE_NO_WAIT: Edits = (
    (
        "    if (threadIdx.x == 0) {\n        kf_poll_at_least(count, producers);",
        "    if (false) {\n        kf_poll_at_least(count, producers);",
    ),
)
# the one launch's row groups as one stream of trips a thread (kf_roll_rows, the next trip's words loaded
# row by row during this one): the next trip past a group's last block column taken at ib + 16 instead of
# the next group's first column (coverage 2: M 1 x N 8192 x K 2048 gives each CTA 2-3 row groups)
ROLL_NO_WRAP: Edits = (("nib = same ? ib + COLS : kc;", "nib = ib + COLS;"),)
KEEP_QUANT_FAST_MUTANTS = (
    _fast("keep-quant fast: Q4_K sub-block min applied to the wrong half", "Wq4_K_Aq8_K_Yfp32", KF_MIN_WRONG_HALF),
    _fast("keep-quant fast: Q6_K high bits shifted by 2 too few", "Wq6_K_Aq8_K_Yfp32", KF_Q6_HIGH_SHIFT),
    _fast("keep-quant fast: Q5_K high nibbles' bit 4 from the low ones' qh bit", "Wq5_K_Aq8_K_Yfp32", KF_Q5_HIGH_BIT),
    _fast("keep-quant fast: Q8_0 slices 2 past a word not realigned", "Wq8_0_Aq8_0_Yfp32", KF_NO_REALIGN),
    _fast("keep-quant fast: the first group's partial rows dropped", "Wq4_K_Aq8_K_Yfp32", KF_GROUP0_DROPPED),
    _fast("keep-quant fast: Q6_K staged without its d word", "Wq6_K_Aq8_K_Yfp32", KF_Q6_STAGE_NO_D),
    _fast("control: keep-quant fast kernel under order=any (Q6_K)", "Wq6_K_Aq8_K_Yfp32", ()),
    _fast("keep-quant fast round 1 (-DQK_KQ_FAST_V1): Q4_K min on the wrong half", "Wq4_K_Aq8_K_Yfp32",
          KF_MIN_WRONG_HALF, "-DQK_KQ_FAST_V1"),
    _fast("control: keep-quant fast round 1 (-DQK_KQ_FAST_V1) under order=any (Q5_K)", "Wq5_K_Aq8_K_Yfp32", (),
          "-DQK_KQ_FAST_V1"),
    _fast("control: keep-quant fast round 2 under order=any (Q4_K)", "Wq4_K_Aq8_K_Yfp32", ()),
    _fast_delayed("keep-quant fast loads first (-DQK_KF_LOADS_FIRST): a delayed quantize not waited for",
                  KF_LOADS_FIRST_NO_WAIT),
    _fast_delayed("control: keep-quant fast loads first (-DQK_KF_LOADS_FIRST) waits for a delayed quantize", ()),
    _fast("control: keep-quant fast loads first (-DQK_KF_LOADS_FIRST) under order=any (Q8_0)", "Wq8_0_Aq8_0_Yfp32",
          (), LOADS_FIRST),
    _fast("control: keep-quant fast loads first (-DQK_KF_LOADS_FIRST) under order=any (Q6_K)", "Wq6_K_Aq8_K_Yfp32",
          (), LOADS_FIRST),
    _fast("keep-quant one launch: the row's quants read in another order", "Wq4_K_Aq8_K_Yfp32", ONE_LANE_ORDER),
    _fast("keep-quant one launch: each row-group CTA's first group skipped", "Wq5_K_Aq8_K_Yfp32",
          ONE_FIRST_GROUP_SKIPPED),
    _fast("keep-quant one launch: delayed quantizing CTAs not waited for", "Wq4_K_Aq8_K_Yfp32",
          ONE_PRODUCERS_DELAYED + ONE_NO_WAIT),
    DeviceMutant("control: keep-quant one launch waits for delayed quantizing CTAs", "ggml/keep_quant_fast.hip", "", "",
                 "matmul_bt_quant", None, leaf="Wq5_K_Aq8_K_Yfp32", edits=ONE_PRODUCERS_DELAYED, contract="order=any"),
    _fast("control: keep-quant two launches (-DQK_KF_TWO_LAUNCH) under order=any (Q4_K)", "Wq4_K_Aq8_K_Yfp32", (),
          TWO_LAUNCH),
    DeviceMutant("keep-quant one launch: the next trip not wrapped to the next row group", "ggml/keep_quant_fast.hip",
                 "", "", "matmul_bt_quant", "matches_oracle", leaf="Wq4_K_Aq8_K_Yfp32", coverage=2,
                 edits=ROLL_NO_WRAP, contract="order=any"),
    _bulk("keep-quant bulk Q6_K: a stage's rows at the full stage's stride", KB_ROW_STRIDE),
    _bulk("keep-quant bulk Q8_0: the sums not reset between row groups", KB_NO_RESET, "Wq8_0_Aq8_0_Yfp32"),
    _bulk("keep-quant bulk Q6_K one launch: delayed quantizing CTAs not waited for",
          ONE_PRODUCERS_DELAYED + ONE_NO_WAIT),
    _bulk("control: keep-quant bulk Q6_K one launch waits for delayed quantizing CTAs", ONE_PRODUCERS_DELAYED,
          control=True),
    _bulk("keep-quant bulk Q8_0 one launch: delayed quantizing CTAs not waited for",
          ONE_PRODUCERS_DELAYED + ONE_NO_WAIT, "Wq8_0_Aq8_0_Yfp32"),
    _bulk("control: keep-quant bulk Q8_0 as two launches (-DQK_KF_TWO_LAUNCH) under order=any", (),
          "Wq8_0_Aq8_0_Yfp32", control=True, define=TWO_LAUNCH),
    _fast("control: keep-quant Q6_K staged as before the bulk copy (-DQK_KF_STAGED) under order=any",
          "Wq6_K_Aq8_K_Yfp32", (), "-DQK_KF_STAGED"),
)
# ort/gqa_flash.hip (gqa_prefill under --contract storage=fp16; coverage 1: a chunk with a past of
# 5 rows, window 3, softcap, a head sink and a full bias; a first prompt with smooth_softmax)
# the causal limit one key past the query's own when there is a past
FLASH_CAUSAL_PAST: Edits = (
    (
        "L = s >= S ? 0 : (past + s + 1 < total ? past + s + 1 : total);",
        "L = s >= S ? 0 : (past + s + 1 + (past > 0) < total ? past + s + 1 + (past > 0) : total);",
    ),
)
# a local window of W + 1 keys
FLASH_WINDOW_W1: Edits = (
    (
        "lo = (window >= 1 && L > window) ? L - window : 0;",
        "lo = (window >= 1 && L > window + 1) ? L - window - 1 : 0;",
    ),
)
# the running sum not rescaled when the running max grows (the sink's initial 1 kept at full weight)
FLASH_SUM_NOT_RESCALED: Edits = (("l_r[h] = QK_FADD(QK_FMUL(l_r[h], corr), ps);", "l_r[h] = QK_FADD(l_r[h], ps);"),)
# the sink's initial 1 in every lane's partial sum (counted four times)
FLASH_SINK_PER_LANE: Edits = (("l_r[h] = sink_mode && t == 0 ? 1.0f : 0.0f;", "l_r[h] = sink_mode ? 1.0f : 0.0f;"),)


# The session-10 kernel qk_gqa_prefill2_h<H> (head_size 64 / 128, no softcap, no bias): coverage 1
# reaches it through core-1x4x0x2x1x64 (a first prompt of 4 tokens, 2 query heads of one KV head:
# one CTA for both heads); coverage 2 adds first prompts of 48 / 128 tokens and chunks over pasts of
# 128 / 256 / 300 rows (several key blocks). The four rows above stay on the session-8 kernels
# (their catching case has a softcap and a bias).
# the diagonal block taken as whole: the causal mask skipped where it is needed
FLASH2_DIAGONAL_UNMASKED: Edits = (
    ("const bool whole = j0 >= in_lo && j0 + QK_FL_BN <= in_end;", "const bool whole = j0 >= in_lo;"),
)
# the running sum and accumulator not rescaled when the second key block raises the max
FLASH2_SECOND_RESCALE_SKIPPED: Edits = (
    (
        "const float rs = empty ? 1.0f : qk_fl2_exp2(QK_FADD(m2[h], -m2_new));",
        "const float rs = empty || jb == jb0 + 1 ? 1.0f : qk_fl2_exp2(QK_FADD(m2[h], -m2_new));",
    ),
)
# every head of a CTA attends with (and writes) the first head's queries
FLASH2_ONE_HEAD: Edits = (("n = head0 + grp / per, b", "n = head0, b"),)
# the scale not folded with log2(e): base-2 exponent of the natural-log argument
FLASH2_NO_LOG2E: Edits = (("const float c2 = (float)((double)alpha * QK_FL2_LOG2E);", "const float c2 = alpha;"),)
# K fragments read from the tile without the chunk swizzle (the ldmatrix path)
FLASH2_K_UNSWIZZLED: Edits = (
    (
        "qk_fl2_at<H>(n0 + ((lane >> 4) & 1) * 8 + (lane & 7), (k0 >> 3) + ((lane >> 3) & 1))",
        "(n0 + ((lane >> 4) & 1) * 8 + (lane & 7)) * H + k0 + ((lane >> 3) & 1) * 8",
    ),
)

# the launch order's head block taken as the first head (heads overlap, some never written)
FLASH2_HEAD_BLOCK_AS_HEAD: Edits = (("const int head0 = (rem / width) * hpc,", "const int head0 = (rem / width),"),)

# qk_gqa_append8 (ort/gqa.hip, the flash path's append): a 4-bit cache's pair packed with element
# 2i in the high nibble (qk_gqa_append and the oracle: the low one)
APPEND8_NIBBLES_SWAPPED: Edits = (("(q[k] + 8) | ((q[k + 1] + 8) << 4)", "(q[k + 1] + 8) | ((q[k] + 8) << 4)"),)


def _flash(
    name: str, leaf: str, edits: Edits, coverage: int = 1, define: str = "", caught_by: str | None = "matches_oracle"
) -> DeviceMutant:
    return DeviceMutant(
        name, "ort/gqa_flash.hip", "", define, "gqa_prefill", caught_by, leaf=leaf, coverage=coverage, edits=edits,
        contract="storage=fp16",
    )  # fmt: skip


GQA_FLASH_MUTANTS = (
    _flash("gqa flash: causal limit one key late with a past", "Xfp16_Wfp16_Yfp16", FLASH_CAUSAL_PAST),
    _flash("gqa flash: window of W + 1 keys", "Xfp32_Wfp32_Yfp32", FLASH_WINDOW_W1),
    _flash("gqa flash: running sum not rescaled", "Xfp16_Wi8_Yfp16", FLASH_SUM_NOT_RESCALED),
    _flash("gqa flash: sink in every lane's sum", "Xfp16_Wu4_Yfp16", FLASH_SINK_PER_LANE),
    _flash("gqa flash v2: diagonal tile unmasked", "Xfp16_Wfp16_Yfp16", FLASH2_DIAGONAL_UNMASKED),
    _flash("gqa flash v2: rescale skipped on the second K tile", "Xfp16_Wfp16_Yfp16", FLASH2_SECOND_RESCALE_SKIPPED, 2),
    _flash("gqa flash v2: every head of a CTA takes the first head's queries", "Xfp32_Wfp32_Yfp32", FLASH2_ONE_HEAD),
    _flash("gqa flash v2: exp2 without log2(e) in the folded scale", "Xfp16_Wi8_Yfp16", FLASH2_NO_LOG2E),
    _flash("gqa flash v2: K fragments read unswizzled", "Xfp16_Wu4_Yfp16", FLASH2_K_UNSWIZZLED),
    _flash("gqa flash v2: launch order's head block taken as the first head", "Xfp16_Wfp16_Yfp16",
           FLASH2_HEAD_BLOCK_AS_HEAD, 2),
    DeviceMutant(
        "gqa flash append8: 4-bit pair with element 2i in the high nibble", "ort/gqa.hip", "", "", "gqa_prefill",
        "matches_oracle", leaf="Xfp16_Wu4_Yfp16", edits=APPEND8_NIBBLES_SWAPPED, contract="storage=fp16",
    ),
    _flash("control: gqa flash V1 build (-DQK_GQA_PREFILL_V1) on every case", "Xfp16_Wfp16_Yfp16", (), 2,
           "-DQK_GQA_PREFILL_V1", None),
)  # fmt: skip
# ort/gqa.hip (gqa_decode, gqa_prefill; --impl cupy). Coverage 1 has a chunk of a prefill with a
# past (5 rows, 4 new tokens, window 3, softcap and a full bias), a decode with interleaved rotary,
# window 4, softcap and bias, and rotary (half split) on every quantized leaf.
# the causal limit one key past the query's own when there is a past (a chunk sees a future key)
GQA_CAUSAL_PAST: Edits = (
    (
        "const qk_i64 L = past + s + 1 < total ? past + s + 1 : total;",
        "const qk_i64 L = past + s + 1 + (past > 0) < total ? past + s + 1 + (past > 0) : total;",
    ),
)
# a local window of W + 1 keys (ORT before PR#25927)
GQA_WINDOW_W1: Edits = (
    (
        "const qk_i64 lo = (window >= 1 && L > window) ? L - window : 0;",
        "const qk_i64 lo = (window >= 1 && L > window + 1) ? L - window - 1 : 0;",
    ),
)
# rotary pairs of the other layout: interleaved read as half split and back
GQA_ROTARY_SWAPPED: Edits = (
    ("    if (interleaved) {\n        p.i = e >> 1;", "    if (!interleaved) {\n        p.i = e >> 1;"),
    ("p.ib = interleaved ? p.ia + 1 : p.ia + rd / 2;", "p.ib = !interleaved ? p.ia + 1 : p.ia + rd / 2;"),
)
# softcap applied to the biased score
GQA_SOFTCAP_AFTER_BIAS: Edits = (
    (
        "    if (softcap > 0.0f) x = QK_FMUL(tanhf(QK_FDIV(x, softcap)), softcap);\n"
        "    if (bias) x = QK_FADD(x, qk_load_f(bias, bi, is16));",
        "    if (bias) x = QK_FADD(x, qk_load_f(bias, bi, is16));\n"
        "    if (softcap > 0.0f) x = QK_FMUL(tanhf(QK_FDIV(x, softcap)), softcap);",
    ),
)
# the combine's split order flips with a call counter (as if the number of splits changed between
# calls): every output within its bound, the low bits not repeatable. The repeat property's small
# sets (coverage 1's, up to 9 keys) fit one split; its cold sets (about 14k keys on an H200: tens
# of splits of the flash kernels, 110 of the legacy ones) catch it
GQA_COMBINE_BY_CALL: Edits = (
    (
        "__device__ __forceinline__ float qk_gqa_neg_inf()",
        "__device__ unsigned qk_gqa_calls;\n__device__ __forceinline__ float qk_gqa_neg_inf()",
    ),
    (
        "    const qk_i64 heads = N + 2 * Nk, half_h = H / 2;\n",
        "    const qk_i64 heads = N + 2 * Nk, half_h = H / 2;\n    if (t == 0) atomicAdd(&qk_gqa_calls, 1u);\n",
    ),
    (  # the append every split-K call launches since session 11 (qk_gqa_append8; qk_gqa_append where H % 8)
        "    const int chunks = (int)H / 8, heads = (int)(N + 2 * Nk);\n",
        "    const int chunks = (int)H / 8, heads = (int)(N + 2 * Nk);\n"
        "    if (blockIdx.x == 0 && blockIdx.y == 0 && threadIdx.x == 0) atomicAdd(&qk_gqa_calls, 1u);\n",
    ),
    (
        "const int sp = sp0 + u;",
        "const int sp = ((qk_gqa_calls >> 2) & 1u) ? splits - 1 - (sp0 + u) : sp0 + u;",
    ),
)
# the new K quantized before rotary: the rotation applied to the dequantized codes, then quantized again
# the flash kernel's lane groups merged without the shift exp(m_rg - M) of their running max
GQA_MERGE_UNSHIFTED: Edits = (
    (
        "const float f = empty ? -1.0f : expf(QK_FADD(mr, -M));",
        "const float f = empty ? -1.0f : 1.0f;",
    ),
)
# the matrix-unit kernels (qk_gqa_mma_*: fp16 queries, fp16 / int8 per-tensor caches, head sizes
# 16..128, so every coverage-1 case of these leaves but the per-channel ones; tests/test_gqa_mma_model.py
# checks the first two catches on a lane-level model): P's lo fp16 half dropped (p kept to 11 bits:
# caught by the int8 prefill's ties case, 2.9x its bound in the model)
GQA_MMA_LO_DROPPED: Edits = (("            pa[2 * half + 1] = lo2;", "            pa[2 * half + 1] = 0u * lo2;"),)
# the V fragment's key pairs (2t, 2t + 1) and (8 + 2t, 9 + 2t) swapped
GQA_MMA_V_SWAPPED: Edits = (
    (
        "            qk_mma_16816(acc[jn], pa, bf);",
        "            const qk_u32 sw = bf[0];\n            bf[0] = bf[1];\n            bf[1] = sw;\n"
        "            qk_mma_16816(acc[jn], pa, bf);",
    ),
)
# the int8 dot of the codes not multiplied by the K scale (scores 127 / 4 times too large)
GQA_MMA_NO_K_SCALE: Edits = (("dk = QK_FMUL(dk, ks0);", "dk = QK_FMUL(dk, 1.0f + 0.0f * ks0);"),)
# the four groups merged without their shift exp(m_g - M): a split needs keys in two groups (more
# than 16), so coverage 2 (100..600 keys of the real models' heads)
GQA_MMA_MERGE_UNSHIFTED: Edits = (
    (
        "const float f = empty ? -1.0f : expf(QK_FADD(mg, -M)); /* group r's shift */",
        "const float f = empty ? -1.0f : 1.0f;",
    ),
)
GQA_QUANT_BEFORE_ROTARY: Edits = (
    (
        "const float ka = qk_load_f(base, src + p.ia, is16), kb = qk_load_f(base, src + p.ib, is16);",
        "float ka = qk_load_f(base, src + p.ia, is16), kb = qk_load_f(base, src + p.ib, is16);\n"
        "            if (bits) {\n"
        "                const float sa = k_scale[per_channel ? kv * H + p.ia : 0];\n"
        "                const float sb = k_scale[per_channel ? kv * H + p.ib : 0];\n"
        "                const int lo = bits == 8 ? -128 : -8, hi = bits == 8 ? 127 : 7;\n"
        "                ka = QK_FMUL((float)qk_gqa_quantize(ka, QK_FDIV(1.0f, sa), lo, hi), sa);\n"
        "                kb = QK_FMUL((float)qk_gqa_quantize(kb, QK_FDIV(1.0f, sb), lo, hi), sb);\n"
        "            }",
    ),
    (  # the decode's rows appended by the mma kernels (session 11): the same error there
        "kv[j] = qk_gqa_new_value(base, src, i % HD, rotate && !isv, rotary_dim, interleaved, cos_cache,\n"
        "                                         sin_cache, pos, 1);",
        "kv[j] = qk_gqa_new_value(base, src, i % HD, rotate && !isv, rotary_dim, interleaved, cos_cache,\n"
        "                                         sin_cache, pos, 1);\n"
        "                const int e = i % HD;\n"
        "                if (KIND == 2 && !isv && rotate && e < rotary_dim) {\n"
        "                    const qk_gqa_pair p = qk_gqa_pair_of(e, rotary_dim, interleaved);\n"
        "                    const qk_i64 cs = pos * (rotary_dim / 2) + p.i;\n"
        "                    const float sk = k_scale[0];\n"
        "                    const float ka = QK_FMUL((float)qk_gqa_quantize(qk_load_f(base, src + p.ia, 1),\n"
        "                                             QK_FDIV(1.0f, sk), -128, 127), sk);\n"
        "                    const float kb = QK_FMUL((float)qk_gqa_quantize(qk_load_f(base, src + p.ib, 1),\n"
        "                                             QK_FDIV(1.0f, sk), -128, 127), sk);\n"
        "                    kv[j] = qk_gqa_rotate(ka, kb, qk_load_f(cos_cache, cs, 1), qk_load_f(sin_cache, cs, 1),\n"
        "                                          p.second, 1);\n"
        "                }",
    ),
)


# the folded combine's tickets left at the split count after a call: later calls never elect a combiner
GQA_FOLD_NO_RESET: Edits = (("if (c_last) *t = 0u;", "if (c_last) *t = 1u << 30;"),)
# the folded append's new K row stored as the input (no rotary), the queries still rotated
GQA_FOLD_K_UNROTATED: Edits = (("rotate && !isv, rotary_dim", "0, rotary_dim"),)
# the folded append's rotary (queries and K) at position past + 1
GQA_FOLD_POS_LATE: Edits = (
    ("qk_gqa_position(position_ids, pid_stride, b, 0, past, first_prompt)",
     "qk_gqa_position(position_ids, pid_stride, b, 0, past + 1, first_prompt)"),
)  # fmt: skip
# the folded combine's l without the sink's exp(sink - M)
GQA_FOLD_NO_SINK: Edits = (("l = QK_FADD(l, expf(QK_FADD(sigma, -c_M[tid])));", "l = QK_FADD(l, 0.0f * sigma);"),)
# the folded combine's 16-byte pieces read at channel q of a head row, not 4 q (overlapping pieces)
GQA_FOLD_PIECE_STRIDE: Edits = (("* HD + (idx % Q4) * 4;", "* HD + (idx % Q4);"),)


def _gqa(name: str, op: str, leaf: str, edits: Edits, caught_by: str | None = "matches_oracle") -> DeviceMutant:
    options = "-DQK_GQA_DECODE_SIMT" if "DECODE_SIMT" in name else ("-DQK_MMA_EMULATE" if "portable" in name else "")
    return DeviceMutant(name, "ort/gqa.hip", "", options, op, caught_by, leaf=leaf, edits=edits)


GQA_MUTANTS = (
    _gqa("gqa: causal limit one key late with a past", "gqa_prefill", "Xfp16_Wfp16_Yfp16", GQA_CAUSAL_PAST),
    _gqa("gqa: window of W + 1 keys", "gqa_prefill", "Xfp32_Wfp32_Yfp32", GQA_WINDOW_W1),
    _gqa("gqa: rotary interleaving swapped", "gqa_decode", "Xfp16_Wfp16_Yfp16", GQA_ROTARY_SWAPPED),
    _gqa("gqa: softcap after the bias", "gqa_decode", "Xfp32_Wfp32_Yfp32", GQA_SOFTCAP_AFTER_BIAS),
    _gqa(
        "gqa: split combine order flips with a call counter",
        "gqa_decode",
        "Xfp32_Wfp32_Yfp32",
        GQA_COMBINE_BY_CALL,
        caught_by="repeatable",
    ),
    _gqa("gqa: K cache quantized before rotary", "gqa_decode", "Xfp16_Wi8_Yfp16", GQA_QUANT_BEFORE_ROTARY),
    _gqa("gqa: flash lane groups merged unshifted", "gqa_decode", "Xfp32_Wfp32_Yfp32", GQA_MERGE_UNSHIFTED),
    _gqa("gqa mma: P lo half dropped", "gqa_prefill", "Xfp16_Wi8_Yfp16", GQA_MMA_LO_DROPPED),
    _gqa("gqa mma: V fragment's two key pairs swapped", "gqa_decode", "Xfp16_Wfp16_Yfp16", GQA_MMA_V_SWAPPED),
    _gqa("gqa mma: int8 K scale left off the scores", "gqa_decode", "Xfp16_Wi8_Yfp16", GQA_MMA_NO_K_SCALE),
    DeviceMutant("gqa mma: groups merged unshifted", "ort/gqa.hip", "", "", "gqa_decode", "matches_oracle",
                 leaf="Xfp16_Wfp16_Yfp16", coverage=2, edits=GQA_MMA_MERGE_UNSHIFTED),
    DeviceMutant("gqa mma folded combine (-DQK_GQA_COMBINE_FOLD): tickets never reset (only the first call combines)",
                 "ort/gqa.hip", "", "-DQK_GQA_COMBINE_FOLD", "gqa_decode", "matches_oracle", leaf="Xfp16_Wfp16_Yfp16",
                 edits=GQA_FOLD_NO_RESET),
    DeviceMutant("gqa mma folded combine (-DQK_GQA_COMBINE_FOLD): the sink left out of l", "ort/gqa.hip", "",
                 "-DQK_GQA_COMBINE_FOLD", "gqa_decode", "matches_oracle", leaf="Xfp16_Wfp16_Yfp16", coverage=2,
                 edits=GQA_FOLD_NO_SINK),
    DeviceMutant("gqa mma folded combine (-DQK_GQA_COMBINE_FOLD): 4-channel pieces at channel q, not 4 q",
                 "ort/gqa.hip", "", "-DQK_GQA_COMBINE_FOLD", "gqa_decode", "matches_oracle", leaf="Xfp16_Wfp16_Yfp16",
                 edits=GQA_FOLD_PIECE_STRIDE),
    DeviceMutant("gqa mma folded append: the new K row not rotated", "ort/gqa.hip", "", "", "gqa_decode",
                 "matches_oracle", leaf="Xfp16_Wfp16_Yfp16", edits=GQA_FOLD_K_UNROTATED),
    DeviceMutant("gqa mma folded append: rotary one position late", "ort/gqa.hip", "", "", "gqa_decode",
                 "matches_oracle", leaf="Xfp16_Wfp16_Yfp16", coverage=2, edits=GQA_FOLD_POS_LATE),
    DeviceMutant("control: gqa mma decode in three launches (session 10), int8", "ort/gqa.hip", "",
                 "-DQK_GQA_APPEND_V1 -DQK_GQA_COMBINE_LAUNCH", "gqa_decode", None, leaf="Xfp16_Wi8_Yfp16"),
    DeviceMutant("control: gqa mma decode in one launch (-DQK_GQA_COMBINE_FOLD), int8", "ort/gqa.hip", "",
                 "-DQK_GQA_COMBINE_FOLD", "gqa_decode", None, leaf="Xfp16_Wi8_Yfp16"),
    _gqa("control: gqa SIMT decode kernels (-DQK_GQA_DECODE_SIMT), fp16", "gqa_decode", "Xfp16_Wfp16_Yfp16", (),
         caught_by=None),
    _gqa("control: gqa mma on the portable mma (shuffles), int8", "gqa_decode", "Xfp16_Wi8_Yfp16", (),
         caught_by=None),
)  # fmt: skip
ALL = (
    HIP_MUTANTS
    + SO_MUTANTS
    + ORT_MUTANTS
    + QMOE_MUTANTS
    + BNB_MUTANTS
    + GGML_FN_MUTANTS
    + KEEP_QUANT_FAST_MUTANTS
    + GQA_MUTANTS
    + GQA_FLASH_MUTANTS
)


def impl_spec(m: DeviceMutant, built: dict[str, Path], source: Path | None = None) -> str:
    """The --impl string for a mutant; ``built`` maps so: sources to their compiled libraries,
    ``source`` is the hip: file to load (default ``m.path()``; a patched mutant's copy)."""
    if m.is_own:
        return "cupy"
    if m.is_so:
        return f"so:{built[m.source]}:{m.symbol}"
    return f"hip:{source or m.path()}:{m.symbol}{m.options}"


def build_all(out_dir: Path) -> dict[str, Path]:
    """Compile every so: source for this machine's GPU."""
    from qconform.device.loader import device_info
    from qconform.device.solib import build_launcher

    info = device_info()
    vendor = "amd" if info.is_hip else "nvidia"
    built = {}
    for m in SO_MUTANTS:
        if m.source not in built:
            lib = out_dir / (Path(m.source).stem + ".so")
            built[m.source] = build_launcher(m.path(), lib, vendor=vendor, arch=info.arch)
    return built


def run_mutant(m: DeviceMutant, built: dict[str, Path], coverage: int = 1):
    """Run the suite on one mutant; returns the LeafResult."""
    from qconform.impls import load_impl
    from qconform.ops import get_op
    from qconform.properties.checks import Prepared
    from qconform.properties.suite import run_leaf

    op = get_op(m.op)
    with m.loaded_source() as source, contextlib.ExitStack() as stack:
        impl = load_impl(impl_spec(m, built, source), [m.op], m.contract or None)
        leaf = m.leaf or op.leaves[0].name
        prepared = [Prepared.from_case(op, c, impl) for c in op.cases(leaf, max(coverage, m.coverage))]
        # the cold (larger than L2) sets only where the row is about repeat calls: their oracle
        # runs take most of a row's time, and the other properties are decided on the case sets
        cold = m.caught_by in (None, "repeatable")
        if not m.is_own:
            return run_leaf(impl, op, leaf, prepared, cold=cold)
        from qconform.device import launchers

        override = {m.source: source} if m.edits else {}
        override |= {name: stack.enter_context(patch.materialised()) for name, patch in m.beside_patches()}
        with launchers.compile_options(*m.options.split()), launchers.source_override(override):
            return run_leaf(impl, op, leaf, prepared, cold=cold)


def context_lost() -> str:
    """Why the process's device context is unusable ("" when it works): a kernel that faulted (an
    illegal address) leaves a sticky error, and every later launch of the process fails with it, so
    a mutant row run after it would be "caught" by the fault, not by a property."""
    import cupy

    try:
        cupy.cuda.runtime.deviceSynchronize()
        if int(cupy.arange(3, dtype=cupy.int32).sum()) != 3:
            return "a probe kernel answered wrongly"
    except Exception as exc:  # noqa: BLE001 - any driver or runtime error means the context is gone
        return f"{type(exc).__name__}: {exc}"
    return ""


UNBUILT = f"raised {CompileError.__name__}: "  # an outcome of a call whose kernel source did not compile


def verdict(m: DeviceMutant, result) -> tuple[bool, str]:
    """(as expected, what happened) for one mutant's LeafResult; a row whose patched source did not
    compile is never "caught" (its properties fail on the compile error, not on the broken rule)."""
    unbuilt = [o for o in result.outcomes if UNBUILT in o.detail]
    if unbuilt:
        return False, f"did not compile: {unbuilt[0].detail[:300]}"
    failed = sorted({o.prop for o in result.failed})
    pending = [o for o in result.outcomes if o.prop == "survives_pending_error"]
    warned = any("WARNING" in o.detail for o in pending)
    if m.caught_by is None:
        ok = not failed and (warned == m.warning)
        what = "passed" + (" with a warning" if warned else "") if not failed else f"failed {failed}"
        return ok, what
    return m.caught_by in failed, f"failed {failed}" if failed else "passed (MISSED)"


def write_sources(directory: Path) -> list[Path]:
    """Write every patched kernel source the suite loads, each as ``directory/<name>/<file>`` beside
    copies of the headers of its folder and a file ``options`` holding the row's -D build options
    (for the offline compile gate, which builds the copy with them); returns the sources' paths."""
    paths = []
    for m in ALL:
        defines = " ".join(o for o in m.options.split() if o.startswith("-D")) + "\n"
        patches = [(m.slug, m.patch())] if m.edits else []
        patches += [(f"{m.slug}--{Path(name).stem}", patch) for name, patch in m.beside_patches()]
        for folder, patch in patches:  # a folder each (the beside sources: the row's slug and their stem)
            paths.append(patch.write(directory / folder))
            (directory / folder / "options").write_text(defines)
    return paths


def chosen_rows(only: list[str] | None = None, family: str | None = None) -> list[DeviceMutant]:
    """The rows of ``ALL`` whose name contains one of ``only`` (None: every row) and whose op is of
    ``family`` (``--family``, as ``ci/device.sh mutants FAMILY``; None: every family)."""
    from qconform.cli import UsageError
    from qconform.ops import get_op

    families = sorted({get_op(m.op).family for m in ALL})
    if family is not None and family not in families:
        raise UsageError(f"--family: no device mutant of family {family!r}; families: {', '.join(families)}")
    return [
        m
        for m in ALL
        if (only is None or any(text in m.name for text in only)) and family in (None, get_op(m.op).family)
    ]


def shard_rows(rows: list[DeviceMutant], spec: str) -> list[DeviceMutant]:
    """``--shard i/n`` (1-based, the rule of ``qconform run --shard``): every n-th row from the i-th,
    so the n parts of ci/device.sh take every row once."""
    from qconform.cli import parse_shard

    i, n = parse_shard(spec)
    return rows[i - 1 :: n]


def main(argv: list[str]) -> int:
    import argparse

    parser = argparse.ArgumentParser(description="Run the device mutants and controls (a GPU), or write sources.")
    parser.add_argument("--write-sources", metavar="DIR", type=Path, help="only write the patched kernel sources")
    parser.add_argument(
        "--only", metavar="TEXT", action="append", help="only the rows whose name contains TEXT (repeatable: any)"
    )
    parser.add_argument("--family", help="only the rows of this family's ops (ort, ggml, bnb)")
    parser.add_argument("--shard", metavar="I/N", default="1/1", help="only every N-th row from the I-th (1-based)")
    parser.add_argument("--rows", help=argparse.SUPPRESS)  # indices into ALL: a run continued in a fresh process
    args = parser.parse_args(argv)
    if args.write_sources is not None:
        for path in write_sources(args.write_sources):
            print(path)
        return 0
    from qconform.cli import UsageError

    if args.rows:
        rows = [ALL[int(i)] for i in args.rows.split(",")]
    else:
        print("| device mutant / control | expected | result | |")
        print("|---|---|---|---|", flush=True)
        try:
            rows = shard_rows(chosen_rows(args.only, args.family), args.shard)
        except UsageError as exc:
            parser.error(str(exc))
    as_expected = run_rows(rows)
    print(f"mutants and controls as expected: {as_expected}/{len(rows)}")
    return 0 if as_expected == len(rows) else 1


def run_rows(rows: list[DeviceMutant]) -> int:
    """Run the rows in order, printing each as it finishes (a cut-off run still shows them); how
    many went as expected. Where a row leaves the device context unusable (``context_lost``), the
    rest run in a fresh process (``--rows``), never in the broken one."""
    import tempfile

    as_expected = 0
    with tempfile.TemporaryDirectory() as tmp:
        built = build_all(Path(tmp))
        for k, m in enumerate(rows):
            ok, what = verdict(m, run_mutant(m, built))
            as_expected += ok
            expect = m.caught_by or ("pass, warning" if m.warning else "pass")
            print(f"| {m.name} | {expect} | {what} | {'ok' if ok else 'UNEXPECTED'} |", flush=True)
            rest = rows[k + 1 :]
            if rest and (why := context_lost()):
                print(f"(device context lost after this row: {why}; the rest in a fresh process)", flush=True)
                fresh, out = run_in_fresh_process(rest)
                print(out, end="", flush=True)
                return as_expected + fresh
    return as_expected


def run_in_fresh_process(rows: list[DeviceMutant]) -> tuple[int, str]:
    """Run the rows in a new process of this script (``--rows``: its own device context, never one a
    faulted row left unusable): how many went as expected (0 where the process printed no total) and
    what it printed."""
    import subprocess

    cmd = [sys.executable, __file__, "--rows", ",".join(str(ALL.index(r)) for r in rows)]
    out = subprocess.run(cmd, stdout=subprocess.PIPE, text=True, check=False).stdout
    found = re.search(r"^mutants and controls as expected: (\d+)/", out, re.M)
    return (int(found.group(1)) if found else 0), out


if __name__ == "__main__":
    sys.path.insert(0, str(REPO / "src"))
    sys.exit(main(sys.argv[1:]))
