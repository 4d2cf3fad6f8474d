"""Numeric contracts (docs/contracts.md): parsing, the per-element MatMulNBits bound (which must
pass every legitimate reordering and catch one element off), the readings a contract accepts
(level 4 either path, ftz unknown, NaN rules), and the worked fp16 example under both contracts."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

from qconform.cli import main
from qconform.contracts import STRICT, parse_contract
from qconform.errors import ArgumentError
from qconform.impls import CallableImpl, load_impl
from qconform.ops import get_op
from qconform.oracles.ggml import quantize
from qconform.oracles.ort import dequantize_nbits, matmul_nbits
from qconform.oracles.ort.matmul_nbits import product_terms
from qconform.properties.checks import Prepared, matches_oracle

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "examples" / "contracts" / "matmul_nbits_half.py"
HALF = "storage=fp16,accumulate=fp16,chain=K/64"
MATMUL = get_op("matmul_nbits")


def _mutants():
    sys.path.insert(0, str(Path(__file__).parent))
    import mutants

    return mutants


def test_parse_names_the_key_and_the_rule() -> None:
    c = parse_contract("storage=fp16, accumulate=fp16,chain=K/64,division=2ulp")
    assert (c.storage, c.accumulate, c.chain, c.division) == ("fp16", "fp16", "K/64", 2)
    assert str(c) == "accumulate=fp16,chain=K/64,storage=fp16,division=2"
    assert str(parse_contract("strict")) == "strict" and parse_contract("") == STRICT
    for text, words in (
        ("storage=fp8", "storage must be one of exact, fp16, bf16"),
        ("precision=fp16", "unknown key 'precision'"),
        ("storage", "KEY=VALUE"),
        ("chain=0,accumulate=fp16", "chain must be"),
        ("chain=64", "chain applies to accumulate=fp16 or bf16"),
        ("division=fast", "division must be exact or Nulp"),
    ):
        with pytest.raises(ArgumentError, match=words):
            parse_contract(text)


def test_contracts_merge_in_order_and_ftz_follows_the_build() -> None:
    base = parse_contract("storage=fp16")
    assert base.merged(parse_contract("accumulate=bf16")).relaxed() == {"accumulate": "bf16", "storage": "fp16"}
    assert STRICT.ftz_modes(True) == (True,) and STRICT.ftz_modes(False) == (False,)
    assert STRICT.ftz_modes(None) == (False, True)  # a so: library: its flags are unknown
    assert parse_contract("ftz=off").ftz_modes(True) == (False,)


def test_the_impl_string_and_the_callable_declare_contracts(tmp_path: Path) -> None:
    mod = tmp_path / "declared.py"
    mod.write_text(
        "from qconform.oracles.ort import matmul_nbits as _m\n"
        "def matmul_nbits(*a, **k):\n    return _m(*a, **k)\n"
        "matmul_nbits.__qconform_contract__ = 'storage=fp16'\n"
    )
    impl = load_impl(f"py:{mod}:matmul_nbits:contract=accumulate=fp16", contract="level4=int8")
    assert impl.contract.relaxed() == {"accumulate": "fp16", "storage": "fp16", "level4": "int8"}
    with pytest.raises(ArgumentError, match="impl: contract: storage must be one of"):
        load_impl(f"py:{mod}:matmul_nbits:contract=storage=fp12")


def _prepared(leaf: str, shape: tuple[int, ...] | None = None, contract: str = "strict", **params):
    impl = load_impl("oracle", contract=contract)
    cases = [c for c in MATMUL.cases(leaf, 2) if (shape is None or c.shape == shape)]
    cases = [c for c in cases if all(c.params.get(k) == v for k, v in params.items())]
    return [Prepared.from_case(MATMUL, c, impl) for c in cases]


def _reordered(p: Prepared, order: str) -> np.ndarray:
    """The product summed in fp32 in another legitimate order (the bound must hold for any)."""
    args, kwargs = MATMUL.call_args(p.inputs, p.params)
    K, keep = kwargs["K"], {k: kwargs[k] for k in ("K", "N", "bits", "block_size", "form") if k in kwargs}
    w = dequantize_nbits(args[1], args[2], args[3], **keep)  # the reference's fp32 weights
    a = p.inputs["A"].astype(np.float32).reshape(-1, K)
    prods = (a[:, None, :] * w[None, :, :]).astype(np.float32)  # (M, N, K) fp32 products
    if order == "sequential":
        acc = np.zeros(prods.shape[:2], np.float32)
        for k in range(K):
            acc = (acc + prods[:, :, k]).astype(np.float32)
    elif order == "reversed":
        acc = np.zeros(prods.shape[:2], np.float32)
        for k in reversed(range(K)):
            acc = (acc + prods[:, :, k]).astype(np.float32)
    else:  # 32 lanes strided, then a butterfly: a warp's order
        pad = -K % 32
        lanes = np.concatenate([prods, np.zeros((*prods.shape[:2], pad), np.float32)], axis=2)
        lanes = lanes.reshape(*prods.shape[:2], -1, 32).sum(axis=2, dtype=np.float32)
        while lanes.shape[-1] > 1:
            half = lanes.shape[-1] // 2
            lanes = (lanes[..., :half] + lanes[..., half:]).astype(np.float32)
        acc = lanes[..., 0]
    if "bias" in p.inputs:
        acc = (acc + p.inputs["bias"].astype(np.float32)).astype(np.float32)
    return acc.reshape(p.want.shape).astype(p.want.dtype)


@pytest.mark.parametrize("order", ["sequential", "reversed", "warp"])
@pytest.mark.parametrize("leaf", ["Xfp16_Wu4_Yfp16", "Xfp32_Wu2_Yfp32", "Xfp32_Wu8_Yfp32"])
def test_every_legitimate_fp32_order_is_within_the_strict_bound(leaf: str, order: str) -> None:
    checked = 0
    for p in _prepared(leaf):
        if p.case.params.get("accuracy_level") == 4 or p.case.params.get("g_idx") or np.prod(p.case.shape) > 3_000_000:
            continue  # (the order models take K blocks in order: no g_idx)
        c = p.verify(MATMUL, _reordered(p, order))
        assert c.ok, (p.case.id, c.detail)
        checked += 1
    assert checked > 20


def test_one_element_two_percent_off_fails_and_is_named() -> None:
    """relL2 alone let this through (3.6e-4 under 4.9e-4): each element has its own bound."""
    (p,) = _prepared("Xfp16_Wu4_Yfp16", (37, 1000, 50))
    got = p.want.copy()
    got[5, 7] = np.float16(float(got[5, 7]) * 1.02)
    c = p.verify(MATMUL, got)
    assert not c.ok
    assert "1 of 1850 elements exceed their bound" in c.detail and "worst at [5, 7] (row 5, column 7" in c.detail
    assert "rule failed: contract strict" in c.detail and "isolated" in c.detail


def test_a_dropped_k_block_is_named() -> None:
    (p,) = _prepared("Xfp32_Wu4_Yfp32", (37, 1000, 50))
    args, kwargs = MATMUL.call_args(p.inputs, p.params)
    t = product_terms(*args, **kwargs)
    got = p.want.copy()
    got[3, 4] = np.float32(t.ref[3, 4] - t.partials(3, 4)[2])  # K block 2 never added
    c = p.verify(MATMUL, got)
    assert not c.ok and "the difference is -1.000x K block 2's partial sum (k 128..191)" in c.detail, c.detail


def test_level4_accepts_either_path_by_default_and_pins_one_on_request() -> None:
    p = next(p for p in _prepared("Xfp32_Wu4_Yfp32", accuracy_level=4) if "zero_points" not in p.inputs)
    args, kwargs = MATMUL.call_args(p.inputs, p.params)
    float_path = matmul_nbits(*args, **{**kwargs, "accuracy_level": 0})
    assert not np.array_equal(float_path, p.want)  # the two readings differ on this case
    assert p.verify(MATMUL, float_path).ok and "fp32 activations" in p.verify(MATMUL, float_path).detail
    assert p.verify(MATMUL, p.want).ok
    (pinned,) = [
        q for q in _prepared("Xfp32_Wu4_Yfp32", p.case.shape, "level4=int8", accuracy_level=4) if q.case == p.case
    ]
    c = pinned.verify(MATMUL, float_path)
    assert not c.ok and "int8 activations" in c.detail


def test_the_fp16_example_fails_strict_naming_the_rule_and_passes_its_contract() -> None:
    sys.path.insert(0, str(EXAMPLE.parent))
    import matmul_nbits_half

    strict = CallableImpl("half", matmul_nbits_half.matmul_nbits, ("matmul_nbits",))
    declared = CallableImpl("half", matmul_nbits_half.matmul_nbits, ("matmul_nbits",))
    declared.contract = parse_contract(HALF)
    for leaf in ("Xfp16_Wu4_Yfp16", "Xfp32_Wu2_Yfp32"):
        cases = [c for c in MATMUL.cases(leaf, 1) if not c.params.get("g_idx")]  # (the example has no g_idx)
        fails = [matches_oracle(strict, MATMUL, Prepared.from_case(MATMUL, c, strict)) for c in cases]
        assert sum(o.ok is False for o in fails) >= len(cases) // 2
        named = [o.detail for o in fails if o.ok is False and "within what storage=fp16" in o.detail]
        assert named and all("rule failed: contract strict" in o.detail for o in fails if o.ok is False)
        passes = [matches_oracle(declared, MATMUL, Prepared.from_case(MATMUL, c, declared)) for c in cases]
        assert all(o.ok for o in passes), [o.detail for o in passes if not o.ok][:1]


def test_a_wrong_kernel_fails_even_under_the_relaxed_contract() -> None:
    """The mutant: the fp16 example reading each byte's high field first."""
    sys.path.insert(0, str(EXAMPLE.parent))
    import matmul_nbits_half

    def swapped(A, B, *args, **kwargs):
        return matmul_nbits_half.matmul_nbits(A, ((B & 0x0F) << 4) | (B >> 4), *args, **kwargs)

    impl = CallableImpl("swapped", swapped, ("matmul_nbits",))
    impl.contract = parse_contract(HALF)
    outcomes = [
        matches_oracle(impl, MATMUL, Prepared.from_case(MATMUL, c, impl))
        for c in MATMUL.cases("Xfp16_Wu4_Yfp16", 1)
        if not c.params.get("g_idx")  # (the example has no g_idx)
    ]
    assert sum(o.ok is False for o in outcomes) >= len(outcomes) - 2
    assert any("contract accumulate=fp16,chain=K/64,storage=fp16" in o.detail for o in outcomes)


