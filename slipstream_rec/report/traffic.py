"""The report's serving section: embedding bytes per trained sample, what was served, the
replica, and the hot set's turnover (``slipstream=serve``; bytes for every policy)."""

from __future__ import annotations

from typing import Any, List, Sequence, Tuple

from slipstream_rec.report.runs import Run

KINDS = ("input", "output", "gradient", "total")
HEADER = ["run", "served fraction", "input B/sample", "output B/sample", "gradient B/sample", "total B/sample",
          "total vs first run", "replica rows", "replica sync B/sample", "rows updated/step"]  # fmt: skip
TURNOVER_HEADER = ["run", "step", "hot rows", "joined", "left"]


def traffic_rows(runs: Sequence[Run]) -> List[List[Any]]:
    """One row per run with a summary that reports bytes (runs of older versions have none)."""
    rows, base = [], None
    for run in runs:
        a2a = run.get("a2a_bytes_per_sample")
        if not a2a:
            continue
        base = a2a["total"] if base is None else base
        replica = run.get("replica") or {}
        rows.append([
            run.label, run.get("served_fraction"), *(a2a[k] for k in KINDS),
            a2a["total"] / base if base else None, replica.get("rows"), replica.get("sync_bytes_per_sample"),
            run.get("rows_updated_per_step"),
        ])  # fmt: skip
    return rows


def turnover_rows(runs: Sequence[Run]) -> List[Tuple[str, int, int, int, int]]:
    """Every later choice of the hot set (``slipstream.hot_refresh_steps``), per run."""
    out = []
    for run in runs:
        for t in (run.get("slipstream") or {}).get("hot_turnover") or []:
            out.append((run.label, t["step"], t["hot_rows"], t["joined"], t["left"]))
    return out
