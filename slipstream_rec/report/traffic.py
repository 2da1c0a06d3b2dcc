"""The report's traffic section: bytes per trained sample of every kind of collective the
program counts, the comms' precision, what was served, the replica, and the hot set's turnover
(``slipstream=serve``; bytes for every policy)."""

from __future__ import annotations

from typing import Any, List, Sequence, Tuple

from slipstream_rec.report.runs import Run

# Every kind of summary.json's a2a_bytes_per_sample (training/embedding_traffic.py), then the sum.
KINDS = ("input", "output", "gradient", "push", "replica", "control", "tracking", "dense", "data_parallel", "total")
HEADER = ["run", "served fraction", *(f"{k} B/sample" for k in KINDS), "total vs first run",
          "off-rank B/sample (program)", "wire B/sample (training)", "wire / program", "comms on the wire",
          "replica rows", "rows updated/step"]  # fmt: skip
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
        kinds = dict(a2a)
        if "replica" not in kinds and replica.get("sync_bytes_per_sample") is not None:
            kinds["replica"] = replica["sync_bytes_per_sample"]  # older runs: not in their total
        wire = run.get("wire") or {}
        rows.append([
            run.label, run.get("served_fraction"), *(kinds.get(k) for k in KINDS),
            a2a["total"] / base if base else None, (run.get("off_rank_bytes_per_sample") or {}).get("total"),
            wire.get("bytes_per_sample"), wire.get("wire_over_program"),
            comms(run), replica.get("rows"), run.get("rows_updated_per_step"),
        ])  # fmt: skip
    return rows


def comms(run: Run) -> str:
    """The precision of the quantized comms (forward / backward, as sent) and the DDP hook."""
    q, hook = run.get("qcomms") or {}, run.get("ddp_comm_hook") or {}
    if not q and not hook:
        return "n/a"
    fwd, bwd = q.get("forward_on_wire", "fp32"), q.get("backward_on_wire", "fp32")
    text = f"embeddings {fwd}/{bwd}, DDP hook {hook.get('hook', 'none')}"
    if q.get("when") == "auto" and "chosen" in q:  # sharding.qcomms.when=auto: what its probe kept
        text += f" (auto: {q['chosen']} kept, {q['reason'].split(', ', 1)[-1]})"
    return text


def turnover_rows(runs: Sequence[Run]) -> List[Tuple[str, int, int, int, int]]:
    """Every later choice of the hot set (``slipstream.hot_refresh_steps``), per run."""
    out = []
    for run in runs:
        for t in (run.get("slipstream") or {}).get("hot_turnover") or []:
            out.append((run.label, t["step"], t["hot_rows"], t["joined"], t["left"]))
    return out
