"""The device ABI every op declares: the ordered, named, typed arguments a user's kernel (``hip:``)
or C launcher (``so:``) is called with, and how an op's inputs and params bind to them.

Arguments come in one order for every op: a device pointer per tensor input (the op's input order;
an absent optional input is a null pointer), the output pointer, then 64-bit integers (sizes,
attributes, enum codes) and fp32 scalars; a ``so:`` launcher takes the stream last and returns a
status. The C spellings (``qconform abi OP``, the generated header ``qconform_abi.h``) come from
these declarations and nothing else, so the Python binder and the C prototype cannot disagree.

Default launch geometry for ``hip:``: ``blockDim.x = threads`` (256), ``gridDim.x =
ceil(work * lanes / threads)``, where ``work`` counts the op's natural items (outputs, blocks) and
``lanes`` the threads a kernel spends on one item; both, the grid and the dynamic shared memory
can be overridden on the ``--impl`` string.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

import numpy as np

from qconform.errors import ArgumentError, Declined

HEADER_NAME = "qconform_abi.h"  # in device/kernels/common: on every kernel's include path
STATUS_OK = 0
STATUS_DECLINED = 801  # cudaErrorNotSupported == hipErrorNotSupported: "this launcher does not handle this case"


@dataclass(frozen=True)
class Enum:
    """Integer codes an ``i64`` argument takes; the header spells them ``QCONFORM_<NAME>_<LABEL>``."""

    name: str
    codes: tuple[tuple[str, int, str], ...]  # (label, value, meaning)

    def __getitem__(self, label: str) -> int:
        for name, value, _ in self.codes:
            if name == label:
                return value
        raise KeyError(f"{self.name} has no code {label!r}")

    def macro(self, label: str) -> str:
        return f"QCONFORM_{self.name.upper()}_{label.upper()}"


DTYPE = Enum(
    "dtype",
    (
        ("float32", 0, "IEEE fp32"),
        ("float16", 1, "IEEE fp16"),
        ("bfloat16", 2, "bf16"),
        ("uint8", 3, ""),
        ("int8", 4, ""),
        ("uint16", 5, ""),
        ("int16", 6, ""),
        ("int32", 7, ""),
        ("int64", 8, ""),
    ),
)


def dtype_code(dtype: Any) -> int:
    """The ``DTYPE`` code of a numpy dtype."""
    return DTYPE[np.dtype(dtype).name]


@dataclass(frozen=True)
class Arg:
    """One kernel argument. ``kind``: ``in`` / ``out`` (device pointers), ``i64`` (``long long``)
    or ``f32`` (``float``). Pointers say their element type and shape in the op's sizes."""

    name: str
    kind: str
    ctype: str
    doc: str
    dtype: str = ""
    shape: str = ""
    optional: bool = False
    enum: Enum | None = None

    @property
    def is_pointer(self) -> bool:
        return self.kind in ("in", "out")


def In(name: str, ctype: str, dtype: str, shape: str, doc: str = "", optional: bool = False) -> Arg:  # noqa: N802
    return Arg(name, "in", f"const {ctype}*", doc, dtype, shape, optional)


def Out(name: str, ctype: str, dtype: str, shape: str, doc: str = "") -> Arg:  # noqa: N802
    return Arg(name, "out", f"{ctype}*", doc, dtype, shape)


def I64(name: str, doc: str, enum: Enum | None = None) -> Arg:  # noqa: N802
    return Arg(name, "i64", "long long", doc, enum=enum)


def F32(name: str, doc: str) -> Arg:  # noqa: N802
    return Arg(name, "f32", "float", doc)


