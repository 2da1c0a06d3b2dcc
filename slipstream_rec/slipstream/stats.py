"""What the controller reports: per-interval records, the run's summary, state size and time.

Read-only views of a ``SlipstreamController``'s components, for the metric log (``record``,
every ``log_every_steps`` and at every snapshot) and for ``summary.json`` (``summary``, once at
the end). Only ``global_counters`` and ``summary`` are collectives.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, Dict

import torch
import torch.distributed as dist

from slipstream_rec.distributed import all_reduce_

if TYPE_CHECKING:  # the controller imports this module
    from slipstream_rec.slipstream.controller import SlipstreamController

__all__ = ["change_histogram", "counters", "global_counters", "record", "serving", "summary", "time_parts"]


def change_histogram(change: torch.Tensor, lo: float = 1e-6, hi: float = 10.0, bins: int = 28) -> Dict[str, Any]:
    """Histogram of the hot rows' changes on log-spaced bins (values below ``lo`` land in the
    first bin, above ``hi`` in the last): how the threshold sits in the distribution."""
    values = change[torch.isfinite(change)].clamp(lo, hi)
    edges = torch.logspace(torch.log10(torch.tensor(lo)), torch.log10(torch.tensor(hi)), bins + 1)
    counts = torch.histogram(values.float(), bins=edges.float()).hist if values.numel() else torch.zeros(bins)
    return {"edges": [round(e, 8) for e in edges.tolist()], "counts": [int(c) for c in counts.tolist()]}


def seconds(ctl: "SlipstreamController") -> Dict[str, float]:
    """This rank's host seconds of Slipstream's own work, by part."""
    s = ctl.seconds
    return {
        "count": ctl.tracker.count_seconds, "classify": s["classify"], "snapshot": s["snapshot"],
        "sync": s["sync"], "quality": ctl.quality.seconds, "lever": s["lever"],
    }  # fmt: skip


def overhead_seconds(ctl: "SlipstreamController") -> float:
    """Every part of Slipstream's own work on this rank (the served gradients' sum and push
    included; the split and the replica part's pooling are serving's, ``ServePlan.seconds``)."""
    return sum(seconds(ctl).values()) + ctl.server.push_seconds + ctl.server.sum_seconds


def time_parts(ctl: "SlipstreamController") -> Dict[str, float]:
    """The controller's parts of the trainer's time breakdown: classifying (inside the data
    side), counting (inside the forward), serving's split and pooling, and its whole overhead."""
    return {
        "classify": ctl.seconds["classify"],
        "count": ctl.tracker.count_seconds,
        "serving": ctl.plan.seconds,
        "overhead": overhead_seconds(ctl),
    }


def tracking_seconds(ctl: "SlipstreamController") -> float:
    """This rank's seconds of Slipstream's own work so far, less classifying: what standing down
    removes (the serve lever's figure without serving)."""
    return overhead_seconds(ctl) - ctl.seconds["classify"]


def counters(ctl: "SlipstreamController") -> Dict[str, int]:
    """This rank's stream counters over all epochs so far."""
    seen, skipped, dropped = ctl.streams_done.with_running(ctl.stream)
    plan = ctl.plan
    return {
        "samples_seen": seen,
        "samples_skipped": skipped,
        "samples_dropped": dropped,
        # what the classifier and safeguards decided, whether or not the policy skips
        # (track_only: what paper_plus would have skipped on the same stream)
        "samples_would_skip": int(ctl.decider.totals.skipped),  # 0 where nothing classifies
        # serve: lookups answered from the replica, samples all of whose lookups were, the
        # bags sent through the shards (padding slots included) of all bags; for every
        # other action nothing is served and every bag is sent
        "samples_served": plan.samples_served,
        "lookups_served": plan.lookups_served,
        "lookups_split": plan.lookups_split,
        "slots_sent": plan.slots_sent,
        "bags_split": plan.bags_split,
    }


def serving(ctl: "SlipstreamController") -> Dict[str, Any]:
    """What serving did on this rank, for the traffic summary (training/embedding_traffic.py):
    the split's counters and per-feature counts, the replica's sync bytes and its summary (None
    where nothing is served)."""
    plan, features = ctl.plan, ctl.index.num_features
    return {
        "counters": plan.counters(),
        "feature_lookups": plan.feature_lookups or [0] * features,
        "feature_served": plan.feature_served or [0] * features,
        "sync_bytes": ctl.server.sync_bytes,
        "replica": ctl.server.summary(),
    }


def global_counters(ctl: "SlipstreamController") -> Dict[str, Any]:
    """Counters summed over ranks, and the first step any rank skipped. Collective: all ranks
    enter two all-reduces."""
    local = counters(ctl)
    t = all_reduce_(torch.tensor([float(v) for v in local.values()], dtype=torch.float64))
    out: Dict[str, Any] = {k: int(v) for k, v in zip(local, t.tolist())}
    never = torch.tensor([float("inf") if ctl.first_skip_step is None else float(ctl.first_skip_step)])
    first = float(all_reduce_(never, dist.ReduceOp.MIN).item())  # all ranks
    out["first_skip_step"] = None if math.isinf(first) else int(first)
    return out


