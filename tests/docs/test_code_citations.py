"""The code cites pages of ``docs/``, and only those: every ``docs/<page>.md#anchor`` in
a source, test, benchmark or example names a page that exists and a heading on it, and
no comment cites the design documents outside the repository ("PROTOCOL §4",
"SPEC §5") that a reader of the repository cannot open."""

from __future__ import annotations

import re
import unicodedata
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
TREES = ("streamworks", "tests", "bench", "examples")
SUFFIXES = {".py", ".lua"}

CITATION = re.compile(r"docs/(?P<page>[a-z0-9_/-]+\.md)(?:#(?P<anchor>[a-z0-9_-]+))?")
OUTSIDE = re.compile(r"\b(?:PROTOCOL|SPEC) §\s*\d")
HEADING = re.compile(r"^#{1,6}\s+(?P<title>.+?)\s*#*\s*$", re.MULTILINE)
FENCE = re.compile(r"^```.*?^```", re.MULTILINE | re.DOTALL)


def _slug(title: str) -> str:
    """Python-Markdown's ``toc`` slug (what mkdocs makes a heading's anchor)."""
    text = re.sub(r"`|\*\*|\[([^\]]*)\]\([^)]*\)", r"\1", title)
    text = unicodedata.normalize("NFKD", text).encode("ascii", "ignore").decode()
    text = re.sub(r"[^\w\s-]", "", text).strip().lower()
    return re.sub(r"[-\s]+", "-", text)


def _anchors(page: Path) -> set[str]:
    text = FENCE.sub("", page.read_text())
    return {_slug(m["title"]) for m in HEADING.finditer(text)}


def _sources() -> list[Path]:
    here = Path(__file__).resolve()
    return sorted(
        p
        for tree in TREES
        for p in (ROOT / tree).rglob("*")
        if p.suffix in SUFFIXES and p.is_file() and p.resolve() != here
    )


def test_slug_matches_mkdocs() -> None:
    assert _slug("Ack-delete and retention (E12)") == "ack-delete-and-retention-e12"
    assert _slug("The HTTP API (v1)") == "the-http-api-v1"
    assert _slug("Several processes per host: `worker --processes`") == (
        "several-processes-per-host-worker-processes"
    )


def test_citations_name_existing_pages_and_headings() -> None:
    anchors: dict[str, set[str]] = {}
    broken: list[str] = []
    cited = 0
    for source in _sources():
        for lineno, line in enumerate(source.read_text().splitlines(), 1):
            for m in CITATION.finditer(line):
                page = DOCS / m["page"]
                where = f"{source.relative_to(ROOT)}:{lineno}: docs/{m['page']}"
                if not page.is_file():
                    broken.append(f"{where}: no such page")
                    continue
                cited += 1
                if m["anchor"] is None:
                    continue
                known = anchors.setdefault(m["page"], _anchors(page))
                if m["anchor"] not in known:
                    broken.append(f"{where}#{m['anchor']}: no such heading")
    assert cited > 30, "the citations were not found: is the pattern still right?"
    assert not broken, "\n".join(broken)


@pytest.mark.parametrize("text", ["(PROTOCOL §6)", 'SPEC §5 "Exclusive processing"'])
def test_outside_citation_pattern(text: str) -> None:
    assert OUTSIDE.search(text)


def test_no_citation_of_documents_outside_the_repository() -> None:
    found = [
        f"{source.relative_to(ROOT)}:{lineno}: {line.strip()}"
        for source in _sources()
        for lineno, line in enumerate(source.read_text().splitlines(), 1)
        if OUTSIDE.search(line)
    ]
    assert not found, "cite docs/ pages instead:\n" + "\n".join(found)
