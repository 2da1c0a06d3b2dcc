"""On which training steps Slipstream acts: pure functions of the step number.

Every rank asks the same questions of the same step numbers and gets the same answers, which is
what lets the controller run its collectives there without an agreement of its own. Steps count
trained steps from 1; the hot set is first chosen at ``count_steps``, and the snapshots, syncs and
refreshes are counted from there. The serve lever's windows are counted from the second snapshot,
the first step whose replica can hold rows (staleness is a change between two snapshots): the
window before it, from ``count_steps``, times steps that nothing is served in, so serving may
start there even where a window spans several snapshots.

A policy that tracks nothing (``off``, ``random``) gets a schedule with no step at all: its
controller runs the same code and nothing is due.
"""

from __future__ import annotations

from dataclasses import dataclass

from slipstream_rec.slipstream.config import SlipstreamConfig

__all__ = ["Schedule"]


@dataclass(frozen=True)
class Schedule:
    """The steps of counting, snapshots, serve syncs, hot-set refreshes and lever windows."""

    tracks: bool  # a tracking policy: counting and snapshots happen at all
    serves: bool  # the serve action: syncs happen at all
    count_steps: int  # the step the hot set is first chosen at (slipstream.count_steps)
    count_every: int  # a counted step every this many (1 / slipstream.count_fraction)
    snapshot_interval: int
    sync_every: int  # serve: steps between pushes and replica syncs
    hot_refresh_steps: int  # 0: the hot set is chosen once
    lever_window: int = 0  # serve_when=auto: steps per timed window (0: no lever)
    settle: int = 0  # steps at a window's start that are not timed (batches split ahead)

    @classmethod
    def from_config(cls, cfg: SlipstreamConfig, lever_window: int = 0, settle: int = 0) -> "Schedule":
        return cls(
            tracks=cfg.policy.tracks,
            serves=cfg.serves,
            count_steps=cfg.count_steps,
            count_every=max(1, round(1.0 / cfg.count_fraction)),
            snapshot_interval=cfg.snapshot_interval,
            sync_every=cfg.replica_sync_steps or cfg.snapshot_interval,
            hot_refresh_steps=cfg.hot_refresh_steps,
            lever_window=lever_window,
            settle=settle,
        )

    def _every(self, step: int, every: int, from_count_steps: bool = True) -> bool:
        """``step`` is one of every ``every`` steps counted from ``count_steps`` (which itself
        counts only with ``from_count_steps``)."""
        since = step - self.count_steps
        return every > 0 and (since >= 0 if from_count_steps else since > 0) and since % every == 0

    def counts(self, step: int) -> bool:
        """Lookups are counted in ``step``: a sampled step of the first ``count_steps``, and of
        every later one while the hot set is chosen again (``hot_refresh_steps``)."""
        window = step <= self.count_steps or self.hot_refresh_steps > 0
        return self.tracks and window and step % self.count_every == 0

    def snapshot(self, step: int) -> bool:
        """The hot rows are snapshotted after ``step`` (the first time, chosen first)."""
        return self.tracks and self._every(step, self.snapshot_interval)

    def first_choice(self, step: int) -> bool:
        """The hot set is chosen for the first time after ``step``."""
        return self.snapshot(step) and step == self.count_steps

    def refresh(self, step: int) -> bool:
        """The hot set is chosen again after ``step`` (a snapshot step, never the first)."""
        return self.snapshot(step) and self._every(step, self.hot_refresh_steps, from_count_steps=False)

    def sync(self, step: int) -> bool:
        """serve: the served gradients are pushed and the replica brought up to date after
        ``step`` (every snapshot, and every ``replica_sync_steps`` in between)."""
        return self.tracks and self.serves and self._every(step, self.sync_every)

    @property
    def first_serving(self) -> int:
        """The step after which the replica can first hold rows: the second snapshot."""
        return self.count_steps + self.snapshot_interval

    def window_end(self, step: int) -> bool:
        """serve_when=auto: a lever window ends after ``step``: the wait for the replica's first
        rows runs from ``count_steps`` to ``first_serving``, and windows of ``lever_window``
        steps follow (with the window a single snapshot interval, every one of them is
        ``lever_window`` long)."""
        since = step - self.first_serving
        on = self.tracks and self.lever_window > 0
        return on and (step == self.count_steps or (since >= 0 and since % self.lever_window == 0))

    def window_mark(self, step: int) -> bool:
        """serve_when=auto: the timed part of a window starts after ``step`` (``settle`` steps in;
        the wait's window untimed where it is no longer than that)."""
        since = step - self.first_serving
        on = self.tracks and self.lever_window > 0
        waiting = step == self.count_steps + self.settle and self.settle < self.snapshot_interval
        return on and (waiting or (since >= 0 and since % self.lever_window == self.settle))
