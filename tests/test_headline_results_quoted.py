"""Every number of the headline tables (README, docs/performance.md) equals
benchmarks/results/headline_levers.json (the headline since the levers measure themselves;
headline.json is the one before, with per-sample serving, quoted nowhere now).

Recomputed here from the file's raw per-seed records (``runs``: train seconds, test AUC, test CTR
and mean prediction of each arm), not from the ``table`` that benchmarks/headline.py derived, at
the precision each table quotes.
"""

from __future__ import annotations

import json
import re
import statistics
from pathlib import Path
from typing import Dict, List

from tests._markdown import table_rows

ROOT = Path(__file__).resolve().parents[1]
NUMBER = re.compile(r"[-+]?\d+\.\d+")
RESULTS = json.loads((ROOT / "benchmarks" / "results" / "headline_levers.json").read_text())["results"]


def _rows(doc: str, header: str) -> List[List[str]]:
    return table_rows(doc, header)


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


def _check(cell: str, values: List[float]) -> None:
    found = NUMBER.findall(cell)
    assert len(found) == len(values), (cell, values)
    for text, value in zip(found, values):
        decimals = len(text.split(".")[1])
        assert abs(float(text) - value) <= 0.5 * 10**-decimals + 1e-12, (cell, text, value)


def test_the_readme_table_quotes_the_results_file():
    rows = _rows("README.md", "| data | golden loop train s |")
    assert {_dataset(r[0]) for r in rows} == set(RESULTS)
    for r in rows:
        runs = RESULTS[_dataset(r[0])]["runs"]
        golden, off, defaults = (_arm(runs, a) for a in ("golden", "off", "defaults"))
        _check(r[1], golden["seconds"])
        _check(r[2], off["speed"][:1])
        _check(r[3], defaults["seconds"])
        _check(r[4], defaults["speed"])
        _check(r[5], defaults["vs_off"])
        _check(r[6], defaults["paired"])


def test_the_performance_table_quotes_the_results_file():
    rows = _rows("docs/performance.md", "| data | run | train s |")
    names = {"golden loop": "golden", "`off` (fp32)": "off", "defaults": "defaults",
             "defaults, `serve_when=always`": "serve_always", "`off` + bf16 and downsampling": "off_auto"}
    assert len(rows) == len(names) * len(RESULTS)
    for r in rows:
        runs = RESULTS[_dataset(r[0])]["runs"]
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
        runs = json.loads((ROOT / "benchmarks" / "results" / EXTERNAL[dataset]).read_text())["results"][dataset]["runs"]
        arm = names[r[1]]
        mine, off = runs[arm], runs["off"]
        vs_off = [b["train_seconds"] / a["train_seconds"] for a, b in zip(mine, off)]
        paired = [a["test_auc"] - b["test_auc"] for a, b in zip(mine, off)]
        _check(r[2], [statistics.mean(x["train_seconds"] for x in mine)])
        _check(r[3], [statistics.mean(vs_off), *vs_off] if arm != "off" else [])
        _check(r[4], [statistics.mean(x["test_auc"] for x in mine)])
        _check(r[5], [statistics.mean(paired), *paired] if arm != "off" else [])
