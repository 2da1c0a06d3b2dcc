"""Every number the README and docs/ quote in a results table equals the results file's value.

A results table is named below (``TABLES``): the document, the table's first header cells, and
for each row the results file (``benchmarks/results/*.json``, written by
``benchmarks/slipstream_policies.py``) and the policy the row reports. Each column maps to a
statistic computed here from the file's raw per-run records (``runs``), not from the summary
the script derived (``median``), at the precision the table quotes (0.061 is compared with the
value rounded to 3 decimals). The document must cite the file it quotes (by name or by the
``slipstream_<name>.json`` pattern with the row's name in a command on the page).

To point a table at new results: change its ``rows`` (label -> file, policy) or add a
``QuotedTable``; a results-shaped table (a ``policy`` column and a ``skip`` column) that no
entry covers fails ``test_every_results_table_is_covered``.
"""

from __future__ import annotations

import json
import re
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Dict, List, Optional, Tuple

import pytest

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
NUMBER = re.compile(r"[-+]?\d+\.\d+|[-+]?\d+")

Runs = Dict[str, List[dict]]  # policy -> one record per repeat (seed)


def _paired(runs: Runs, policy: str, against: str) -> List[float]:
    return [a["test_auc"] - b["test_auc"] for a, b in zip(runs[policy], runs[against])]


def _mean_sd(values: List[float]) -> List[float]:
    return [statistics.mean(values), statistics.stdev(values)]


def _skip(runs: Runs, policy: str) -> List[float]:
    return [statistics.median(r["skip_fraction"] for r in runs[policy])]


def _ideal(runs: Runs, policy: str) -> List[float]:
    return [1 / (1 - _skip(runs, policy)[0])]


def _test_auc_mean(runs: Runs, policy: str) -> List[float]:
    return [statistics.mean(r["test_auc"] for r in runs[policy])]


def _vs_off(runs: Runs, policy: str) -> List[float]:
    return _mean_sd(_paired(runs, policy, "off"))


def _vs_off_per_seed(runs: Runs, policy: str) -> List[float]:
    return _vs_off(runs, policy) + _paired(runs, policy, "off")


def _vs_random(runs: Runs, policy: str) -> List[float]:
    return _mean_sd(_paired(runs, policy, f"random@{policy}"))


def _vs_random_per_seed(runs: Runs, policy: str) -> List[float]:
    return _vs_random(runs, policy) + _paired(runs, policy, f"random@{policy}")


Statistic = Callable[[Runs, str], List[float]]


@dataclass
class QuotedTable:
    doc: str  # relative to the repository root
    header: str  # the table's header line starts with this
    rows: Dict[Tuple[str, ...], Tuple[str, str]]  # leading cells -> (results file, policy)
    columns: Dict[str, Statistic]  # header cell -> the numbers its cells quote, in order


SLIPSTREAM_MATRIX = {
    "skip": _skip,
    "ideal 1/(1-skip)": _ideal,
    "test AUC (mean of 3)": _test_auc_mean,
    "paired diff. to `off` (per seed)": _vs_off_per_seed,
    "diff. to the random control (per seed)": _vs_random_per_seed,
}

TABLES = [
    QuotedTable(
        doc="README.md",
        header="| data | policy | skip |",
        rows={
            ("`clicklog`", "`paper_plus`"): ("slipstream_clicklog.json", "paper_plus"),
            ("`clicklog`, seeds 0-1", "`negative_sampling`"): ("slipstream_clicklog_negatives.json", "negative_sampling"),
            ("`clicklog`, seeds 0-1", "`paper_plus_negatives`"): ("slipstream_clicklog_negatives.json", "paper_plus_negatives"),
            ("`movielens_1m`", "`paper_plus`"): ("slipstream_movielens_1m.json", "paper_plus"),
            ("`synthetic`", "`paper_plus`"): ("slipstream_synthetic.json", "paper_plus"),
        },
        columns={
            "skip": _skip,
            "ideal speedup": _ideal,
            "paired test AUC vs `off`": _vs_off,
            "vs the random control": _vs_random,
        },
    ),
    QuotedTable(
        doc="docs/slipstream.md",
        header="| dataset | policy | skip |",
        rows={
            **{(d, p): (f"slipstream_{d}.json", p) for d in ("clicklog", "movielens_1m")
               for p in ("off", "paper_plus", "random@paper_plus")},  # fmt: skip
            ("synthetic", "off"): ("slipstream_synthetic.json", "off"),
            ("synthetic", "paper_plus"): ("slipstream_synthetic.json", "paper_plus"),
            ("clicklog_quick, `feature_norm=layer`", "off"): ("slipstream_clicklog_quick_feature_norm.json", "off"),
            ("clicklog_quick, `feature_norm=layer`", "paper_plus"): ("slipstream_clicklog_quick_feature_norm.json", "paper_plus"),
            ("clicklog_quick, `feature_norm=none`", "paper_plus"): ("slipstream_cq_qc0.json", "paper_plus"),
        },
        columns=SLIPSTREAM_MATRIX,
    ),
    QuotedTable(
        doc="docs/datasets.md",
        header="| policy | skip | ideal 1/(1-skip) | test AUC (mean of 3) |",
        rows={(p,): ("slipstream_movielens_1m.json", p) for p in ("off", "paper_plus", "random@paper_plus")},
        columns=SLIPSTREAM_MATRIX,
    ),
]


