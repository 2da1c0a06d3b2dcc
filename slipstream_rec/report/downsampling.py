"""The report's section on the levers: the precision chosen (and its timing), whether serving paid
(``slipstream.serve_when=auto``'s decisions), negative downsampling's rule and guard decisions
(``slipstream.negative_downsampling``), and calibration on test (mean predicted click rate
against the observed one)."""

from __future__ import annotations

from typing import Any, List, Sequence

from slipstream_rec.report.runs import Run

RUN_HEADER = ["run", "precision", "why", "downsampling", "final rate", "non-clicks dropped",
              "test CTR", "test predicted CTR", "predicted / observed"]  # fmt: skip
SERVE_HEADER = ["run", "step", "from", "to", "serving ms/step", "standing down ms/step", "reason"]
GUARD_HEADER = ["run", "step", "decision", "rate before", "rate after", "non-click share",
                "added noise", "max noise", "observed CTR", "predicted CTR", "reason"]  # fmt: skip


def run_rows(runs: Sequence[Run]) -> List[List[Any]]:
    """One row per run whose summary records the precision or the downsampling (newer runs)."""
    rows = []
    for run in runs:
        prec, down = run.get("precision") or {}, run.get("negative_downsampling") or {}
        if not prec and not down:
            continue
        ctr, pred = run.get("test_ctr"), run.get("test_predicted_ctr")
        rows.append([
            run.label, prec.get("chosen"), prec.get("reason"), down.get("setting"), down.get("rate"),
            down.get("negatives_dropped"), ctr, pred, pred / ctr if ctr and pred is not None else None,
        ])  # fmt: skip
    return rows


def serve_rows(runs: Sequence[Run]) -> List[List[Any]]:
    """Every decision of the serve lever, per run (summary.json ``serve_lever``)."""
    rows = []
    for run in runs:
        for d in (run.get("serve_lever") or {}).get("decisions") or []:
            rows.append([run.label, d.get("step"), d.get("from"), d.get("to"), d.get("serving_ms_per_step"),
                         d.get("standing_down_ms_per_step"), d.get("reason")])  # fmt: skip
    return rows


def guard_rows(runs: Sequence[Run]) -> List[List[Any]]:
    """The rule's decision and every guard check, in step order, per run (metrics.jsonl records
    of kind ``downsampling``, the rule's from the summary)."""
    rows = []
    for run in runs:
        down = run.get("negative_downsampling") or {}
        records = [d for d in down.get("decisions") or [] if d.get("decision") == "rule"]
        records += [r for r in run.records if r.get("kind") == "downsampling"]
        for r in records:
            rows.append([
                run.label, r.get("step"), r.get("decision"), r.get("rate_before"), r.get("rate_after"),
                r.get("negative_share"), r.get("added_noise"), r.get("max_noise"),
                r.get("observed_ctr", r.get("click_rate")), r.get("predicted_ctr"), r.get("reason"),
            ])  # fmt: skip
    return rows
