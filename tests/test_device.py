"""Device suite (marker ``device``; skipped without a GPU): every device kernel through every
property, the launchers' argument rules, the device mutants caught and the controls passing."""

from __future__ import annotations

import numpy as np
import pytest
from device_catalogue import ALL, DeviceMutant, build_all, run_mutant, verdict

from qconform.errors import ArgumentError
from qconform.ops import get_op
from qconform.properties.checks import Prepared
from qconform.properties.suite import run_leaf

pytestmark = pytest.mark.device

OWN = [
    ("cupy", "q8_k_quant"),
    ("cupy:ref", "q8_k_quant"),
    ("cupy", "q8_0_quant"),
    ("cupy", "q8_k_dequant"),
    ("cupy", "q8_0_dequant"),
]


@pytest.fixture(scope="session")
def built(tmp_path_factory: pytest.TempPathFactory) -> dict:
    return build_all(tmp_path_factory.mktemp("so"))


@pytest.mark.parametrize("impl_name,op_name", OWN, ids=[f"{i}-{o}" for i, o in OWN])
def test_own_kernel_passes_every_property(impl_name: str, op_name: str) -> None:
    from qconform.impls import load_impl

    impl = load_impl(impl_name)
    op = get_op(op_name)
    leaf = op.leaves[0].name
    prepared = [Prepared.from_case(op, c, impl.ftz) for c in op.cases(leaf, 2)]
    result = run_leaf(impl, op, leaf, prepared)
    assert result.verdict == "PASS", [o for o in result.failed]
    props = {o.prop: o for o in result.outcomes}
    assert props["survives_pending_error"].ok is True, props["survives_pending_error"].detail
    assert "WARNING" not in props["survives_pending_error"].detail
    cold = [o for o in result.outcomes if o.prop == "matches_oracle" and o.case and o.case.startswith("normal-")]
    assert cold, "the cold input sets were checked against the oracle"


@pytest.mark.parametrize("m", ALL, ids=[m.name for m in ALL])
def test_device_mutant(m: DeviceMutant, built: dict) -> None:
    ok, what = verdict(m, run_mutant(m, built))
    assert ok, f"{m.name}: expected {m.caught_by or 'pass'}, {what}"


def test_launcher_rejects_before_launch() -> None:
    import cupy

    from qconform.device.ggml import q8_quant as launch

    x = cupy.ones((2, 300), cupy.float32)
    out = cupy.full((2, 2 * 292), 0xA5, cupy.uint8)
    with pytest.raises(ArgumentError, match="multiple of 256"):
        launch.quantize(x, "Q8_K", out=out)
    with pytest.raises(ArgumentError, match="dtype must be float32"):
        launch.quantize(cupy.ones((2, 512), cupy.float64), "Q8_K", out=out)
    with pytest.raises(ArgumentError, match="cupy.ndarray"):
        launch.quantize(np.ones((2, 512), np.float32), "Q8_K")
    with pytest.raises(ArgumentError, match="shape must be"):
        launch.quantize(cupy.ones((2, 512), cupy.float32), "Q8_K", out=cupy.zeros((2, 583), cupy.uint8))
    flat = cupy.ones(2 * 512 + 1, cupy.float32)
    with pytest.raises(ArgumentError, match="16-byte aligned"):
        launch.quantize(flat[1:].reshape(2, 512), "Q8_K")
    with pytest.raises(ArgumentError, match="variant"):
        launch.quantize(cupy.ones((2, 512), cupy.float32), "Q8_K", variant="nope")
    assert bool((out == 0xA5).all()), "a rejected call wrote into out"


def test_launcher_uses_the_callers_stream() -> None:
    import cupy

    from qconform.device.ggml import q8_quant as launch
    from qconform.oracles.ggml import quantize

    x = np.random.default_rng(3).standard_normal((64, 4096)).astype(np.float32)
    s = cupy.cuda.Stream(non_blocking=True)
    with s:
        dx = cupy.asarray(x)
        y = launch.quantize(dx, "Q8_K")
    s.synchronize()
    assert cupy.asnumpy(y).tobytes() == quantize(x, "Q8_K", ftz=True).tobytes()


def test_zero_rows_launch_nothing() -> None:
    import cupy

    from qconform.device.ggml import q8_quant as launch

    assert launch.quantize(cupy.ones((0, 256), cupy.float32), "Q8_K").shape == (0, 292)


ORT_LEAVES = [
    (op_name, lf.name)
    for op_name in ("dequantize_nbits", "matmul_nbits", "gather_block_quantized", "fake_quantize", "qswiglu")
    for lf in get_op(op_name).leaves
]


@pytest.mark.parametrize("op_name,leaf", ORT_LEAVES, ids=[f"{o}-{lf}" for o, lf in ORT_LEAVES])
def test_ort_kernel_passes_every_property(op_name: str, leaf: str) -> None:
    from qconform.impls import load_impl

    impl = load_impl("cupy")
    op = get_op(op_name)
    prepared = [Prepared.from_case(op, c, impl.ftz) for c in op.cases(leaf, 1)]
    result = run_leaf(impl, op, leaf, prepared, repeat_calls=33, cold=op_name == "matmul_nbits" and "u2" in leaf)
    assert result.verdict == "PASS", [o.detail for o in result.failed][:3]


@pytest.mark.parametrize("dtype", ["uint16", "uint8"])
def test_qswiglu_fused_equals_unfused_and_counts_steps(dtype: str) -> None:
    import cupy

    from qconform.device import ort as ort_launch
    from qconform.ops import Case
    from qconform.ops.ort.qswiglu import _swiglu_call, _swiglu_inputs
    from qconform.oracles.ort import qswiglu

    leaf = "Xu16_Yu16" if dtype == "uint16" else "Xu8_Yu8"
    inputs = _swiglu_inputs(Case("qswiglu", leaf, 5, (64, 14336), "normal"))
    (g, u), kw = _swiglu_call(inputs, {"dtype": dtype})
    dev = {k: v for k, v in kw.items() if k != "dtype"}
    fused = ort_launch.qswiglu(cupy.asarray(g), cupy.asarray(u), dtype=dtype, **dev)
    unfused = ort_launch.qswiglu(cupy.asarray(g), cupy.asarray(u), dtype=dtype, fused=False, **dev)
    assert cupy.asnumpy(fused).tobytes() == cupy.asnumpy(unfused).tobytes()
    want = qswiglu(g, u, **kw)
    diff = np.abs(cupy.asnumpy(fused).astype(np.int64) - want.astype(np.int64))
    print(f"qswiglu {dtype}: {int((diff > 0).sum())} of {diff.size} elements one step from the oracle")
    assert diff.max() <= 1
