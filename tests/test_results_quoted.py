"""Every number the README and docs/ quote from a results file equals the file's value.

Each number is recomputed here from the file's raw per-run records (``runs``), not from the
summary the script that wrote it derived, and compared at the precision the document quotes
(0.061 with the value rounded to 3 decimals). One section per kind of results file:

- policies (``slipstream_*.json``, benchmarks/slipstream_policies.py): the tables ``TABLES``
  names, each row's results file and policy, each column's statistic;
- serving (``serve_*.json``, benchmarks/serve.py): every table whose header starts
  ``| data | seeds | served |``, each row naming its file;
- the headline (``headline_*.json``, benchmarks/headline.py): the README's and
  docs/performance.md's tables;
- the network (``network_*.json``, benchmarks/network.py; ``step_model_*.json``,
  benchmarks/step_model.py): the wire, the step-time model and the serve runs over a shaped link.

Markdown tables are read by tests/_markdown.py.
"""

from __future__ import annotations

import json
import re
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Dict, List, Tuple

import pytest

from tests._markdown import Table, table_rows, tables

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
NUMBER = re.compile(r"[-+]?\d+\.\d+|[-+]?\d+")


def _decimals(text: str) -> int:
    return len(text.split(".")[1]) if "." in text else 0


def _quoted(cell: str) -> List[Tuple[float, int]]:
    """The numbers of a cell with their decimals ("-0.0013 +- 0.0003" -> two, 4 decimals)."""
    return [(float(n), _decimals(n)) for n in NUMBER.findall(cell.replace(",", ""))]


def _check(cell: str, values: List[float]) -> None:
    """``cell`` quotes exactly ``values``, in order, each rounded to the decimals it is written with."""
    found = NUMBER.findall(cell)
    assert len(found) == len(values), (cell, values)
    for text, value in zip(found, values):
        assert float(text) == pytest.approx(round(value, _decimals(text)), abs=1e-12), (cell, text, value)


def _rows(doc: str, header_start: str) -> List[List[str]]:
    """The body rows of the first table of ``doc`` whose header starts with ``header_start``."""
    rows = table_rows(doc, header_start)
    assert rows, f"{doc}: no rows under {header_start!r}"
    return rows


# ---- policies: benchmarks/slipstream_policies.py ------------------------------------------------
#
# A results table is named in ``TABLES``: the document, the table's first header cells, and for
# each row the results file and the policy the row reports. Each column maps to a statistic of
# the file's ``runs`` (not of the ``median`` summary the script derived). The document must cite
# the file it quotes (by name or by the ``slipstream_<name>.json`` pattern with the row's name in
# a command on the page). To point a table at new results: change its ``rows`` (label -> file,
# policy) or add a ``QuotedTable``; a results-shaped table (a ``policy`` column and a ``skip``
# column) that no entry covers fails ``test_every_results_table_is_covered``.

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
        doc="docs/results/policies.md",
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
        doc="docs/results/policies.md",
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


def _table(spec: QuotedTable) -> Table:
    found = [t for t in tables(spec.doc) if ("| " + " | ".join(t.header) + " |").startswith(spec.header)]
    assert len(found) == 1, f"{spec.doc}: {len(found)} tables start with {spec.header!r}"
    return found[0]


CASES = [(spec, key) for spec in TABLES for key in spec.rows]


@pytest.mark.parametrize("spec, key", CASES, ids=[f"{s.doc}:{'/'.join(k)}" for s, k in CASES])
def test_quoted_numbers_equal_the_results_file(spec: QuotedTable, key: Tuple[str, ...]):
    table = _table(spec)
    line, header, body = table.line, table.header, table.rows
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
    covered = {(s.doc, _table(s).line) for s in TABLES}
    older = {  # measured before benchmarks/slipstream_policies.py wrote its results files
        ("docs/results/policies.md", "Default configuration (the Quickstart's main job), 2 repeats:"),
        ("docs/results/policies.md", "Larger skew (`data=synthetic_skewed`, Zipf 1.3, same size), 1 repeat:"),
        ("docs/results/policies.md", "run of POLICY, at the skip fraction POLICY measured (same data, seed and samples trained):"),
        ("docs/results/policies.md", "shift). 3 seeds, alternating:"),
    }
    missing = []
    for doc in ["README.md", *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "docs").rglob("*.md"))]:
        lines = (ROOT / doc).read_text().splitlines()
        for t in tables(doc):
            if "policy" in t.header and "skip" in t.header and (doc, t.line) not in covered:
                before = next((l.strip() for l in reversed(lines[: t.line - 1]) if l.strip()), "")
                if (doc, before) not in older:
                    missing.append(f"{doc}:{t.line}")
    assert not missing, f"results tables no QuotedTable covers: {missing}"


# ---- serving: benchmarks/serve.py --------------------------------------------------------------
#
# A serve table (header ``| data | seeds | served |``) names in each row's first cell the data,
# the setting if it is not ``serve`` (backticked) and the results file (``serve_<name>.json``).
# Each number is recomputed from the file's per-seed records (``runs``), not from its ``table``.

SERVE_HEADER = "| data | seeds | served |"
SERVE_DOCS = ["README.md", "docs/results/serve.md"]


def _serve_rows(doc: str) -> List[List[str]]:
    """The body rows of every serve table of ``doc``, one table after the other."""
    return [row for t in tables(doc) if t.text.startswith(SERVE_HEADER) for row in t.rows]


def _serve_expected(runs: Dict[str, List[dict]], setting: str) -> Dict[str, List[float]]:
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


@pytest.mark.parametrize("doc", SERVE_DOCS)
def test_serve_tables_quote_their_results_files(doc):
    rows = _serve_rows(doc)
    assert rows, f"{doc}: no serve results table ({SERVE_HEADER!r})"
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
        exp = _serve_expected(data["runs"], setting)
        assert cells[1] == (f"0-{data['seeds'] - 1}" if data["seeds"] > 1 else "0")
        _check(cells[2], exp["served"])
        _check(cells[3], exp["bytes"])
        _check(cells[4], exp["speed"])
        _check(cells[5], exp["auc"])


# ---- the headline: benchmarks/headline.py -------------------------------------------------------
#
# docs/performance.md's headline table quotes headline_levers.json (the
# headline since the levers measure themselves; headline.json is the one before, with per-sample
# serving, quoted nowhere now), recomputed from its per-seed records (``runs``: train seconds,
# test AUC, test CTR and mean prediction of each arm), not from its ``table``.

HEADLINE = json.loads((RESULTS / "headline_levers.json").read_text())["results"]
# The README's table: the headline again after auto took TorchRec's kinds on CPU (793715a).
README_HEADLINE = json.loads((RESULTS / "headline_torchrec_types.json").read_text())["results"]


def _dataset(cell: str) -> str:
    return re.match(r"`([a-z_0-9]+)`", cell).group(1)


def _arm(runs: Dict[str, List[dict]], arm: str) -> Dict[str, List[float]]:
    mine, golden, off = runs[arm], runs["golden"], runs["off"]
    speed = [g["train_seconds"] / a["train_seconds"] for a, g in zip(mine, golden)]
    vs_off = [b["train_seconds"] / a["train_seconds"] for a, b in zip(mine, off)]
    d_auc = [a["test_auc"] - b["test_auc"] for a, b in zip(mine, off)]
    return {
        "seconds": [statistics.mean(r["train_seconds"] for r in mine)],
        "speed": [statistics.mean(speed), *speed],
        "vs_off": [statistics.mean(vs_off), *vs_off],
        "auc": [statistics.mean(r["test_auc"] for r in mine)],
        "paired": [statistics.mean(d_auc), *d_auc],
        "calibration": [r["test_predicted_ctr"] / r["test_ctr"] for r in mine],
    }


def test_the_readme_table_quotes_the_results_file():
    rows = _rows("README.md", "| data | golden loop train s |")
    assert {_dataset(r[0]) for r in rows} == set(README_HEADLINE)
    for r in rows:
        runs = README_HEADLINE[_dataset(r[0])]["runs"]
        golden, off, defaults = (_arm(runs, a) for a in ("golden", "off", "defaults"))
        _check(r[1], golden["seconds"])
        _check(r[2], off["speed"][:1])
        _check(r[3], defaults["seconds"])
        _check(r[4], defaults["speed"])
        _check(r[5], defaults["vs_off"])
        _check(r[6], defaults["paired"])


def test_the_headline_on_torchrecs_kinds_paragraph_quotes_the_results_file():
    text = " ".join((ROOT / "docs/performance.md").read_text().split())
    para = text[text.index("**The headline on TorchRec's kinds**"):][:900]
    arms = {d: {a: _arm(README_HEADLINE[d]["runs"], a) for a in ("golden", "off", "defaults")} for d in README_HEADLINE}
    raw, log = arms["clicklog_raw"], arms["clicklog"]
    per_seed = lambda v: ", ".join(f"{x:.2f}" for x in v[1:])  # noqa: E731
    assert f"`clicklog_raw` (per seed {per_seed(raw['off']['speed'])}) and on `clicklog` ({per_seed(log['off']['speed'])})" in para
    assert f"the defaults {raw['defaults']['speed'][0]:.2f}x and {log['defaults']['speed'][0]:.2f}x" in para
    assert f"+{raw['defaults']['paired'][0]:.4f} and {log['defaults']['paired'][0]:.4f}" in para
    assert f"took {raw['golden']['seconds'][0]:.1f} s and {log['golden']['seconds'][0]:.1f} s on average" in para


def test_the_performance_table_quotes_the_results_file():
    rows = _rows("docs/performance.md", "| data | run | train s |")
    names = {"golden loop": "golden", "`off` (fp32)": "off", "defaults": "defaults",
             "defaults, `serve_when=always`": "serve_always", "`off` + bf16 and downsampling": "off_auto"}
    assert len(rows) == len(names) * len(HEADLINE)
    for r in rows:
        runs = HEADLINE[_dataset(r[0])]["runs"]
        arm = names[r[1]]
        got = _arm(runs, arm)
        _check(r[2], got["seconds"])
        _check(r[3].replace("**", ""), got["speed"] if arm != "golden" else [])
        _check(r[4].replace("**", ""), got["vs_off"] if arm not in ("golden", "off") else [])
        _check(r[5], got["auc"])
        _check(r[6].replace("**", ""), got["paired"] if arm != "off" else [])
        _check(r[7], got["calibration"])


EXTERNAL = {"instacart": "headline_instacart.json", "movielens_1m": "headline_movielens.json"}


def test_the_external_logs_table_quotes_its_results_files():
    rows = _rows("docs/performance.md", "| data | run | train s | vs `off` (per seed) |")
    names = {"`off` (fp32)": "off", "defaults": "defaults", "`off` + bf16 and downsampling": "off_auto"}
    assert len(rows) == len(names) * len(EXTERNAL)
    for r in rows:
        dataset = _dataset(r[0])
        runs = json.loads((RESULTS / EXTERNAL[dataset]).read_text())["results"][dataset]["runs"]
        arm = names[r[1]]
        mine, off = runs[arm], runs["off"]
        vs_off = [b["train_seconds"] / a["train_seconds"] for a, b in zip(mine, off)]
        paired = [a["test_auc"] - b["test_auc"] for a, b in zip(mine, off)]
        _check(r[2], [statistics.mean(x["train_seconds"] for x in mine)])
        _check(r[3], [statistics.mean(vs_off), *vs_off] if arm != "off" else [])
        _check(r[4], [statistics.mean(x["test_auc"] for x in mine)])
        _check(r[5], [statistics.mean(paired), *paired] if arm != "off" else [])


# ---- the network: benchmarks/network.py and benchmarks/step_model.py ----------------------------
#
# The wire over the training steps beside the program's count (docs/performance.md), the
# step-time model's check and predictions (docs/scale.md), and the serve runs over a shaped link
# (docs/results/serve.md; the unserved layout's run in docs/slipstream.md, beside the design it measures).


def _job(cell: str) -> str:
    return cell.split("(")[0].strip().strip("`").strip()


