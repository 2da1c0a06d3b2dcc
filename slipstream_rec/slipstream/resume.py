"""What a checkpoint carries of the method, and how a run resumes it (local, no collective).

Everything but the running epoch's stream, which the trainer saves with the data position. The
global part is identical on every rank; the tracker's is per shard (``load_tracker_state`` says
what happens when the shard layout changed).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Dict, List, Tuple

from slipstream_rec.slipstream import stats
from slipstream_rec.slipstream.tracker import StalenessTracker

if TYPE_CHECKING:  # the controller imports this module
    from slipstream_rec.slipstream.controller import SlipstreamController

__all__ = ["load_state_dict", "load_tracker_state", "state_dict", "tracker_state"]

# The components whose state a checkpoint carries under their own name (and the tracker's, the
# per-shard state, below).
COMPONENTS = ("threshold", "decider", "quality", "server", "lever")


def state_dict(ctl: "SlipstreamController") -> Dict[str, Any]:
    return {
        "step": ctl.step,
        "first_skip_step": ctl.first_skip_step,
        "seconds": stats.seconds(ctl),
        "streams_done": ctl.streams_done.state_dict(),
        "row_state": ctl.row_state.state_dict(),
        **{name: getattr(ctl, name).state_dict() for name in COMPONENTS},
        "tracker": tracker_state(ctl.tracker) if ctl.cfg.policy.tracks else None,
    }


def load_state_dict(ctl: "SlipstreamController", state: Dict[str, Any]) -> bool:
    """Restore ``ctl``; returns whether the per-shard tracking state was restored exactly."""
    c = ctl.cfg
    for saved, here, what in (
        (state["tracker"] is not None, c.policy.tracks, f"a tracking policy (slipstream.policy={c.policy.value})"),
        (state["server"] is not None, c.serves, f"slipstream.action={c.action.value}"),
    ):  # fmt: skip
        if saved != here:
            raise ValueError(
                f"the checkpoint was written {'without' if here else 'with'} {what}, this run "
                f"{'has' if here else 'has not'}. Fix: resume with the slipstream setting the run "
                "started with, or start a new run directory"
            )
    saved_rows = int(state["row_state"]["num_rows"])
    if saved_rows != ctl.row_state.num_rows:
        raise ValueError(
            f"the checkpoint tracks {saved_rows} embedding rows, this model has "
            f"{ctl.row_state.num_rows}. Fix: resume with the dataset and model the run started with"
        )
    ctl.step, ctl.first_skip_step = int(state["step"]), state["first_skip_step"]
    ctl.row_state.load_state_dict(state["row_state"])
    ctl.streams_done.load_state_dict(state["streams_done"])
    ctl.seconds.update({k: v for k, v in state["seconds"].items() if k in ctl.seconds})
    ctl.quality.seconds = state["seconds"]["quality"]
    for name in COMPONENTS:
        getattr(ctl, name).load_state_dict(state[name])
    ctl.plan.paused = not ctl.lever.serves
    exact = load_tracker_state(ctl.tracker, state["tracker"]) if c.policy.tracks else True
    ctl.tracker.set_counting(ctl.lever.tracks and ctl.schedule.counts(ctl.step + 1))
    return exact


# ---- the tracker's per-shard state ------------------------------------------------------
def layout(tracker: StalenessTracker) -> List[Tuple[Any, ...]]:
    """This rank's shards as plain tuples: equal layouts mean the local state carries over."""
    return [
        (u.table, u.feature, u.sharding_type, u.row_offset, u.col_offset, u.rows, u.cols)
        for u in tracker.units
    ]


def tracker_state(tracker: StalenessTracker) -> Dict[str, Any]:
    """Global hot set plus this rank's per-shard counts, hot rows and snapshots (on CPU)."""

    def cpu(t: Any) -> Any:
        return None if t is None else t.detach().cpu().clone()

    return {
        "layout": layout(tracker),
        "snapshots_taken": tracker.snapshots_taken,
        "hot_keys": tracker.hot_keys.clone(),
        "selection": tracker.selection,
        "turnover": list(tracker.turnover),
        "count_seconds": tracker.count_seconds,
        "units": [
            {
                "counted_rows": cpu(u.counted_rows),
                "counted": cpu(u.counted),
                "hot_rows": cpu(u.hot_rows),
                "snapshot": cpu(u.snapshot),
            }
            for u in tracker.units
        ],
    }


def load_tracker_state(tracker: StalenessTracker, state: Dict[str, Any]) -> bool:
    """Restore; returns whether the per-shard state was restored exactly.

    With the same shard layout everything is restored. With another one (a different world
    size or sharding plan) only the global hot set carries over: each shard re-derives its
    hot rows from it and takes its next snapshot as a fresh baseline, so the stale set stays
    as saved until the snapshot after that; counts of an unfinished counting phase restart.
    """
    tracker.snapshots_taken = int(state["snapshots_taken"])
    tracker.hot_keys = state["hot_keys"].clone()
    tracker.selection, tracker.turnover = state["selection"], list(state["turnover"])
    tracker.counter.seconds = float(state["count_seconds"])
    same = [tuple(x) for x in state["layout"]] == layout(tracker)
    hot = tracker.hot_keys
    for i, unit in enumerate(tracker.units):
        dev = unit.weights.device
        if same:
            saved = state["units"][i]
            unit.clear_counts()
            if saved.get("counted_rows") is not None:
                unit.counted_rows = saved["counted_rows"].to(dev)
                unit.counted = saved["counted"].to(dev)
            unit.hot_rows = None if saved["hot_rows"] is None else saved["hot_rows"].to(dev)
            unit.snapshot = None if saved["snapshot"] is None else saved["snapshot"].to(dev)
            continue
        unit.clear_counts()
        unit.snapshot = None
        if not hot.numel():
            unit.hot_rows = None
            continue
        unit.hot_rows = tracker.local_rows(unit, hot).to(dev)
    return same
