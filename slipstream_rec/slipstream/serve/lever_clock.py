"""The serve lever's windows timed, agreed and acted on, after every step (``lever.py`` is the rule).

``WindowClock`` times a window on the trainer's clock from a mark every rank shares and agrees on
the slowest rank's seconds per step; ``lever_window_step`` runs after every step on every rank:
it marks the timed part of a window, checks a window on trial part of the way in, feeds the
rule at a window's end, and applies what the rule decides (``_switch``: the replica rebuilt or
emptied, counting on or off, a re-basing snapshot).
"""

from __future__ import annotations

import logging
import math
from collections import deque
from typing import TYPE_CHECKING, Any, Callable, Deque, Dict, List, Optional, Tuple

import torch
import torch.distributed as dist

from slipstream_rec.distributed import all_reduce_
from slipstream_rec.timing import timed
from slipstream_rec.slipstream import stats
from slipstream_rec.slipstream.serve.lever import MIN_TIMED, LeverState, ms_per_step

if TYPE_CHECKING:  # the controller imports this module
    from slipstream_rec.slipstream.controller import SlipstreamController

__all__ = ["WindowClock", "lever_window_step"]

logger = logging.getLogger(__name__)


class WindowClock:
    """Times the lever's windows on the trainer's clock (training seconds, the device's queue
    drained; set by the trainer before the first step): a mark where a window's timed part
    starts, and at its end the slowest rank's seconds per step (collective). Every agreed figure
    is kept (``figures``: the latest ``KEPT``, for summary.json; ``take_new``: each once, for
    metrics.jsonl), so that a run's timing can be read window by window, not only where the rule
    decided."""

    KEPT = 512  # figures summary.json keeps (the latest; metrics.jsonl has every one)

    def __init__(self) -> None:
        self.clock: Optional[Callable[[], float]] = None
        self._mark: Optional[Tuple[int, float, float]] = None  # (step, clock, tracking seconds)
        self.checked = -1  # the last step a window on trial was checked at (a lever step: its all-reduce)
        self.figures: Deque[Dict[str, Any]] = deque(maxlen=self.KEPT)
        self.measured = 0  # figures agreed in this process (those before a resume are in the log)
        self._new: List[Dict[str, Any]] = []

    def note(self, step: int, state: LeverState, timed_steps: int, seconds_per_step: Optional[float]) -> None:
        """Keep the figure the ranks agreed at ``step`` for the window timed in ``state`` over
        ``timed_steps`` steps (None: not measured, nothing kept). Local: every rank holds the
        same figures."""
        if seconds_per_step is None:
            return
        figure = {"step": step, "state": state.value, "timed_steps": timed_steps, "ms_per_step": ms_per_step(seconds_per_step)}
        self.figures.append(figure)
        self._new.append(figure)
        self.measured += 1

    def take_new(self) -> List[Dict[str, Any]]:
        """The figures agreed since the last call (for the metric log)."""
        out, self._new = self._new, []
        return out

    def mark(self, step: int, tracking_seconds: float) -> None:
        assert self.clock is not None, "serve_when=auto needs the trainer's clock"
        self._mark = (step, self.clock(), tracking_seconds)

    @property
    def marked(self) -> bool:
        """A window's timing is running."""
        return self._mark is not None

    @property
    def mark_step(self) -> int:
        """The step after which the running window's timing started (-1: none running)."""
        return self._mark[0] if self._mark is not None else -1

    def measure(
        self, step: int, serving: bool, tracking_seconds: float, on_agree: Callable[[int], None], least: int = 1
    ) -> Optional[float]:
        """Seconds per step since the mark, the slowest rank's; not serving, less the tracking
        work done meanwhile (the step Slipstream would leave). None where this run has no mark
        (resumed inside the window) or timed fewer than ``least`` steps. Collective: all ranks
        enter one MAX all-reduce."""
        per_step = -1.0
        if self._mark is not None and step - self._mark[0] >= least:
            s0, c0, k0 = self._mark
            assert self.clock is not None, "serve_when=auto needs the trainer's clock"
            elapsed = self.clock() - c0
            if not serving:
                elapsed -= tracking_seconds - k0
            per_step = elapsed / max(1, step - s0)
        t = all_reduce_(torch.tensor([per_step], dtype=torch.float64), dist.ReduceOp.MAX)  # all ranks
        on_agree(t.numel() * t.element_size())
        agreed = float(t.item())
        return agreed if agreed >= 0 else None

    def reset(self) -> None:
        self._mark = None


