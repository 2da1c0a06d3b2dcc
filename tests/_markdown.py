"""Reading the docs' markdown tables, for the tests that check quoted results against their files."""

from __future__ import annotations

from pathlib import Path
from typing import List, NamedTuple

ROOT = Path(__file__).resolve().parents[1]


class Table(NamedTuple):
    line: int  # of the header, 1-based
    text: str  # the header line as written, indentation stripped
    header: List[str]  # the header's cells
    rows: List[List[str]]  # the cells of each body row


def _cells(line: str) -> List[str]:
    return [c.strip() for c in line.strip().strip("|").split("|")]


def tables(doc: str) -> List[Table]:
    """Every markdown table of ``doc`` (relative to the repository): a line that starts with
    ``|`` followed by one that starts with ``|---``, then its body up to the first line that does
    not start with ``|`` (each line read with its indentation stripped)."""
    lines = [line.lstrip() for line in (ROOT / doc).read_text().splitlines()]
    out = []
    i = 0
    while i < len(lines):
        if lines[i].startswith("|") and i + 1 < len(lines) and lines[i + 1].startswith("|---"):
            j = i + 2
            while j < len(lines) and lines[j].startswith("|"):
                j += 1
            out.append(Table(i + 1, lines[i], _cells(lines[i]), [_cells(l) for l in lines[i + 2 : j]]))
            i = j
        i += 1
    return out


def table_rows(doc: str, header_start: str) -> List[List[str]]:
    """The cells of each body row of the first table in ``doc`` whose header line starts with
    ``header_start`` (a table indented under a list item too); [] if there is none."""
    return next((t.rows for t in tables(doc) if t.text.startswith(header_start)), [])
