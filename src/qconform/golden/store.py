"""Golden vector files: ``<set>/<op>/<leaf>.safetensors`` plus ``<set>/MANIFEST.json``.

Each file holds the inputs and oracle outputs of a list of cases as tensors named
``<case id>/<input or output name>``, stored in their exact bytes (float32 and uint8 natively;
bf16/fp8 would be stored as U16/U8 bit patterns, docs/device-tooling.md E1), and in its metadata the
op, the leaf, and each case's seed, shape, pattern and params as JSON. The manifest records the
sha256 of every file, of its header and of every tensor's byte range, so a changed byte is named
by file and tensor, and provenance: qconform version, a hash of the oracle sources, the
generator's environment.
"""

from __future__ import annotations

import hashlib
import json
import platform
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

import numpy as np
from safetensors.numpy import load

import qconform
from qconform.ops import Case, OpSpec, get_op
from qconform.ops.spec import output_parts
from qconform.properties.checks import Prepared

FILE_FORMAT = "qconform-golden-1"
MANIFEST = "MANIFEST.json"
SCHEMA_VERSION = 1


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def oracle_source_hash() -> str:
    """sha256 over the sources that define golden outputs (formats, oracles, ops)."""
    root = Path(qconform.__file__).parent
    h = hashlib.sha256()
    for sub in ("formats", "oracles", "ops"):
        for path in sorted((root / sub).rglob("*.py")):
            h.update(path.relative_to(root).as_posix().encode())
            h.update(path.read_bytes())
    return h.hexdigest()


def environment() -> dict[str, str]:
    import numba

    return {
        "python": platform.python_version(),
        "numpy": np.__version__,
        "numba": numba.__version__,
        "machine": platform.machine(),
        "system": platform.system(),
    }


_DTYPE_CODES = {
    "float32": "F32",
    "float64": "F64",
    "float16": "F16",
    "uint8": "U8",
    "int8": "I8",
    "uint16": "U16",
    "int16": "I16",
    "uint32": "U32",
    "int32": "I32",
    "int64": "I64",
    "uint64": "U64",
}


def encode_safetensors(tensors: dict[str, np.ndarray], metadata: dict[str, str]) -> bytes:
    """A safetensors file with its header in sorted key order, so equal inputs give equal bytes
    (the safetensors library writes metadata from a hash map, in no fixed order)."""
    header: dict[str, Any] = {"__metadata__": dict(sorted(metadata.items()))}
    chunks, offset = [], 0
    for name in sorted(tensors):
        a = np.ascontiguousarray(tensors[name])
        data = a.astype(a.dtype.newbyteorder("<"), copy=False).tobytes()
        header[name] = {
            "dtype": _DTYPE_CODES[a.dtype.name],
            "shape": list(a.shape),
            "data_offsets": [offset, offset + len(data)],
        }
        chunks.append(data)
        offset += len(data)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)  # the data section starts 8-byte aligned, as the library pads
    return struct.pack("<Q", len(text)) + text + b"".join(chunks)


def leaf_path(op: str, leaf: str) -> str:
    return f"{op}/{leaf}.safetensors"


def encode_leaf(op: OpSpec, leaf: str, prepared: Iterable[Prepared]) -> bytes:
    tensors: dict[str, np.ndarray] = {}
    logical: dict[str, str] = {}
    cases: list[dict[str, Any]] = []
    for p in prepared:
        present = [n for n in op.input_names if n in p.inputs]  # optional inputs may be absent
        stored = {**{n: p.inputs[n] for n in present}, **dict(zip(op.output_names, output_parts(p.want), strict=True))}
        for name, a in stored.items():
            key = f"{p.case.id}/{name}"
            tensors[key] = np.ascontiguousarray(a)
            logical[key] = op.logical_dtypes.get(name, str(tensors[key].dtype)).format(**p.params)
        cases.append(json.loads(p.case.to_json()) | {"id": p.case.id})
    meta = {
        "format": FILE_FORMAT,
        "op": op.name,
        "leaf": leaf,
        "qconform_version": qconform.__version__,
        "inputs": json.dumps(list(op.input_names)),
        "output": op.output_name,
        **({"outputs": json.dumps(list(op.outputs))} if op.outputs else {}),
        "cases": json.dumps(cases, sort_keys=True),
        "logical_dtypes": json.dumps(logical, sort_keys=True),
    }
    return encode_safetensors(tensors, meta)


