"""Every number of the serve results tables (README, docs/slipstream.md) equals its results file.

A serve table (header ``| data | seeds | served |``) names in each row's first cell the data, the
setting if it is not ``serve`` (backticked) and the results file (``serve_<name>.json``, written
by ``benchmarks/serve.py``). Each number
is recomputed here from the file's raw per-seed records (``runs``), not from the ``table`` the
script derived, at the precision the table quotes.
"""

from __future__ import annotations

import json
import re
import statistics
from pathlib import Path
from typing import Dict, List

import pytest

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
HEADER = "| data | seeds | served |"
NUMBER = re.compile(r"[-+]?\d+\.\d+|[-+]?\d+")
DOCS = ["README.md", "docs/slipstream.md"]


def _rows(doc: str) -> List[List[str]]:
    lines = (ROOT / doc).read_text().splitlines()
    out: List[List[str]] = []
    for i, line in enumerate(lines):
        if line.startswith(HEADER):
            for row in lines[i + 2 :]:
                if not row.startswith("|"):
                    break
                out.append([c.strip() for c in row.strip("|").split("|")])
    return out


def _expected(runs: Dict[str, List[dict]], setting: str) -> Dict[str, List[float]]:
    mine, off = runs[setting], runs["off"]
    total = lambda r: r["a2a_bytes_per_sample"]["total"]  # noqa: E731
    d_auc = [a["test_auc"] - b["test_auc"] for a, b in zip(mine, off)]
    return {
        "served": [statistics.mean(r["served_fraction"] for r in mine)],
        "bytes": [statistics.mean(total(a) / total(b) for a, b in zip(mine, off)),
                  statistics.mean(total(r) for r in mine), statistics.mean(total(r) for r in off)],
        "speed": [statistics.mean(a["samples_per_second"] / b["samples_per_second"] for a, b in zip(mine, off))],
        "auc": [statistics.mean(d_auc), *d_auc],
        "trained": [float(all(a["samples_trained"] == b["samples_trained"] for a, b in zip(mine, off)))],
    }


def _decimals(text: str) -> int:
    return len(text.split(".")[1]) if "." in text else 0


def _check(cell: str, values: List[float]) -> None:
    found = NUMBER.findall(cell)
    assert len(found) >= len(values), (cell, values)
    for text, value in zip(found, values):
        assert float(text) == pytest.approx(round(value, _decimals(text)), abs=1e-12), (cell, text, value)


@pytest.mark.parametrize("doc", DOCS)
def test_serve_tables_quote_their_results_files(doc):
    rows = _rows(doc)
    assert rows, f"{doc}: no serve results table ({HEADER!r})"
    text = (ROOT / doc).read_text()
    for cells in rows:
        name = re.search(r"serve_(\w+)\.json", cells[0])
        assert name, f"{doc}: the row {cells[0]!r} names no serve_<name>.json"
        path = RESULTS / f"serve_{name.group(1)}.json"
        assert path.name in text
        data = json.loads(path.read_text())
        tokens = re.findall(r"`([^`]+)`", cells[0])  # the data, then the setting if not serve
        setting = tokens[1] if len(tokens) > 1 else "serve"
        assert setting in data["runs"], (doc, cells[0], list(data["runs"]))
        exp = _expected(data["runs"], setting)
        assert cells[1] == (f"0-{data['seeds'] - 1}" if data["seeds"] > 1 else "0")
        _check(cells[2], exp["served"])
        _check(cells[3], exp["bytes"])
        _check(cells[4], exp["speed"])
        _check(cells[5], exp["auc"])
