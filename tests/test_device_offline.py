"""The device backend's parts that need no GPU: the kernel registry and launch geometry, the
hip: spec parser, the so: build command, the runtime-library scan, every symbol the
registry and the device mutants name existing in its source, and the mutants' patches applying
to the shipped kernels, which carry no hooks, and changing their CUDA device code (nvcc)."""

from __future__ import annotations

import re

import pytest
from cuda_ptx import HAVE_NVCC, cuda_ptx, edited_lines, emitted_lines, parallel_map
from device_catalogue import ALL, RING_TRANSPOSE, chosen_rows, shard_rows, verdict, write_sources

from qconform.device.errstate import mapped_runtimes
from qconform.device.patch import Patch, PatchError, apply_edits
from qconform.device.registry import (
    COMMON_DIR,
    KERNEL_DIR,
    KERNELS,
    TOOL_KERNELS,
    Geometry,
    Launch,
    check_grid,
    kernel_for,
    parse_impl_spec,
)
from qconform.device.solib import build_command
from qconform.errors import ArgumentError
from qconform.ops import CATALOGUE


def _kernel_symbols(text: str) -> set[str]:
    bounds = r"(?: __launch_bounds__\([^)]*\))?"
    return set(re.findall(r'extern "C" __global__ void' + bounds + r"\s+(?!__launch_bounds__)(\w+)\(", text))


def _mma_instances(text: str) -> set[str]:
    """The matrix-unit kernels a source instantiates through QK_NBITS_MMA(BITS, R, T, P, O),
    QK_NBITS_MMAA(BITS, R, S) and QK_NBITS_MMAA_O(BITS, R, S, O) (the fp16-A ring kernel and its
    fp32-A twin qk_nbits_mmaf; _o{O} ending the bounded ones' symbols)."""
    bits = re.findall(r"^QK_NBITS_MMA_BITS\((\d)\)", text, re.M)
    general = re.findall(r"QK_NBITS_MMA\(BITS, (\d+), (\d+), (\d+), (\d+)\)", text)
    ring = re.findall(r"QK_NBITS_MMAA\(BITS, (\d+), (\d+)\)", text)
    ring += [(r, s + "_o" + o) for r, s, o in re.findall(r"QK_NBITS_MMAA_O\(BITS, (\d+), (\d+), (\d+)\)", text)]
    return {f"qk_nbits_mma_u{b}_r{r}_t{t}_p{p}_o{o}" for r, t, p, o in general for b in bits} | {
        f"qk_nbits_mma{kind}_u{b}_r{r}_s{s}" for r, s in ring for b in bits for kind in ("a", "f")
    }


def _gemm_instances(text: str) -> set[str]:
    """The prefill GEMMs a source instantiates through QK_NBITS_GEMM(BITS, R, WN, WM, S) and
    QK_NBITS_GEMM_Z (the same and its packed-zero-point twin, ending _z) x QK_NBITS_GEMM_BITS(BITS)."""
    bits = re.findall(r"^QK_NBITS_GEMM_BITS\((\d)\)", text, re.M)
    tiles = re.findall(r"QK_NBITS_GEMM(_Z)?\(BITS, (\d+), (\d+), (\d+), (\d+)\)", text)
    return {
        f"qk_nbits_gemm_u{b}_r{r}_n{wn}_m{wm}_s{st}{suffix}"
        for z, r, wn, wm, st in tiles
        for b in bits
        for suffix in (("", "_z") if z else ("",))
    }


def _wgmma_instances(text: str) -> set[str]:
    """The wgmma prefill GEMMs a source instantiates through QK_NBITS_WGMMA(BITS, S) and
    QK_NBITS_WGMMA_FOLD(BITS, S) (symbols qk_nbits_wgmma_u{BITS}_s{S}; qk_nbits_wgmma_fold_u{BITS}_s{S}
    and its tail-split form qk_nbits_wgmma_fold_split_u{BITS}_s{S}): the default zero point's and its
    packed-zero-point twin (ending _z)."""
    found = re.findall(r"^QK_NBITS_WGMMA(_FOLD)?\((\d), (\d)\)", text, re.M)
    forms = {"": ("",), "_FOLD": ("_fold", "_fold_split")}
    return {f"qk_nbits_wgmma{form}_u{b}_s{st}{z}" for f, b, st in found for form in forms[f] for z in ("", "_z")}


def _kq_instances(text: str) -> set[str]:
    """The keep-quant GEMVs a source instantiates through KQ_GEMV(NAME, ...) x KQ_GEMV_ALL(MT)."""
    names = re.findall(r"KQ_GEMV\((\w+), [^()]*MT\)", text)
    tiles = re.findall(r"^KQ_GEMV_ALL\((\d)\)", text, re.M)
    # keep_quant_fast.hip: KF_GEMV(NAME, ..., MT, UNROLL, FN) x KF_GEMV_ALL(MT, UNROLL, UNROLL2)
    fast = re.findall(r"KF_GEMV\((\w+), [^()]*MT, UNROLL[,)]", text)
    fast_tiles = re.findall(r"^KF_GEMV_ALL\((\d), \d, \w+\)", text, re.M)
    return {f"qk_kq_gemv_{n}_m{t}" for n in names for t in tiles} | {
        f"qk_kq_fast_{n}_m{t}" for n in fast for t in fast_tiles
    }


def _gqa_instances(text: str) -> set[str]:
    """The attention kernels a source instantiates: QK_GQA_FLASH(NAME, KIND, PC, WIDE, U) and
    QK_GQA_MMA(NAME, KIND, HD, KW, VW, C) (decode, gqa.hip), QK_GQA_PREFILL(NAME, H) and
    QK_GQA_PREFILL2(NAME, H) (flash prefill, gqa_flash.hip)."""
    return set(re.findall(r"^QK_GQA_(?:FLASH|MMA|PREFILL2?)\((\w+), ", text, re.M))


