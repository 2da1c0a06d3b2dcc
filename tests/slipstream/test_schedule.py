"""The schedule's steps, worked out by hand from the config (pure functions of the step)."""

from __future__ import annotations

from slipstream_rec.slipstream.config import Action, Policy, SlipstreamConfig
from slipstream_rec.slipstream.schedule import Schedule


def _steps(pred, last=60):
    return [s for s in range(1, last + 1) if pred(s)]


def test_counting_snapshots_syncs_and_refreshes_fall_where_the_config_says():
    cfg = SlipstreamConfig(
        policy=Policy.paper_plus, action=Action.serve, count_steps=8, count_fraction=0.25,
        snapshot_interval=10, replica_sync_steps=5, hot_refresh_steps=20,
    )  # fmt: skip
    s = Schedule.from_config(cfg)
    # every 4th step (1 / 0.25) while the hot set is counted; with refreshes, for good
    assert _steps(s.counts, 24) == [4, 8, 12, 16, 20, 24]
    # snapshots every 10 steps from count_steps; the first choice only at count_steps
    assert _steps(s.snapshot) == [8, 18, 28, 38, 48, 58]
    assert _steps(s.first_choice) == [8]
    # refreshes every 20 steps after the first choice, never at it
    assert _steps(s.refresh) == [28, 48]
    # serve syncs every 5 steps from count_steps (every snapshot among them)
    assert _steps(s.sync, 30) == [8, 13, 18, 23, 28]
    assert not any(s.window_end(k) or s.window_mark(k) for k in range(1, 61))  # no lever


def test_counting_stops_at_count_steps_without_refreshes_and_syncs_default_to_snapshots():
    cfg = SlipstreamConfig(policy=Policy.paper_plus, action=Action.serve, count_steps=6, count_fraction=0.5,
                           snapshot_interval=4)  # fmt: skip
    s = Schedule.from_config(cfg)
    assert _steps(s.counts, 20) == [2, 4, 6]
    assert _steps(s.sync, 20) == [6, 10, 14, 18] == _steps(s.snapshot, 20)
    assert _steps(s.refresh) == []


def test_the_lever_windows_and_their_timed_part():
    cfg = SlipstreamConfig(policy=Policy.paper_plus, action=Action.serve, count_steps=10, snapshot_interval=5,
                           count_fraction=0.2)  # fmt: skip
    s = Schedule.from_config(cfg, lever_window=10, settle=3)
    # the wait for the replica's first rows: from the hot set's choice (10) to the second
    # snapshot (15), the first step whose replica can hold rows; then windows of 10
    assert _steps(s.window_end) == [10, 15, 25, 35, 45, 55]
    assert _steps(s.window_mark) == [13, 18, 28, 38, 48, 58]
    # every step a window ends at is a snapshot step (each window holds its snapshots whole)
    assert set(_steps(s.window_end)) <= set(_steps(s.snapshot))


def test_windows_of_one_snapshot_interval_run_from_the_hot_sets_choice():
    cfg = SlipstreamConfig(policy=Policy.paper_plus, action=Action.serve, count_steps=20, snapshot_interval=50,
                           count_fraction=0.25)  # fmt: skip
    s = Schedule.from_config(cfg, lever_window=50, settle=2)
    assert _steps(s.window_end, 200) == [20, 70, 120, 170]
    assert _steps(s.window_mark, 200) == [22, 72, 122, 172]


def test_a_wait_no_longer_than_the_settling_steps_is_not_timed():
    cfg = SlipstreamConfig(policy=Policy.paper_plus, action=Action.serve, count_steps=10, snapshot_interval=5,
                           count_fraction=0.2)  # fmt: skip
    s = Schedule.from_config(cfg, lever_window=10, settle=6)
    assert _steps(s.window_end) == [10, 15, 25, 35, 45, 55]
    assert _steps(s.window_mark) == [21, 31, 41, 51]  # nothing marked in 10..15


def test_a_policy_that_tracks_nothing_has_no_step_at_all():
    for cfg in (SlipstreamConfig(policy=Policy.off), SlipstreamConfig(policy=Policy.random, random_skip_fraction=0.3)):
        s = Schedule.from_config(cfg, lever_window=10)
        assert not any(
            f(k) for f in (s.counts, s.snapshot, s.first_choice, s.refresh, s.sync, s.window_end, s.window_mark)
            for k in range(1, 301)
        )  # fmt: skip


def test_skipping_policies_never_sync():
    s = Schedule.from_config(SlipstreamConfig(policy=Policy.paper_plus, count_steps=4, count_fraction=0.25))
    assert _steps(s.snapshot, 200) and not _steps(s.sync, 200)
