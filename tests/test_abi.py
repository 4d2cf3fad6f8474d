"""The declared device ABIs (qconform.ops.abi): every case of every op binds, to the oracle's output
shape and dtype; every rule-breaking call is rejected by the binder (it runs the oracle's own
validators); the committed C header is the one the declarations generate; the CLI prints them."""

from __future__ import annotations

import re

import numpy as np
import pytest

from qconform.cli import main
from qconform.device.registry import COMMON_DIR
from qconform.errors import ArgumentError, Declined
from qconform.ops import CATALOGUE
from qconform.ops.abi import HEADER_NAME, STATUS_DECLINED, header, macro_name
from qconform.ops.spec import output_parts
from qconform.properties.expect import oracle_output

OPS = list(CATALOGUE.values())


@pytest.mark.parametrize("op", OPS, ids=lambda op: op.name)
def test_every_case_binds_to_the_oracle_output(op) -> None:
    bound_any = False
    for leaf in op.leaves:
        for case in op.cases(leaf.name, 2):
            inputs, params = op.make_inputs(case), op.params(case)
            try:
                b = op.abi.bind(*op.call_args(inputs, params))
            except Declined:
                continue
            bound_any = True
            # the oracle's output alone (not every reading a contract accepts: only its parts' shapes and dtypes count)
            wants = output_parts(oracle_output(op, inputs, params, False))  # one Out argument to each part
            assert [(tuple(s), np.dtype(d)) for s, d in b.outs] == [(w.shape, w.dtype) for w in wants], case.id
            assert len(wants) == sum(a.kind == "out" for a in op.abi.args), case.id
            assert b.work == wants[0].size or op.abi.work == "n_blocks", case.id
            for arg in op.abi.pointers:
                src = b.tensors.get(arg.name)
                if arg.kind == "in" and src is not None:
                    assert src[0] in inputs, (case.id, arg.name)
                if arg.kind == "in" and not arg.optional:
                    assert src is not None, (case.id, arg.name)
            assert [a.name for a, _ in op.abi.values(b)] == [a.name for a in op.abi.scalars]
    assert bound_any, f"{op.name}: no case binds to its ABI"


@pytest.mark.parametrize("op", OPS, ids=lambda op: op.name)
def test_the_binder_rejects_every_bad_argument(op) -> None:
    for leaf in op.leaves:
        for bad in op.bad_arguments(leaf.name):
            if bad.bad_out is not None:
                continue  # out is checked by the device layer against the bound shape and dtype
            with pytest.raises(ArgumentError):
                op.abi.bind(*op.call_args(bad.inputs, bad.params))


def test_matmul_nbits_binds_the_zero_point_kinds() -> None:
    op = CATALOGUE["matmul_nbits"]
    kinds = {}
    for case in op.cases("Xfp16_Wu4_Yfp16", 2):
        if case.params.get("g_idx"):
            continue  # (the ABI declines g_idx)
        b = op.abi.bind(*op.call_args(op.make_inputs(case), op.params(case)))
        kinds[case.params["zp"]] = (b.scalars["zp_kind"], b.tensors["zero_points"])
    assert kinds["none"] == (0, None)
    assert kinds["packed"] == (1, ("zero_points", np.dtype(np.uint8)))
    assert kinds["float"] == (2, ("zero_points", np.dtype(np.float16)))
    assert kinds["uniform"] == (2, ("zero_points", np.dtype(np.float16)))  # ORT's form: per block
    assert kinds["scalar"] == (3, ("zero_points", np.dtype(np.float32)))  # the kernel form, widened


def test_committed_header_is_generated() -> None:
    committed = (COMMON_DIR / HEADER_NAME).read_text()
    regenerate = "qconform abi --header src/qconform/device/kernels/common/qconform_abi.h"
    assert committed == header(CATALOGUE), regenerate
    for op in CATALOGUE:
        assert f"#define {macro_name(op)} \\" in committed
    assert f"#define QCONFORM_STATUS_DECLINED {STATUS_DECLINED}" in committed


def test_header_codes_match_the_kernels_use_of_them() -> None:
    """Our own kernels spell the enum codes through the header, never as numbers of their own."""
    text = (COMMON_DIR.parent / "ort" / "ort_common.h").read_text()
    assert re.search(r"#define ZP_DEFAULT QCONFORM_ZP_KIND_NONE", text)
    assert not re.search(r"#define ZP_\w+ \d", text)


def test_cli_abi_prints_prototype_and_table(capsys) -> None:
    assert main(["abi", "matmul_nbits"]) == 0
    out = capsys.readouterr().out
    assert 'extern "C" __global__ void symbol(' in out and "void* stream" in out
    for arg in CATALOGUE["matmul_nbits"].abi.args:
        assert re.search(rf"^\d+\s+{arg.name}\s", out, re.M), arg.name
    assert "QCONFORM_ZP_KIND_PACKED = 1" in out
    assert main(["abi"]) == 0
    listing = capsys.readouterr().out
    assert all(op in listing for op in CATALOGUE)
    assert main(["abi", "nope"]) == 2


def test_cli_abi_header_writes_the_generated_file(tmp_path) -> None:
    target = tmp_path / HEADER_NAME
    assert main(["abi", "--header", str(target)]) == 0
    assert target.read_text() == header(CATALOGUE)