def test_the_wire_table_quotes_its_runs():
    rows = _rows("docs/performance.md", "| results | nodes | dim | job | wire B / trained sample, training steps")
    current = None
    for cells in rows:
        link = re.search(r"\(\.\./benchmarks/results/([^)]+\.json)\)", cells[0])
        current = link.group(1) if link else current
        assert current, cells
        table = json.loads((RESULTS / current).read_text())["table"]
        rate = "none" if any(r["rate"] == "none" for r in table) else table[0]["rate"]
        (row,) = [r for r in table if r["job"] == _job(cells[3]) and r["rate"] == rate]
        assert int(cells[1]) == len(json.loads((RESULTS / current).read_text())["nodes"])
        assert float(cells[4]) == round(row["wire_train_bytes_per_sample"]), cells
        assert float(cells[5]) == round(row["program_off_rank_bytes_per_sample"]["total"]), cells
        assert float(cells[6]) == round(row["wire_train_over_program"], 3), cells
        assert float(cells[7]) == round(row["wire_train_minus_dense_bytes_per_sample"]), cells
        # the claim of the paragraph below the table: within 0.3-3.1%
        assert 1.0 <= row["wire_train_over_program"] <= 1.031


_HARNESS_JOBS = {"golden loop": "golden", "golden + qcomms": "golden+qcomms", "`off`": "off",
                 "`off` + qcomms + fp16 hook": "off+qcomms", "`off` + qcomms + bf16 hook": "off+qcomms",
                 "defaults": "defaults"}


def _harness_table(name: str, header: str):
    """A harness table of docs/performance.md against its results file: every row as the file's
    table has it. Returns the file and its table by (job, rate)."""
    doc = json.loads((RESULTS / name).read_text())
    assert name in doc["command"] and doc["rates"] == ["none", "1gbit", "200mbit"]
    table = {(r["job"], r["rate"]): r for r in doc["table"]}
    rows = _rows("docs/performance.md", header)
    assert len(rows) == len(table) == 15
    for cells in rows:
        r = table[(_HARNESS_JOBS[cells[0].split(" (")[0]], cells[1])]
        _check(cells[2] + " " + cells[3].replace(",", ""), [r["train_seconds"], r["samples_per_second"]])
        _check(cells[4], [r["wire_bytes_per_sample"]])
        _check(cells[5], [] if r["program_bytes_per_sample"] is None else [r["program_bytes_per_sample"]])
        _check(cells[6] + " " + cells[7], [r["test_auc"]] + ([] if r["job"] == "off" else [r["paired_auc_vs_off"]]))
    return doc, table


def test_the_harness_on_torchrecs_kinds_quotes_its_run():
    """The harness after auto took TorchRec's kinds (793715a): its table and the ratios quoted."""
    doc, table = _harness_table(
        "network_harness_clicklog_torchrec_types_seed0.json",
        "| job (the harness, `clicklog`, seed 0, TorchRec's kinds) | link |",
    )
    text = " ".join((ROOT / "docs/performance.md").read_text().split())
    sec = {k: v["train_seconds"] for k, v in table.items()}
    golden = [f"{sec[('golden', r)] / sec[('off', r)]:.2f}x" for r in ("none", "1gbit", "200mbit")]
    assert f"{golden[0]} unshaped, {golden[1]} over 1gbit, {golden[2]} over 200mbit" in text
    wire = {k: v["wire_bytes_per_sample"] for k, v in table.items()}
    assert f"**{wire[('off+qcomms', '200mbit')] / wire[('off', '200mbit')]:.2f} of `off`'s**" in text
    assert f"**{sec[('off', '200mbit')] / sec[('off+qcomms', '200mbit')]:.2f}x `off`'s**" in text
    assert f"{sec[('golden+qcomms', '200mbit')] / sec[('off+qcomms', '200mbit')]:.2f}x the golden loop with its own qcomms" in text
    defaults = [f"{sec[('off', r)] / sec[('defaults', r)]:.2f}x" for r in ("none", "1gbit", "200mbit")]
    assert f"{defaults[0]} `off` unshaped and {defaults[1]} over 1gbit" in text and f"{defaults[2]} `off`. Paired test AUC" in text
    share = doc["communication_share"]["by_rate"]
    assert f"{share['1gbit']:.1%} at 1gbit (the noise above) and {share['200mbit']:.1%} at 200mbit" in text


def test_the_lockstep_every_8_pair_quotes_its_run():
    doc = json.loads((RESULTS / "network_lockstep_every8_200mbit.json").read_text())
    assert "network_lockstep_every8_200mbit.json" in doc["command"]
    runs = {r["job"]: r for r in doc["runs"]}
    one, eight = runs["off"], runs["off_agree8"]
    assert one["samples_trained"] == eight["samples_trained"]
    t1, t8 = one["time_breakdown_rank0"], eight["time_breakdown_rank0"]
    text = " ".join((ROOT / "docs/performance.md").read_text().split())
    assert (f"data time {t1['data']:.1f} s -> {t8['data']:.1f} s, backward {t1['backward']:.1f} s -> "
            f"{t8['backward']:.1f} s, train {one['train_seconds']:.1f} s -> {eight['train_seconds']:.1f} s "
            f"({one['train_seconds'] / eight['train_seconds']:.2f}x)") in text


def test_the_harness_table_quotes_its_run():
    """The harness on the full log (5 jobs x 3 links, seed 0): every row of the table as the
    results file's table has it, and the ratios the bullets below it quote."""
    doc, table = _harness_table("network_harness_clicklog_seed0.json", "| job (the harness, `clicklog`, seed 0) | link |")
    text = " ".join((ROOT / "docs/performance.md").read_text().split())
    sec = {k: v["train_seconds"] for k, v in table.items()}
    share = doc["communication_share"]["by_rate"]
    assert f"{share['1gbit']:.1%} at 1gbit and {share['200mbit']:.1%} at 200mbit" in text
    assert "0.91x" in text and round(sec[("golden", "200mbit")] / sec[("off", "200mbit")], 2) == 0.91
    quoted = [f"{sec[('off', rate)] / sec[('defaults', rate)]:.2f}x" for rate in ("none", "1gbit", "200mbit")]
    assert f"{quoted[0]} `off` unshaped and {quoted[1]} over 1gbit" in text and f"{quoted[2]} `off`. Paired" in text


def test_the_harness_on_three_seeds_quotes_its_run():
    """The harness's published run (5 jobs x 3 links x 3 seeds): every row as the results file's
    runs have it, per seed, and the ratios the bullets below it quote."""
    name = "network_harness_clicklog_3seeds.json"
    doc = json.loads((RESULTS / name).read_text())
    assert name in doc["command"] and doc["rates"] == ["none", "1gbit", "200mbit"] and doc["seeds"] == 3
    runs = {(r["job"], r["rate"], r["seed"]): r for r in doc["runs"]}
    table = {(r["job"], r["rate"]): r for r in doc["table"]}
    rows = _rows("docs/performance.md", "| job (the harness, `clicklog`, 3 seeds) | link |")
    assert len(rows) == len(table) == 15 and len(runs) == 45
    for cells in rows:
        job, rate = _HARNESS_JOBS[cells[0].split(" (")[0]], cells[1]
        row = table[(job, rate)]
        mine, off = ([runs[(j, rate, s)] for s in range(3)] for j in (job, "off"))
        _check(cells[2], [row["train_seconds"]] + [r["train_seconds"] for r in mine])
        _check(cells[3].replace(",", ""), [row["samples_per_second"]])
        paired = job != "off"
        _check(cells[4], [o["train_seconds"] / m["train_seconds"] for o, m in zip(off, mine)] if paired else [])
        _check(cells[5], [row["wire_bytes_per_sample"]])
        _check(cells[6], [] if row["program_bytes_per_sample"] is None else [row["program_bytes_per_sample"]])
        _check(cells[7], [row["test_auc"]])
        _check(cells[8], [m["test_auc"] - o["test_auc"] for o, m in zip(off, mine)] if paired else [])
    text = " ".join((ROOT / "docs/performance.md").read_text().split())
    (trained,) = {r["samples_trained"] for r in doc["runs"]}
    assert f"every job trained the same {trained:,} samples" in text
    share = doc["communication_share"]["by_rate"]
    assert f"{share['1gbit']:.1%} at 1gbit and {share['200mbit']:.1%} at 200mbit" in text
    assert f"wall seconds sum to {sum(r['wall_seconds'] for r in doc['runs']):.0f})" in text
    sec = {k: v["train_seconds"] for k, v in runs.items()}
    mean_sec = {k: v["train_seconds"] for k, v in table.items()}
    golden = ", ".join(f"{sec[('golden', '200mbit', s)] / sec[('off', '200mbit', s)]:.3f}" for s in range(3))
    assert f"**0.99x over 200mbit on every seed** ({golden})" in text
    wire = {k: v["wire_bytes_per_sample"] for k, v in table.items()}
    qcomms_bytes = f"{wire[('off+qcomms', '200mbit')] / wire[('off', '200mbit')]:.2f}"
    assert f"**{qcomms_bytes} of `off`'s**" in text
    fast = [f"{sec[('off', '200mbit', s)] / sec[('off+qcomms', '200mbit', s)]:.2f}x" for s in range(3)]
    assert f"**{fast[0]}, {fast[1]} and {fast[2]} `off`**" in text
    assert f"{mean_sec[('golden+qcomms', '200mbit')] / mean_sec[('off+qcomms', '200mbit')]:.2f}x the golden loop with its own" in text
    defaults = sorted(sec[("off", "200mbit", s)] / sec[("defaults", "200mbit", s)] for s in range(3))
    assert f"**{defaults[0]:.2f}-{defaults[-1]:.2f}x `off`**" in text
    assert f"`off` + qcomms is {mean_sec[('defaults', '200mbit')] / mean_sec[('off+qcomms', '200mbit')]:.2f}x the defaults" in text
    # what the serve lever did in the defaults' runs: down at one step unshaped and over 1gbit,
    # serving from one step over 200mbit, and the embedding side of the wire there
    lever = {(r["rate"], r["seed"]): (r["serve_lever"], r["served_fraction"]) for r in doc["runs"] if r["job"] == "defaults"}
    down = {lv["decisions"][0]["step"] for (rate, _), (lv, _) in lever.items() if rate != "200mbit" and lv["state"] == "down"}
    (down_at,) = down
    assert f"stood serving down at step {down_at} on all six runs" in text
    shaped = [lever[("200mbit", s)] for s in range(3)]
    (serve_from,) = {lv["decisions"][0]["step"] for lv, _ in shaped if lv["decisions"][0]["to"] == "serving"}
    assert f"served from step {serve_from} ({min(f for _, f in shaped):.2f} of the lookups)" in text
    assert max(f for _, f in shaped) - min(f for _, f in shaped) < 0.005
    emb = [table[(j, "200mbit")]["wire_train_minus_dense_bytes_per_sample"] for j in ("defaults", "off")]
    assert f"the embedding side {emb[0]:.0f} against {emb[1]:.0f}, {emb[0] / emb[1]:.2f}" in text
    readme = " ".join((ROOT / "README.md").read_text().split())
    auc = [f"{runs[('off+qcomms', '200mbit', s)]['test_auc'] - runs[('off', '200mbit', s)]['test_auc']:+.4f}" for s in range(3)]
    assert (f"trained {min(fast)[:-1]}-{max(fast)} `off` over 200mbit on {qcomms_bytes} of its bytes at "
            f"{auc[0]}, {auc[1]} and {auc[2]}, and") in readme


def _check_rows() -> Dict[Tuple[int, str, str, str], dict]:
    doc = json.loads((RESULTS / "step_model_check.json").read_text())
    out = {}
    for r in doc["rows"]:
        dim = re.search(r"dim(\d+)", Path(r["file"]).name).group(1)
        out[(r["nodes"], dim, r["rate"], r["job"])] = r
    return out


def test_the_step_model_check_quotes_its_results():
    rows = _rows("docs/scale.md", "| nodes | dim | link | job | unshaped ms / step")
    mine = _check_rows()
    assert len(rows) == len(mine)
    for cells in rows:
        r = mine[(int(cells[0]), cells[1], cells[2], _job(cells[3]))]
        assert [float(c) for c in cells[4:7]] == [round(r[k], 1) for k in ("unshaped_ms", "measured_ms", "predicted_ms")]
        assert cells[7] == f"{r['error']:+.1%}"
    errors = [abs(r["error"]) for r in mine.values()]
    text = (ROOT / "docs/scale.md").read_text()
    assert f"|error| {sum(errors) / len(errors):.1%} over {len(errors)} runs" in text
    assert f"within 10% on {sum(e <= 0.10 for e in errors)}" in text


@pytest.mark.parametrize("name", ["step_model_check.json"])
def test_the_model_s_results_hold_their_command(name):
    assert "step_model.py check" in json.loads((RESULTS / name).read_text())["command"]