def _moe_instances(text: str) -> set[str]:
    """The grouped QMoE GEMMs a source instantiates through QK_MOE_GEMM(B), and the fc1 kernels through
    QK_MOE_FC1M(NAME, ZP) and QK_MOE_FC2M(NAME, ZP) (qmoe.hip)."""
    gemms = {f"qk_moe_gemm{fc}_u{b}" for b in re.findall(r"^QK_MOE_GEMM\((\d)\)", text, re.M) for fc in (1, 2)}
    return gemms | set(re.findall(r"^QK_MOE_FC[12]M\((\w+), ", text, re.M))


def test_every_registered_kernel_exists_in_its_source() -> None:
    """One registry lists every kernel of every family (a family may have none yet: oracle only);
    each symbol is defined in its source, and every extern "C" kernel of every shipped source is
    registered."""
    assert {k.family for k in KERNELS} <= {op.family for op in CATALOGUE.values()}
    for k in KERNELS:
        assert k.op in CATALOGUE
        text = k.path.read_text()
        instances = _mma_instances(text) | _gemm_instances(text) | _kq_instances(text) | _gqa_instances(text)
        instances |= _moe_instances(text) | _wgmma_instances(text)
        assert k.symbol in _kernel_symbols(text) | instances, k.symbol
    for source, symbol, _ in TOOL_KERNELS:
        assert symbol in _kernel_symbols((KERNEL_DIR / source).read_text()), symbol
    registered = {(k.source, k.symbol) for k in KERNELS} | {(src, sym) for src, sym, _ in TOOL_KERNELS}
    for path in sorted(KERNEL_DIR.glob("*/*.hip")):
        source = str(path.relative_to(KERNEL_DIR))
        code = re.sub(r"/\*.*?\*/|//[^\n]*", "", path.read_text(), flags=re.S)
        for symbol in _kernel_symbols(code):
            assert (source, symbol) in registered, f"{source}: {symbol} is not in the registry"


def test_kernels_name_leaves_of_their_op() -> None:
    """A kernel that covers only some of its op's leaves names them (the device suite runs those, the
    launcher declines the others); every kernel of one op names the same leaves."""
    for k in KERNELS:
        if k.leaves is not None:
            assert k.leaves and set(k.leaves) <= {lf.name for lf in CATALOGUE[k.op].leaves}, k.symbol
            assert {j.leaves for j in KERNELS if j.op == k.op} == {k.leaves}, k.op


def test_fake_quantize_kernel_names_every_integer_leaf() -> None:
    """``registry.FAKE_QUANTIZE_LEAVES`` (a literal, the registry imports no op) is exactly the catalogue's
    fake_quantize leaves of the types its ABI takes: a new integer leaf is not left out of the device suite."""
    from qconform.device.registry import FAKE_QUANTIZE_LEAVES
    from qconform.oracles.ort.qdq import FP8_TYPES

    integer = {lf.name for lf in CATALOGUE["fake_quantize"].leaves if lf.params["dtype"] not in FP8_TYPES}
    assert set(FAKE_QUANTIZE_LEAVES) == integer


def test_every_device_mutant_symbol_exists() -> None:
    for m in ALL:
        text = m.patch().text() if m.edits else m.path().read_text()
        if m.is_own:
            # its -D options reach every module the run builds: the family's other sources too (the
            # qk_nbits_gemm rows' -DQK_NBITS_NO_WGMMA acts in ort/nbits_wgmma.hip)
            text += (COMMON_DIR / "qk_portable.h").read_text()
            text += "".join(p.read_text() for p in sorted((KERNEL_DIR / m.source.split("/")[0]).glob("*.hip")))
            for define in m.options.split():
                assert define.startswith("-D") and define[2:] in text, m.name
        elif m.is_so:
            assert f"int {m.symbol}(" in text, m.name
        else:
            included = text + "".join(k.path.read_text() for k in KERNELS if f'"{k.source}"' in text)
            assert m.symbol in _kernel_symbols(included), m.name


HOOK_TOKENS = ("QK_MUT_", "QK_DIAG_", "QK_Q8K_ROUND", "QK_COOP_TIE_LOWER")


def test_shipped_kernels_carry_no_mutant_or_diagnostic_hooks() -> None:
    """Mutants and diagnostic builds are patches held by the tests and the bench (docs/architecture.md)."""
    sources = [p for p in sorted(KERNEL_DIR.rglob("*")) if p.suffix in (".hip", ".h", ".cu", ".cuh")]
    assert any(p.name == "nbits_mma.hip" for p in sources) and any(p.name == "q8_quant.hip" for p in sources)
    for path in sources:
        text = path.read_text()
        for token in HOOK_TOKENS:
            assert token not in text, f"{path.relative_to(KERNEL_DIR)}: {token}"


def _patches() -> list[tuple[str, Patch]]:
    """(name, patch) of every patched source (a row's own, then those beside it), in the order
    ``--write-sources`` writes them."""
    return [(m.name, p) for m in ALL for p in ([m.patch()] if m.edits else []) + [p for _, p in m.beside_patches()]]