def call_arguments(oracle: Callable[..., Any], args: tuple, kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """The oracle's parameters by name for a call ``oracle(*args, **kwargs)``, defaults filled in."""
    bound = inspect.signature(oracle).bind(*args, **kwargs)
    bound.apply_defaults()
    return dict(bound.arguments)


@dataclass(frozen=True)
class Bound:
    """An op call bound to its ABI, from the arguments' dtypes and shapes alone (no data).

    ``tensors``: pointer argument -> (the oracle's parameter it comes from, the dtype it is passed
    as) or None (a null pointer); a dtype other than the argument's means the caller converts it
    first (documented per op in ``Abi.notes``). ``out_shape`` / ``out_dtype``: the first output;
    ``more_outs``: (shape, dtype) of each further one of an op with several, in ABI order.
    """

    tensors: dict[str, tuple[str, np.dtype] | None]
    out_shape: tuple[int, ...]
    out_dtype: np.dtype
    scalars: dict[str, int | float]
    work: int
    more_outs: tuple[tuple[tuple[int, ...], np.dtype], ...] = ()

    @property
    def outs(self) -> tuple[tuple[tuple[int, ...], np.dtype], ...]:
        """(shape, dtype) of every output, in ABI order."""
        return ((tuple(self.out_shape), np.dtype(self.out_dtype)), *self.more_outs)


@dataclass(frozen=True)
class Abi:
    """An op's declared device ABI: its arguments, how a call binds to them, its default geometry.

    ``bind(args, kwargs)`` takes a call of the op's oracle (numpy arrays, or stand-ins with the
    device arrays' dtypes and shapes), checks every rule the oracle checks (``ArgumentError``), and
    returns a ``Bound``; a call the ABI cannot express raises ``qconform.Declined``.
    """

    args: tuple[Arg, ...]
    bind: Callable[[tuple, Mapping[str, Any]], Bound]
    summary: str
    work: str
    lanes: int = 1
    threads: int = 256
    notes: tuple[str, ...] = field(default_factory=tuple)

    def __post_init__(self) -> None:
        kinds = [a.kind for a in self.args]
        order = {"in": 0, "out": 1, "i64": 2, "f32": 2}
        if [order[k] for k in kinds] != sorted(order[k] for k in kinds) or kinds.count("out") < 1:
            raise ValueError("an ABI lists its inputs, then its outputs (one per op output), then its scalars")

    @property
    def enums(self) -> tuple[Enum, ...]:
        return tuple(dict.fromkeys(a.enum for a in self.args if a.enum is not None))

    @property
    def pointers(self) -> tuple[Arg, ...]:
        return tuple(a for a in self.args if a.is_pointer)

    @property
    def scalars(self) -> tuple[Arg, ...]:
        return tuple(a for a in self.args if not a.is_pointer)

    def values(self, bound: Bound) -> list[tuple[Arg, int | float]]:
        """The scalar arguments in ABI order with their values (every one must be bound)."""
        missing = [a.name for a in self.scalars if a.name not in bound.scalars]
        if missing:
            raise ValueError(f"ABI bind left {missing} unbound")
        return [(a, bound.scalars[a.name]) for a in self.scalars]


# --------------------------------------------------------------------------- C renderings


def macro_name(op: str) -> str:
    return f"QCONFORM_{op.upper()}_PARAMS"


def c_params(abi: Abi, indent: str = "    ") -> str:
    return f",\n{indent}".join(f"{a.ctype} {a.name}" for a in abi.args)


def prototypes(op: str, abi: Abi) -> str:
    """The ``hip:`` kernel and ``so:`` launcher prototypes of ``op`` (``symbol`` is yours)."""
    params = c_params(abi)
    return (
        f'extern "C" __global__ void symbol(\n    {params});\n\n'
        f'extern "C" int symbol(\n    {params},\n    void* stream);  /* returns the status of its own launch */'
    )


def table(abi: Abi) -> list[tuple[str, str, str, str]]:
    """(argument, C type, dtype / shape, meaning) rows."""
    rows = []
    for a in abi.args:
        what = f"{a.dtype} {a.shape}".strip() if a.is_pointer else ("enum " + a.enum.name if a.enum else "")
        doc = a.doc + (" (null when absent)" if a.optional else "")
        rows.append((a.name, a.ctype, what, doc))
    return rows


def geometry_line(abi: Abi) -> str:
    return (
        f"work = {abi.work}; default lanes = {abi.lanes}, threads = {abi.threads}: "
        f"blockDim.x = threads, gridDim.x = ceil(work * lanes / threads)"
    )


def header(catalogue: Mapping[str, Any]) -> str:
    """``qconform_abi.h``: the enum codes, and per op a ``QCONFORM_<OP>_PARAMS`` macro (the
    argument list, for ``extern "C" __global__ void k(QCONFORM_<OP>_PARAMS)``) and a launcher
    typedef. Generated by ``qconform abi --header``; plain C, for device and host compilers."""
    lines = [
        "/* qconform_abi.h: the device ABI of every qconform op. GENERATED by `qconform abi --header`",
        " * from the catalogue's declarations (qconform.ops.abi): do not edit.",
        " *",
        ' *   hip: kernels   extern "C" __global__ void my_kernel(QCONFORM_<OP>_PARAMS);',
        ' *   so: launchers  extern "C" int my_launcher(QCONFORM_<OP>_PARAMS, void* stream);',
        " *",
        " * Pointers are device pointers to C-contiguous arrays (null for an absent optional input);",
        " * `long long` arguments are 64-bit sizes, attributes and the enum codes below. A so: launcher",
        " * returns the status of its own launch (0 = success; never a pending error it did not cause),",
        " * QCONFORM_STATUS_DECLINED for a case it does not handle, and a non-zero status for invalid",
        " * (e.g. negative) sizes. */",
        "#ifndef QCONFORM_ABI_H",
        "#define QCONFORM_ABI_H",
        "",
        f"#define QCONFORM_STATUS_OK {STATUS_OK}",
        f"#define QCONFORM_STATUS_DECLINED {STATUS_DECLINED} /* cudaErrorNotSupported == hipErrorNotSupported */",
        "",
    ]
    enums = [DTYPE]
    for spec in catalogue.values():
        enums += [e for e in spec.abi.enums if e not in enums]
    for e in enums:
        lines.append(f"/* enum {e.name} */")
        for label, value, doc in e.codes:
            lines.append(f"#define {e.macro(label)} {value}" + (f" /* {doc} */" if doc else ""))
        lines.append("")
    for name, spec in catalogue.items():
        abi = spec.abi
        lines.append(f"/* {name}: {abi.summary}")
        lines.append(f" * {geometry_line(abi)} */")
        body = " \\\n    ".join(f"{a.ctype} {a.name}," for a in abi.args).rstrip(",")
        lines.append(f"#define {macro_name(name)} \\\n    {body}")
        lines.append(f"typedef int (*qconform_{name}_launcher)({macro_name(name)}, void* stream);")
        lines.append("")
    lines.append("#endif /* QCONFORM_ABI_H */")
    return "\n".join(lines) + "\n"


def check_predicate(expr: str, scalars: Mapping[str, Any]) -> None:
    """Decline (``qconform.Declined``) when an implementation's declared predicate over the ABI's
    scalars (``requires=`` / ``__qconform_requires__``: ``"bits == 4 and K % 128 == 0"``) is false."""
    names = dict(scalars)
    try:
        ok = eval(expr, {"__builtins__": {}}, names)  # noqa: S307 - the user's own expression
    except Exception as exc:
        raise ArgumentError(f"requires: cannot evaluate {expr!r} on {names}: {exc}") from exc
    if not ok:
        raise Declined(f"requires {expr} (false for {names})")


def check_declared_predicate(fn: Any, abi: "Abi", args: tuple, kwargs: Mapping[str, Any]) -> None:
    """A ``py:`` callable's ``__qconform_requires__`` on the call's ABI scalars; a call that does
    not bind (a bad argument) is left to the callable's own validators."""
    expr = getattr(fn, "__qconform_requires__", None)
    if not expr:
        return
    try:
        scalars = abi.bind(args, kwargs).scalars
    except (ArgumentError, Declined, TypeError, ValueError):
        return
    check_predicate(expr, scalars)