def test_the_step_model_predictions_quote_their_results():
    rows = _rows("docs/scale.md", "| fabric | job | exposed communication ms / step")
    doc = json.loads((RESULTS / "step_model_predictions.json").read_text())
    mine = {(r["fabric"], r["job"]): r for r in doc["rows"]}
    assert len(rows) == len(mine)
    for cells in rows:
        r = mine[(cells[0], cells[1].strip("`"))]
        assert [float(c) for c in cells[2:5]] == [round(r[k], 3) for k in ("comm_ms", "compute_ms", "step_ms")]
        assert cells[5] == f"{r['speedup_vs_off']:.2f}x"
        # the compute was set so that off's exposed communication is the published share
        if r["job"] == "off":
            assert r["comm_ms"] / r["step_ms"] == pytest.approx(r["published_share"], abs=1e-3)


_JOBS = {"slipstream=off": "off", "slipstream=serve slipstream.serve_when=always": "serve_always", "defaults": "defaults"}


def _job_rows(header: str, name: str, seconds: int, ratio: int, job_of=lambda cell: _JOBS[_job(cell)]):
    """Each row of the docs' table under ``header`` beside its job's table row and run of
    results file ``name`` (the job named by ``job_of`` of the row's first cell; by default off,
    serve-always and the defaults as ``_JOBS`` names them), its train seconds (column
    ``seconds``, then the speed against off's) and its embedding side on the wire against off's
    (column ``ratio``) checked; the rows, runs and off's row for the table's other columns."""
    rows = _rows("docs/results/serve.md", header)
    doc = json.loads((RESULTS / name).read_text())
    by_job = {r["job"]: r for r in doc["table"]}
    runs = {r["job"]: r for r in doc["runs"]}
    off = by_job["off"]
    out = []
    for cells in rows:
        job = job_of(cells[0])
        row, run = by_job[job], runs[job]
        assert float(cells[seconds]) == round(row["train_seconds"], 1), cells
        if job != "off":
            assert cells[seconds + 1] == f"{off['train_seconds'] / row['train_seconds']:.3f}x", cells
            wire = row["wire_train_minus_dense_bytes_per_sample"] / off["wire_train_minus_dense_bytes_per_sample"]
            assert float(cells[ratio]) == round(wire, 3), cells
        out.append((cells, job, row, run))
    return out, runs, off


def test_the_per_feature_table_quotes_its_run():
    header = "| job | train s | vs `off` | lookups served | slots | wire over the training steps"
    rows, _, _ = _job_rows(header, "network_per_feature_clicklog_dim128.json", seconds=1, ratio=7)
    assert len(rows) == 3
    for cells, _, row, run in rows:
        assert float(cells[3]) == round(run["served_fraction"], 3) and float(cells[4]) == round(run["slots_fraction"], 3), cells
        assert float(cells[5]) == round(row["wire_train_bytes_per_sample"]), cells
        assert float(cells[6]) == round(row["wire_train_minus_dense_bytes_per_sample"]), cells
        assert float(cells[8]) == round(row["wire_train_over_program"], 3), cells
        assert float(cells[9]) == round(row["test_auc"], 4), cells


@pytest.mark.parametrize(
    "header, name",
    [
        ("| job | train s | vs `off` | slots | its embedding side on the wire", "network_host_memory_clicklog_dim128.json"),
        ("| job | train s | vs `off` | slots | the embedding side on the wire", "network_two_layouts_clicklog_dim128.json"),
    ],
)
def test_the_host_memory_and_two_layout_tables_quote_their_runs(header, name):
    rows, runs, off = _job_rows(header, name, seconds=1, ratio=5)
    assert len(rows) == 3
    for cells, job, row, run in rows:
        assert float(cells[3]) == round(run["slots_fraction"], 3), cells
        assert float(cells[4]) == round(row["wire_train_minus_dense_bytes_per_sample"]), cells
        if job != "off":
            assert float(cells[6]) == round(row["test_auc"] - off["test_auc"], 4), cells
    # every job trained in the same precision, so the ratios compare the policy alone
    assert {run["precision"]["chosen"] for run in runs.values()} == {"bf16"}


def test_the_unserved_layout_comparison_quotes_its_run():
    doc = json.loads((RESULTS / "network_unserved_layout_dim128.json").read_text())
    by_job = {r["job"]: r for r in doc["table"]}
    runs = {r["job"]: r for r in doc["runs"]}
    assert runs["nostale"]["served_fraction"] == 0.0 and runs["nostale"]["slots_fraction"] == 1.0
    text = " ".join((ROOT / "docs/slipstream.md").read_text().split())
    off, nostale = by_job["off"], by_job["nostale"]
    assert (
        f"`off` {off['train_seconds']:.1f} s, nothing served {nostale['train_seconds']:.1f} s, "
        f"{off['wire_bytes_per_sample']:,.0f} and {nostale['wire_bytes_per_sample']:,.0f} wire bytes per sample"
    ) in text


def test_the_warm_up_and_sync_table_quotes_its_run():
    """The table of the hot set counted over 20 steps instead of 100, with pushes and syncs every
    25 steps or a replica bound, against off and serve-always of the same run."""
    name = "network_warmup_clicklog_dim128.json"
    header = "| job | its overrides | train s | vs `off` | slots | push + replica"
    rows, runs, off = _job_rows(header, name, seconds=2, ratio=7, job_of=_job)
    jobs = json.loads((RESULTS / name).read_text())["jobs"]
    assert [job for _, job, _, _ in rows] == list(runs)
    for cells, job, row, run in rows:
        assert cells[1] == f"`{' '.join(jobs[job])}`", cells
        assert float(cells[4]) == round(run["slots_fraction"], 3), cells
        program = run["program_off_rank_bytes_per_sample"]
        assert float(cells[5]) == round(program["push"] + program["replica"]), cells
        assert float(cells[6]) == round(row["wire_train_minus_dense_bytes_per_sample"]), cells
        if job != "off":
            assert float(cells[8]) == round(row["test_auc"] - off["test_auc"], 4), cells
    assert {run["precision"]["chosen"] for run in runs.values()} == {"bf16"}


def test_the_half_width_sync_table_quotes_its_run():
    """The table of sync_precision=bf16 beside fp32 syncs, both counted over 20 steps, and off."""
    name = "network_sync_bf16_clicklog_dim128.json"
    header = "| job | its overrides | train s | vs `off` | push, B / sample | replica, B / sample"
    rows, runs, off = _job_rows(header, name, seconds=2, ratio=7, job_of=_job)
    jobs = json.loads((RESULTS / name).read_text())["jobs"]
    assert [job for _, job, _, _ in rows] == list(runs) == ["off", "early", "early_bf16"]
    for cells, job, row, run in rows:
        assert cells[1] == f"`{' '.join(jobs[job])}`", cells
        program = run["program_off_rank_bytes_per_sample"]
        assert float(cells[4]) == round(program["push"]) and float(cells[5]) == round(program["replica"]), cells
        assert float(cells[6]) == round(row["wire_train_minus_dense_bytes_per_sample"]), cells
        assert float(cells[8]) == round(row["wire_train_over_program"], 3), cells
        if job != "off":
            assert float(cells[9]) == round(row["test_auc"] - off["test_auc"], 4), cells
    assert {run["precision"]["chosen"] for run in runs.values()} == {"bf16"}


def test_the_preset_defaults_table_quotes_its_run():
    """The main job's defaults with the 20-step count and bf16 syncs against off, one run."""
    name = "network_preset_defaults_clicklog_dim128.json"
    header = "| job | the preset | train s | vs `off` | slots | served | the embedding side on the wire"
    rows, runs, off = _job_rows(header, name, seconds=2, ratio=7)
    assert [job for _, job, _, _ in rows] == list(runs) == ["off", "defaults"]
    for cells, job, row, run in rows:
        assert float(cells[4]) == round(run["slots_fraction"], 3) and float(cells[5]) == round(run["served_fraction"], 3), cells
        assert float(cells[6]) == round(row["wire_train_minus_dense_bytes_per_sample"]), cells
        if job != "off":
            assert float(cells[8]) == round(row["test_auc"] - off["test_auc"], 4), cells
            assert run["serve_lever"]["serve_when"] == "auto", run["serve_lever"]
    assert {run["precision"]["chosen"] for run in runs.values()} == {"bf16"}


# ---- quantized comms and the fp16 DDP hook against off (docs/performance.md) -------------------
# Each row: its results file, its setting; bytes and AUC recomputed from the per-seed records.
QCOMMS_ROWS = {
    ("qcomms + fp16 hook", "the planner's", False): ("serve_qcomms_clicklog", "qcomms"),
    ("qcomms + fp16 hook, `clicklog_raw`", "the planner's", False): ("serve_qcomms_clicklog_raw", "qcomms"),
    ("qcomms alone", "the planner's", False): ("serve_qcomms_parts_clicklog", "qcomms_only"),
    ("fp16 hook alone", "`off`'s", False): ("serve_qcomms_parts_clicklog", "hook_only"),
    ("qcomms + fp16 hook", "`off`'s, pinned", False): ("serve_qcomms_offplan_clicklog", "qcomms"),
    ("qcomms + fp16 hook", "TorchRec's kinds (793715a)", False): ("serve_qcomms_torchrec_types_clicklog", "qcomms"),
    ("qcomms alone", "TorchRec's kinds (793715a)", False): ("serve_qcomms_torchrec_types_clicklog", "qcomms_only"),
    ("qcomms + fp16 hook", "TorchRec's kinds, pinned (54681a4)", False): ("serve_qcomms_scaled_clicklog", "qcomms"),
    ("qcomms + fp16 hook, both scaled by 1024", "TorchRec's kinds, pinned (54681a4)", False):
        ("serve_qcomms_scaled_clicklog", "qcomms_scaled"),
    ("qcomms + fp16 hook, `clicklog_raw`", "TorchRec's kinds, pinned (54681a4)", False):
        ("serve_qcomms_scaled_clicklog_raw", "qcomms"),
    ("qcomms + fp16 hook, both scaled by 1024, `clicklog_raw`", "TorchRec's kinds, pinned (54681a4)", False):
        ("serve_qcomms_scaled_clicklog_raw", "qcomms_scaled"),
    ("qcomms in bf16 on gloo + bf16 hook (063dc4e)", "`off`'s (`plan_as=fp32`)", False):
        ("serve_qcomms_bf16_clicklog", "qcomms_bf16"),
    ("qcomms in bf16 on gloo + bf16 hook (063dc4e), `clicklog_raw`", "`off`'s (`plan_as=fp32`)", False):
        ("serve_qcomms_bf16_clicklog_raw", "qcomms_bf16"),
}


def test_the_qcomms_table_quotes_its_runs():
    rows = _rows("docs/performance.md", "| setting | plan | bytes per sample vs `off` (program's count) |")
    assert len(rows) == len(QCOMMS_ROWS)
    for row in rows:
        name, setting = QCOMMS_ROWS[(row[0], row[1], False)]
        data = json.loads((RESULTS / f"{name}.json").read_text())
        runs, off = data["runs"][setting], data["runs"]["off"]  # per seed, in seed order
        assert len(runs) == len(off) == data["seeds"] == 3

        def ratio(kinds):  # the mean over seeds of each seed's bytes against off's
            per_seed = [sum(a["a2a_bytes_per_sample"].get(k, 0) for k in kinds)
                        / sum(b["a2a_bytes_per_sample"].get(k, 0) for k in kinds) for a, b in zip(runs, off)]
            return sum(per_seed) / len(per_seed)

        _check(row[2].replace("*", ""), [ratio(["total"]), ratio(["embedding", "push", "replica"])])
        paired = [a["test_auc"] - b["test_auc"] for a, b in zip(runs, off)]
        _check(row[3], [sum(paired) / len(paired), *paired])


def test_the_fp16_gradient_shares_are_quoted():
    data = json.loads((RESULTS / "fp16_gradients_clicklog.json").read_text())
    assert data["overrides"] == ["data=clicklog", "trainer.max_steps=400"] and data["ranks"] == 2
    emb, dense = data["pooled_embedding_gradients"], data["dense_all_reduce"]
    text = " ".join((ROOT / "docs/performance.md").read_text().split())
    assert (f"{100 * emb['subnormal_share']:.1f}% of the nonzero pooled-embedding gradients handed to the backward's "
            f"codec and {100 * dense['subnormal_share']:.1f}% of the dense all-reduce's") in text
    assert f"{100 * emb['to_zero_share']:.2f}% and {100 * dense['to_zero_share']:.1f}% below half" in text


# ---- the paired AUC's noise floor (docs/performance.md) -----------------------------------------
# Each row: its setting in serve_auc_noise_clicklog.json; the paired AUCs recomputed per seed.
NOISE_ROWS = {"`init`": "init", "`bf16`": "bf16"}