def read_header(data: bytes) -> tuple[int, dict[str, Any]]:
    """(where the data section starts, the parsed JSON header) of a safetensors file."""
    (n,) = struct.unpack("<Q", data[:8])
    return 8 + n, json.loads(data[8 : 8 + n])


def layout(data: bytes) -> tuple[int, dict[str, tuple[int, int]]]:
    """(header end, {tensor: (start, end)}) in absolute file offsets, from a safetensors header."""
    base, header = read_header(data)
    spans = {
        k: (base + v["data_offsets"][0], base + v["data_offsets"][1]) for k, v in header.items() if k != "__metadata__"
    }
    return base, spans


def manifest_entry(op: str, leaf: str, data: bytes, cases: list[Case]) -> dict[str, Any]:
    header_end, spans = layout(data)
    return {
        "path": leaf_path(op, leaf),
        "op": op,
        "leaf": leaf,
        "bytes": len(data),
        "sha256": sha256(data),
        "cases": [c.id for c in cases],
        "seeds": [c.seed for c in cases],
        "header": {"offsets": [0, header_end], "sha256": sha256(data[:header_end])},
        "tensors": {k: {"offsets": [a, b], "sha256": sha256(data[a:b])} for k, (a, b) in sorted(spans.items())},
    }


def write_set(
    out_dir: Path,
    leaves: list[tuple[OpSpec, str, list[Prepared]]],
    *,
    name: str | None = None,
    coverage: int | None = None,
    command: str = "",
) -> dict[str, Any]:
    """Write every leaf file and the manifest; return the manifest."""
    out_dir.mkdir(parents=True, exist_ok=True)
    files = []
    for op, leaf, prepared in leaves:
        data = encode_leaf(op, leaf, prepared)
        path = out_dir / leaf_path(op.name, leaf)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        files.append(manifest_entry(op.name, leaf, data, [p.case for p in prepared]))
    manifest = {
        "schema_version": SCHEMA_VERSION,
        "set": name or out_dir.name,
        "qconform_version": qconform.__version__,
        "oracle_source_sha256": oracle_source_hash(),
        "coverage": coverage,
        "generator": environment() | {"command": command},
        "files": files,
    }
    (out_dir / MANIFEST).write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")
    return manifest


@dataclass(frozen=True)
class GoldenLeaf:
    op: OpSpec
    leaf: str
    prepared: list[Prepared]


def decode_leaf(data: bytes) -> GoldenLeaf:
    """Read one golden file back into cases with their stored inputs and expected outputs."""
    meta = read_header(data)[1].get("__metadata__", {})
    if meta.get("format") != FILE_FORMAT:
        raise ValueError(f"not a {FILE_FORMAT} file (format={meta.get('format')!r})")
    op = get_op(meta["op"])
    tensors = load(data)
    inputs = json.loads(meta["inputs"])
    outputs = json.loads(meta["outputs"]) if "outputs" in meta else None  # an op with several outputs
    prepared = []
    for c in json.loads(meta["cases"]):
        case = Case.from_dict(c)
        ins = {name: tensors[f"{c['id']}/{name}"] for name in inputs if f"{c['id']}/{name}" in tensors}
        if outputs:
            want = tuple(tensors[f"{c['id']}/{name}"] for name in outputs)
        else:
            want = tensors[f"{c['id']}/{meta['output']}"]
        prepared.append(Prepared(case, ins, op.params(case), want))
    return GoldenLeaf(op, meta["leaf"], prepared)


def read_manifest(set_dir: Path) -> dict[str, Any]:
    return json.loads((set_dir / MANIFEST).read_text())