def test_every_patch_applies_once_to_the_shipped_kernel() -> None:
    """Each device mutant given as a patch, and each bench diagnostic build, patches a shipped kernel
    whose current text holds every original snippet exactly once, and changes it: a kernel edit that
    breaks a patch fails here instead of the mutant silently testing the shipped kernel."""
    patches = _patches()
    assert {m.name for m in ALL if m.edits} >= {
        "ties away from zero",
        "coop ties to the higher index",
        "mma GEMV: last chunk reads the previous block's scale",
        "mma GEMV: activation pairs in swapped K slots",
        "mma GEMV: last K split not added",
    }
    for name, patch in patches:
        assert patch.source.resolve().is_relative_to(KERNEL_DIR.resolve()), name
        shipped = patch.source.read_text()
        for original, replacement in patch.edits:
            assert shipped.count(original) == 1, f"{name}: {original!r}"
            assert replacement != original, name
        text = patch.text()
        assert text != shipped, name
        assert not any(token in text for token in ("QK_MUT_", "QK_DIAG_")), name
    for m in ALL:  # the -D options left are build options of the shipped kernels, not hooks
        build = (
            "-DQK_MMA_DEFAULT_ONLY",
            "-DQK_MMA_EMULATE",
            "-DQK_MOE_LEGACY",
            "-DQK_NBITS_ZP_SUM_V1",
            "-DQK_GQA_PREFILL_V1",
            "-DQK_GQA_DECODE_SIMT",
            "-DQK_MOE_RAGGED_V1",
            "-DQK_BNB_CPU_SIMT",
            "-DQK_KQ_FAST_V1",
            "-DQK_MOE_GEMM_V1",
            "-DQK_GQA_COMBINE_FOLD",
            "-DQK_GQA_APPEND_V1",
            "-DQK_GQA_COMBINE_LAUNCH",
            "-DQK_GQA_APPEND_LAUNCH",
            "-DQK_MOE_FC1_SIMT",
            "-DQK_BNBM_TAB16",
            "-DQK_MOE_FC2_SIMT",
            "-DQK_NBITS_NO_WGMMA",
            "-DQK_KF_LOADS_FIRST",
            "-DQK_KF_TWO_LAUNCH",
            "-DQK_KF_STAGED",
            "-DQK_MOE_BIAS_AT_END",
        )
        assert all(o in build for o in m.options.split() if o.startswith("-D"))


def test_patch_rules_and_written_sources(tmp_path) -> None:
    """A snippet found 0 or 2 times is an error; --write-sources writes each patched kernel as a
    complete file beside copies of its folder's headers (the loader's -I of the source's folder)."""
    with pytest.raises(PatchError, match="occurs 0 times"):
        apply_edits("a b", (("c", "d"),))
    with pytest.raises(PatchError, match="occurs 2 times"):
        apply_edits("a a", (("a", "d"),))
    assert apply_edits("a b", (("a", "c"), ("c b", "e"))) == "e"
    written = write_sources(tmp_path)
    patches = _patches()
    assert len(written) == len(patches) == len({path.parent for path in written})
    for path, (name, patch) in zip(written, patches, strict=True):
        assert path.name == patch.source.name and path.read_text() == patch.text(), name
        for header in patch.source.parent.glob("*.h"):
            assert (path.parent / header.name).read_bytes() == header.read_bytes(), name
    for path in written:  # the row's -D options beside its copy: the compile gate builds it with them
        assert (path.parent / "options").is_file(), path
    kq = next(m for m in ALL if m.edits and "(-DQK_KQ_FAST_V1)" in m.name)
    assert (tmp_path / kq.slug / "options").read_text().split() == ["-DQK_KQ_FAST_V1"]
    ring = dict(patches)["ring GEMV: the quad transpose reads unswizzled slots"]
    with Patch(KERNEL_DIR / "ort/nbits_mma.hip", ring.edits).materialised() as path:
        assert path.read_text() == ring.text() and (path.parent / "ort_common.h").is_file()
    assert not path.exists()


def test_geometry_grid_rule() -> None:
    assert Geometry(8, 256).grid(1) == 1
    assert Geometry(8, 256).grid(32) == 1
    assert Geometry(8, 256).grid(33) == 2
    assert Geometry(1, 32).grid(65) == 3
    assert Geometry(64, 256).grid(5) == 2
    with pytest.raises(ArgumentError, match="over the 2147483647"):
        check_grid("q8_k_dequant", 2**40, Geometry(64, 256))


def test_kernel_for_variants() -> None:
    assert kernel_for("q8_k_quant").variant == "coop"
    assert kernel_for("q8_k_quant", "ref").symbol == "qk_q8_k_quant_ref"
    assert kernel_for("q8_0_quant", "ref").symbol == "qk_q8_0_quant"  # one kernel serves every variant
    with pytest.raises(ArgumentError, match="variants"):
        kernel_for("q8_k_quant", "fast")
    with pytest.raises(ArgumentError, match="no device kernel"):
        kernel_for("nope_quant")


def test_parse_impl_spec(tmp_path) -> None:
    src = tmp_path / "k.hip"
    src.write_text("")
    assert parse_impl_spec(f"hip:{src}:sym") == (src, "sym", Launch())
    got = parse_impl_spec(f"hip:{src}:sym:lanes=8:threads=64:grid=3:smem=0:opt=-DX=1:opt=-G:requires=bits==2")
    assert got == (src, "sym", Launch(8, 64, 3, 0, ("-DX=1", "-G"), "bits==2"))
    assert parse_impl_spec(f"so:{src}:f:requires=M<=8")[2] == Launch(requires="M<=8")
    for bad, rule in [
        (f"hip:{src}", "hip:path/file:symbol"),
        (f"hip:{src}:sym:lanes=0", "lanes must be a positive integer"),
        (f"hip:{src}:sym:warps=2", "options are lanes="),
        (f"so:{src}:f:lanes=2", "options are requires="),
        (f"hip:{tmp_path}/missing.hip:sym", "no such kernel source"),
        (f"so:{tmp_path}/missing.so:sym", "no such shared library"),
    ]:
        with pytest.raises(ArgumentError, match=rule):
            parse_impl_spec(bad)