def record(ctl: "SlipstreamController", with_tables: bool = False) -> Dict[str, Any]:
    """Per-interval observability (this rank's classification counters; the rest is global)."""
    c = counters(ctl)
    parts = seconds(ctl)
    out: Dict[str, Any] = {
        "threshold": ctl.threshold.value,
        "skip_fraction": c["samples_skipped"] / c["samples_seen"] if c["samples_seen"] else 0.0,
        "hot_rows": int(ctl.tracker.hot_keys.numel()),
        "target_skip_fraction": ctl.target_skip_fraction(),
        "count_seconds": parts["count"],
        **{f"{k}_seconds": v for k, v in parts.items() if k != "count"},
        "serve_seconds": ctl.plan.seconds,
        "push_seconds": ctl.server.push_seconds,
        "served_sum_seconds": ctl.server.sum_seconds,
        "serve_lever": ctl.lever.state.value if ctl.lever.auto else None,
        **ctl.server.record(),
    }
    tracks = ctl.cfg.policy.tracks
    if ctl.threshold.value is not None:
        stale = ctl.row_state.stale_keys(ctl.threshold.value)  # O(hot rows)
        out["stale_rows"] = int(stale.numel())
        if with_tables and tracks:
            out["stale_rows_per_table"] = ctl.tracker.rows_per_table(stale)
    else:
        out["stale_rows"] = 0
    if with_tables and tracks:
        out["hot_rows_per_table"] = ctl.tracker.hot_rows_per_table()
        out["threshold_info"] = ctl.threshold.info
        out["change_histogram"] = change_histogram(ctl.row_state.values)
    return out


def state_bytes(ctl: "SlipstreamController") -> int:
    """Bytes of this rank's Slipstream per-row state now: the tracker's (hot keys, counts, hot
    rows, snapshots), the published changes with their lookup view, the frozen keys, the
    replica (serve)."""
    held = ctl.row_state.nbytes() + ctl.threshold.frozen_keys.numel() * 8
    return int(held + ctl.server.nbytes() + ctl.tracker.state_bytes())


def peak_state_bytes(ctl: "SlipstreamController") -> int:
    """The largest ``state_bytes`` so far on this rank, snapshot copies and gathers included."""
    tracker_peak = ctl.tracker.peak_bytes + ctl.threshold.frozen_keys.numel() * 8 if ctl.cfg.policy.tracks else 0
    return int(max(tracker_peak, state_bytes(ctl)))


def summary(ctl: "SlipstreamController") -> Dict[str, Any]:
    """The policy's part of summary.json. Collective: all ranks enter (the counters summed, the
    slowest rank's overhead and the largest rank's state)."""
    totals = global_counters(ctl)  # all ranks
    overhead = all_reduce_(torch.tensor([overhead_seconds(ctl)], dtype=torch.float64), dist.ReduceOp.MAX)
    peak = all_reduce_(torch.tensor([peak_state_bytes(ctl)], dtype=torch.int64), dist.ReduceOp.MAX)
    slip = record(ctl, with_tables=True)
    seen = max(1, totals["samples_seen"])
    return {
        "samples_seen": totals["samples_seen"],
        "samples_skipped": totals["samples_skipped"],
        "first_skip_step": totals["first_skip_step"],
        "target_skip_fraction": ctl.target_skip_fraction(),
        "quality_decisions": ctl.quality.decisions,
        "samples_dropped_at_end": totals["samples_dropped"],
        "skip_fraction": totals["samples_skipped"] / seen,
        "would_skip_fraction": totals["samples_would_skip"] / seen,
        "hot_rows": slip["hot_rows"],
        "stale_rows": slip["stale_rows"],
        "threshold": slip["threshold"],
        # the rule's state and decisions, and the figures of the windows it timed (the latest)
        "serve_lever": {**ctl.lever.summary(), "windows_measured": ctl.window_clock.measured,
                        "windows": list(ctl.window_clock.figures)},
        "slipstream_overhead_seconds": round(float(overhead.item()), 3),
        "slipstream_state_bytes": int(peak.item()),
        "slipstream": {
            "hot_selection": ctl.tracker.selection,
            "hot_turnover": ctl.tracker.turnover,
            "hot_rows_per_table": slip.get("hot_rows_per_table"),
            "stale_rows_per_table": slip.get("stale_rows_per_table"),
            "threshold_info": slip.get("threshold_info"),
            "seconds": {k: round(v, 3) for k, v in slip.items() if k.endswith("_seconds")},
        },
    }
