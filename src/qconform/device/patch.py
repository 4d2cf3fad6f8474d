"""Kernel variants as text patches of a shipped source: the device mutants (tests/device_catalogue.py).
Shipped kernels carry no mutant or diagnostic hooks (docs/architecture.md, Device kernels); a
variant is the shipped file with exact snippets replaced, each of which must occur exactly once in
it, so a kernel edit that moves or changes a snippet fails loudly (tests/test_device_offline.py)
instead of silently testing the shipped kernel.

A patched source is written as a complete file beside copies of the headers of its folder: the
loader puts the source's own folder on the include path (``-I``, and ``#include "x.h"`` looks
there first), so ``ort/nbits_mma.hip`` patched elsewhere still finds ``ort_common.h``;
``kernels/common`` comes from ``-I`` as for the shipped file. No CuPy here.
"""

from __future__ import annotations

import contextlib
import hashlib
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator


class PatchError(ValueError):
    """A patch's original snippet does not occur exactly once in the source it patches."""


def apply_edits(text: str, edits: tuple[tuple[str, str], ...], where: str = "source") -> str:
    """``text`` with each (original, replacement) applied in order; every original must occur
    exactly once in the text it is applied to, and differ from its replacement."""
    for original, replacement in edits:
        count = text.count(original)
        if count != 1:
            raise PatchError(f"{where}: the snippet {original!r} occurs {count} times, not once")
        if replacement == original:
            raise PatchError(f"{where}: the snippet {original!r} is replaced by itself")
        text = text.replace(original, replacement)
    return text


@dataclass(frozen=True)
class Patch:
    """``source`` (a kernel file) with ``edits``: (exact original snippet, its replacement) pairs."""

    source: Path
    edits: tuple[tuple[str, str], ...]

    def text(self) -> str:
        """The patched source (PatchError if a snippet does not occur exactly once)."""
        return apply_edits(self.source.read_text(), self.edits, where=str(self.source))

    def write(self, directory: Path) -> Path:
        """Write the patched source as ``directory/<source name>`` beside copies of the ``*.h``
        of the source's folder; returns its path."""
        text = self.text()
        directory.mkdir(parents=True, exist_ok=True)
        for header in self.source.parent.glob("*.h"):
            shutil.copyfile(header, directory / header.name)
        path = directory / self.source.name
        path.write_text(text)
        return path

    @contextlib.contextmanager
    def materialised(self) -> Iterator[Path]:
        """The patched source's path in a temporary directory, removed after the block. The path
        names the content's hash: kernels are cached per path for the process, so one path never
        stands for two different texts."""
        digest = hashlib.sha256(self.text().encode()).hexdigest()[:16]
        with tempfile.TemporaryDirectory(prefix="qconform-patch-") as tmp:
            yield self.write(Path(tmp) / digest)