def test_launch_geometry_from_the_abi() -> None:
    abi = CATALOGUE["matmul_nbits"].abi
    assert Launch().shape(abi, 7) == (1, 256)  # 7 outputs x 32 lanes
    assert Launch().shape(abi, 9) == (2, 256)
    assert Launch(lanes=1, threads=128).shape(abi, 300) == (3, 128)
    assert Launch(grid=5).shape(abi, 10**6) == (5, 256)
    with pytest.raises(ArgumentError, match="over the 2147483647"):
        Launch().shape(abi, 2**40)


def test_so_build_commands_share_the_runtime(tmp_path) -> None:
    nv = build_command(tmp_path / "a.cu", tmp_path / "a.so", vendor="nvidia", arch="sm_90")
    assert nv[0] == "nvcc" and ["--cudart", "shared"] == nv[nv.index("--cudart") : nv.index("--cudart") + 2]
    assert "-arch=sm_90" in nv and "-shared" in nv
    amd = build_command(tmp_path / "a.cu", tmp_path / "a.so", vendor="amd", arch="gfx90a")
    assert amd[0] == "hipcc" and "--offload-arch=gfx90a" in amd
    with pytest.raises(ArgumentError, match="vendor"):
        build_command(tmp_path / "a.cu", tmp_path / "a.so", vendor="intel", arch="x")


def test_mapped_runtimes_reads_the_maps_format() -> None:
    maps = "\n".join(
        [
            "7f00-7f10 r--p 00000000 08:01 11 /usr/lib/x86_64-linux-gnu/libc.so.6",
            "7f10-7f20 r-xp 00000000 08:01 12 /usr/local/cuda/lib64/libcudart.so.13.0.96",
            "7f20-7f30 r--p 00010000 08:01 12 /usr/local/cuda/lib64/libcudart.so.13.0.96",
            "7f30-7f40 rw-p 00000000 00:00 0 ",
            "7f40-7f50 r-xp 00000000 08:01 13 /opt/rocm/lib/libamdhip64.so.7",
            "7f50-7f60 r-xp 00000000 08:01 14 /opt/x/libcudart_static_helper.a",
        ]
    )
    assert mapped_runtimes(maps) == ["/usr/local/cuda/lib64/libcudart.so.13.0.96", "/opt/rocm/lib/libamdhip64.so.7"]
    assert mapped_runtimes("") == []


def test_every_mma_shape_is_instantiated() -> None:
    """Each MatMulNBits matrix-unit shape the launcher or the bench can pick is compiled."""
    from qconform.device.registry import KERNEL_DIR, MMA_DECODE_CANDIDATES, MMA_SHAPES

    text = (KERNEL_DIR / "ort/nbits_mma.hip").read_text()
    made = _mma_instances(text)
    default_only = text[text.index("#define QK_NBITS_MMA_BITS(BITS)") :]
    for shape in MMA_SHAPES.values():  # compiled with -DQK_MMA_DEFAULT_ONLY too
        if not shape.ring:
            macro = f"QK_NBITS_MMA(BITS, {shape.r}, {shape.t}, {shape.p}, {shape.o})"
        elif shape.o >= 2:
            macro = f"QK_NBITS_MMAA_O(BITS, {shape.r}, {shape.p}, {shape.o})"
        else:
            macro = f"QK_NBITS_MMAA(BITS, {shape.r}, {shape.p})"
        assert macro in default_only, shape
    for shape in (*MMA_SHAPES.values(), *MMA_DECODE_CANDIDATES):
        for bits in (2, 4):
            assert shape.symbol(bits) in made, shape


def test_ring_split_for_the_bench_shapes() -> None:
    """The ring decode kernel's K split (H200: 132 SMs, 227 KiB per CTA; r=2 s=3: 7680 bytes of ring
    per warp): 4 warps where that gives the launch 12 warps an SM (5120 x 17920 u2: 560 items, 20
    superchunks, 10 KiB staged; the lm_head's 3136 items), else 8 (17920 x 5120: 160 items, 70
    superchunks, activations not staged; 4 would give 4.8 warps an SM); a short K stops at 2
    superchunks per warp, shared memory at the CTA's limit; a ring that cannot fit one warp gives 0
    (the launcher then takes the general kernel)."""
    from qconform.device.registry import MMA_SHAPES, MmaShape

    shape = MMA_SHAPES["decode"]
    assert shape.ring and shape.ring_bytes() == 3 * 2 * 2 * 32 * 20
    per_cta = 227 * 1024
    assert shape.ring_split(560, 20, 10240, per_cta, 132) == 4
    assert shape.ring_split(3136, 20, 10240, per_cta, 132) == 4
    assert shape.ring_split(396, 20, 10240, per_cta, 132) == 4  # 396 x 4 = 12 x 132
    assert shape.ring_split(395, 20, 10240, per_cta, 132) == 8
    assert shape.ring_split(160, 70, 0, per_cta, 132) == 8  # 35 KiB of activations: read from L2
    assert shape.ring_split(160, 5, 0, per_cta, 132) == 2  # 5 superchunks: 2 per warp at most
    assert shape.ring_split(160, 70, 40 * 1024, 64 * 1024, 132) == 2  # 40 KiB + 4 rings pass 64 KiB
    assert MmaShape(r=2, t=1, p=64, ring=True).ring_split(560, 20, 10240, 48 * 1024, 132) == 0