def test_the_noise_floor_table_quotes_its_run():
    rows = _rows("docs/performance.md", "| setting against `off` | what differs | paired test AUC (per seed) |")
    assert [row[0] for row in rows] == list(NOISE_ROWS)
    data = json.loads((RESULTS / "serve_auc_noise_clicklog.json").read_text())
    off = data["runs"]["off"]  # per seed, in seed order
    assert data["settings"]["off"] == ["slipstream=off", "trainer.precision=fp32", "sharding=table_wise"]
    for row in rows:
        runs = data["runs"][NOISE_ROWS[row[0]]]
        assert len(runs) == len(off) == data["seeds"] == 3
        assert [a["samples_trained"] for a in runs] == [b["samples_trained"] for b in off]
        paired = _paired(data["runs"], NOISE_ROWS[row[0]], "off")
        _check(row[2], [sum(paired) / len(paired), *paired])


def _links_table(name: str, header: str) -> Dict[Tuple[str, str], Dict]:
    """A table of off and the defaults on each link (docs/results/serve.md) against its network
    run: train s, the ratio, the wire and its embedding side, Slipstream's and serving's
    seconds, and a last column of test AUC against off where the table has one. Returns the
    runs by (job, rate)."""
    doc = json.loads((RESULTS / f"{name}.json").read_text())
    rows = _rows("docs/results/serve.md", header)
    table = {(r["job"], r["rate"]): r for r in doc["table"]}
    runs = {(r["job"], r["rate"]): r for r in doc["runs"]}
    assert len(rows) == len(table) == 4 and f"benchmarks/results/{name}.json" in doc["command"]
    for cells in rows:
        key = ("off" if cells[0] == "`slipstream=off`" else cells[0], cells[1])
        row, run, off = table[key], runs[key], table[("off", cells[1])]
        assert float(cells[2]) == round(row["train_seconds"], 1), cells
        assert float(cells[4]) == round(row["wire_train_bytes_per_sample"]), cells
        assert float(cells[5]) == round(row["wire_train_minus_dense_bytes_per_sample"]), cells
        if key[0] == "off":
            assert set(cells[3:4] + cells[6:]) == {""}, cells
            continue
        assert cells[3] == f"{off['train_seconds'] / row['train_seconds']:.3f}x", cells
        breakdown = run["time_breakdown_rank0"]
        assert [float(cells[6]), float(cells[7])] == [round(breakdown["slipstream"], 1), round(breakdown["serving"], 1)]
        if len(cells) > 8:
            _check(cells[8], [row["test_auc"] - off["test_auc"]])
        assert run["samples_trained"] == runs[("off", cells[1])]["samples_trained"]
    return runs


def test_the_ceiling_table_quotes_its_run():
    """off and the defaults, unshaped and over 1gbit at dim 128 (docs/results/serve.md)."""
    runs = _links_table("network_ceiling_clicklog_dim128", "| job | link | train s | vs `off` on that link |")
    doc = json.loads((RESULTS / "network_ceiling_clicklog_dim128.json").read_text())
    assert doc["communication_share"]["by_rate"]["1gbit"] == pytest.approx(0.478, abs=5e-4)
    decisions = runs[("defaults", "none")]["serve_lever"]["decisions"]
    assert [(d["step"], d["to"], d["serving_ms_per_step"], d["standing_down_ms_per_step"]) for d in decisions] == [
        (170, "down", 215.364, 144.891), (670, "down", 202.88, 145.717)]


def test_the_look_budget_table_quotes_its_run():
    """The decisions' cost after serve_look_budget (docs/performance.md, the levers measured)."""
    runs = json.loads((RESULTS / "headline_look_budget.json").read_text())["results"]["clicklog"]["runs"]
    rows = _rows("docs/performance.md", "| arm | train s (per seed) | against `off` + bf16 (per seed) |")
    arms = {"`off` (fp32)": "off", "defaults": "defaults", "`off` + bf16 and downsampling": "off_auto"}
    assert [arms[r[0]] for r in rows] == ["off", "defaults", "off_auto"]
    seconds = {arm: [x["train_seconds"] for x in runs[arm]] for arm in arms.values()}
    for r in rows:
        arm = arms[r[0]]
        _check(r[1], [statistics.mean(seconds[arm]), *seconds[arm]])
        cost = [a / b for a, b in zip(seconds[arm], seconds["off_auto"])]
        _check(r[2], [statistics.mean(cost), *cost] if arm == "defaults" else [])
        paired = _paired(runs, arm, "off")
        _check(r[3], [statistics.mean(paired), *paired] if arm != "off" else [])
    for run in runs["defaults"]:  # one decision each: stood down, no second look
        assert [(d["step"], d["to"]) for d in run["serve_lever"]["decisions"]] == [(170, "down")]


def test_the_six_seed_decisions_cost_table_quotes_its_run():
    """The decisions' cost over 6 alternating pairs (docs/performance.md, the levers measured)."""
    runs = json.loads((RESULTS / "headline_decisions_6seeds.json").read_text())["results"]["clicklog"]["runs"]
    rows = _rows("docs/performance.md", "| seed (4f0bf02, 6 alternating) |")
    base, mine = runs["off_auto"], runs["defaults"]
    assert [r[0] for r in rows] == [str(i) for i in range(len(mine))] + ["summed"]
    for r, a, b in zip(rows, base, mine):
        _check(r[1], [a["train_seconds"]])
        _check(r[2], [b["train_seconds"]])
        _check(r[3], [100 * (b["train_seconds"] / a["train_seconds"] - 1)])
        _check(r[4], [b["test_auc"] - a["test_auc"]])
        (d,) = b["serve_lever"]["decisions"]  # one decision: stood down, no second look
        assert d["to"] == "down", d
        _check(r[5], [d["step"], d["serving_ms_per_step"], d["standing_down_ms_per_step"]])
        _check(r[6], [b["time_breakdown_rank0"]["slipstream"]])
        _check(r[7], [b["time_breakdown_rank0"]["serving"]])
    total = [sum(x["train_seconds"] for x in arm) for arm in (base, mine)]
    _check(rows[-1][1], [total[0]])
    _check(rows[-1][2], [total[1]])
    _check(rows[-1][3], [100 * (total[1] / total[0] - 1)])


def test_the_unshaped_look_budget_run_is_quoted():
    doc = json.loads((RESULTS / "network_unshaped_look_budget_dim128.json").read_text())
    runs = {r["job"]: r for r in doc["runs"]}
    text = (ROOT / "docs/results/serve.md").read_text()
    off, defaults = runs["off"]["train_seconds"], runs["defaults"]["train_seconds"]
    (decision,) = runs["defaults"]["serve_lever"]["decisions"]
    quoted = (f"`off` {off:.1f} s, the defaults\n  {defaults:.1f} s ({off / defaults:.3f}x), one decision (step "
              f"{decision['step']}: {decision['serving_ms_per_step']:.1f} ms a step serving against "
              f"{decision['standing_down_ms_per_step']:.1f} without, the\n  next look 2150 steps later)")
    assert quoted in text
    assert "look again in 2150 steps" in decision["reason"]


def _embedding_on_wire(run: Dict) -> float:
    """A network run's embedding side on the wire: the trainer's reading of the nodes' counters
    over the training steps less the dense and data-parallel all-reduces (program's off-rank count)."""
    o = run["program_off_rank_bytes_per_sample"]
    return run["wire_train"]["bytes_per_sample"] - (o["dense"] + o["data_parallel"])


def _serve_section(heading: str) -> str:
    """docs/results/serve.md's section that starts with ``heading``, up to the next heading of
    its level or above, its whitespace folded to single spaces."""
    text = Path(ROOT / "docs/results/serve.md").read_text()
    section = text[text.index(heading):]
    return " ".join(section[:10 + re.search(r"\n#{1,2} ", section[10:]).start()].split())


def _span(values: List[float], fmt: str) -> str:
    """A range as quoted: the lowest and highest value in ``fmt``."""
    return f"{min(values):{fmt}}-{max(values):{fmt}}"


def _check_pair(cells: List[str], off: Dict, mine: Dict) -> None:
    """Six cells of a seeded network table: off's and the job's train s, the ratio, the embedding
    side on the wire (off -> job), its ratio, the paired test AUC; and the same samples trained."""
    _check(cells[0] + " " + cells[1], [off["train_seconds"], mine["train_seconds"]])
    assert cells[2] == f"{off['train_seconds'] / mine['train_seconds']:.3f}x", cells
    _check(cells[3].replace("->", " "), [_embedding_on_wire(off), _embedding_on_wire(mine)])
    _check(cells[4], [_embedding_on_wire(mine) / _embedding_on_wire(off)])
    _check(cells[5], [mine["test_auc"] - off["test_auc"]])
    assert mine["samples_trained"] == off["samples_trained"]


def test_the_three_seed_dim128_table_quotes_its_runs():
    doc = json.loads((RESULTS / "network_serve_always_3seeds_dim128.json").read_text())
    runs = {(r["job"], r["seed"]): r for r in doc["runs"]}
    rows = _rows("docs/results/serve.md", "| seed | `off` train s | serve always train s | vs `off` |")
    assert [int(r[0]) for r in rows] == [0, 1, 2] and doc["seeds"] == 3

    embedding = _embedding_on_wire

    for cells in rows:
        off, serve = runs[("off", int(cells[0]))], runs[("serve_always", int(cells[0]))]
        assert serve["serve_lever"]["serve_when"] == "always" and off["served_fraction"] == 0.0
        _check(cells[1] + " " + cells[2], [off["train_seconds"], serve["train_seconds"]])
        assert cells[3] == f"{off['train_seconds'] / serve['train_seconds']:.3f}x", cells
        _check(cells[4].replace("->", " "), [embedding(off), embedding(serve)])
        _check(cells[5], [embedding(serve) / embedding(off)])
        _check(cells[6], [serve["served_fraction"]])
        _check(cells[7], [serve["test_auc"] - off["test_auc"]])
        assert serve["samples_trained"] == off["samples_trained"]


def test_the_defaults_on_two_links_at_dim16_table_quotes_its_run():
    """The defaults against off, unshaped and over 200mbit, one run each (docs/results/serve.md)."""
    _links_table("network_preset_defaults_clicklog_dim16", "| job (dim 16) | link | train s | vs `off` on that link |")


def _check_decisions(cell: str, decisions: List[Dict]) -> None:
    """The lever's decisions quoted as "step N: serve|stand down (serving ms, without ms); ..."."""
    quoted = cell.split("; ")
    assert decisions and decisions[0]["from"] == "probe_on" and len(quoted) == len(decisions), (cell, decisions)
    for decision, part in zip(decisions, quoted):
        assert part.startswith(f"step {decision['step']}: ")
        assert ("serve" if decision["to"] == "serving" else "stand down") in part
        held = decision["from"] == decision["to"]  # no look: the state held to the run's end
        assert held is ("to the end" in part) and held is decision["reason"].startswith("no "), (part, decision)
        _check(part.split("(")[1], [decision["serving_ms_per_step"], decision["standing_down_ms_per_step"]])


def _seeded_links_table(name: str, header: str, rows_expected: List[Tuple[int, str]]) -> None:
    """A table of the defaults against off per seed and link, each row with the lever's one
    decision (step, verdict, its two figures), quoting ``benchmarks/results/<name>.json``."""
    doc = json.loads((RESULTS / f"{name}.json").read_text())
    runs = {(r["job"], r["rate"], r["seed"]): r for r in doc["runs"]}
    rows = _rows("docs/results/serve.md", header)
    assert [(int(r[0]), r[1]) for r in rows] == rows_expected
    assert doc["seeds"] == len({seed for seed, _ in rows_expected}) and f"{name}.json" in doc["command"]

    for cells in rows:
        off, mine = runs[("off", cells[1], int(cells[0]))], runs[("defaults", cells[1], int(cells[0]))]
        _check_pair(cells[2:8], off, mine)
        _check_decisions(cells[8], mine["serve_lever"]["decisions"])


def test_the_two_seed_defaults_table_at_dim128_quotes_its_runs():
    _seeded_links_table(
        "network_defaults_2seeds_dim128", "| seed | link | `off` train s | defaults train s | vs `off` |",
        [(0, "none"), (0, "1gbit"), (1, "none"), (1, "1gbit")],
    )  # fmt: skip


