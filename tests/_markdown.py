"""Reading the docs' markdown tables, for the tests that check quoted results against their files."""

from __future__ import annotations

from pathlib import Path
from typing import List

ROOT = Path(__file__).resolve().parents[1]


def table_rows(doc: str, header_start: str) -> List[List[str]]:
    """The cells of each body row of the first table in ``doc`` (relative to the repository) whose
    header line starts with ``header_start`` (a table indented under a list item too)."""
    lines = [line.lstrip() for line in (ROOT / doc).read_text().splitlines()]
    start = next(i for i, line in enumerate(lines) if line.startswith(header_start))
    rows = []
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        rows.append([c.strip() for c in line.strip().strip("|").split("|")])
    return rows