def test_ring_tail_wave_choice() -> None:
    """The ring kernel's resident CTAs (H200: 228 KiB of shared memory an SM) and the tail-wave rule:
    5120 x 17920 at M 8 (560 CTAs of 4 warps, 30 KiB of rings each) fits 4 CTAs an SM at 128
    registers (528 slots: a last wave of 32 CTAs), so fewer_warps: 3 warps a CTA, 5 an SM at 128
    registers (660 slots: one wave); decode_wave (6 at 80: 792) where those would not fit; the
    lm_head's 3136 CTAs of 4 warps (5.9 waves on 528 slots) and 4096 x 14336's 448 (one wave) keep
    decode, as would 8-warp CTAs at 2 an SM (264 slots: 1.7 waves); exactly one wave is no tail."""
    from qconform.device.registry import fewer_warps, resident_ctas, tail_wave

    per_sm = 228 * 1024
    assert resident_ctas(4, 128, 30720, per_sm) == 4
    assert resident_ctas(4, 80, 30720, per_sm) == 6
    assert (fewer_warps(4), fewer_warps(8), fewer_warps(2), fewer_warps(1)) == (3, 6, 2, 1)
    assert resident_ctas(3, 128, 23040, per_sm) == 5 and not tail_wave(560, 5 * 132)
    assert resident_ctas(3, 128, 33280, per_sm) == 5  # 10 KiB of staged activations more (M 1)
    assert resident_ctas(4, 80, 41984, per_sm) == 5  # 10 KiB of staged activations more
    assert resident_ctas(8, 128, 61440, per_sm) == 2
    assert resident_ctas(1, 128, 7680, per_sm) == 16
    assert resident_ctas(1, 40, 7680, per_sm) == 26  # shared memory the limit: 26 x 8.5 KiB
    assert tail_wave(560, 4 * 132) and not tail_wave(560, 6 * 132)
    assert not tail_wave(3136, 4 * 132) and not tail_wave(448, 4 * 132) and not tail_wave(448, 2 * 132)
    assert not tail_wave(528, 528) and tail_wave(660, 528) and not tail_wave(661, 528)


def test_wgmma_tiles_count_the_launch() -> None:
    """The prefill GEMM's CTAs, as the launcher's grid makes them: 256 tokens (fold) or 128 a CTA, 128
    rows, each side rounded up (the fold kernel's 5120 x 17920 at M 2048: 8 x 140; a token and a row past
    a whole tile each add one)."""
    from qconform.device.registry import wgmma_tiles

    assert wgmma_tiles(2048, 17920, fold=True) == 8 * 140 and wgmma_tiles(2048, 17920) == 16 * 140
    assert wgmma_tiles(2049, 17921, fold=True) == 9 * 141 and wgmma_tiles(256, 128, fold=True) == 1


def test_fold_tail_split_fills_the_last_wave() -> None:
    """The fold kernels' tail split (qk_nbits_wgmma_fold_split where parts > 1): the whole waves' tiles kept,
    each tile of the part-empty last wave split over as many CTAs as fill it, at most 8 and one chunk a
    part. On 132 SMs, 5120 x 17920 at M 512 / 1024 / 2048 (280 / 560 / 1120 tiles of 80 chunks) leaves 16 /
    32 / 64 tiles to 8 / 4 / 2 parts; at M 4096 (2240: 128 left) and 4096 x 14336 at M 512 (224: 92 left)
    nothing is split, nor where the waves are whole or a tile has one chunk."""
    from qconform.device.registry import fold_launch_split, fold_tail_split

    assert [fold_tail_split(t, 80, 132) for t in (280, 560, 1120, 2240)] == [(264, 8), (528, 4), (1056, 2), (2240, 1)]
    assert fold_tail_split(224, 64, 132) == (224, 1) and fold_tail_split(264, 80, 132) == (264, 1)
    assert fold_tail_split(3, 1, 132) == (3, 1) and fold_tail_split(10, 3, 132) == (0, 3)
    # the launch's (tiles, full, parts) from M, N, K: 64-wide chunks, K rounded up (520: 9 chunks)
    assert fold_launch_split(512, 17920, 5120, 132) == (280, 264, 8)
    assert fold_launch_split(300, 8960, 512, 132) == (140, 132, 8) and fold_launch_split(300, 8960, 520, 132)[2] == 8
    assert fold_launch_split(256, 512, 130, 132) == (4, 0, 3) and fold_launch_split(272, 136, 64, 132) == (4, 4, 1)


def test_decode_shape_by_rows_per_sm() -> None:
    """16-row ring tiles when 32-row ones give an SM fewer than two: on 132 SMs 5120 and 4096 rows
    (160 and 128 tiles) take the narrow shape, 17920 and 14336 (560, 448) the wide one; the
    boundary is 264 tiles."""
    from qconform.device.registry import MMA_SHAPES, decode_shape

    wide, narrow = MMA_SHAPES["decode"], MMA_SHAPES["decode_narrow"]
    assert (wide.r, narrow.r) == (2, 1) and narrow.ring
    assert decode_shape(5120, 132) is narrow and decode_shape(4096, 132) is narrow
    assert decode_shape(17920, 132) is wide and decode_shape(14336, 132) is wide
    assert decode_shape(264 * 32, 132) is wide and decode_shape(263 * 32, 132) is narrow


def test_mma_k_split_keeps_one_wave() -> None:
    """The decode K split for 5120 x 17920 (r=2: 560 items of 32 rows, 80 chunks) on 132 SMs:
    with 126 registers (rounded to 128) a CTA of 2 warps fits 8 per SM (1056 >= 560 CTAs) and of 4
    warps only 4 (528 < 560), so 2; at 64 registers 4 warps fit 8 per SM and 8 warps 4 (528 < 560);
    a fixed wk is returned as is; at least 2p chunks per warp bound it for short K."""
    from qconform.device.registry import MmaShape

    shape = MmaShape(r=2, t=1, p=2, warps_per_sm=64)
    assert shape.k_split(560, 80, 126, 132) == 2
    assert shape.k_split(560, 80, 64, 132) == 4
    assert MmaShape(r=2, t=1, p=2, wk=8).k_split(560, 80, 126, 132) == 8
    assert shape.k_split(560, 7, 64, 132) == 1  # 7 chunks < 2 x 2 x 2
    assert MmaShape(r=2, t=1, p=2, warps_per_sm=16).k_split(560, 80, 64, 132) == 2  # 560 x 4 > 16 x 132


