"""What a checkpoint carries of the method, and how a run resumes it (local, no collective).

Everything but the running epoch's stream, which the trainer saves with the data position. The
global part is identical on every rank; the tracker's is per shard (``StalenessTracker``
``load_state_dict`` says what happens when the shard layout changed).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Dict

from slipstream_rec.slipstream import stats

if TYPE_CHECKING:  # the controller imports this module
    from slipstream_rec.slipstream.controller import SlipstreamController

__all__ = ["load_state_dict", "state_dict"]

# The components whose state a checkpoint carries under their own name.
COMPONENTS = ("threshold", "decider", "quality", "tracker", "server", "lever")


def state_dict(ctl: "SlipstreamController") -> Dict[str, Any]:
    return {
        "step": ctl.step,
        "first_skip_step": ctl.first_skip_step,
        "seconds": stats.seconds(ctl),
        "count_seconds": [m.count_seconds for m in ctl.tracker.modules],
        "streams_done": ctl.streams_done.state_dict(),
        "row_state": ctl.row_state.state_dict(),
        **{name: getattr(ctl, name).state_dict() for name in COMPONENTS},
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
        if name != "tracker":
            getattr(ctl, name).load_state_dict(state[name])
    ctl.plan.paused = not ctl.lever.serves
    exact = ctl.tracker.load_state_dict(state["tracker"])
    if len(state["count_seconds"]) == len(ctl.tracker.modules):
        for m, v in zip(ctl.tracker.modules, state["count_seconds"]):
            m.count_seconds = float(v)
    ctl.tracker.set_counting(ctl.lever.tracks and ctl.schedule.counts(ctl.step + 1))
    return exact