@pytest.mark.parametrize("op_name", ["q8_0_quant", "q8_k_quant"])
def test_nan_policies(op_name: str) -> None:
    op = get_op(op_name)
    leaf = op.leaves[0].name
    impl = CallableImpl("ieee", _mutants().ieee_max, (op_name,))

    def run(contract: str) -> list:
        impl.contract = parse_contract(contract)
        return [matches_oracle(impl, op, Prepared.from_case(op, c, impl)) for c in op.cases(leaf, 1)]

    strict, ieee, unsupported = run("strict"), run("nan=ieee"), run("nan=unsupported")
    assert any(o.ok is False for o in strict)  # the reference's NaN rules are checked by default
    assert all(o.ok for o in ieee)
    declined = [o for o in unsupported if o.ok is None]
    assert declined and all("nan=unsupported" in o.detail for o in declined)
    assert all(o.ok for o in unsupported if o.ok is not None)


def test_a_nan_ieee_kernel_must_still_get_the_other_bytes_right() -> None:
    op = get_op("q8_0_quant")
    case = next(c for c in op.cases(op.leaves[0].name, 1) if c.pattern == "nan")

    def off_by_one(x, qtype, out=None):
        y = _mutants().ieee_max(x, qtype).copy()
        finite_block = np.flatnonzero(~np.isnan(x.reshape(-1, 32)).any(axis=1))[0]
        y.reshape(-1, 34)[finite_block, 2] ^= 1
        return y

    impl = CallableImpl("off", off_by_one, ("q8_0_quant",))
    impl.contract = parse_contract("nan=ieee")
    assert matches_oracle(impl, op, Prepared.from_case(op, case, impl)).ok is False