def test_mutant_shards_split_the_rows_once_each() -> None:
    """ci/device.sh runs the device mutants as ``--shard i/n`` processes: together they take every
    row once; a malformed shard is a usage error."""
    from qconform.cli import UsageError

    rows = list(ALL)
    for count in (1, 3, 8, len(rows) + 1):
        taken = [m.name for i in range(1, count + 1) for m in shard_rows(rows, f"{i}/{count}")]
        assert sorted(taken) == sorted(m.name for m in rows)
    for bad in ("0/3", "4/3", "-1/2", "1", "a/b", "1/0"):
        with pytest.raises(UsageError, match="--shard: must be i/n"):
            shard_rows(rows, bad)


def test_a_patched_source_that_does_not_compile_is_never_caught() -> None:
    """A device mutant row whose patched source fails to compile fails every property on the
    compile error, its expected one included: the row is reported as not compiled, not as caught;
    the same row failing its property on a kernel that compiled is caught."""
    from qconform.errors import CompileError
    from qconform.properties.checks import Outcome, _raised
    from qconform.properties.suite import LeafResult

    m = next(r for r in ALL if r.edits and r.caught_by)

    def result(detail: str) -> LeafResult:
        outcomes = [Outcome(p, m.op, "", "c", False, detail) for p in ("matches_oracle", "repeatable", m.caught_by)]
        return LeafResult(m.op, m.leaf or "", "sm_90", "cupy", outcomes)

    unbuilt = _raised(CompileError("compiling nbits_mma.hip failed:\nerror: expected ';'"))
    ok, what = verdict(m, result(unbuilt))
    assert not ok and what.startswith("did not compile: raised CompileError: compiling nbits_mma.hip"), what
    ok, what = verdict(m, result("output differs at element 3"))
    assert ok and what.startswith("failed ["), what


@pytest.mark.parametrize("child_ok", [1, 0])
def test_rows_after_a_lost_context_run_in_a_fresh_process(monkeypatch: pytest.MonkeyPatch, child_ok: int) -> None:
    """A row that faults the device (a sticky error) must not "catch" the rows after it: they go to
    a fresh ``--rows`` process, whose verdicts are the ones counted."""
    import subprocess

    import device_catalogue as dc

    rows = ALL[:3]
    probes = iter(["", "CUDADriverError: CUDA_ERROR_ILLEGAL_ADDRESS"])
    calls: list[list[str]] = []

    def child(cmd: list[str], **kwargs: object) -> subprocess.CompletedProcess:
        calls.append(cmd)
        out = f"| {rows[2].name} | x | y | ok |\nmutants and controls as expected: {child_ok}/1\n"
        return subprocess.CompletedProcess(cmd, 0, stdout=out)

    monkeypatch.setattr(dc, "build_all", lambda directory: {})
    monkeypatch.setattr(dc, "run_mutant", lambda m, built: None)
    monkeypatch.setattr(dc, "verdict", lambda m, result: (True, "as expected"))
    monkeypatch.setattr(dc, "context_lost", lambda: next(probes))
    monkeypatch.setattr(subprocess, "run", child)
    assert dc.run_rows(rows) == 2 + child_ok
    (cmd,) = calls
    assert cmd[-2:] == ["--rows", str(ALL.index(rows[2]))]


@pytest.mark.parametrize("child_ok", [1, 0])
def test_a_device_mutant_test_after_a_fault_runs_its_row_in_a_fresh_process(
    monkeypatch: pytest.MonkeyPatch, child_ok: int
) -> None:
    """pytest's test_device_mutant in a worker whose context an earlier row faulted: the row never runs
    in that context but in a fresh ``--rows`` process, whose verdict decides. Mutant: the former test,
    which failed every later row of the worker ("context lost") whatever the row did."""
    import subprocess

    import test_device as td

    m = ALL[1]
    calls: list[list[str]] = []

    def child(cmd: list[str], **kwargs: object) -> subprocess.CompletedProcess:
        calls.append(cmd)
        out = f"| {m.name} | x | y | ok |\nmutants and controls as expected: {child_ok}/1\n"
        return subprocess.CompletedProcess(cmd, 0, stdout=out)

    def in_lost_context(*args: object) -> None:
        raise AssertionError("a row ran in the lost context")

    def former(m: object, built: dict) -> None:
        assert not (why := td.context_lost()), f"the worker's device context was lost by an earlier test: {why}"

    monkeypatch.setattr(td, "context_lost", lambda: "CUDARuntimeError: cudaErrorMisalignedAddress")
    monkeypatch.setattr(td, "run_mutant", in_lost_context)
    monkeypatch.setattr(subprocess, "run", child)
    if child_ok:
        td.test_device_mutant(m, {})
        with pytest.raises(AssertionError, match="context was lost"):
            former(m, {})
    else:
        with pytest.raises(AssertionError, match="in a fresh process"):
            td.test_device_mutant(m, {})
    (cmd,) = calls
    assert cmd[-2:] == ["--rows", str(ALL.index(m))]