@pytest.mark.parametrize("name, header, rows", [
    ("network_early_cut_2seeds_dim128", "| seed (trial cut short) | link |", [(0, "none"), (0, "1gbit"), (1, "none"), (1, "1gbit")]),
    ("network_early_cut_unshaped_dim128_reversed", "| seed (dim 128, defaults first) | link |", [(0, "none"), (1, "none")]),
    ("network_early_cut_unshaped_dim16", "| seed (dim 16, `off` first) | link |", [(0, "none"), (1, "none")]),
    ("network_early_cut_unshaped_dim16_reversed", "| seed (dim 16, defaults first) | link |", [(0, "none"), (1, "none")]),
])  # fmt: skip
def test_the_trial_cut_short_tables_quote_their_runs(name, header, rows):
    _seeded_links_table(name, header, rows)


def test_the_recheck_from_the_serving_windows_table_quotes_its_runs():
    """e8f15bd's 3 seeds over 1gbit at dim 128: the pair, the decision, and where the re-check
    fell as the decision priced it (its reason) and as the serving windows moved it (summary)."""
    name, header = "network_recheck_mean_3seeds_dim128", "| seed (re-check from the serving windows) | link |"
    _seeded_links_table(name, header, [(0, "1gbit"), (1, "1gbit"), (2, "1gbit")])
    doc = json.loads((RESULTS / f"{name}.json").read_text())
    runs = {r["seed"]: r for r in doc["runs"] if r["job"] == "defaults"}
    for cells in _rows("docs/results/serve.md", header):
        lever = runs[int(cells[0])]["serve_lever"]
        decision = lever["decisions"][-1]
        priced = decision["step"] + int(decision["reason"].split("re-checked in ")[1].split(" steps")[0])
        assert cells[9] == f"step {priced}, then {lever['recheck_at_step']}", cells


def test_the_int32_keys_row_quotes_its_run_and_trains_as_before():
    """7b9da13's pair at dim 16 over 200mbit: its bytes by kind, and the same training as seed 0
    of the 3-seed run before it (int32 keys and positions change what is sent, not what arrives)."""
    doc = json.loads((RESULTS / "network_int32_keys_dim16_200mbit.json").read_text())
    before = json.loads((RESULTS / "network_defaults_3seeds_dim16_200mbit.json").read_text())
    runs = {r["job"]: r for r in doc["runs"]}
    earlier = {r["job"]: r for r in before["runs"] if r["seed"] == 0}
    (cells,) = _rows("docs/results/serve.md", "| seed (int32 keys) | `off` train s (200mbit) |")
    assert int(cells[0]) == 0 and doc["seeds"] == 1 and doc["rates"] == ["200mbit"]
    off, mine = runs["off"], runs["defaults"]
    _check_pair(cells[1:7], off, mine)
    counted = mine["program_off_rank_bytes_per_sample"]
    _check(cells[7] + " " + cells[8], [counted["push"], counted["replica"]])
    was = earlier["defaults"]["program_off_rank_bytes_per_sample"]
    assert counted["push"] < 0.91 * was["push"] and counted["replica"] < 0.91 * was["replica"]
    assert mine["test_auc"] == earlier["defaults"]["test_auc"] and off["test_auc"] == earlier["off"]["test_auc"]
    assert mine["replica"]["rows_pushed_per_rank"] == earlier["defaults"]["replica"]["rows_pushed_per_rank"]


def _dim16_pairs_with_bytes(name: str, header: str) -> Dict:
    """The 3-seed pairs of off and int8 over 200mbit that ``header``'s table quotes, each row's six
    pair cells and its push and replica bytes checked; the runs by (job, seed)."""
    doc = json.loads((RESULTS / f"{name}.json").read_text())
    runs = {(r["job"], r["seed"]): r for r in doc["runs"]}
    rows = _rows("docs/results/serve.md", header)
    assert [int(r[0]) for r in rows] == [0, 1, 2] and doc["seeds"] == 3 and doc["rates"] == ["200mbit"]
    for cells in rows:
        off, mine = runs[("off", int(cells[0]))], runs[("int8", int(cells[0]))]
        _check_pair(cells[1:7], off, mine)
        counted = mine["program_off_rank_bytes_per_sample"]
        _check(cells[7] + " " + cells[8], [counted["push"], counted["replica"]])
    return runs


def test_the_int8_sync_table_quotes_its_runs_and_sends_a_third_less_than_bf16():
    """763dece's 3 seeds at dim 16 over 200mbit with slipstream.sync_precision=int8: each pair, the
    push's and the sync's bytes, and against the bf16 run of seed 0 at 7b9da13 (int32 keys) the
    rows pushed within 1% and the push and the replica at most 0.72 of their bytes (a row's 24
    bytes against 36: 0.67, plus what an int8 rounding sends again)."""
    bf16 = {r["job"]: r for r in json.loads((RESULTS / "network_int32_keys_dim16_200mbit.json").read_text())["runs"]}
    runs = _dim16_pairs_with_bytes("network_int8_sync_3seeds_dim16_200mbit", "| seed (int8 syncs) | `off` train s (200mbit) |")
    mine, was = runs[("int8", 0)], bf16["defaults"]
    assert runs[("off", 0)]["test_auc"] == bf16["off"]["test_auc"]  # the same off: paired across runs
    # against the bf16 defaults of the 3 seeds before (d1a5d54, bf16 syncs), whose off is the same
    before = {(r["job"], r["seed"]): r for r in json.loads((RESULTS / "network_defaults_3seeds_dim16_200mbit.json").read_text())["runs"]}
    gaps = []
    for seed in range(3):
        assert before[("off", seed)]["test_auc"] == runs[("off", seed)]["test_auc"]
        gaps.append([runs[(job, seed)]["test_auc"] - runs[("off", seed)]["test_auc"] for job in ("int8",)]
                    + [before[("defaults", seed)]["test_auc"] - before[("off", seed)]["test_auc"]])
    quoted = "int8 is {:.6f}, {:.6f} and {:.6f} against bf16's {:.6f}, {:.6f} and {:.6f}".format(
        *[g[0] for g in gaps], *[g[1] for g in gaps])
    assert quoted in " ".join((ROOT / "docs/results/serve.md").read_text().split())
    pushed, pushed_bf16 = mine["replica"]["rows_pushed_per_rank"], was["replica"]["rows_pushed_per_rank"]
    assert abs(pushed / pushed_bf16 - 1) < 0.01
    for kind in ("push", "replica"):
        assert mine["program_off_rank_bytes_per_sample"][kind] <= 0.72 * was["program_off_rank_bytes_per_sample"][kind]


def test_the_int8_feedback_table_quotes_its_runs_beside_bf16_and_int8_without_remainders():
    """8e65f76's 3 seeds (the int8 push's remainders carried): each pair, its bytes as without
    them (within 0.2%), and the three variants' paired test AUCs as quoted, all on the same off."""
    plain = {(r["job"], r["seed"]): r for r in json.loads((RESULTS / "network_int8_sync_3seeds_dim16_200mbit.json").read_text())["runs"]}
    bf16 = {(r["job"], r["seed"]): r for r in json.loads((RESULTS / "network_defaults_3seeds_dim16_200mbit.json").read_text())["runs"]}
    runs = _dim16_pairs_with_bytes("network_int8_feedback_3seeds_dim16_200mbit", "| seed (int8, remainders carried) | `off` train s (200mbit) |")
    for seed in range(3):
        off, counted = runs[("off", seed)], runs[("int8", seed)]["program_off_rank_bytes_per_sample"]
        for kind in ("push", "replica"):
            assert abs(counted[kind] / plain[("int8", seed)]["program_off_rank_bytes_per_sample"][kind] - 1) < 0.002
        assert off["test_auc"] == plain[("off", seed)]["test_auc"] == bf16[("off", seed)]["test_auc"]
    gaps = {name: [src[(job, s)]["test_auc"] - src[("off", s)]["test_auc"] for s in range(3)]
            for name, src, job in (("ef", runs, "int8"), ("bf16", bf16, "defaults"), ("plain", plain, "int8"))}
    text = " ".join((ROOT / "docs/results/serve.md").read_text().split())
    quoted = "The paired test AUC is {:.6f}, {:.6f} and {:.6f}: against bf16's {:.6f}, {:.6f} and {:.6f} and the int8 push without remainders' {:.6f}, {:.6f} and {:.6f}"
    assert quoted.format(*gaps["ef"], *gaps["bf16"], *gaps["plain"]) in text
    spread = max(abs(a - b) for s in range(3) for a in (gaps["ef"][s], gaps["plain"][s]) for b in (gaps["bf16"][s],))
    assert spread <= 0.00005 and gaps["ef"][1] < -0.0005 < gaps["bf16"][1]


def test_the_int8_every_5_steps_table_quotes_its_runs_paired_with_the_run_before():
    """The preset's int8 syncs every 5 steps, the job alone, paired with off of the run before it
    (the same test AUC per seed in every run before: deterministic), and against bf16 every 10
    steps a smaller loss on every seed and within 1% of its push and replica bytes together."""
    doc = json.loads((RESULTS / "network_int8_sync5_3seeds_dim16_200mbit.json").read_text())
    off = {r["seed"]: r for r in json.loads((RESULTS / "network_int8_feedback_3seeds_dim16_200mbit.json").read_text())["runs"]
           if r["job"] == "off"}
    bf16 = {(r["job"], r["seed"]): r for r in json.loads((RESULTS / "network_defaults_3seeds_dim16_200mbit.json").read_text())["runs"]}
    runs = {r["seed"]: r for r in doc["runs"]}
    assert doc["jobs"] == {"int8_sync5": ["slipstream.sync_precision=int8", "slipstream.replica_sync_steps=5"]}
    rows = _rows("docs/results/serve.md", "| seed (int8 every 5 steps) |")
    assert [int(r[0]) for r in rows] == [0, 1, 2] and doc["seeds"] == 3
    losses = []
    for cells in rows:
        seed = int(cells[0])
        mine = runs[seed]
        _check_pair(cells[1:7], off[seed], mine)
        counted = mine["program_off_rank_bytes_per_sample"]
        _check(cells[7] + " " + cells[8], [counted["push"], counted["replica"]])
        was = bf16[("defaults", seed)]
        assert off[seed]["test_auc"] == bf16[("off", seed)]["test_auc"]
        losses.append((mine["test_auc"] - off[seed]["test_auc"], was["test_auc"] - bf16[("off", seed)]["test_auc"]))
        assert losses[-1][0] - losses[-1][1] >= 0.0001
        assert mine["replica"]["pushes"] == 197 and mine["replica"]["rows_pushed_per_rank"] > 3.08e6
    bf16_0 = {r["job"]: r for r in json.loads((RESULTS / "network_int32_keys_dim16_200mbit.json").read_text())["runs"]}
    together = [sum(r["program_off_rank_bytes_per_sample"][k] for k in ("push", "replica")) for r in (runs[0], bf16_0["defaults"])]
    assert abs(together[0] / together[1] - 1) < 0.01, together
    text = " ".join((ROOT / "docs/results/serve.md").read_text().split())
    quoted = "-{:.6f}, -{:.6f} and -{:.6f}, against bf16 every 10 steps' -{:.6f}, -{:.6f} and -{:.6f}".format(
        *[-a for a, _ in losses], *[-b for _, b in losses])
    assert quoted in text


def test_the_int8_every_5_steps_dim128_table_quotes_its_runs_beside_bf16_every_10():
    """The preset's int8 syncs every 5 steps at dim 128 over 1gbit, 2 seeds: each pair, and against
    e8f15bd's bf16 every 10 steps on the same seeds (the same off test AUC) the quoted losses, less
    of the embedding side on the wire, and a slower run."""
    doc = json.loads((RESULTS / "network_int8_sync5_2seeds_dim128.json").read_text())
    was = {(r["job"], r["seed"]): r for r in json.loads((RESULTS / "network_recheck_mean_3seeds_dim128.json").read_text())["runs"]}
    runs = {(r["job"], r["seed"]): r for r in doc["runs"]}
    rows = _rows("docs/results/serve.md", "| seed (int8 every 5, dim 128) |")
    assert [int(r[0]) for r in rows] == [0, 1] and doc["seeds"] == 2 and doc["rates"] == ["1gbit"]
    losses = []
    for cells in rows:
        seed = int(cells[0])
        off, mine = runs[("off", seed)], runs[("defaults", seed)]
        _check_pair(cells[1:7], off, mine)
        counted = mine["program_off_rank_bytes_per_sample"]
        _check(cells[7] + " " + cells[8], [counted["push"], counted["replica"]])
        assert off["test_auc"] == was[("off", seed)]["test_auc"]
        before = was[("defaults", seed)]
        losses.append((mine["test_auc"] - off["test_auc"], before["test_auc"] - off["test_auc"]))
        assert losses[-1][0] > losses[-1][1]
        assert _embedding_on_wire(mine) < _embedding_on_wire(before)
        assert mine["train_seconds"] / off["train_seconds"] > before["train_seconds"] / was[("off", seed)]["train_seconds"]
    text = " ".join((ROOT / "docs/results/serve.md").read_text().split())
    quoted = "-{:.6f} and -{:.6f}, against bf16 every 10 steps' -{:.6f} and -{:.6f}".format(
        -losses[0][0], -losses[1][0], -losses[0][1], -losses[1][1])
    assert quoted in text