def _tables(doc: str) -> List[Tuple[int, List[str], List[List[str]]]]:
    """(line, header cells, body rows) of every markdown table of ``doc``."""
    out, lines = [], (ROOT / doc).read_text().splitlines()
    i = 0
    while i < len(lines):
        if lines[i].startswith("|") and i + 1 < len(lines) and lines[i + 1].startswith("|---"):
            cells = lambda l: [c.strip() for c in l.strip().strip("|").split("|")]  # noqa: E731
            j = i + 2
            while j < len(lines) and lines[j].startswith("|"):
                j += 1
            out.append((i + 1, cells(lines[i]), [cells(l) for l in lines[i + 2 : j]]))
            i = j
        i += 1
    return out


def _table(spec: QuotedTable) -> Tuple[int, List[str], List[List[str]]]:
    found = [t for t in _tables(spec.doc) if ("| " + " | ".join(t[1]) + " |").startswith(spec.header)]
    assert len(found) == 1, f"{spec.doc}: {len(found)} tables start with {spec.header!r}"
    return found[0]


def _quoted(cell: str) -> List[Tuple[float, int]]:
    """The numbers of a cell with their decimals ("-0.0013 +- 0.0003" -> two, 4 decimals)."""
    return [(float(n), len(n.split(".")[1]) if "." in n else 0) for n in NUMBER.findall(cell.replace(",", ""))]


CASES = [(spec, key) for spec in TABLES for key in spec.rows]


@pytest.mark.parametrize("spec, key", CASES, ids=[f"{s.doc}:{'/'.join(k)}" for s, k in CASES])
def test_quoted_numbers_equal_the_results_file(spec: QuotedTable, key: Tuple[str, ...]):
    line, header, body = _table(spec)
    rows = [r for r in body if tuple(r[: len(key)]) == key]
    assert len(rows) == 1, f"{spec.doc}:{line}: {len(rows)} rows {key}"
    file, policy = spec.rows[key]
    runs: Runs = json.loads((RESULTS / file).read_text())["runs"]
    for column, statistic in spec.columns.items():
        cell = rows[0][header.index(column)]
        quoted = _quoted(cell)
        if not quoted or re.search(r"[A-Za-z]", cell):
            continue  # an empty cell (no control for that row) or prose ("(no control for 0.5%)")
        try:
            values = statistic(runs, policy)
        except KeyError:
            pytest.fail(f"{spec.doc}:{line}: {key} {column} = {cell!r}, but {file} has no such runs")
        # "mean +- sd" may stand without its per-seed values
        assert len(quoted) in (len(values), min(2, len(values))), f"{spec.doc}:{line}: {key} {column}: {cell!r} vs {values}"
        for (q, decimals), v in zip(quoted, values):
            assert q == round(v, decimals) or q == 0 == round(v, decimals), (
                f"{spec.doc}:{line}: {key} {column} quotes {q} where {file} gives {v:.6f}"
            )


@pytest.mark.parametrize("spec", TABLES, ids=[s.doc for s in TABLES])
def test_the_document_cites_its_results_files(spec: QuotedTable):
    text = (ROOT / spec.doc).read_text()
    for file, _ in set(spec.rows.values()):
        name = file.removeprefix("slipstream_").removesuffix(".json")
        cited = file in text or ("slipstream_<name>.json" in text and f"--name {name}" in text)
        assert cited, f"{spec.doc} quotes {file} without citing it"


def test_every_results_table_is_covered():
    """A table that quotes policy results (a policy and a skip column) has a QuotedTable entry,
    unless it predates the results files (listed here, with why)."""
    covered = {(s.doc, _table(s)[0]) for s in TABLES}
    older = {  # measured before benchmarks/slipstream_policies.py wrote its results files
        ("docs/slipstream.md", "Default configuration (the Quickstart's main job), 2 repeats:"),
        ("docs/slipstream.md", "Larger skew (`data=synthetic_skewed`, Zipf 1.3, same size), 1 repeat:"),
    }
    missing = []
    for doc in ["README.md", *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "docs").glob("*.md"))]:
        lines = (ROOT / doc).read_text().splitlines()
        for line, header, _ in _tables(doc):
            if "policy" in header and "skip" in header and (doc, line) not in covered:
                before = next((l for l in reversed(lines[: line - 1]) if l.strip()), "")
                if (doc, before) not in older:
                    missing.append(f"{doc}:{line}")
    assert not missing, f"results tables no QuotedTable covers: {missing}"
