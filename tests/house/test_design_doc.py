"""docs/design.md is where the code's reasons live: its sections are numbered and each has
an anchor, and every reference to it in the repository names a section it has."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DESIGN = ROOT / "docs" / "design.md"
# where references to the design live; generated and third-party files are not read
SCANNED = ("src", "tests", "benchmarks", "docs", "deploy")
SUFFIXES = {".py", ".pyx", ".pyi", ".pxd", ".md", ".lua", ".toml", ".sh"}
_ANCHOR = re.compile(r'<a id="([a-z0-9-]+)"></a>\n## (\d+)\. ')
_LINK = re.compile(r"design\.md#([\w-]+)")
# the name of the team's old design document followed by a section number
_OLD = re.compile("DESIGN" + r"(?:'s)?\s*(?:§|\d)")


def anchors() -> dict[str, int]:
    text = DESIGN.read_text(encoding="utf-8")
    return {name: int(n) for name, n in _ANCHOR.findall(text)}


def files() -> list[Path]:
    return sorted(p for d in SCANNED for p in (ROOT / d).rglob("*")
                  if p.suffix in SUFFIXES and p.is_file() and "__pycache__" not in p.parts)


def test_every_section_is_numbered_in_order_and_has_an_anchor() -> None:
    text = DESIGN.read_text(encoding="utf-8")
    headings = re.findall(r"^## (\d+)\. ", text, flags=re.M)
    numbers = sorted(anchors().values())
    assert numbers == list(range(1, len(headings) + 1)), \
        "every '## N.' heading has an anchor line above it, numbered 1, 2, 3, ..."
    for name in anchors():
        assert f"(#{name})" in text, f"section {name} is missing from the list at the top"


def test_every_reference_names_a_section_the_design_has() -> None:
    known = anchors()
    wrong = [f"{p.relative_to(ROOT)}: design.md#{name}" for p in files()
             for name in _LINK.findall(p.read_text(encoding="utf-8", errors="replace"))
             if name not in known]
    assert not wrong, "\n".join(wrong)


def test_no_reference_points_at_a_document_outside_the_repository() -> None:
    old = [f"{p.relative_to(ROOT)}:{n}" for p in files()
           for n, line in enumerate(p.read_text(encoding="utf-8", errors="replace")
                                    .splitlines(), 1) if _OLD.search(line)]
    assert not old, "cite docs/design.md#<section> instead:\n" + "\n".join(old)