def test_the_three_seed_dim16_table_quotes_its_runs():
    doc = json.loads((RESULTS / "network_defaults_3seeds_dim16_200mbit.json").read_text())
    runs = {(r["job"], r["seed"]): r for r in doc["runs"]}
    rows = _rows("docs/results/serve.md", "| seed | `off` train s (200mbit) | defaults train s | vs `off` |")
    assert [int(r[0]) for r in rows] == [0, 1, 2] and doc["seeds"] == 3 and doc["rates"] == ["200mbit"]

    for cells in rows:
        off, mine = runs[("off", int(cells[0]))], runs[("defaults", int(cells[0]))]
        _check_pair(cells[1:7], off, mine)
        assert [(d["step"], d["to"]) for d in mine["serve_lever"]["decisions"]] == [(120, "serving")]


@pytest.mark.parametrize("header, names", [
    ("| seed (the preset, dim 128, 5176a06) | link |",
     ["network_int8_sync5_seeds01_rerun_dim128", "network_int8_sync5_seed2_dim128", "network_int8_sync5_unshaped_dim128"]),
    ("| seed (the preset, dim 16, 5176a06) | link |", ["network_int8_sync5_unshaped_dim16"]),
    ("| seed (the preset, dim 128, defaults first) | link |", ["network_int8_sync5_unshaped_dim128_reversed"]),
    ("| seed (the preset, dim 16, defaults first) | link |", ["network_int8_sync5_unshaped_dim16_reversed"]),
    ("| seed (the preset, dim 16 over 200mbit, 5176a06) | link |", ["network_int8_sync5_3seeds_dim16_200mbit_rerun"]),
    ("| seed (48e7686, dim 16, `off` first) | link |", ["network_lockstep_unshaped_dim16"]),
    ("| seed (48e7686, dim 16, defaults first) | link |", ["network_lockstep_unshaped_dim16_reversed"]),
    ("| seed (48e7686, dim 128, `off` first) | link |", ["network_lockstep_unshaped_dim128"]),
    ("| seed (48e7686, dim 128, defaults first) | link |", ["network_lockstep_unshaped_dim128_reversed"]),
    ("| seed (4aaab99, dim 16 over 200mbit) | link |", ["network_serve50_3seeds_dim16_200mbit"]),
    ("| seed (4aaab99, dim 128 over 1gbit) | link |", ["network_serve50_3seeds_dim128_1gbit"]),
    ("| seed (4aaab99, dim 16, unshaped) | link |", ["network_serve50_unshaped_dim16"]),
    ("| seed (a97b860, dim 128 over 1gbit) | link |", ["network_sync_3seeds_dim128_1gbit"]),
    ("| seed (a97b860, dim 128, unshaped) | link |", ["network_sync_unshaped_dim128"]),
    ("| seed (f439327, dim 128, unshaped) | link |", ["network_sync_unshaped_dim128", "network_unshaped_dim128_seeds12"]),
    ("| seed (f439327, dim 16, unshaped) | link |", ["network_unshaped_dim16_3seeds"]),
    ("| seed (4c33efb, dim 128 over 1gbit) | link |", ["network_gather_3seeds_dim128_1gbit"]),
    ("| seed (4c33efb, dim 128, unshaped) | link |", ["network_gather_unshaped_dim128"]),
    ("| seed (4c33efb, dim 16, unshaped) | link |", ["network_gather_unshaped_dim16"]),
    ("| seed (4749203, dim 16, unshaped, alternating) | link |", ["network_alternate_unshaped_dim16"]),
    ("| seed (cd9c767, dim 16 over 200mbit) | link |", ["network_gather_3seeds_dim16_200mbit"]),
    ("| seed (cd9c767, dim 128, unshaped, alternating) | link |", ["network_alternate_unshaped_dim128"]),
    ("| seed (e85e84f, dim 16 over 200mbit) | link |", ["network_recheck_cut_dim16_200mbit"]),
    ("| seed (e85e84f, dim 16 over 200mbit, seeds 3-5) | link |", ["network_recheck_cut_seeds3to5_dim16_200mbit"]),
    ("| seed (a61cf5e, dim 16 over 200mbit) | link |", ["network_halfcheck_dim16_200mbit"]),
    ("| seed (081d985, dim 16 over 200mbit, seeds 3-5) | link |", ["network_halfcheck_seeds3to5_dim16_200mbit"]),
    ("| seed (539511b, dim 16 over 200mbit) | link |", ["network_lookend_dim16_200mbit"]),
    ("| seed (3460cc9, dim 16 over 200mbit) | link |", ["network_bf16scale_dim16_200mbit", "network_bf16scale_seed2_dim16_200mbit"]),
    ("| seed (0ba27cf, dim 16 over 200mbit, two epochs) | link |", ["network_recheck_2epochs_dim16_200mbit"]),
    ("| seed (10342f2, dim 16 over 200mbit, three epochs) | link |", ["network_recheck_3epochs_dim16_200mbit"]),
])  # fmt: skip
def test_the_preset_on_one_machine_tables_quote_their_runs(header, names):
    """The preset against off at dim 128 (3 seeds over 1gbit, seed 0 unshaped) and dim 16
    (unshaped), one run per file on the same machine: each pair, Slipstream's and serving's own
    seconds, and the lever's decisions; each row from the file whose command wrote it."""
    runs: Dict[Tuple[str, str, int], Dict] = {}
    for name in names:
        doc = json.loads((RESULTS / f"{name}.json").read_text())
        assert f"{name}.json" in doc["command"]
        for r in doc["runs"]:
            assert (r["job"], r["rate"], r["seed"]) not in runs, (name, r["job"], r["seed"])
            runs[(r["job"], r["rate"], r["seed"])] = r
    rows = _rows("docs/results/serve.md", header)
    assert sorted((int(r[0]), r[1]) for r in rows) == sorted({(s, rate) for _, rate, s in runs})
    for cells in rows:
        key = (cells[1], int(cells[0]))
        off, mine = runs[("off", *key)], runs[("defaults", *key)]
        _check_pair(cells[2:8], off, mine)
        spent = mine["time_breakdown_rank0"]
        _check(cells[8] + " " + cells[9], [spent["slipstream"], spent["serving"]])
        _check_decisions(cells[10], mine["serve_lever"]["decisions"])


def test_the_recheck_cut_short_over_200mbit_is_quoted():
    """Which re-checks were cut short, the served shares and Slipstream's seconds by part that
    docs/results/serve.md's section on e85e84f quotes."""
    runs = {(r["job"], r["seed"]): r for r in json.loads((RESULTS / "network_recheck_cut_dim16_200mbit.json").read_text())["runs"]}
    more = json.loads((RESULTS / "network_recheck_cut_seeds3to5_dim16_200mbit.json").read_text())["runs"]
    runs.update({(r["job"], r["seed"]): r for r in more})
    every = [runs[("defaults", s)] for s in range(6)]
    cut = ["cuts the window short" in r["serve_lever"]["decisions"][1]["reason"] for r in every]
    assert cut == [False, False, True, True, False, True]
    mine = every[:3]
    section = _serve_section("## A re-check cut short where serving wins by far (e85e84f)")
    low, high = sorted(r["served_fraction"] for r in mine[:2])
    assert f"{mine[2]['served_fraction']:.3f} of the lookups served against {low:.3f}-{high:.3f}" in section
    parts = mine[0]["slipstream_seconds"]
    quoted = (f"the replica's syncs {parts['sync_seconds']:.2f} s, the pushes {parts['push_seconds']:.2f} s, "
              f"snapshots {parts['snapshot_seconds']:.2f} s")  # fmt: skip
    assert quoted in section and f"the host split {parts['serve_seconds']:.2f} s" in section
    # the six seeds by whether the re-check was cut: served shares and embedding bytes, ranges
    for was_cut, words in [(True, "served {}, **{} of `off`'s embedding bytes**"), (False, "served {}, {}")]:
        runs_cut = [(s, r) for s, (r, c) in enumerate(zip(every, cut)) if c is was_cut]
        served_range = _span([r["served_fraction"] for _, r in runs_cut], ".3f")
        ratio = _span([_embedding_on_wire(r) / _embedding_on_wire(runs[("off", s)]) for s, r in runs_cut], ".3f")
        assert words.format(served_range, ratio) in section, (served_range, ratio)


def test_the_noise_floor_tables_quote_their_runs():
    """off against off, and off, off again and the defaults with CPU seconds (dim 16 unshaped):
    each row's seconds, ratios and order as the files hold them, and the sums the text quotes."""
    aa = {(r["job"], r["seed"]): r for r in json.loads((RESULTS / "network_aa_unshaped_dim16.json").read_text())["runs"]}
    rows = _rows("docs/results/serve.md", "| seed (4749203, `off` against `off`, dim 16, unshaped) |")
    assert [int(r[0]) for r in rows] == [0, 1, 2]
    for cells in rows:
        off, again = aa[("off", int(cells[0]))], aa[("off_again", int(cells[0]))]
        _check(cells[1] + " " + cells[2], [off["train_seconds"], again["train_seconds"]])
        assert cells[3] == f"{off['train_seconds'] / again['train_seconds']:.3f}x", cells
        _check(cells[4], [again["test_auc"] - off["test_auc"]])
    doc = json.loads((RESULTS / "network_cpu_unshaped_dim16.json").read_text())
    assert doc["order"] == "alternate" and "network_cpu_unshaped_dim16.json" in doc["command"]
    runs = {(r["job"], r["seed"]): r for r in doc["runs"]}
    names = {"`off`": "off", "`off` again": "off_again", "defaults": "defaults"}
    rows = _rows("docs/results/serve.md", "| seed (cd9c767, dim 16, unshaped) | order |")
    assert [int(r[0]) for r in rows] == [0, 1, 2]
    for cells in rows:
        seed = int(cells[0])
        trio = [runs[(job, seed)] for job in ("off", "off_again", "defaults")]
        assert [names[n] for n in cells[1].split(", ")] == sorted(names.values(), key=lambda j: runs[(j, seed)]["position"])
        wall, cpu = [r["train_seconds"] for r in trio], [r["train_cpu_seconds"] for r in trio]
        _check(" ".join(cells[2:5]), wall)
        assert cells[5:7] == [f"{wall[0] / wall[1]:.3f}x", f"{wall[0] / wall[2]:.3f}x"], cells
        _check(" ".join(cells[7:10]), cpu)
        assert cells[10:12] == [f"{cpu[0] / cpu[1]:.3f}x", f"{cpu[0] / cpu[2]:.3f}x"], cells
        per = [c / w for c, w in zip(cpu, wall)]
        _check(cells[12].replace("-", " "), [min(per), max(per)])
        _check(cells[13], [trio[2]["test_auc"] - trio[0]["test_auc"]])
    text = " ".join((ROOT / "docs/results/serve.md").read_text().split())
    alt = json.loads((RESULTS / "network_alternate_unshaped_dim16.json").read_text())["runs"]
    both = [r for r in alt if r["job"] in ("off", "defaults")] + [r for r in doc["runs"] if r["job"] != "off_again"]
    off = sum(r["train_seconds"] for r in both if r["job"] == "off")
    mine = sum(r["train_seconds"] for r in both if r["job"] == "defaults")
    assert len(both) == 14 and f"{off / mine:.3f}x on the summed seconds ({off:.1f} s against {mine:.1f} s)" in text