def lever_window_step(ctl: "SlipstreamController", step: int) -> None:
    """After every step (all ranks): time the lever's window; at its end let the lever decide and
    apply its state. Collective where a timed window ends (one MAX all-reduce) and where the
    state changes (the replica rebuilt or emptied, a re-basing snapshot). Standing down empties
    the replica and stops counting and snapshots; looking again resumes them with a snapshot
    that re-bases the hot rows' changes; serving again rebuilds the replica to the stale set."""
    lever, sched, clock = ctl.lever, ctl.schedule, ctl.window_clock
    # the timing starts at the window's mark, or again where the trainer's own timed steps end
    if lever.timed and (sched.window_mark(step) or (step == ctl.timed_from - 1 and clock.marked)):
        clock.mark(step, stats.tracking_seconds(ctl))
    least = max(1, math.ceil(MIN_TIMED * lever.window))
    # A mark before the trainer's timed steps end (a probe's turns still ahead, past this
    # window's end: the precision's and the comms' probes together can outlast a window) times
    # those turns: its figure is not the lever's to use. The same on every rank (the probes'
    # ends are agreed), so the collectives below stay matched.
    ours = clock.mark_step >= ctl.timed_from - 1
    if not sched.window_end(step):
        # A window on trial (serving, or without it) is checked at its checks' steps after its
        # mark (steps every rank shares), and may end there.
        checked = step - clock.mark_step
        if lever.cuts_short and clock.marked and ours and checked in lever.checks:
            clock.checked = step
            with timed(ctl.seconds, "lever"):
                measured = clock.measure(step, lever.timing_serving, stats.tracking_seconds(ctl), ctl.count_control, checked)
                before = lever.state
                clock.note(step, before, checked, measured)
                after = lever.early_end(step, measured, checked)
                if after is not None:
                    clock.reset()
                    _switch(ctl, before, after, step)
                    _log_decision(ctl, step)
        return
    with timed(ctl.seconds, "lever"):
        measured, before = None, lever.state
        if lever.timed:
            tracking = stats.tracking_seconds(ctl)
            measured = clock.measure(step, lever.timing_serving, tracking, ctl.count_control, least)
            measured = measured if ours else None
            clock.note(step, before, step - clock.mark_step, measured)
        clock.reset()
        after = lever.window_end(step, measured, ready=ctl.server.rows > 0)
        if after is not None:
            _switch(ctl, before, after, step)
        _log_decision(ctl, step)  # a switch's, or a state held to the run's end


def _log_decision(ctl: "SlipstreamController", step: int) -> None:
    """Rank 0's log line for a decision the lever recorded at ``step`` (none: nothing)."""
    decisions = ctl.lever.decisions
    if ctl.is_rank0 and decisions and decisions[-1]["step"] == step:
        logger.info("slipstream: serving at step %d: %s", step, decisions[-1]["reason"])


def _switch(ctl: "SlipstreamController", before: LeverState, after: LeverState, step: int) -> None:
    """The lever went from ``before`` to ``after`` at ``step``: apply it. All ranks take the same
    transition at the same step (collective where the replica is rebuilt or emptied)."""
    lever, sched = ctl.lever, ctl.schedule
    ctl.plan.paused = not after.serves
    if after is LeverState.down:
        ctl.server.rebuild(torch.zeros(0, dtype=torch.int64), step)  # the replica emptied
    elif before is LeverState.down:
        # Looking again: the snapshots stopped while stood down, so this one re-bases
        # the hot rows' changes and the next measures them over one interval.
        ctl.tracker.snapshot()
    elif after.serves and not before.serves:
        ctl.server.rebuild(ctl.threshold.stale_now(step), step, resumed=True)  # every row may have moved
    ctl.tracker.set_counting(lever.tracks and sched.counts(step + 1))
