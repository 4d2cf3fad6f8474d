"""The OpSpec record (modelled on PyTorch's OpInfo) and the Case every check runs on."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from qconform.ops.abi import Abi


@dataclass(frozen=True)
class Leaf:
    """A dtype variant of an op, named as kernel unit tests name it (``Xfp32_Yq8_K``)."""

    name: str
    params: dict[str, Any] = field(default_factory=dict)


# default params that repeat the shape: left out of case ids (num_heads / kv_num_heads: attention)
SHAPE_PARAMS = ("K", "rows", "cols", "num_heads", "kv_num_heads")


@dataclass(frozen=True)
class Case:
    """One deterministic input: inputs are built with numpy from ``seed``, ``shape`` and ``pattern``."""

    op: str
    leaf: str
    seed: int
    shape: tuple[int, ...]
    pattern: str
    params: dict[str, Any] = field(default_factory=dict)
    # the op's params that repeat the shape (left out of the id); not part of the case's identity
    shape_params: tuple[str, ...] = field(default=SHAPE_PARAMS, compare=False, repr=False)

    @property
    def id(self) -> str:
        """``pattern-shape-seed``, then the params that are not the shape again (``bs=64,zp=none``)."""
        dims = "x".join(str(d) for d in self.shape)
        extra = ",".join(f"{k}={v}" for k, v in sorted(self.params.items()) if k not in self.shape_params)
        return f"{self.pattern}-{dims}-s{self.seed}" + (f"-{extra}" if extra else "")

    def to_json(self) -> str:
        return json.dumps(
            {
                "op": self.op,
                "leaf": self.leaf,
                "seed": self.seed,
                "shape": list(self.shape),
                "pattern": self.pattern,
                "params": self.params,
            },
            sort_keys=True,
            separators=(",", ":"),
        )

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Case":
        return cls(
            d["op"],
            d["leaf"],
            int(d["seed"]),
            tuple(int(s) for s in d["shape"]),
            d["pattern"],
            dict(d.get("params", {})),
        )

    @classmethod
    def from_json(cls, text: str) -> "Case":
        return cls.from_dict(json.loads(text))


@dataclass(frozen=True)
class Check:
    """How an implementation's output is compared with the oracle's.

    ``exact``: bytes equal (float outputs: bit-equal, or NaN in both places).
    ``rel_l2``: ||out - ref|| / ||ref|| <= ``tol`` with NaN positions equal; ``reason`` says why.
    ``steps``: integer outputs within ``tol`` quantization steps; the differing elements counted.
    ``tol_for(params)``, when given, derives the tolerance from the case (K, the output dtype).
    ``bound``: every element within its own bound, derived from the data and the implementation's
    numeric contract (``OpSpec.numerics`` gives the error model: ``qconform.properties.bounds``).
    """

    kind: str = "exact"
    tol: float = 0.0
    reason: str = "bit-exact op"
    tol_for: Callable[[dict[str, Any]], float] | None = None


@dataclass(frozen=True)
class BadArgument:
    """A call that breaks one rule: the implementation must raise, touching no buffer, for that
    rule: the message must name ``arg`` (the argument the rule is about: ``bits``, ``B``, ``out``)
    and match ``match`` (a regex, searched case-insensitively). qconform's validators raise
    ``ArgumentError("<arg>: <rule>")``; ``match`` is derived from what they raise for the call,
    kept loose enough for another implementation's wording (a key word or the expected value).
    """

    rule: str
    inputs: dict[str, Any]
    params: dict[str, Any]
    bad_out: Any = None  # an ill-formed ``out`` buffer, when the rule is about ``out``
    arg: str = field(kw_only=True)
    match: str = field(kw_only=True)

    def names_arg(self, message: str) -> bool:
        """``arg`` appears in the message as a whole identifier (``_`` may be written as a space)."""
        name = re.escape(self.arg).replace("_", "[_ ]")
        return re.search(rf"(?<!\w){name}(?!\w)", message) is not None

    def mismatch(self, message: str) -> str | None:
        """None when ``message`` rejects the call for this rule, else what it should have said."""
        if self.names_arg(message) and re.search(self.match, message, re.IGNORECASE):
            return None
        return f"expected an error naming '{self.arg}' and matching /{self.match}/"


@dataclass(frozen=True)
class OpSpec:
    """One declarative catalogue entry.

    ``oracle`` is the plain function a ``py:`` implementation replaces; ``call_args`` says how the
    suite calls such a function for given inputs and params.
    """

    name: str
    family: str
    leaves: tuple[Leaf, ...]
    oracle: Callable[..., np.ndarray]
    call_args: Callable[[dict[str, np.ndarray], dict[str, Any]], tuple[tuple, dict]]
    make_inputs: Callable[[Case], dict[str, np.ndarray]]
    cases: Callable[[str, int], list[Case]]
    strategy: Callable[[str], Any]
    validate: Callable[..., Any]  # (inputs, params, out=None); raises ArgumentError
    bad_arguments: Callable[[str], list[BadArgument]]
    decode: Callable[[np.ndarray, dict[str, Any]], np.ndarray]
    abi: Abi  # the kernel arguments a hip:/so: implementation is called with (qconform abi OP)
    check: Check = Check()
    input_names: tuple[str, ...] = ("x",)
    output_name: str = "y"
    locate: Callable[[dict[str, Any], tuple[int, ...]], str] | None = None
    # what each tensor holds, for golden metadata; formatted with the case params ("{qtype}")
    logical_dtypes: dict[str, str] = field(default_factory=dict)
    # (leaf, size, seed) -> a realistic case that grows with ``size``, the op's own growth unit (rows
    # at a wide LLM row width, output columns of a layer, tokens, experts): the device checks size
    # the cold input sets from its measured bytes per unit, and draw never-seen shapes from it
    sized_case: Callable[[str, int, int], Case] | None = None
    # device checks add input sets larger than the L2 cache (weights read cold) to the repeat
    # rotation and match them against the oracle
    cold_repeat: bool = True
    # (inputs, params, contract, ftz) -> the readings of the op the contract accepts, each a
    # qconform.properties.expect.Expected; None: the oracle's output is the one reading
    numerics: Callable[..., list[Any]] | None = None
    # an op with several outputs names them here, in the order its oracle returns them (a tuple;
    # ``out=`` is a tuple of buffers): the first is checked by ``check``, each other exactly, on
    # the elements its reading's mask leaves checked (``Expected.mask``, one entry per output)
    outputs: tuple[str, ...] = ()

    @property
    def output_names(self) -> tuple[str, ...]:
        return self.outputs or (self.output_name,)

    def leaf(self, name: str) -> Leaf:
        for leaf in self.leaves:
            if leaf.name == name:
                return leaf
        raise KeyError(f"{self.name} has no leaf {name!r}; leaves: {[lf.name for lf in self.leaves]}")

    def params(self, case: Case) -> dict[str, Any]:
        return {**self.leaf(case.leaf).params, **case.params}


def output_parts(result: Any) -> tuple[Any, ...]:
    """An op's result (or ``out``) as the tuple of its outputs: one array is a 1-tuple."""
    return tuple(result) if isinstance(result, (tuple, list)) else (result,)


def result_bytes(result: Any) -> bytes:
    """Every output's bytes, in order: equal results give equal bytes."""
    return b"".join(np.asarray(a).tobytes() for a in output_parts(result))


def result_size(result: Any) -> int:
    """Elements in every output together."""
    return sum(int(np.asarray(a).size) for a in output_parts(result))