def test_the_code_control_and_the_waits_over_200mbit_are_quoted():
    """4aaab99's code and cd9c767's, back to back (one run each, seed 0 over 200mbit): their
    seconds and test AUC as quoted; and the CPU seconds and waits of the 3 seeds' runs."""
    old, head = (json.loads((RESULTS / f"network_{n}_control_dim16_200mbit.json").read_text())["runs"][0]
                 for n in ("4aaab99", "head"))
    assert old["seed"] == head["seed"] == 0 and old["rate"] == head["rate"] == "200mbit"
    assert "train_cpu_seconds" not in old and head["train_cpu_seconds"] is not None  # the old code had none
    text = " ".join((ROOT / "docs/results/serve.md").read_text().split())
    assert (f"trained in {old['train_seconds']:.1f} s and {head['train_seconds']:.1f} s with test AUC "
            f"{old['test_auc']:.6f} and {head['test_auc']:.6f}") in text
    runs = json.loads((RESULTS / "network_gather_3seeds_dim16_200mbit.json").read_text())["runs"]
    quoted = re.search(r"`off`'s ranks spent (\S+) CPU seconds and waited (\S+) rank-seconds .{0,40}"
                       r"the defaults' spent (\S+) and waited (\S+):", text)
    assert quoted, "the CPU seconds and waits over 200mbit are not quoted"
    for job, spent, waited in (("off", 1, 2), ("defaults", 3, 4)):
        cpu = [r["train_cpu_seconds"] for r in runs if r["job"] == job]
        wait = [2 * r["train_seconds"] - r["train_cpu_seconds"] for r in runs if r["job"] == job]
        assert len(cpu) == 3
        _check(quoted.group(spent).replace("-", " "), [min(cpu), max(cpu)])
        _check(quoted.group(waited).replace("-", " "), [min(wait), max(wait)])


def test_the_one_element_agreement_sums_quote_their_unshaped_pairs():
    """48e7686's unshaped pairs, both orders, 2 seeds each: each dim's summed seconds and their
    ratio as quoted."""
    text = " ".join((ROOT / "docs/results/serve.md").read_text().split())
    for dim in (16, 128):
        runs = [r for suffix in ("", "_reversed") for r in json.loads(
            (RESULTS / f"network_lockstep_unshaped_dim{dim}{suffix}.json").read_text())["runs"]]
        assert len(runs) == 8 and {r["rate"] for r in runs} == {"none"}
        off = sum(r["train_seconds"] for r in runs if r["job"] == "off")
        mine = sum(r["train_seconds"] for r in runs if r["job"] == "defaults")
        assert f"{off / mine:.3f}x `off` at dim {dim} ({off:.1f} s against {mine:.1f} s)" in text


def test_the_preset_before_the_sync_changes_trains_the_same_on_the_same_machine():
    """8f04bff's preset, seed 0 at dim 128 over 1gbit on the machine of 2026-12-06: the same test
    AUC to the digit as 5176a06's (the sync changes since moved no value), its time as quoted."""
    old = json.loads((RESULTS / "network_int8_sync5_8f04bff_seed0_dim128.json").read_text())["runs"][0]
    new = {r["job"]: r for r in json.loads((RESULTS / "network_int8_sync5_seeds01_rerun_dim128.json").read_text())["runs"]
           if r["seed"] == 0}
    assert old["seed"] == 0 and old["rate"] == "1gbit" and old["test_auc"] == new["defaults"]["test_auc"]
    text = " ".join((ROOT / "docs/results/serve.md").read_text().split())
    assert (f"trained seed 0 in {old['train_seconds']:.1f} s with the same test AUC to the digit (Slipstream "
            f"{old['time_breakdown_rank0']['slipstream']:.1f} s): {new['off']['train_seconds'] / old['train_seconds']:.2f}x "
            f"against `off`'s {new['off']['train_seconds']:.1f} s") in text


def test_the_serving_start_table_quotes_its_local_runs():
    """The local runs that chose the preset's start (docs/results/serve.md): each row's
    overrides, embedding side (the program's off-rank count, tracking where counted), served
    share, hot rows and test AUC as serve_start_local.json holds them."""
    doc = json.loads((RESULTS / "serve_start_local.json").read_text())
    assert "serve_start_local.json" in doc["command"]
    rows = _rows("docs/results/serve.md", "| run (`clicklog`, one local run each, seed 0, 2 ranks) |")
    assert [r[0] for r in rows] == [run["run"] for run in doc["runs"]]
    kinds = ("input", "output", "gradient", "push", "replica", "control", "tracking")
    for cells, run in zip(rows, doc["runs"]):
        counted = run["off_rank_bytes_per_sample"]
        assert cells[1] == f"`{run['overrides']}`"
        _check(cells[2], [sum(counted.get(k, 0.0) for k in kinds)])
        if "tracking" in counted:
            _check(cells[3], [counted["tracking"]])
        else:
            assert cells[3] == "not counted", cells
        _check(cells[4] + " " + cells[5].replace(",", "") + " " + cells[6],
               [run["served_fraction"], run["hot_rows"], run["test_auc"]])


def test_the_serving_start_side_by_side_quotes_its_run():
    """The preset's start before against 4aaab99's, one seed over 200mbit (docs/results/serve.md)."""
    doc = json.loads((RESULTS / "network_serve50_vs_before_dim16_200mbit.json").read_text())
    assert "network_serve50_vs_before_dim16_200mbit.json" in doc["command"]
    runs = {r["job"]: r for r in doc["runs"]}
    before, now = runs["before"], runs["defaults"]
    assert before["samples_trained"] == now["samples_trained"] and before["rate"] == now["rate"] == "200mbit"
    text = " ".join((ROOT / "docs/results/serve.md").read_text().split())
    spent = [r["time_breakdown_rank0"]["slipstream"] for r in (before, now)]
    assert (f"{before['train_seconds']:.1f} s against {now['train_seconds']:.1f} s, "
            f"{_embedding_on_wire(before):.0f} against {_embedding_on_wire(now):.0f} bytes a sample of embedding side "
            f"on the wire, Slipstream's own work {spent[0]:.1f} s against {spent[1]:.1f} s, test AUC "
            f"{before['test_auc']:.5f} against {now['test_auc']:.5f}") in text


def test_the_half_window_checks_over_200mbit_are_quoted():
    """Where each of the six re-checks was cut (a quarter or half of its window), the served
    shares, embedding bytes and serving's gain at the cut that docs/results/serve.md's section
    on a61cf5e quotes."""
    runs: Dict[Tuple[str, int], Dict] = {}
    for name in ["network_halfcheck_dim16_200mbit", "network_halfcheck_seeds3to5_dim16_200mbit"]:
        runs.update({(r["job"], r["seed"]): r for r in json.loads((RESULTS / f"{name}.json").read_text())["runs"]})
    every = [runs[("defaults", s)] for s in range(6)]
    recheck = [r["serve_lever"]["decisions"][1] for r in every]
    at = [int(re.match(r"after (\d+) steps without serving, \d+% past the line cuts", d["reason"]).group(1)) for d in recheck]
    assert at == [20, 10, 10, 20, 10, 10]
    section = _serve_section("## Re-checks checked at half their window too (a61cf5e)")

    def faster(d):
        return 100 * (1 - d["serving_ms_per_step"] / d["standing_down_ms_per_step"])

    quarter = [s for s in range(6) if at[s] == 10]
    half = [s for s in range(6) if at[s] == 20]
    ratio = {s: _embedding_on_wire(every[s]) / _embedding_on_wire(runs[("off", s)]) for s in range(6)}
    assert (f"serving {_span([faster(recheck[s]) for s in quarter], '.1f')}% faster over the quarter's 10 steps; "
            f"served {_span([every[s]['served_fraction'] for s in quarter], '.3f')}, "
            f"**{_span([ratio[s] for s in quarter], '.3f')} of `off`'s embedding bytes**") in section
    assert len({f"{every[s]['served_fraction']:.3f}" for s in half}) == 1  # quoted once for both
    assert (f"{faster(recheck[half[0]]):.1f}% and {faster(recheck[half[1]]):.1f}% faster over 20 steps" in section
            and f"served {every[half[0]]['served_fraction']:.3f}, {_span([ratio[s] for s in half], '.3f')}" in section)
    speed = [runs[("off", s)]["train_seconds"] / every[s]["train_seconds"] for s in range(6)]
    assert f"**Time: {_span(speed, '.3f')}x `off`**" in section
    d_auc = [every[s]["test_auc"] - runs[("off", s)]["test_auc"] for s in range(6)]
    assert f"Paired test AUC {max(d_auc):+.4f} to {min(d_auc):+.4f}" in section


def test_the_recheck_held_to_the_end_over_200mbit_is_quoted():
    """The bytes, served shares, where the re-checks were held and seed 0's parts against the
    half-check run earlier that day, as docs/results/serve.md's section on 539511b quotes them."""
    runs = {(r["job"], r["seed"]): r for r in json.loads((RESULTS / "network_lookend_dim16_200mbit.json").read_text())["runs"]}
    before = {(r["job"], r["seed"]): r for r in json.loads((RESULTS / "network_halfcheck_dim16_200mbit.json").read_text())["runs"]}
    mine = [runs[("defaults", s)] for s in range(2)]
    section = _serve_section("## A re-check only where steps are left to act on it (539511b)")
    ratios = {f"{_embedding_on_wire(r) / _embedding_on_wire(runs[('off', s)]):.3f}" for s, r in enumerate(mine)}
    served = {f"{r['served_fraction']:.3f}" for r in mine}
    assert len(ratios) == len(served) == 1
    assert f"**{ratios.pop()} of `off`'s embedding bytes on both seeds** (served {served.pop()})" in section
    held = [r["serve_lever"]["decisions"][-1] for r in mine]
    assert all(d["from"] == d["to"] == "serving" for d in held)
    left = sorted(int(re.match(r"no re-check: (\d+) steps", d["reason"]).group(1)) for d in held)
    steps = sorted(d["step"] for d in held)
    assert f"came at step {steps[0]}-{steps[1]}, with {left[0]}-{left[1]} steps left" in section
    now, then = mine[0]["time_breakdown_rank0"], before[("defaults", 0)]["time_breakdown_rank0"]
    assert (f"forward {now['forward']:.1f} s against {then['forward']:.1f} earlier in the day for the same seed, "
            f"backward {now['backward']:.1f} against {then['backward']:.1f}, the host split {now['serving']:.2f} "
            f"against {then['serving']:.2f}, its precision probe's fp32 step "
            f"{mine[0]['precision']['probe']['fp32_ms_per_step']:.1f} ms against "
            f"{before[('defaults', 0)]['precision']['probe']['fp32_ms_per_step']:.1f}") in section


def test_the_bf16_scale_over_200mbit_is_quoted():
    """The program's push and replica bytes per trained sample before and after the bf16 scale
    and the served share, as docs/results/serve.md's section on 3460cc9 quotes them."""
    def defaults(name):
        return [r for r in json.loads((RESULTS / f"{name}.json").read_text())["runs"] if r["job"] == "defaults"]

    now, before = defaults("network_bf16scale_dim16_200mbit"), defaults("network_lookend_dim16_200mbit")
    section = " ".join(_serve_section("## int8 rows at a bf16 scale (3460cc9)").split())
    mean = lambda rs, k: statistics.mean(r["program_off_rank_bytes_per_sample"][k] for r in rs)  # noqa: E731
    assert (f"the pushes {mean(now, 'push'):.1f} bytes per trained sample instead of {mean(before, 'push'):.1f} and "
            f"the replica's syncs {mean(now, 'replica'):.1f} instead of {mean(before, 'replica'):.1f}") in section
    assert {f"{r['served_fraction']:.3f}" for r in now} == {"0.926"} and "(0.926)" in section  # seeds 0 and 1
    # the bf16 scale: 2 bytes a row fewer on both collectives (rows pushed and synced per sample)
    assert mean(now, "push") < mean(before, "push") and mean(now, "replica") < mean(before, "replica")


def _network_runs(name: str) -> List[dict]:
    """The runs of benchmarks/results/``name``.json (benchmarks/network.py)."""
    return json.loads((RESULTS / f"{name}.json").read_text())["runs"]