def test_prefill_gemm_tiles() -> None:
    """The prefill GEMM's tiles and shared memory (``qk_nbits_gemm``'s STAGE: per row 8 bits weight
    bytes, a scale word and with packed zero points a zero-point word, per token 72 halves; 4 stages;
    or the fp16 output tile of tokens x (rows + 8) halves): short (256 rows x 64 tokens) to M 64,
    long (128 x 128) beyond; u2 short 4 x (256 x 20 + 64 x 144) = 57344 bytes (its output tile 64 x
    264 x 2 = 33792), u4 long with packed zero points 4 x (128 x 40 + 128 x 144) = 94208; every tile
    shape within the H200's 227 KiB a CTA."""
    from qconform.device.registry import GEMM_CANDIDATES, GEMM_MIN_M, GEMM_SHAPES, gemm_shape

    short, long = GEMM_SHAPES["short"], GEMM_SHAPES["long"]
    assert gemm_shape(GEMM_MIN_M) is short and gemm_shape(64) is short and gemm_shape(65) is long
    assert (short.rows, short.tokens, short.threads) == (256, 64, 256)
    assert (long.rows, long.tokens, long.threads) == (128, 128, 256)
    assert short.smem(2) == 57344 and long.smem(4, packed=True) == 94208 and long.smem(2) == 83968
    assert short.symbol(2, packed=True) == "qk_nbits_gemm_u2_r4_n4_m2_s4_z"
    assert long.symbol(4) == "qk_nbits_gemm_u4_r4_n2_m4_s4"
    for shape in (*GEMM_SHAPES.values(), *GEMM_CANDIDATES):
        for bits in (2, 4):
            assert shape.tokens * (shape.rows + 8) * 2 <= shape.smem(bits) <= 227 * 1024, (shape, bits)


def test_the_launchers_storage_values_are_the_contracts() -> None:
    """A launcher's ``storage`` check (registry.STORAGE_TYPES) accepts exactly what a contract can declare."""
    from qconform.contracts import STORAGE
    from qconform.device.registry import STORAGE_TYPES

    assert STORAGE_TYPES == STORAGE


LAYOUT_PROBE = r"""
#include <stddef.h>
#include <stdio.h>
#include <cuda.h>
int main(void) {
    printf("%zu %zu %zu %zu\n", sizeof(CUlaunchAttribute), offsetof(CUlaunchAttribute, value),
           sizeof(CUlaunchConfig), offsetof(CUlaunchConfig, hStream));
    printf("%zu %zu %d\n", offsetof(CUlaunchConfig, attrs), offsetof(CUlaunchConfig, numAttrs),
           (int)CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION);
    return 0;
}
"""


def test_dependent_launch_structures_match_cuda_h(tmp_path) -> None:
    """qconform.device.pdl's ctypes CUlaunchAttribute / CUlaunchConfig have cuda.h's sizes and field
    offsets, and its attribute id is cuda.h's (a C probe nvcc builds with its toolkit's header);
    skipped without nvcc."""
    import ctypes
    import shutil
    import subprocess

    from qconform.device import pdl

    if shutil.which("nvcc") is None:
        pytest.skip("no nvcc (CUDA toolkit)")
    (tmp_path / "probe.c").write_text(LAYOUT_PROBE)
    subprocess.run(["nvcc", "-o", str(tmp_path / "probe"), str(tmp_path / "probe.c")], check=True)
    out = subprocess.run([str(tmp_path / "probe")], check=True, capture_output=True, text=True).stdout.split()
    attr_size, value_at, config_size, stream_at, attrs_at, num_at, attr_id = (int(v) for v in out)
    assert (ctypes.sizeof(pdl._Attribute), pdl._Attribute.value.offset) == (attr_size, value_at)
    assert ctypes.sizeof(pdl._Config) == config_size
    assert (pdl._Config.stream.offset, pdl._Config.attrs.offset, pdl._Config.num_attrs.offset) == (
        stream_at,
        attrs_at,
        num_at,
    )
    assert pdl.PROGRAMMATIC_STREAM_SERIALIZATION == attr_id


def test_mutant_families_split_the_rows_once_each() -> None:
    """``ci/device.sh mutants FAMILY`` runs ``--family FAMILY``: the families' rows together are every
    row once, each of its family; ``--only`` narrows within one; an unknown family is a usage error
    naming the families."""
    from qconform.cli import UsageError

    parts = {fam: chosen_rows(family=fam) for fam in ("ort", "ggml", "bnb")}
    assert sorted(m.name for rows in parts.values() for m in rows) == sorted(m.name for m in ALL)
    assert all(CATALOGUE[m.op].family == fam for fam, rows in parts.items() for m in rows)
    assert [m.name for m in chosen_rows(["bnb mma"], "bnb")] == [m.name for m in ALL if "bnb mma" in m.name]
    assert chosen_rows(["bnb mma"], "ort") == []
    with pytest.raises(UsageError, match="--family: no device mutant of family 'gguf'; families: bnb, ggml, ort"):
        chosen_rows(family="gguf")


def _dead_in_cuda(rows: list[tuple[str, Patch, tuple[str, ...]]]) -> list[str]:
    """The names of the rows whose patch leaves the sm_90 device code as shipped: every edit sits in
    code the CUDA build drops (an AMD or pre-sm_75 branch, a build option's other side, a function
    nothing calls there). A patch that changes a line the shipped build emits code from (its line
    table) is live without a build of its own; each other patch (one that changes only comments or
    whitespace too) is built and its PTX compared with the shipped build's. One -O0 build a
    source and define set instead of one a patch: about 135 builds fewer, 150-170 s -> 15 s of the CI's
    2-core pytest."""
    keys = sorted({(p.source, d) for _, p, d in rows})
    emitted = dict(zip(keys, parallel_map(lambda k: emitted_lines(*k), keys), strict=True))

    def unproven(row: tuple[str, Patch, tuple[str, ...]]) -> bool:
        lines = edited_lines(row[1])
        return lines is None or not lines & emitted[(row[1].source, row[2])]

    rest = [r for r in rows if unproven(r)]
    rest_keys = sorted({(p.source, d) for _, p, d in rest})
    shipped = dict(zip(rest_keys, parallel_map(lambda k: cuda_ptx(*k), rest_keys), strict=True))
    patched = parallel_map(lambda r: cuda_ptx(r[1].source, r[2], r[1]), rest)
    return [name for (name, p, d), text in zip(rest, patched, strict=True) if text == shipped[(p.source, d)]]


