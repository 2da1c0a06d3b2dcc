"""Whether serving pays in this run, measured rather than assumed (``slipstream.serve_when=auto``).

Serving takes embedding traffic off the network and pays for it with its own work: counting
and snapshots to find the stale rows, the replica's syncs, the pushes, the host split and the
served part's gather in the model. Across nodes the traffic is the step's largest cost and
serving wins; on one machine the all-to-alls are cheap and serving loses (measured: 0.66x
``off``'s speed in bf16 on 2 CPU ranks, docs/slipstream.md). No setting knows which; a clock does.

The lever measures the training time per step in windows of ``serve_window_steps`` steps (a
multiple of ``snapshot_interval``, so that every window holds one snapshot), from window
boundaries that every rank shares, and agrees on the slowest rank's figure (one MAX all-reduce
per window: the step is as slow as its slowest rank):

* *with serving*: the whole step, tracking included: what serving costs where it runs;
* *without serving*: the step with nothing served and no replica sync, less the tracking work
  measured in the same window (counting, snapshots, pushes): the step Slipstream leaves when it
  stands down entirely.

States (``LeverState``): the lever waits until the replica first holds rows, timing those
windows as windows without serving (nothing is served or synced there yet; the tracking is taken
out as in any window without serving), then measures a window serving (``probe_on``) and
decides: serve while a step with serving takes at most ``1 - serve_min_gain`` of a step without.
Where the wait gave no figure (a window shorter than ``MIN_TIMED``), a window not serving
(``probe_off``) is timed after the one serving, as at every re-check. Serving is re-checked
after ``serve_recheck_windows`` windows by one window without it. Where it does not pay,
Slipstream stands down (``down``): nothing is served, counted or snapshotted, the replica is
emptied, and every window's step time keeps the estimate without serving fresh; after
``serve_recheck_windows`` windows it looks again: tracking resumes with a snapshot that re-bases
the rows' changes (``looking``), the next snapshot finds the stale rows again, and one window
serving decides. A re-check costs a window in the losing state, so each one that confirms the
decision doubles the windows until the next (``span``); one that reverses it starts again from
``serve_recheck_windows``. And the wait is never shorter than what keeps that cost within
``serve_look_budget`` of the steps waited: a window in the losing state costs (slower / faster
- 1) of a window's steps, so at a budget of 1% a look where serving was 49% slower waits at
least 49 windows (``look_windows``): the further apart the two figures, the rarer the look.
The decision prices that wait from its two figures; every window of the decided state prices it
again from the mean of the state's own windows (``_rebudget``), so that one noisy trial window
does not set it for the rest of the run. And a look needs as many steps after its window as
before it (``last_step``, the trainer's plan): else it would cost over ``serve_look_budget`` of
the steps it could act on, and the decided state holds to the end (``final``, recorded once): a
change then goes unseen for under two waits instead of one.
Each decision, its two figures and its reason is a record (``decisions``). A window on trial
(``probe_on``, ``probe_off``) whose other figure is known is also measured part of the way in
(``EARLY_CHECKS``: a quarter, then half): where the state it times already loses by that
check's margin past the rule's line (10%, then 5%), the lever decides there (``early_end``),
since the rest of the window would only add to its cost: a window serving that loses by that
much stands down; a window without serving (a re-check) where serving wins by that much serves
again, the re-check's own cost cut to a quarter or a half. The margin narrows as the steps
behind the figure grow (a sequential test's boundary): a quarter decides only far from the
line, half a window nearer it, the whole window at the line itself.

The first ``SETTLE_STEPS`` steps of a window (plus ``trainer.lockstep_every_steps`` - 1, whose
batches are split that much further ahead) are not timed: the batches the pipeline prefetched
before a switch were split under the previous state, and the switch's own replica copy lands
there. Nor are the steps before ``timed_from`` (the trainer's: the precision probe's fp32 and
bf16 turns): a window's timing that started before it starts again there. This module is the
rule on measured figures (pure, unit-tested on recorded timings); ``lever_clock.py`` times the
windows, agrees on their figures and applies the rule's transitions, after every step.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Dict, List, Optional, Tuple

from slipstream_rec.slipstream.config import ServeWhen, SlipstreamConfig

__all__ = [
    "EARLY_CHECKS", "LeverState", "MIN_TIMED", "ServeLever", "SETTLE_STEPS", "early_checks", "look_windows",
    "ms_per_step", "window_loss", "window_steps",
]  # fmt: skip

# Steps after a window boundary before its timing starts: TorchRec's TrainPipelineSparseDist
# holds two batches ahead, split under the state before the boundary.
SETTLE_STEPS = 2
# A window's figure needs at least this share of its steps timed (else it is not measured).
MIN_TIMED = 0.25
# A window on trial is checked after these shares of its timed steps, each cutting it short where
# the state it times already measures that margin slower than the rule's line (serving: the step
# without it less serve_min_gain; without serving: the step serving over 1 - serve_min_gain): not
# near the line, every further step is lost. The later check sees twice the steps and cuts nearer
# (over 200mbit at dim 16, re-checks that found serving 8.5-11.7% faster ran all 40 steps).
EARLY_CHECKS: Tuple[Tuple[float, float], ...] = ((MIN_TIMED, 0.10), (0.5, 0.05))


class LeverState(Enum):
    waiting = "waiting"  # before the replica first holds rows: tracking runs, nothing to decide
    probe_on = "probe_on"  # a window serving, timed
    probe_off = "probe_off"  # a window not serving (tracking still runs, subtracted), timed
    serving = "serving"  # decided: serve; every window timed, re-checked every recheck windows
    down = "down"  # decided: stand down (no serving, no tracking); looks again after recheck windows
    looking = "looking"  # tracking resumed after standing down: one window to re-base the changes

    @property
    def serves(self) -> bool:
        """Whether batches split in this state may be served from the replica."""
        return self in (LeverState.waiting, LeverState.probe_on, LeverState.serving, LeverState.looking)

    @property
    def tracks(self) -> bool:
        """Whether lookups are counted and the hot rows snapshotted in this state."""
        return self is not LeverState.down


def ms_per_step(seconds: Optional[float]) -> Optional[float]:
    return None if seconds is None else round(1e3 * seconds, 3)


def window_loss(on_s: float, off_s: float) -> float:
    """What a window in the losing state costs, as a fraction of a window: slower / faster - 1."""
    slow, fast = max(on_s, off_s), min(on_s, off_s)
    return slow / fast - 1.0 if fast > 0 else 0.0


def look_windows(loss: float, budget: float) -> int:
    """The fewest windows to wait before a re-check that runs one window in the losing state,
    for that window's extra time (``loss`` of a window, ``window_loss``) to stay within
    ``budget`` of the steps waited."""
    return max(1, math.ceil(loss / budget - 1e-9))


def early_checks(window: int) -> Dict[int, float]:
    """Where a window of ``window`` steps on trial is checked: timed steps -> the margin past the
    rule's line that cuts it short there (``EARLY_CHECKS``). Two checks on one step (a short
    window): the wider margin holds, as a figure from that few steps decides only far from it."""
    checks: Dict[int, float] = {}
    for share, margin in EARLY_CHECKS:
        checks.setdefault(max(1, math.ceil(share * window)), margin)
    return checks


def window_steps(requested: int, snapshot_interval: int) -> int:
    """The lever's window: ``requested`` steps rounded up to a multiple of the snapshot interval."""
    return max(1, -(-requested // snapshot_interval)) * snapshot_interval


@dataclass
class ServeLever:
    """The rule. ``auto`` false (``serve_when=always``): always serving, never timed."""

    auto: bool = False
    min_gain: float = 0.02  # slipstream.serve_min_gain
    recheck_windows: int = 8  # slipstream.serve_recheck_windows
    look_budget: float = 0.01  # slipstream.serve_look_budget
    window: int = 50  # steps per window (window_steps)
    state: LeverState = LeverState.waiting
    on_s: Optional[float] = None  # seconds per step serving, latest measured window
    off_s: Optional[float] = None  # seconds per step standing down, latest measured window
    since: int = 0  # windows measured in the current decided state (serving, down)
    span: int = 0  # windows of the decided state before its next re-check (0: recheck_windows)
    base: int = 0  # the span from the re-checks alone (recheck_windows, doubled per confirmation)
    state_s: float = 0.0  # the sum of the decided state's window figures (seconds per step)
    last_step: Optional[int] = None  # the run's last step (the trainer's plan; None: unknown)
    final: bool = False  # the decided state holds to the run's end: too few steps left for a look
    entered: int = 0  # the step the current state began
    decisions: List[Dict[str, Any]] = field(default_factory=list)
    _new: List[Dict[str, Any]] = field(default_factory=list)  # not yet taken by the log

    @property
    def serves(self) -> bool:
        return not self.auto or self.state.serves

    @property
    def tracks(self) -> bool:
        return not self.auto or self.state.tracks

    @classmethod
    def from_config(cls, cfg: SlipstreamConfig) -> "ServeLever":
        """``serve_when=auto`` under serve; serving always (never timed) otherwise."""
        return cls(
            auto=cfg.serves and cfg.serve_when is ServeWhen.auto, min_gain=cfg.serve_min_gain,
            recheck_windows=cfg.serve_recheck_windows, look_budget=cfg.serve_look_budget,
            window=window_steps(cfg.serve_window_steps, cfg.snapshot_interval),
        )  # fmt: skip

    def pushes(self, step: int) -> bool:
        """Whether a sync step pushes the served gradients: while tracking, and stood down only in
        the first window after, which trains the last batches split while serving (the
        pipeline's and the lock-step's batches ahead); nothing is served after them."""
        return self.tracks or step <= self.entered + self.window

    @property
    def timed(self) -> bool:
        """Whether the window now running is timed (its figure feeds a decision)."""
        return self.auto and self.state is not LeverState.looking

    @property
    def cuts_short(self) -> bool:
        """Whether the window now timed may end early (``early_end``): a window on trial
        (serving, or without it) with the other state's figure to hold it against."""
        if not self.auto:
            return False
        if self.state is LeverState.probe_on:
            return self.off_s is not None
        return self.state is LeverState.probe_off and self.on_s is not None

    @property
    def checks(self) -> Dict[int, float]:
        """Timed steps after which a window on trial is checked -> the margin that cuts it."""
        return early_checks(self.window)

    def early_end(self, step: int, seconds_per_step: Optional[float], timed_steps: int) -> Optional[LeverState]:
        """The window on trial measured ``seconds_per_step`` over its first ``timed_steps`` steps
        (serving: the whole step; without: less the tracking), one of its checks (``checks``):
        where its state already loses by over that check's margin past the rule's line, decide
        now instead of at the window's end (a window serving stands down; a window without
        serving serves). Returns the state left, or None where the window runs on. Pure, as
        ``window_end``."""
        if not self.cuts_short or seconds_per_step is None:
            return None
        margin = self.checks[timed_steps]
        serving = self.state is LeverState.probe_on
        line = 1.0 - self.min_gain  # serving pays where on <= off * line
        if serving:
            assert self.off_s is not None
            if seconds_per_step <= self.off_s * line * (1.0 + margin):
                return None
            self.on_s = seconds_per_step
        else:
            assert self.on_s is not None
            if self.on_s * (1.0 + margin) > seconds_per_step * line:
                return None
            self.off_s = seconds_per_step
        before = self.state
        timing = "serving" if serving else "without serving"
        self._decide(step, before, f"after {timed_steps} steps {timing}, {100 * margin:g}% past the line cuts the window short; ")
        assert self.state.serves is not before.serves, "a window cut short loses by more than the rule's margin"
        self.entered, self.since, self.state_s = step, 0, 0.0
        return self.state

    @property
    def timing_serving(self) -> bool:
        """Whether the window now timed serves (its figure: the whole step) or not (less the
        tracking): waiting, nothing is served yet."""
        return self.state in (LeverState.probe_on, LeverState.serving)

    def window_end(self, step: int, seconds_per_step: Optional[float], ready: bool) -> Optional[LeverState]:
        """The window ending at ``step`` measured ``seconds_per_step`` (serving: the whole step;
        not serving: less the tracking; None: not measured, e.g. right after a resume);
        ``ready``: the replica holds rows for the next window. Returns the state the lever left,
        or None where it stays. Pure: the same figures give the same states on every rank."""
        if not self.auto:
            return None
        before = s = self.state
        if s is LeverState.waiting:
            if seconds_per_step is not None:  # a window without serving
                self.off_s = seconds_per_step
            if ready:
                self.state = LeverState.probe_on
        elif s is LeverState.looking:
            self.state = LeverState.probe_on if ready else LeverState.down
            if not ready:  # stood down again: the next look waits twice as long
                self.span = self.base = 2 * (self.span or self.recheck_windows)
                self._record(step, before, f"nothing stale to serve after looking again: stand down for "
                                           f"{self.span * self.window} steps")  # fmt: skip
        elif seconds_per_step is None:
            return None  # an unmeasured window (resumed mid-window): measure the next one
        elif s is LeverState.probe_on:
            self.on_s = seconds_per_step
            if self.off_s is None:
                self.state = LeverState.probe_off
            else:
                self._decide(step, before)
        elif s is LeverState.probe_off:
            self.off_s = seconds_per_step
            self._decide(step, before)
        elif s is LeverState.serving:
            self.on_s = seconds_per_step
            if self._rebudget(seconds_per_step) and self._steps_left_for_a_look(step):
                self.state = LeverState.probe_off
        elif s is LeverState.down:
            self.off_s = seconds_per_step
            if self._rebudget(seconds_per_step) and self._steps_left_for_a_look(step):
                self.state = LeverState.looking
        if self.state is before:
            return None
        self.entered, self.since, self.state_s = step, 0, 0.0
        return self.state

    def _rebudget(self, seconds_per_step: float) -> bool:
        """A window of the decided state (serving, down) measured ``seconds_per_step``: the wait
        before the re-check follows the state's windows so far (``_state_loss``); returns whether
        it is over. The decision priced it from one window (serving on trial carries the
        replica's first whole syncs: 236.6 ms a step where the windows after it took 210); a
        mean, since single windows swing with the refreshes and syncs that fall in them. The
        wait never falls below the re-checks' own span (``base``)."""
        self.since += 1
        self.state_s += seconds_per_step
        self.span = max(self.base or self.recheck_windows, look_windows(self._state_loss, self.look_budget))
        return self.since >= self.span  # the wait is over: a look is due

    @property
    def _state_loss(self) -> float:
        """A look's window in the losing state's cost (``window_loss``): the mean of the decided
        state's windows so far against the other state's last figure."""
        mean = self.state_s / self.since
        on, off = (mean, self.off_s) if self.state is LeverState.serving else (self.on_s, mean)
        assert on is not None and off is not None, "a decided state holds both figures"
        return window_loss(on, off)

    def _steps_left_for_a_look(self, step: int) -> bool:
        """Whether a look due after ``step`` leaves as many steps after its window as the budget's
        wait for its cost (``look_windows`` of ``_state_loss``); else the decided state holds to
        the run's end, recorded once (``final``). Unknown run length: always."""
        if self.last_step is None:
            return True
        left, loss = self.last_step - step - self.window, self._state_loss
        needed = look_windows(loss, self.look_budget) * self.window
        if left >= needed:
            return True
        if not self.final:
            self.final = True
            what = "re-check" if self.state is LeverState.serving else "look"
            self._record(step, self.state, f"no {what}: {max(0, left)} steps would be left after its window, fewer "
                                           f"than the {needed} that keep its cost (a window {100 * loss:.0f}% "
                                           f"slower) within {100 * self.look_budget:g}% of them: "
                                           f"{self.state.value} to the run's end")  # fmt: skip
        return False

    def _decide(self, step: int, before: LeverState, early: str = "") -> None:
        assert self.on_s is not None and self.off_s is not None
        pays = self.on_s <= self.off_s * (1.0 - self.min_gain)
        faster = 1.0 - self.on_s / self.off_s if self.off_s > 0 else 0.0
        self.state = LeverState.serving if pays else LeverState.down
        # a re-check that confirms the last decision doubles the wait before the next one
        confirmed = bool(self.decisions) and self.decisions[-1]["to"] == self.state.value
        span = 2 * (self.span or self.recheck_windows) if confirmed else self.recheck_windows
        # ... and never so soon that its window in the losing state costs over the budget (read
        # again from the new state's own windows as they come: ``_rebudget``)
        loss = window_loss(self.on_s, self.off_s)
        budgeted = look_windows(loss, self.look_budget)
        self.base = span
        self.span = max(span, budgeted)
        again = f"{self.span * self.window} steps"
        if budgeted > span:
            again += f" (a window {100 * loss:.0f}% slower, within {100 * self.look_budget:g}% of the wait)"
        verdict = (
            f"serve, re-checked in {again}" if pays
            else f"stand down (no serving, counting or snapshots), look again in {again}"
        )  # fmt: skip
        self._record(
            step, before,
            f"{early}serving {1e3 * self.on_s:.1f} ms per step against {1e3 * self.off_s:.1f} ms without "
            f"({100 * faster:+.1f}% faster, needs {100 * self.min_gain:+.1f}%): {verdict}",
        )  # fmt: skip

    def _record(self, step: int, before: LeverState, reason: str) -> None:
        rec = {
            "step": step,
            "from": before.value,
            "to": self.state.value,
            "serving_ms_per_step": ms_per_step(self.on_s),
            "standing_down_ms_per_step": ms_per_step(self.off_s),
            "reason": reason,
        }
        self.decisions.append(rec)
        self._new.append(rec)

    def take_new(self) -> List[Dict[str, Any]]:
        """The decisions taken since the last call (for the metric log)."""
        out, self._new = self._new, []
        return out

    def summary(self) -> Dict[str, Any]:
        return {
            "serve_when": "auto" if self.auto else "always",
            "state": self.state.value if self.auto else "always",
            "window_steps": self.window,
            "min_gain": self.min_gain,
            "serving_ms_per_step": ms_per_step(self.on_s),
            "standing_down_ms_per_step": ms_per_step(self.off_s),
            # where serving or standing down is re-checked next (None: in no decided state, or
            # held to the run's end)
            "recheck_at_step": (
                self.entered + (self.span or self.recheck_windows) * self.window
                if self.auto and self.state in (LeverState.serving, LeverState.down) and not self.final else None
            ),
            "decisions": list(self.decisions),
        }

    def state_dict(self) -> Dict[str, Any]:
        return {
            "state": self.state.value, "on_s": self.on_s, "off_s": self.off_s, "since": self.since,
            "entered": self.entered, "span": self.span, "base": self.base, "state_s": self.state_s,
            "final": self.final, "decisions": list(self.decisions),
        }  # fmt: skip

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        self.state = LeverState(state["state"])
        self.on_s, self.off_s, self.since = state["on_s"], state["off_s"], int(state["since"])
        self.entered, self.span = int(state["entered"]), int(state["span"])
        # (a checkpoint from before the state's own mean: its span stands as the base, and its
        # windows so far count at the figure they left)
        self.base = int(state.get("base", self.span))
        last = self.on_s if self.state is LeverState.serving else self.off_s
        self.state_s = float(state.get("state_s", (last or 0.0) * self.since))
        self.decisions = list(state["decisions"])
        self.final = bool(state.get("final", False))
