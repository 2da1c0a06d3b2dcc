"""The report's traffic section: bytes per trained sample of every kind of collective the
program counts, the comms' precision, what was served, the replica, and the hot set's turnover
(``slipstream=serve``; bytes for every policy)."""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence, Tuple

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
    if q.get("when") == "auto" and "chosen" in q:  # sharding.qcomms.when=auto: what its probe and guard kept
        text += f" (auto: {q['chosen']} kept; {_probe_figures(q.get('probe') or {})}{_guard_figures(q.get('guard'))})"
    return text


def _probe_figures(probe: Dict[str, Any]) -> str:
    """The comms probe's timings (summary.json's ``qcomms.probe``)."""
    if not probe:
        return "the probe did not finish"
    return (f"fp32 {probe['fp32_ms_per_step']:.1f} / quantized {probe['quantized_ms_per_step']:.1f} ms per step, "
            f"{probe['steps_each']} steps each")  # fmt: skip


def _guard_figures(guard: Optional[Dict[str, Any]]) -> str:
    """The comms guard's outcome (summary.json's ``qcomms.guard``; none before it existed)."""
    if not guard or not guard.get("checks"):
        return ""
    worst = guard["worst"]
    error = max(f["error"] for f in worst.values())
    lost = max(f["lost"] for f in worst.values())
    checks = guard["checks"]
    text = f"; guard: {checks} check{'s' if checks != 1 else ''}, error up to {error:.2g}, lost up to {lost:.2g}"
    return text + (f", fp32 from step {guard['tripped_at'] + 1}" if guard["tripped_at"] is not None else "")


def turnover_rows(runs: Sequence[Run]) -> List[Tuple[str, int, int, int, int]]:
    """Every later choice of the hot set (``slipstream.hot_refresh_steps``), per run."""
    out = []
    for run in runs:
        for t in (run.get("slipstream") or {}).get("hot_turnover") or []:
            out.append((run.label, t["step"], t["hot_rows"], t["joined"], t["left"]))
    return out