def test_every_patch_changes_the_cuda_device_code() -> None:
    """The device mutants run on NVIDIA: a patch whose edits all sit where the sm_90 device pass does
    not look tests the shipped kernel and can never be caught (session 34: the ring-transpose mutant
    edited only the four shared reads after the ldmatrix read became the CUDA path, and was missed on
    the device). Its mutant: that edit alone is reported dead; a control edit of the live read is not."""
    if not HAVE_NVCC:
        pytest.skip("no nvcc (CUDA toolkit)")
    options = {m.name: tuple(o for o in m.options.split() if o.startswith("-D")) for m in ALL}
    rows = [(name, patch, options[name]) for name, patch in _patches()]
    ring = KERNEL_DIR / "ort/nbits_mma.hip"
    four_reads, ldmatrix = RING_TRANSPOSE  # the row's two edits: the four shared reads, the ldmatrix address
    assert "stage[" in four_reads[0] and "qk_ring_slot(lane & 7" in ldmatrix[0]
    probes = [
        ("four shared reads only", Patch(ring, (four_reads,)), ()),
        ("ldmatrix read", Patch(ring, (ldmatrix,)), ()),
        ("four shared reads, -DQK_NBITS_RING_LDS", Patch(ring, (four_reads,)), ("-DQK_NBITS_RING_LDS",)),
    ]
    dead = _dead_in_cuda(rows + probes)
    assert dead == ["four shared reads only"], dead


def test_edited_lines_are_the_changed_span(tmp_path) -> None:
    """The lines ``_dead_in_cuda`` looks up in the shipped build's line table: those the patch changes,
    not the whole snippet it anchors on; an insertion's both sides; none for an edit of comments or
    whitespace alone (such a patch is built); None for an edit of an edit's text."""
    src = tmp_path / "k.hip"
    src.write_text("a = 1;\nb = 2;\nc = 3;\nd = 4;\n")
    assert edited_lines(Patch(src, (("b = 2;\nc = 3;", "b = 2;\nc = 5;"),))) == {3}
    assert edited_lines(Patch(src, (("a = 1;\nb = 2;\nc", "a = 7;\nb = 2;\nc"),))) == {1}
    assert edited_lines(Patch(src, (("b = 2;\n", "b = 2;\nx();\n"),))) == {2, 3}  # inserted after line 2
    assert edited_lines(Patch(src, (("b = 2;", "b = 9;"), ("d = 4;", "d = 8;")))) == {2, 4}
    assert edited_lines(Patch(src, (("b = 2;", "b = 9;"), ("b = 9;", "b = 6;")))) is None
    assert edited_lines(Patch(src, (("b = 2;", "b = 2; /* two */"), ("c = 3;", "c =  3;")))) == set()


def test_every_gemv_variant_has_its_build() -> None:
    """Each ggml_gemv variant either runs the shipped build by name (DEFAULT_BUILD) or has its build
    options; a variant added to one table only (it would time the shipped build) is named."""
    from qconform.bench.ggml_gemv_builds import OPTIONS, VARIANTS, unbuilt

    assert unbuilt(VARIANTS, OPTIONS) == []
    assert unbuilt({**VARIANTS, "narrow": "any"}, OPTIONS) == ["narrow"]
    assert unbuilt(VARIANTS, {**OPTIONS, "wide": ("-DQK_WIDE",)}) == ["wide"]


def test_family_filter_selects_each_own_kernel_test() -> None:
    """``ci/device.sh check FAMILY`` selects a family's own-kernel tests by ``-k FAMILY``: each
    test_own_kernel_* test names its op (or family) first, and conftest gives it that family as a keyword
    (the one over every op carries the family in its ids). Collected with the script's filter for ort,
    the MatMulNBits tests are in and the bnb ones out."""
    import os
    import subprocess
    import sys

    import test_device
    from conftest import REPO, own_kernel_family

    names = [n for n in dir(test_device) if n.startswith("test_own_kernel_")]
    assert [n for n in names if own_kernel_family(n) is None] == ["test_own_kernel_passes_every_property"]
    assert own_kernel_family("test_own_kernel_matmul_nbits_prefill_gemm") == "ort"
    assert own_kernel_family("test_own_kernel_matmul_bt_quant_fast_under_order_any") == "ggml"
    assert own_kernel_family("test_own_kernel_bnb_gemm_simt_is_bit_exact") == "bnb"
    assert own_kernel_family("test_matmul_nbits_prefill_gemm") is None
    # the script's own lines that build its -k filter, run by bash with FAMILY=ort
    script = (REPO / "ci" / "device.sh").read_text().splitlines()
    lines = [ln.strip() for ln in script if ln.strip().startswith(("filter=", '[ -n "$FAMILY" ] && filter='))]
    assert len(lines) == 2, lines
    filt = subprocess.run(["bash", "-c", "\n".join(lines) + '\necho "$filter"'], capture_output=True, text=True,
                          check=True, env={**os.environ, "FAMILY": "ort"}).stdout.strip()
    assert filt.endswith("and (ort or not own_kernel)"), filt
    cmd = [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", "-m", "device", "-k", filt,
           "tests/test_device.py"]
    out = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, check=True).stdout
    assert "test_own_kernel_matmul_nbits_prefill_gemm[" in out and "test_own_kernel_qmoe_ragged_mm_grouped" in out
    assert "test_own_kernel_bnb_" not in out and "test_own_kernel_matmul_bt_quant" not in out