def test_quantized_comms_across_two_nodes_are_quoted():
    """docs/performance.md's two tables of qcomms across the emulated nodes on the plan without
    them (d6b573e): per seed at dim 16 over 200mbit, each job's seconds, the ratios and the
    paired test AUC; at dim 128 over 1gbit each job's seconds, counted bytes, compute and
    Slipstream's own seconds."""
    doc = "docs/performance.md"
    runs = {(r["job"], r["seed"]): r for r in _network_runs("network_qcomms_fp32plan_200mbit")}
    rows = _rows(doc, "| seed (d6b573e, dim 16, 200mbit) |")
    assert len(rows) == 3
    for row in rows:
        seed = int(row[0])
        off, oq, de, dq = (runs[(job, seed)] for job in ("off", "off+qcomms", "defaults", "defaults+qcomms"))
        t = lambda r: r["train_seconds"]  # noqa: E731
        auc = lambda r: r["test_auc"] - off["test_auc"]  # noqa: E731
        for cell, value in zip(row[1:], [t(off), t(oq), t(off) / t(oq), t(de), t(dq), t(de) / t(dq), auc(oq), auc(de), auc(dq)]):
            _check(cell, [value])
        assert oq["sharding_plan"] == off["sharding_plan"]  # plan_as=fp32: off's plan

    big = {r["job"]: r for r in _network_runs("network_qcomms_fp32plan_dim128_1gbit")}
    big["always"] = _network_runs("network_qcomms_serve_always_dim128_1gbit")[0]
    small = _network_runs("network_qcomms_serve_always_dim16_200mbit")[0]
    rows = _rows(doc, "| job (d6b573e, seed 0) |")
    assert len(rows) == 6
    for row, r in zip(rows, [big["off"], big["off+qcomms"], big["defaults"], big["defaults+qcomms"], big["always"], small]):
        off = big["off"] if r is not small else runs[("off", 0)]
        tb, counted = r["time_breakdown_rank0"], r["program_bytes_per_sample"]
        _check(row[2], [r["train_seconds"]])
        if r is not big["off"]:
            _check(row[3].split("(")[0], [off["train_seconds"] / r["train_seconds"]])
            _check(row[7], [r["test_auc"] - off["test_auc"]])
        _check(row[4], [counted["total"], counted["embedding"], counted["dense"]])
        _check(row[5], [tb["forward"] + tb["backward"]])
        if row[6].strip():
            _check(row[6], [tb["slipstream"] + tb["serving"]])


def test_the_defaults_with_quantized_comms_at_dim_128_are_quoted():
    """The per-seed table of the defaults with and without qcomms at dim 128 over 1gbit: seed 0
    from the four-job run, seeds 1 and 2 from their own; each row's seconds, ratio and paired
    AUC, and the lever's stand-down on every run with qcomms."""
    runs = {(r["job"], r["seed"]): r for r in _network_runs("network_qcomms_defaults_seeds12_dim128_1gbit")}
    runs.update({(r["job"], 0): r for r in _network_runs("network_qcomms_fp32plan_dim128_1gbit")})
    rows = _rows("docs/performance.md", "| seed (d6b573e, dim 128, 1gbit) |")
    assert [int(r[0]) for r in rows] == [0, 1, 2]
    for row in rows:
        de, dq = runs[("defaults", int(row[0]))], runs[("defaults+qcomms", int(row[0]))]
        for cell, value in zip(row[1:], [de["train_seconds"], dq["train_seconds"], de["train_seconds"] / dq["train_seconds"],
                                         dq["test_auc"] - de["test_auc"]]):
            _check(cell, [value])
        assert dq["serve_lever"]["decisions"][0]["step"] == 62 and dq["served_fraction"] < 0.02
        assert 0.925 <= round(de["served_fraction"], 3) <= 0.926


def test_the_comms_guard_is_quoted():
    """docs/performance.md's table of the comms guard across two nodes: every run's seconds,
    ratio, wire bytes, the guard's checks, its largest error and share lost with their directions,
    what the run ended with and the paired test AUC."""
    runs = {r["job"]: r for r in _network_runs("network_qcomms_guard_200mbit")}
    names = {"`off`": "off", "`off` + qcomms, auto": "off+qcomms(auto)",
             "`off` + qcomms scaled by 1024, auto": "off+qcomms scaled(auto)"}  # fmt: skip
    rows = _rows("docs/performance.md", "| job (qcomms auto with the guard, dim 16, 200mbit, seed 0) |")
    assert [names[row[0]] for row in rows] == list(runs)
    off = runs["off"]
    for row in rows:
        r = runs[names[row[0]]]
        _check(row[1], [r["train_seconds"]])
        _check(row[3], [r["wire_bytes_per_sample"]])
        if r is off:
            assert row[2] == row[4] == row[5] == row[6] == row[7] == row[8] == ""
            continue
        _check(row[2], [off["train_seconds"] / r["train_seconds"]])
        _check(row[8], [r["test_auc"] - off["test_auc"]])
        guard = r["qcomms"]["guard"]
        _check(row[4], [guard["checks"]])
        error = max(guard["worst"].items(), key=lambda kv: kv[1]["error"])
        lost = max(guard["worst"].items(), key=lambda kv: kv[1]["lost"])
        _check(row[5], [1e4 * error[1]["error"]])
        _check(row[6], [100 * lost[1]["lost"]])
        assert row[5].endswith(f"({error[0]})") and row[6].endswith(f"({lost[0]})")
        tripped = guard["tripped_at"]
        assert row[7] == (f"fp32 from step {tripped + 1}" if tripped is not None else r["qcomms"]["chosen"])
        assert (r["qcomms"]["chosen"] == "fp32") == (tripped is not None)

    runs = {(r["job"], r["seed"]): r for name in ("network_qcomms_guard_200mbit", "network_qcomms_guard_seeds12_200mbit")
            for r in _network_runs(name)}  # fmt: skip
    rows = _rows("docs/performance.md", "| seed (qcomms scaled by 1024, auto, with the guard, 200mbit) |")
    assert [int(row[0]) for row in rows] == [0, 1, 2]
    for row in rows:
        off, r = runs[("off", int(row[0]))], runs[("off+qcomms scaled(auto)", int(row[0]))]
        guard = r["qcomms"]["guard"]
        _check(" ".join(row[1:5]), [off["train_seconds"], r["train_seconds"], off["train_seconds"] / r["train_seconds"],
                                    guard["checks"]])  # fmt: skip
        _check(row[5], [1e4 * max(f["error"] for f in guard["worst"].values())])
        _check(row[6], [100 * max(f["lost"] for f in guard["worst"].values())])
        assert row[7] == r["qcomms"]["chosen"] == "quantized" and guard["tripped_at"] is None
        _check(row[8], [r["test_auc"] - off["test_auc"]])


def test_the_bf16_comms_on_gloo_are_quoted():
    """docs/performance.md's table of the fp16 / bf16 comms with the bf16 hook across two nodes:
    each seed's seconds and ratio, the guard's checks, its largest backward and all-reduce errors,
    the largest share lost, what the run kept, the paired test AUC (and their mean over the six
    seeds, quoted below the table); every run sent bf16."""
    runs = {(r["job"], r["seed"]): r for name in ("network_qcomms_bf16_200mbit", "network_qcomms_bf16_seeds345_200mbit")
            for r in _network_runs(name)}  # fmt: skip
    rows = _rows("docs/performance.md", "| seed (qcomms fp16 / bf16 + the bf16 hook, auto, with the guard, 200mbit) |")
    assert [int(row[0]) for row in rows] == [0, 1, 2, 3, 4, 5]
    paired = [runs[("off+qcomms bf16(auto)", s)]["test_auc"] - runs[("off", s)]["test_auc"] for s in range(6)]
    text = " ".join((ROOT / "docs/performance.md").read_text().split())
    assert f"paired test AUC is {sum(paired) / 6:+.5f} on average" in text
    for row in rows:
        off, r = runs[("off", int(row[0]))], runs[("off+qcomms bf16(auto)", int(row[0]))]
        assert r["qcomms"]["backward_on_wire"] == "bf16" and r["ddp_comm_hook"]["hook"] == "bf16"
        guard = r["qcomms"]["guard"]
        _check(" ".join(row[1:5]), [off["train_seconds"], r["train_seconds"], off["train_seconds"] / r["train_seconds"],
                                    guard["checks"]])  # fmt: skip
        _check(row[5], [1e4 * guard["worst"][d]["error"] for d in ("backward", "all_reduce")])
        _check(row[6], [100 * max(f["lost"] for f in guard["worst"].values())])
        assert row[7] == r["qcomms"]["chosen"] == "quantized" and guard["tripped_at"] is None
        _check(row[8], [r["test_auc"] - off["test_auc"]])


def test_the_bf16_comms_parts_are_quoted():
    """docs/performance.md's seed-1 table of each part of the bf16 comms alone: the wire's bytes
    and the paired test AUC of every run, each run quantized in its one part only."""
    runs = {r["job"]: r for r in _network_runs("network_qcomms_bf16_parts_seed1")}
    names = {"`off`": "off", "forward fp16": "forward fp16", "backward bf16": "backward bf16", "bf16 hook": "bf16 hook"}
    rows = _rows("docs/performance.md", "| seed 1, one part quantized (two nodes, unshaped) |")
    assert [names[row[0]] for row in rows] == list(runs)
    off = runs["off"]
    wire = {"off": ("fp32", "fp32", "none"), "forward fp16": ("fp16", "fp32", "none"),
            "backward bf16": ("fp32", "bf16", "none"), "bf16 hook": ("fp32", "fp32", "bf16")}  # fmt: skip
    for row in rows:
        r = runs[names[row[0]]]
        assert (r["qcomms"]["forward_on_wire"], r["qcomms"]["backward_on_wire"], r["ddp_comm_hook"]["hook"]) == wire[r["job"]]
        _check(row[1], [r["wire_bytes_per_sample"]])
        if r is off:
            assert row[2] == ""
        else:
            _check(row[2], [r["test_auc"] - off["test_auc"]])


def test_quantized_comms_where_they_pay_are_quoted():
    """docs/performance.md's two tables of ``sharding.qcomms.when=auto``: every run's seconds,
    ratio, wire bytes, the probe's two medians, what it kept and the paired test AUC; after the
    serve lever's fix, the defaults with and without the comms and the lever's two figures."""
    doc = "docs/performance.md"
    runs = {(r["job"], r["rate"]): r for r in _network_runs("network_qcomms_auto_clicklog")}
    names = {"`off`": "off", "`off` + qcomms": "off+qcomms", "`off` + qcomms, auto": "off+qcomms(auto)",
             "defaults + qcomms, auto": "defaults+qcomms(auto)", "defaults + qcomms, auto (before 937bac9)": "defaults+qcomms(auto)"}
    rows = _rows(doc, "| job (qcomms auto, dim 16, seed 0) |")
    assert len(rows) == len(runs) == 8
    for row in rows:
        r, off = runs[(names[row[0]], row[1])], runs[("off", row[1])]
        _check(row[2], [r["train_seconds"]])
        _check(row[4], [r["wire_bytes_per_sample"]])
        if r is off:
            assert row[3] == row[5] == row[6] == row[7] == ""
            continue
        _check(row[3], [off["train_seconds"] / r["train_seconds"]])
        _check(row[7], [r["test_auc"] - off["test_auc"]])
        q = r["qcomms"]
        if q["when"] == "auto":
            p = q["probe"]
            _check(row[5], [p["fp32_ms_per_step"], p["quantized_ms_per_step"], p["steps_each"]])
            assert row[6] == q["chosen"]
        else:
            assert row[5] == row[6] == ""
    assert runs[("defaults+qcomms(auto)", "200mbit")]["serve_lever"]["state"] == "serving"  # the fault

    runs = {r["job"]: r for r in _network_runs("network_qcomms_auto_defaults_200mbit")}
    rows = _rows(doc, "| job (qcomms auto, after the fix, dim 16, 200mbit, seed 0) |")
    de = runs["defaults"]
    assert [row[0] for row in rows] == ["defaults", "defaults + qcomms", "defaults + qcomms, auto"]
    for row, job in zip(rows, ("defaults", "defaults+qcomms", "defaults+qcomms(auto)")):
        r = runs[job]
        _check(row[1], [r["train_seconds"]])
        _check(row[3], [r["wire_bytes_per_sample"]])
        first = r["serve_lever"]["decisions"][0]
        assert row[4].startswith("served" if first["to"] == "serving" else "stood down")
        _check(row[4].split("(")[1], [first["serving_ms_per_step"], first["standing_down_ms_per_step"]])
        if r is not de:
            _check(row[2], [de["train_seconds"] / r["train_seconds"]])
            _check(row[5], [r["test_auc"] - de["test_auc"]])
    assert runs["defaults+qcomms(auto)"]["qcomms"]["chosen"] == "quantized"

    runs = {(r["job"], r["seed"]): r for r in _network_runs("network_qcomms_auto_cost_200mbit")}
    rows = _rows(doc, "| seed (qcomms auto against always, 200mbit) |")
    assert [int(row[0]) for row in rows] == [0, 1, 2]
    for row in rows:
        always, auto = runs[("off+qcomms", int(row[0]))], runs[("off+qcomms(auto)", int(row[0]))]
        p = auto["qcomms"]["probe"]
        for cell, values in zip(row[1:], [[always["train_seconds"]], [auto["train_seconds"]],
                                          [always["train_seconds"] / auto["train_seconds"]],
                                          [p["fp32_ms_per_step"], p["quantized_ms_per_step"]],
                                          [auto["test_auc"] - always["test_auc"]]]):
            _check(cell, values)
        assert auto["qcomms"]["chosen"] == "quantized" and p["steps_each"] == 8
