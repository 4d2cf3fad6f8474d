"""Which kernels of a source changed their machine code: a kernel file built twice with nvcc -cubin
(two git revisions, or two sets of build options), each kernel's code compared byte for byte.

A cubin is an ELF file with one section ``.text.<kernel>`` of machine code per kernel, and one per
device function the compiler kept apart (compared the same way); a kernel's register count is the
``.nv.info`` section's EIATTR_REGCOUNT entry for its symbol. Equal bytes are equal SASS, the same
instructions in the same order (the ELF layout: the System V gABI, "Sections"; the cubin's sections
and attributes: CUDA Binary Utilities, cuobjdump -elf). Used to back a claim such
as "the default build's SASS is unchanged (all 12 kernels)" with a command that needs only nvcc, no GPU
and no cuobjdump:

    python ci/sass_diff.py ort/nbits_wgmma.hip --base HEAD~1 --arch sm_90a
    python ci/sass_diff.py ort/nbits_mma.hip --define=-DQK_NBITS_RING_STRIDED   # a build option's kernels

The source is named under src/qconform/device/kernels; the base build takes that tree at --base
(default HEAD) with --base-define, the other the working tree with --define. Exit status 0 when every
kernel is the same, 1 when one differs or is in one build only, 2 when a build fails.
"""

from __future__ import annotations

import argparse
import struct
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
KERNELS = "src/qconform/device/kernels"


EIATTR_REGCOUNT = 0x2F  # a .nv.info attribute: (symbol index, registers), as nvcc 12-13's cubins carry it


def kernel_code(cubin: bytes) -> dict[str, tuple[bytes, int]]:
    """Each kernel's machine code and register count, by name, from an ELF64 cubin: the ``.text.*``
    sections (section headers at e_shoff, e_shnum of e_shentsize bytes; names in section e_shstrndx;
    sh_info the kernel's symbol index) and ``.nv.info``'s EIATTR_REGCOUNT entries (each a format
    byte, an attribute byte, then for format 4 a 16-bit size and that many bytes, else 2 bytes)."""
    if cubin[:4] != b"\x7fELF" or cubin[4] != 2:
        raise ValueError("cubin: not an ELF64 file")
    shoff = struct.unpack_from("<Q", cubin, 0x28)[0]
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", cubin, 0x3A)
    sections = []  # (name, bytes, sh_info)
    strtab = struct.unpack_from("<Q", cubin, shoff + shstrndx * shentsize + 0x18)[0]
    for i in range(shnum):
        name_at, _, _, _, offset, size, _, info = struct.unpack_from("<IIQQQQII", cubin, shoff + i * shentsize)
        name = cubin[strtab + name_at : cubin.index(b"\0", strtab + name_at)].decode()
        sections.append((name, cubin[offset : offset + size], info))
    regs = {}
    for name, data, _ in sections:
        p = 0
        while name == ".nv.info" and p + 4 <= len(data):
            fmt, attr = data[p], data[p + 1]
            size = struct.unpack_from("<H", data, p + 2)[0] if fmt == 4 else 0
            if attr == EIATTR_REGCOUNT and fmt == 4:
                symbol, count = struct.unpack_from("<II", data, p + 4)
                regs[symbol] = count
            p += 4 + size
    return {n[len(".text.") :]: (d, regs.get(info, 0)) for n, d, info in sections if n.startswith(".text.")}


def compare(base: dict[str, tuple[bytes, int]], new: dict[str, tuple[bytes, int]]) -> list[tuple[str, str]]:
    """(kernel, verdict) for every kernel of either build, sorted by name: ``same``, ``DIFF`` (with
    both register counts), ``only in base`` or ``only in new``."""
    rows = []
    for name in sorted(set(base) | set(new)):
        if name not in new:
            rows.append((name, "only in base"))
        elif name not in base:
            rows.append((name, "only in new"))
        elif base[name][0] == new[name][0]:
            rows.append((name, "same"))
        else:
            rows.append((name, f"DIFF (registers {base[name][1]} -> {new[name][1]})"))
    return rows


def build(tree: Path, source: str, arch: str, defines: list[str], out: Path) -> bytes:
    """nvcc -cubin of tree/KERNELS/source for arch, the kernel tree's folders on the include path."""
    k = tree / KERNELS
    src = k / source
    cmd = ["nvcc", "-cubin", f"-arch={arch}", *defines, f"-I{k}", f"-I{k / 'common'}", f"-I{src.parent}"]
    subprocess.run([*cmd, "-x", "cu", str(src), "-o", str(out)], check=True, capture_output=True, text=True)
    return out.read_bytes()


def base_tree(rev: str, into: Path) -> Path:
    """The kernel tree as of git revision rev, extracted under into."""
    into.mkdir(parents=True)
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", rev, KERNELS], check=True, capture_output=True)
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive.stdout, check=True)
    return into


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python ci/sass_diff.py", description=__doc__.split("\n\n")[0])
    p.add_argument("source", help=f"the kernel file, relative to {KERNELS} (e.g. ort/nbits_mma.hip)")
    p.add_argument("--base", default="HEAD", help="the git revision of the base build (default HEAD)")
    p.add_argument("--arch", default="sm_90", help="nvcc -arch (default sm_90; sm_90a for wgmma sources)")
    p.add_argument(
        "--define", action="append", default=[], help="a build option of the new build, as --define=-DNAME (repeatable)"
    )
    p.add_argument(
        "--base-define", action="append", default=[], help="a build option of the base build, as --base-define=-DNAME"
    )
    p.add_argument("--same-tree", action="store_true", help="build the base from the working tree too")
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        t = Path(tmp)
        try:
            tree = ROOT if args.same_tree else base_tree(args.base, t / "base")
            old = kernel_code(build(tree, args.source, args.arch, args.base_define, t / "base.cubin"))
            new = kernel_code(build(ROOT, args.source, args.arch, args.define, t / "new.cubin"))
        except subprocess.CalledProcessError as e:
            print(f"sass_diff: {' '.join(map(str, e.cmd[:3]))} ... failed:\n{e.stderr}", file=sys.stderr)
            return 2
    rows = compare(old, new)
    for name, verdict in rows:
        print(f"{verdict:>28}  {name}")
    changed = sum(v != "same" for _, v in rows)
    print(f"{len(rows) - changed} of {len(rows)} kernels the same, {changed} changed ({args.arch})")
    return 1 if changed else 0


if __name__ == "__main__":
    raise SystemExit(main())
