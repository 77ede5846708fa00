"""Every "spec N.N" citation names a section of docs/spec/, and every provenance tag is defined.

Docstrings, comments and documents cite the project's specification as ``spec 1.2``,
``spec §1.2``, ``spec section 1.2``, ``spec 1.5-1.8``, ``spec 5.1, 5.4`` or ``spec sections 2.1
and 2.3``; the compressor table of docs/guide/compressors.md has a ``spec`` column of section numbers. A section exists
when a Markdown heading of a page under ``docs/spec/`` starts with its number. Provenance tags
(``[CHOICE]``, ``[SEED-R: ...]``, ...) must be defined in the table of ``docs/spec/index.md``.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest


def _repository_root() -> Path:
    for folder in Path(__file__).resolve().parents:
        if (folder / "pyproject.toml").is_file():
            return folder
    raise RuntimeError("no pyproject.toml above this test")


ROOT = _repository_root()
SPEC_DIR = ROOT / "docs" / "spec"
#: where citations are looked for (this file is left out: it holds counter-examples)
SCANNED = ("src", "docs", "tests", "examples", "benchmarks")
SUFFIXES = (".py", ".md")

_NUMBER = r"\d+(?:\.\d+)*"
#: "spec" (or "specification", "spec's"), an optional "section(s)" and "§", then a section
#: number, then more numbers joined by commas, "and", "to" or a dash; a joined number must have
#: a dot, so that "spec 1.10, 50 epochs" cites 1.10 only
CITATION = re.compile(
    r"\b[Ss]pec(?:ification)?(?:'s)?\s+(?:[Ss]ections?\s+)?§?\s*"
    rf"(?P<first>{_NUMBER})"
    r"(?P<rest>(?:\s*(?:,|-|–|—|\band\b|\bto\b)\s*§?\d+\.\d+(?:\.\d+)*)*)"
)
HEADING = re.compile(rf"^#{{1,6}}\s+§?(?P<number>{_NUMBER})\.?(?:\s|$)", re.MULTILINE)
#: an upper-case word of four or more letters in square brackets, optionally with ``-X``,
#: followed by ``]``, a space, ``,``, ``:`` or ``;``: ``[CHOICE]``, ``[SEED-R: ...]``
# a tag in brackets; not a Markdown link text (``[QESGD](qesgd.md)``) nor a list of names
# (``members: [SCHEMES, VARIANTS]``)
TAG = re.compile(r"(?<!members: )\[(?P<tag>[A-Z]{4,}(?:-[A-Z])?)(?:(?=[\s,:;])|\](?![(\[]))")
TAG_DEFINITION = re.compile(r"^\|\s*\[(?P<tag>[A-Z]{4,}(?:-[A-Z])?)\]\s*\|", re.MULTILINE)


def cited_sections(text: str) -> Iterator[tuple[str, int]]:
    """``(section, line number)`` for every section a citation in ``text`` names."""
    for match in CITATION.finditer(text):
        line = text.count("\n", 0, match.start()) + 1
        yield match["first"], line
        for number in re.findall(r"\d+\.\d+(?:\.\d+)*", match["rest"]):
            yield number, line


def table_sections(text: str) -> Iterator[tuple[str, int]]:
    """Section numbers in the ``spec`` column of Markdown tables (the guide's compressor table)."""
    column: int | None = None
    for line_number, line in enumerate(text.splitlines(), start=1):
        if not line.startswith("|"):
            column = None
            continue
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if column is None:
            lowered = [cell.lower() for cell in cells]
            column = lowered.index("spec") if "spec" in lowered else None
            continue
        if column < len(cells):
            for number in re.findall(r"\d+\.\d+(?:\.\d+)*", cells[column]):
                yield number, line_number


def spec_headings() -> list[tuple[str, str]]:
    """(section number, page) of every numbered heading in docs/spec/, in page order."""
    return [
        (match["number"], page.name)
        for page in sorted(SPEC_DIR.glob("*.md"))
        for match in HEADING.finditer(page.read_text(encoding="utf-8"))
    ]


def spec_sections() -> dict[str, str]:
    """Every section number with a heading in docs/spec/, mapped to its (first) page."""
    sections: dict[str, str] = {}
    for number, page in spec_headings():
        sections.setdefault(number, page)
    return sections


def scanned_files() -> list[Path]:
    files = [ROOT / "README.md"]
    for folder in SCANNED:
        files.extend(
            path
            for path in sorted((ROOT / folder).rglob("*"))
            if path.suffix in SUFFIXES and path.is_file() and path.resolve() != Path(__file__)
        )
    return [path for path in files if path.is_file()]


def _shown(path: Path) -> str:
    resolved = path.resolve()
    return str(resolved.relative_to(ROOT)) if resolved.is_relative_to(ROOT) else path.name


def unresolved(files: list[Path], sections: dict[str, str]) -> list[str]:
    """``path:line: spec N.N`` for every citation whose section has no heading."""
    missing = []
    for path in files:
        text = path.read_text(encoding="utf-8")
        found = list(cited_sections(text))
        if path.suffix == ".md":  # the guide's compressor table has a spec column
            found.extend(table_sections(text))
        for number, line in found:
            if number not in sections:
                missing.append(f"{_shown(path)}:{line}: spec {number}")
    return missing


def test_spec_pages_exist() -> None:
    for name in ("index", "dqsg", "qesgd", "lpc-svrg", "dqgan", "dryden", "checklist"):
        assert (SPEC_DIR / f"{name}.md").is_file(), f"docs/spec/{name}.md is missing"


def test_every_chapter_and_section_has_a_heading() -> None:
    sections = spec_sections()
    expected = {
        "0": 6,
        "1": 10,
        "2": 4,
        "3": 8,
        "4": 6,
        "5": 7,
        "6": 6,
        "7": 5,
    }
    for chapter, count in expected.items():
        assert chapter in sections, f"chapter {chapter} has no heading"
        for index in range(1, count + 1):
            assert f"{chapter}.{index}" in sections, f"section {chapter}.{index} has no heading"


def test_section_numbers_are_unique() -> None:
    seen: dict[str, str] = {}
    for number, page in spec_headings():
        assert number not in seen, f"section {number} in both {seen[number]} and {page}"
        seen[number] = page


def test_every_citation_names_an_existing_section() -> None:
    files = scanned_files()
    assert len(files) > 100, "the scan found suspiciously few files"
    assert not unresolved(files, spec_sections())


def test_the_scan_finds_the_citations_it_should() -> None:
    text = (
        "see spec 1.2 and (spec §3.3), spec sections 2.1 and 2.3, spec 1.5-1.8, Spec 0.6 and\n"
        "5.2, spec 5.1, 5.4, 1.9; the spec's 4.5; spec section 4; spec 1.10, 50 epochs;"
        " spec 1.2–1.4"
    )
    numbers = [number for number, _ in cited_sections(text)]
    assert numbers == [
        "1.2",
        "3.3",
        "2.1",
        "2.3",
        "1.5",
        "1.8",
        "0.6",
        "5.2",
        "5.1",
        "5.4",
        "1.9",
        "4.5",
        "4",
        "1.10",
        "1.2",
        "1.4",
    ]
    table = "| name | spec |\n|---|---|\n| `a` | 1.2–1.4 |\n| `b` | — |\n\n| x |\n| 9.9 |"
    assert [number for number, _ in table_sections(table)] == ["1.2", "1.4"]


def test_a_citation_of_a_missing_section_is_reported(tmp_path: Path) -> None:
    cited = tmp_path / "module.py"
    cited.write_text('"""Uses the rule of spec 1.2 and of spec 9.9."""\n', encoding="utf-8")
    sections = spec_sections()
    assert "1.2" in sections
    assert "9.9" not in sections
    assert unresolved([cited], sections) == ["module.py:1: spec 9.9"]


def defined_tags() -> set[str]:
    index = (SPEC_DIR / "index.md").read_text(encoding="utf-8")
    return {match["tag"] for match in TAG_DEFINITION.finditer(index)}


def test_index_defines_the_provenance_tags() -> None:
    assert defined_tags() >= {"SEED", "SEED-R", "CODE", "RECON", "CHOICE"}


@pytest.mark.parametrize("folder", ["src", "docs"])
def test_every_tag_used_is_defined(folder: str) -> None:
    defined = defined_tags()
    undefined = []
    for path in sorted((ROOT / folder).rglob("*")):
        if path.suffix not in SUFFIXES or not path.is_file():
            continue
        text = path.read_text(encoding="utf-8")
        for match in TAG.finditer(text):
            if match["tag"] not in defined:
                line = text.count("\n", 0, match.start()) + 1
                undefined.append(f"{_shown(path)}:{line}: [{match['tag']}]")
    assert not undefined
