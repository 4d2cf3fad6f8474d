"""The repository is self-contained: what a user reads points only at files the checkout has.

- No text file of the repository mentions a folder beside the checkout (the parent's shared
  folder, its specs, or a bare spec file name from it): the facts live in docs/.
- Every ``docs/<page>.md`` cited anywhere exists, and a citation that names sections
  (``docs/ort-ops.md 1.2``, ``docs/device-tooling.md B1-B5``, ``docs/ggml-formats.md sections 1.2,
  3.3, 8``, ``docs/device-tooling.md C:``) names sections the page has: a heading that starts with
  the id (``## 3.``, ``### 3.5 Q8_K``, ``## C.``, ``### C2.``) or an explicit ``<a id="...">``.
- Relative links between docs/ pages resolve.

qconform's own pages have lower-case names (``docs/ort-ops.md``); capitalised names such as onnx's
``docs/Operators.md`` are upstream files a page quotes, and are not checked.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# Built from pieces so that this file does not match itself.
_SHARED = ".." + "/shared"
_SHARED_SPECS = "shared" + "/specs"
_SPEC_FILES = ("ggml-quants", "ort-ops", "bnb-4bit", "tooling")
OUTSIDE = re.compile(
    "|".join(
        [
            re.escape(_SHARED),
            re.escape(_SHARED_SPECS),
            r"(?<![\w/-])" + "specs" + r"/(?:" + "|".join(map(re.escape, _SPEC_FILES)) + r")\.md",
        ]
    )
)

# A section id: "3", "3.5", "C2", or a bare letter "C" when punctuation follows it ("C:", "C)").
_ID = r"(?:[A-Z]?\d+(?:\.\d+)*|[A-Z](?=[:;,)]|\.(?:\s|$)|$))"
CITATION = re.compile(
    r"(?<![\w./-])docs/(?P<page>[a-z0-9][a-z0-9_-]*)\.md"
    r"(?:[`'\"*]*[ \t]+(?:sections?[ \t]+|§[ \t]*)?(?P<ids>" + _ID + r"(?:(?:,[ \t]*|[ \t]+and[ \t]+|[ \t]*[-–][ \t]*)"
    + _ID
    + r")*))?"
)
_ID_SPLIT = re.compile(r",[ \t]*|[ \t]+and[ \t]+|[ \t]*[-–][ \t]*")
HEADING = re.compile(r"^#{1,6}[ \t]+([A-Z]?\d+(?:\.\d+)*|[A-Z])\.?(?:[ \t]|$)", re.M)
ANCHOR = re.compile(r"""<a\s+(?:id|name)=["']([^"']+)["']""")
MD_LINK = re.compile(r"\]\((?!https?:|mailto:|#)([^)\s#]+)(?:#[^)\s]*)?\)")
# "owner/repo docs/x.md": a path in another repository.
_OTHER_REPO = re.compile(r"[\w.-]+/[\w.-]+[`'\"]*[ \t]*$")


def repo_files() -> list[Path]:
    """Every file git tracks or would track (untracked, not ignored); a plain walk without git."""
    try:
        out = subprocess.run(
            ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
            cwd=ROOT,
            capture_output=True,
            check=True,
        ).stdout
        names = sorted({n for n in out.decode("utf-8", "surrogateescape").split("\0") if n})
        paths = [ROOT / n for n in names]
    except (OSError, subprocess.CalledProcessError):
        paths = [ROOT / "README.md"]
        for top in ("src", "tests", "ci", "examples", "docs"):
            paths += sorted(p for p in (ROOT / top).rglob("*") if "__pycache__" not in p.parts)
    return [p for p in paths if p.is_file()]


def read_text(path: Path) -> str | None:
    data = path.read_bytes()
    if b"\0" in data[:8192]:
        return None
    return data.decode("utf-8", "replace")


def text_files() -> list[tuple[str, str]]:
    files = []
    for path in repo_files():
        text = read_text(path)
        if text is not None:
            files.append((path.relative_to(ROOT).as_posix(), text))
    return files


def outside_references(text: str) -> list[tuple[int, str]]:
    return [
        (lineno, line.strip())
        for lineno, line in enumerate(text.splitlines(), 1)
        if OUTSIDE.search(line)
    ]


def section_ids(page_text: str) -> set[str]:
    return set(HEADING.findall(page_text)) | set(ANCHOR.findall(page_text))


def citations(text: str) -> list[tuple[int, str, list[str]]]:
    """(line, page name, section ids) of every docs/<page>.md citation in ``text``."""
    found = []
    for lineno, line in enumerate(text.splitlines(), 1):
        for m in CITATION.finditer(line):
            if _OTHER_REPO.search(line[: m.start()]):
                continue
            ids = _ID_SPLIT.split(m.group("ids")) if m.group("ids") else []
            found.append((lineno, m.group("page"), ids))
    return found


def broken_citations(files: list[tuple[str, str]], docs_dir: Path) -> list[str]:
    problems = []
    pages: dict[str, set[str] | None] = {}
    for name, text in files:
        for lineno, page, ids in citations(text):
            if page not in pages:
                path = docs_dir / f"{page}.md"
                pages[page] = section_ids(path.read_text(encoding="utf-8")) if path.is_file() else None
            have = pages[page]
            if have is None:
                problems.append(f"{name}:{lineno}: docs/{page}.md does not exist")
                continue
            missing = [i for i in ids if i not in have]
            if missing:
                problems.append(f"{name}:{lineno}: docs/{page}.md has no section {', '.join(missing)}")
    return problems


def broken_relative_links(docs_dir: Path) -> list[str]:
    problems = []
    for page in sorted(docs_dir.glob("*.md")):
        for lineno, line in enumerate(page.read_text(encoding="utf-8").splitlines(), 1):
            for target in MD_LINK.findall(line):
                if not (page.parent / target).exists():
                    problems.append(f"docs/{page.name}:{lineno}: link to {target} does not resolve")
    return problems


def test_nothing_points_outside_the_repository():
    offenders = [
        f"{name}:{lineno}: {line}"
        for name, text in text_files()
        for lineno, line in outside_references(text)
    ]
    assert not offenders, "paths outside the checkout (cite docs/ instead):\n" + "\n".join(offenders)


def test_cited_docs_pages_and_sections_exist():
    problems = broken_citations(text_files(), ROOT / "docs")
    assert not problems, "\n".join(problems)


def test_docs_relative_links_resolve():
    problems = broken_relative_links(ROOT / "docs")
    assert not problems, "\n".join(problems)


def test_reference_pages_are_present():
    for page in ("ggml-formats", "ort-ops", "bnb-4bit", "device-tooling"):
        text = (ROOT / "docs" / f"{page}.md").read_text(encoding="utf-8")
        assert section_ids(text), f"docs/{page}.md has no numbered sections"


def test_the_checks_can_fail(tmp_path):
    """The scanners flag what they are meant to flag (so a green run means something). The
    made-up citations are assembled at run time, so this file itself cites no missing page."""
    assert outside_references(f"see {_SHARED}/x.md") == [(1, f"see {_SHARED}/x.md")]
    assert outside_references(f"facts: {_SHARED_SPECS}/ort-ops.md") != []
    assert outside_references("facts: " + "specs" + "/tooling.md C2") != []
    assert outside_references("facts: docs/device-tooling.md C2") == []

    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "page.md").write_text("# Page\n\n## 1. One\n\n### 1.2 Sub\n\n## C. Letter\n\n### C4. Four\n")
    (docs / "links.md").write_text("[ok](page.md#c) [bad](missing.md)\n")
    d = "docs" + "/"
    good = f"{d}page.md 1.2, {d}page.md sections 1, 1.2 and C4, {d}page.md C: text, {d}page.md C4-C4"
    assert broken_citations([("a.py", good)], docs) == []
    bad = f"{d}nope.md; {d}page.md 3.1; {d}page.md sections 1-2; {d}page.md D:"
    assert broken_citations([("a.py", bad)], docs) == [
        f"a.py:1: {d}nope.md does not exist",
        f"a.py:1: {d}page.md has no section 3.1",
        f"a.py:1: {d}page.md has no section 2",
        f"a.py:1: {d}page.md has no section D",
    ]
    # Upstream pages quoted by name are not ours to check.
    assert citations(f"onnx/onnx {d}Operators.md; llama.cpp ggml-org/llama.cpp {d}build.md") == []
    assert broken_relative_links(docs) == [f"{d}links.md:1: link to missing.md does not resolve"]