def test_reports_state_the_contract(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import json

    out = tmp_path / "r.json"
    spec = f"py:{EXAMPLE}:matmul_nbits"
    argv = ["run", "--impl", spec, "--ops", "matmul_nbits", "--leaf", "Xfp16_Wu4_Yfp16", "--coverage", "1"]
    assert main([*argv, "--contract", HALF, "--format", "json", "--out", str(out), "--repeat-calls", "3"]) == 0
    data = json.loads(out.read_text())
    assert {r["contract"] for r in data["rows"]} == {"accumulate=fp16,chain=K/64,storage=fp16"}
    assert main([*argv, "--repeat-calls", "3", "--max-failures", "1"]) == 1
    text = capsys.readouterr().out
    assert "contract: strict" in text and "rule failed: contract strict" in text


@pytest.mark.parametrize("op_name", ["q8_0_quant", "q8_k_quant"])
def test_approximate_division_fails_strict_on_a_named_case_and_passes_when_declared(op_name: str) -> None:
    """A fast-math quantizer: its reciprocal 1 ulp off (the oracle's own ``nudge``)."""
    op = get_op(op_name)
    leaf = op.leaves[0].name

    def fast(x, qtype, out=None):
        return quantize(x, qtype, nudge=(0, 1))

    def fast_and_wrong(x, qtype, out=None):  # one quant byte off besides
        y = fast(x, qtype).copy()
        y.reshape(-1)[-1] ^= 1
        return y

    def run(fn, contract: str) -> list:
        impl = CallableImpl(fn.__name__, fn, (op_name,))
        impl.contract = parse_contract(contract)
        return [(c.pattern, matches_oracle(impl, op, Prepared.from_case(op, c, impl))) for c in op.cases(leaf, 1)]

    strict = run(fast, "strict")
    assert "ties_npot" in {pattern for pattern, o in strict if o.ok is False}
    assert all(o.ok for _, o in run(fast, "division=1ulp"))
    assert all(o.ok is False for _, o in run(fast_and_wrong, "division=2ulp"))


def test_fake_quantize_by_the_reciprocal_passes_only_under_a_division_contract() -> None:
    mutants = _mutants()
    op = get_op("fake_quantize")
    impl = CallableImpl("recip", mutants.fake_quantize_times_reciprocal, ("fake_quantize",))
    for contract, failing in (("strict", True), ("division=1ulp", False)):
        impl.contract = parse_contract(contract)
        outcomes = [matches_oracle(impl, op, Prepared.from_case(op, c, impl)) for c in op.cases("Xfp32_Qi8_Yfp32", 2)]
        assert any(o.ok is False for o in outcomes) == failing, contract
    off = CallableImpl("off", lambda *a, **k: mutants.fake_quantize_times_reciprocal(*a, **k) * 1.5, ("fake_quantize",))
    off.contract = parse_contract("division=2ulp")
    assert any(
        matches_oracle(off, op, Prepared.from_case(op, c, off)).ok is False for c in op.cases("Xfp32_Qi8_Yfp32", 1)
    )


def test_flush_to_zero_unknown_accepts_either_and_names_the_reading() -> None:
    """A so: library's flags are unknown (ftz None): a flushing build passes, and so does a
    non-flushing one; a CPU build (ftz off) that flushes fails on the subnormal case."""
    op = get_op("q8_k_quant")  # its fp32 d keeps what flushing changes
    case = next(c for c in op.cases(op.leaves[0].name, 1) if c.pattern == "subnormal")

    def flushing(x, qtype, out=None):
        return quantize(x, qtype, ftz=True)

    impl = CallableImpl("flushing", flushing, ("q8_k_quant",))
    assert matches_oracle(impl, op, Prepared.from_case(op, case, impl)).ok is False  # built ftz off
    impl.ftz = None  # as a so: library: unknown
    outcome = matches_oracle(impl, op, Prepared.from_case(op, case, impl))
    assert outcome.ok and "ftz on" in outcome.detail
    impl.contract = parse_contract("ftz=off")
    assert matches_oracle(impl, op, Prepared.from_case(op, case, impl)).ok is False


def test_accumulation_bounds_follow_the_declared_model() -> None:
    from qconform.properties.bounds import LAMBDA, accumulation_error, gamma

    u = 2.0**-24
    strict, worst = STRICT, parse_contract("bound=worst-case")
    assert accumulation_error(16, 64, strict) == gamma(16, u)  # small n: gamma_n is the tighter
    assert accumulation_error(5120, 64, strict) == LAMBDA * 5120**0.5 * u < accumulation_error(5120, 64, worst)
    half = parse_contract("accumulate=fp16")  # chains of the block (64) in fp16, then fp32
    assert accumulation_error(5120, 64, half) == pytest.approx(
        gamma(64, 2.0**-11) + gamma(81, u) * (1 + gamma(64, 2.0**-11))
    )
    assert accumulation_error(5120, 64, parse_contract("accumulate=fp16,chain=K/64")) == accumulation_error(
        5120, 80, half
    )
    assert accumulation_error(5120, 64, parse_contract("accumulate=bf16,chain=512")) == float("inf")  # 512 u >= 1


def test_a_contract_without_a_bound_fails_instead_of_passing_everything() -> None:
    (p,) = [q for q in _prepared("Xfp16_Wu4_Yfp16", (37, 1000, 50), "accumulate=bf16,chain=512")]
    c = p.verify(MATMUL, p.want)
    assert not c.ok and "no error bound holds for bf16 chains of 512" in c.detail


def test_the_contract_option_may_sit_among_the_other_options(monkeypatch: pytest.MonkeyPatch) -> None:
    """hip:/so: strings carry other options (requires=, lanes=): the contract is taken out
    wherever it sits and the rest goes to the loader unchanged."""
    import qconform.impls as impls

    seen = []
    monkeypatch.setattr(impls, "_load", lambda spec, ops: seen.append(spec) or impls.OracleImpl())
    for spec in (
        "hip:k.hip:gemv:contract=storage=fp16,ftz=off:requires=bits==2:lanes=64",
        "hip:k.hip:gemv:requires=bits==2:lanes=64:contract=ftz=off,storage=fp16",
    ):
        impl = impls.load_impl(spec)
        assert impl.contract.relaxed() == {"storage": "fp16", "ftz": "off"}
    assert seen == ["hip:k.hip:gemv:requires=bits==2:lanes=64"] * 2


def test_level4_int8_activations_with_an_approximate_inverse(monkeypatch: pytest.MonkeyPatch) -> None:
    """A kernel whose 127/amax is 1 ulp off steps some int8 activation codes: it fails the int8
    reading strictly and passes under division=1ulp; a wrong kernel still fails under it."""
    mn = sys.modules["qconform.oracles.ort.matmul_nbits"]
    exact = mn._activation_products

    def one_ulp_up(a: np.ndarray, block_size: int):
        prod, sa = exact(a, block_size)
        return (prod * np.float32(1 + 2.0**-23)).astype(np.float32), sa  # as if inv were 1 ulp up

    def fast(*args, **kwargs):
        with monkeypatch.context() as m:
            m.setattr(mn, "_activation_products", one_ulp_up)
            return matmul_nbits(*args, **kwargs)

    def fast_and_wrong(*args, **kwargs):
        y = fast(*args, **kwargs).copy()
        y.reshape(-1)[0] += 0.25
        return y

    # (not the exact int8 ties: under division=1ulp either side of each is accepted, so the 0.25 goes unseen)
    cases = [
        c for c in MATMUL.cases("Xfp32_Wu4_Yfp32", 2) if c.params.get("accuracy_level") == 4 and c.pattern != "ties8"
    ]

    def outcomes(fn, contract: str) -> list:
        impl = CallableImpl(fn.__name__, fn, ("matmul_nbits",))
        impl.contract = parse_contract(contract)
        return [matches_oracle(impl, MATMUL, Prepared.from_case(MATMUL, c, impl)).ok for c in cases]

    assert False in outcomes(fast, "level4=int8")
    assert all(outcomes(fast, "level4=int8,division=1ulp"))
    assert not any(outcomes(fast_and_wrong, "level4=int8,division=1ulp"))


def test_non_finite_outputs_must_sit_where_the_oracles_do() -> None:
    from qconform.properties.bounds import check_bound

    p = _prepared("Xfp16_Wu4_Yfp16", (37, 1000, 50))[0]
    e = p.expected[0]
    want = e.want.copy()
    want[2, 3], want[4, 5] = np.nan, np.inf
    assert check_bound(want.copy(), want, e.model, STRICT, False, str).ok  # the same NaN and inf
    for bad in (1.0, -np.inf):
        got = want.copy()
        got[2, 3] = bad
        c = check_bound(got, want, e.model, STRICT, False, str)
        assert not c.ok and "1 non-finite outputs differ; first at [2, 3]" in c.detail
    got = want.copy()
    got[0, 0] = np.nan
    assert "first at [0, 0]" in check_bound(got, want, e.model, STRICT, False, str).detail
