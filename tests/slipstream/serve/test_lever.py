"""The serve lever's rule on recorded timings (slipstream/serve/lever.py): serve only while a step
with serving is measurably faster than one without; otherwise stand down and look again."""

import pytest

from slipstream_rec.slipstream.serve.lever import (
    LeverState, ServeLever, early_checks, look_windows, window_loss, window_steps,
)  # fmt: skip

S = LeverState


def lever(**kw):
    # look_budget 1: a window's cost never lengthens the waits of these short walks (see the
    # budget's own tests below)
    return ServeLever(auto=True, min_gain=kw.pop("min_gain", 0.02), recheck_windows=kw.pop("recheck", 3), window=50,
                      look_budget=kw.pop("look_budget", 1.0), **kw)  # fmt: skip


def walk(lv, figures, ready=True, start=100):
    """Feed one window end per figure; returns the states after each."""
    states = []
    for i, f in enumerate(figures):
        lv.window_end(start + 50 * i, f, ready)
        states.append(lv.state)
    return states


def test_waits_for_rows_to_serve_then_times_a_window_with_and_one_without():
    lv = lever()
    # waiting: timed as a window without serving; here its window was not measured
    assert lv.window_end(100, None, ready=False) is None and lv.state is S.waiting and lv.timed
    assert lv.window_end(150, None, ready=True) is S.probe_on and lv.timed and lv.serves
    assert lv.window_end(200, 0.030, ready=True) is S.probe_off and not lv.serves and lv.tracks
    assert lv.window_end(250, 0.040, ready=True) is S.serving
    rec = lv.decisions[-1]
    assert rec["from"] == "probe_off" and rec["to"] == "serving" and rec["step"] == 250
    assert rec["serving_ms_per_step"] == 30.0 and rec["standing_down_ms_per_step"] == 40.0
    assert "+25.0% faster" in rec["reason"] and "serve" in rec["reason"]
    assert lv.take_new() == [rec] and lv.take_new() == []


def test_the_wait_for_the_first_rows_is_timed_as_a_window_without_serving():
    lv = lever()
    assert lv.timed and not lv.timing_serving  # nothing is served before the replica holds rows
    assert lv.window_end(100, 0.041, ready=False) is None and lv.off_s == 0.041
    assert lv.window_end(150, 0.040, ready=True) is S.probe_on and lv.off_s == 0.040 and lv.timing_serving
    # one window serving decides, against the wait's figure: no window without serving
    assert lv.window_end(200, 0.030, ready=True) is S.serving
    rec = lv.decisions[-1]
    assert rec["from"] == "probe_on" and rec["step"] == 200 and rec["standing_down_ms_per_step"] == 40.0
    lv = lever()
    walk(lv, [0.030, 0.039])  # serving slower than the wait
    assert lv.state is S.down and lv.decisions[-1]["from"] == "probe_on"


def test_slower_serving_stands_everything_down_and_looks_again_after_the_recheck_windows():
    lv = lever(recheck=3)
    walk(lv, [None, 0.039, 0.031])  # ready, on, off
    assert lv.state is S.down and not lv.serves and not lv.tracks
    assert "stand down" in lv.decisions[-1]["reason"] and "-25.8% faster" in lv.decisions[-1]["reason"]
    # every stood-down window keeps the figure without serving fresh; the third looks again
    assert walk(lv, [0.030, 0.029, 0.028], start=300) == [S.down, S.down, S.looking]
    assert lv.off_s == 0.028 and lv.serves and lv.tracks and not lv.timed
    # looking: one window re-bases the changes, then one window serving decides against the
    # freshest figure without it
    assert lv.window_end(500, None, ready=True) is S.probe_on
    assert lv.window_end(550, 0.0270, ready=True) is S.serving  # 0.027 <= 0.028 * 0.98
    assert [d["to"] for d in lv.decisions] == ["down", "serving"]


def test_the_margin_decides_at_its_edge():
    for on, expected in [(0.979, S.serving), (0.9801, S.down), (0.5, S.serving), (1.2, S.down)]:
        lv = lever(min_gain=0.02)
        walk(lv, [None, on, 1.0])
        assert lv.state is expected, on
    # a negative gain tolerates a slower step (bytes off the wire at a cost in time)
    lv = lever(min_gain=-0.5)
    walk(lv, [None, 1.4, 1.0])
    assert lv.state is S.serving


def test_serving_is_rechecked_by_one_window_without_it():
    lv = lever(recheck=2)
    walk(lv, [None, 0.030, 0.040])
    assert lv.state is S.serving
    assert walk(lv, [0.031, 0.032], start=300) == [S.serving, S.probe_off]
    assert lv.on_s == 0.032
    assert lv.window_end(400, 0.031, ready=True) is S.down  # the network got faster: now it does not pay
    assert lv.decisions[-1]["from"] == "probe_off"


def test_each_confirming_recheck_doubles_the_wait_and_a_reversal_resets_it():
    lv = lever(recheck=2)
    walk(lv, [None, 0.040, 0.030])  # down: re-checked after 2 windows
    assert lv.state is S.down and lv.span == 2 and "look again in 100 steps" in lv.decisions[-1]["reason"]
    # look: 2 windows down, looking, probe_on still slower -> down again for 4 windows
    assert walk(lv, [0.03, 0.03, None, 0.04], start=250) == [S.down, S.looking, S.probe_on, S.down]
    assert lv.span == 4 and "look again in 200 steps" in lv.decisions[-1]["reason"]
    assert walk(lv, [0.03] * 4, start=450) == [S.down] * 3 + [S.looking]
    # this time serving pays: the reversal starts the waits again from recheck_windows
    assert walk(lv, [None, 0.02], start=650) == [S.probe_on, S.serving]
    assert lv.span == 2
    assert walk(lv, [0.02, 0.02, 0.03], start=750) == [S.serving, S.probe_off, S.serving]
    assert lv.span == 4  # confirmed: serving's next re-check waits twice as long


def test_an_unmeasured_window_changes_nothing():
    lv = lever()
    walk(lv, [None, 0.03])
    assert lv.state is S.probe_off
    assert lv.window_end(250, None, ready=True) is None and lv.state is S.probe_off and lv.off_s is None


def test_looking_again_with_nothing_stale_stands_down_again():
    lv = lever(recheck=1)
    walk(lv, [None, 0.04, 0.03, 0.03])
    assert lv.state is S.looking
    assert lv.window_end(300, None, ready=False) is S.down
    assert "nothing stale" in lv.decisions[-1]["reason"]
    # and waits twice as long before the next look
    assert lv.span == 2 and walk(lv, [0.03, 0.03], start=350) == [S.down, S.looking]


def test_always_never_times_nor_changes():
    lv = ServeLever(auto=False)
    for f in (None, 0.01, 10.0):
        assert lv.window_end(100, f, ready=True) is None
    assert lv.serves and lv.tracks and not lv.timed and lv.decisions == []
    assert lv.summary()["serve_when"] == "always"


def test_state_round_trips():
    lv = lever()
    walk(lv, [None, 0.039, 0.031, 0.03])
    again = lever()
    again.load_state_dict(lv.state_dict())
    assert (again.state, again.on_s, again.off_s, again.since, again.entered, again.span) == (
        lv.state, lv.on_s, lv.off_s, lv.since, lv.entered, lv.span)
    assert lv.entered == 200  # the window end that stood serving down
    assert again.decisions == lv.decisions


@pytest.mark.parametrize("on, off, budget, expected", [
    (1.49, 1.0, 0.01, 49),  # serving 49% slower: a look costs 0.49 of a window
    (1.0, 1.2, 0.01, 20),  # serving pays by 1.2x: a re-check without it costs 0.2 of a window
    (1.2, 1.0, 0.1, 2),  # exactly at the budget: no window more than needed
    (1.0, 1.0, 0.01, 1),
])  # fmt: skip
def test_look_windows_keep_a_window_in_the_losing_state_within_the_budget(on, off, budget, expected):
    assert look_windows(window_loss(on, off), budget) == expected


def test_the_further_serving_loses_the_later_it_looks_again():
    lv = lever(recheck=2, look_budget=0.01)
    walk(lv, [None, 0.0149, 0.0100])  # serving 49% slower
    assert lv.state is S.down and lv.span == 49
    assert "look again in 2450 steps (a window 49% slower, within 1% of the wait)" in lv.decisions[-1]["reason"]
    assert walk(lv, [0.01] * 49, start=250) == [S.down] * 48 + [S.looking]
    # a confirming look doubles the wait where that is longer than the budget asks
    walk(lv, [None, 0.0103], start=2700)  # 3% slower: the budget asks 3 windows, doubling 98
    assert lv.state is S.down and lv.span == 98 and lv.decisions[-1]["reason"].endswith("look again in 4900 steps")


def test_serving_that_pays_well_is_rechecked_rarely():
    lv = lever(recheck=2, look_budget=0.01)
    walk(lv, [None, 0.010, 0.012])  # a window without serving costs 20% of a window
    assert lv.state is S.serving and lv.span == 20
    assert walk(lv, [0.01] * 20, start=250) == [S.serving] * 19 + [S.probe_off]


@pytest.mark.parametrize("requested, interval, expected", [(50, 50, 50), (50, 20, 60), (1, 50, 50), (120, 50, 150)])
def test_windows_hold_whole_snapshot_intervals(requested, interval, expected):
    assert window_steps(requested, interval) == expected


def test_a_trial_is_checked_at_a_quarter_and_at_half_its_steps_nearer_the_line_the_later():
    assert early_checks(50) == {13: 0.10, 25: 0.05} and early_checks(40) == {10: 0.10, 20: 0.05}
    assert early_checks(2) == {1: 0.10}  # a window too short for two checks: the later margin never cuts
    assert lever().checks == early_checks(50)


def test_a_window_serving_that_clearly_loses_is_cut_short():
    EARLY_LOSS = 0.10  # the quarter's margin (13 steps of 50)

    lv = lever()
    # no figure without serving yet, or not a window serving: nothing to cut
    assert lv.early_end(110, 0.080, 13) is None and lv.state is S.waiting
    assert lv.window_end(100, 0.040, ready=True) is S.probe_on
    # at the edge (EARLY_LOSS slower than the rule's line, 2% under 40 ms) the window runs on;
    # beyond it, the lever stands down now
    assert lv.early_end(113, 0.040 * 0.98 * (1 + EARLY_LOSS), 13) is None and lv.state is S.probe_on
    assert lv.early_end(113, None, 13) is None and lv.state is S.probe_on
    assert lv.early_end(113, 0.0441, 13) is S.down and lv.entered == 113 and not lv.serves and not lv.tracks
    rec = lv.decisions[-1]
    assert (rec["from"], rec["to"], rec["step"], rec["serving_ms_per_step"]) == ("probe_on", "down", 113, 44.1)
    assert rec["reason"].startswith("after 13 steps serving, 10% past the line cuts the window short; serving 44.1 ms")
    # stood down, nothing is cut any more; a window serving that pays runs to its end
    assert lv.early_end(120, 1.0, 13) is None and lv.state is S.down
    lv = lever()
    walk(lv, [0.040])
    assert lv.early_end(113, 0.030, 13) is None and lv.window_end(150, 0.030, ready=True) is S.serving
    # a serving state's windows are never cut (only a window serving on trial)
    assert lv.early_end(163, 0.080, 13) is None and lv.state is S.serving
    # the line moves with the margin: where serving may cost 90%, 10% slower is no loss
    lv = lever(min_gain=-0.9)
    walk(lv, [0.040])
    assert lv.early_end(113, 0.0441, 13) is None and lv.early_end(113, 0.040 * 1.9 * 1.1 + 1e-6, 13) is S.down


def test_a_recheck_without_serving_where_serving_clearly_wins_is_cut_short():
    EARLY_LOSS = 0.10  # the quarter's margin (13 steps of 50)

    lv = lever(recheck=2)
    walk(lv, [None, 0.030, 0.040])  # probe_on, probe_off: serving
    assert lv.state is S.serving and lv.early_end(263, 0.080, 13) is None  # a decided state runs on
    assert walk(lv, [0.030, 0.030], start=250) == [S.serving, S.probe_off]
    # the line without serving: serving's 30 ms over 0.98; EARLY_LOSS past it the re-check runs on
    # at the edge, beyond it serving resumes now
    edge = 0.030 * (1 + EARLY_LOSS) / 0.98
    assert lv.early_end(363, edge * (1 - 1e-9), 13) is None and lv.state is S.probe_off
    assert lv.early_end(363, None, 13) is None and lv.state is S.probe_off
    assert lv.early_end(363, 0.0340, 13) is S.serving and lv.entered == 363 and lv.serves and lv.tracks
    rec = lv.decisions[-1]
    assert (rec["from"], rec["to"], rec["step"], rec["standing_down_ms_per_step"]) == ("probe_off", "serving", 363, 34.0)
    assert rec["reason"].startswith("after 13 steps without serving, 10% past the line cuts the window short; serving 30.0 ms")
    assert lv.span == 4  # a re-check that confirms, cut short or not: twice the wait
    # a re-check where serving no longer wins by that much runs to its end and decides there
    lv = lever(recheck=2)
    walk(lv, [None, 0.030, 0.040, 0.030, 0.030])
    assert lv.state is S.probe_off and lv.early_end(363, 0.0320, 13) is None
    assert lv.window_end(400, 0.0300, ready=True) is S.down
    # the trial's window without serving (no figure from the wait) is cut the same way
    lv = lever()
    walk(lv, [None, 0.030])
    assert lv.state is S.probe_off and lv.early_end(213, 0.040, 13) is S.serving


def test_half_a_window_on_trial_cuts_it_nearer_the_line_than_a_quarter():
    # a trial serving 8% past the line (40 ms without less 2%): on at the quarter, cut at half
    lv = lever()
    walk(lv, [0.040])
    past = 0.040 * 0.98 * 1.08
    assert lv.early_end(113, past, 13) is None and lv.state is S.probe_on
    assert lv.early_end(125, 0.040 * 0.98 * 1.05, 25) is None and lv.state is S.probe_on  # at its edge
    assert lv.early_end(125, past, 25) is S.down and lv.entered == 125
    assert lv.decisions[-1]["reason"].startswith("after 25 steps serving, 5% past the line cuts the window short")
    # a re-check where serving wins 8% past the line (30 ms serving over 0.98, 8% more)
    lv = lever(recheck=2)
    walk(lv, [None, 0.030, 0.040, 0.030, 0.030])
    assert lv.state is S.probe_off
    past = 0.030 * 1.08 / 0.98
    assert lv.early_end(363, past, 13) is None and lv.state is S.probe_off
    assert lv.early_end(375, 0.030 * 1.05 / 0.98 * (1 - 1e-9), 25) is None and lv.state is S.probe_off
    assert lv.early_end(375, past, 25) is S.serving and lv.entered == 375 and lv.span == 4
    rec = lv.decisions[-1]
    assert (rec["from"], rec["to"], rec["standing_down_ms_per_step"]) == ("probe_off", "serving", round(1e3 * past, 3))
    assert rec["reason"].startswith("after 25 steps without serving, 5% past the line cuts the window short")
    # within 5% of the line, the whole window decides
    lv = lever()
    walk(lv, [0.040])
    assert lv.early_end(125, 0.040 * 0.98 * 1.04, 25) is None and lv.window_end(150, 0.040 * 0.98 * 1.04, True) is S.down


@pytest.mark.parametrize("last_step, looks", [(None, True), (2250, True), (2249, False)])
def test_a_look_needs_as_many_steps_after_it_as_its_cost_is_priced_on(last_step, looks):
    # serving 20% faster: a re-check window costs 20% of a window, so at a 1% budget it waits 20
    # windows (1000 steps) after the decision at step 200, and needs as many after its window
    lv = lever(recheck=2, look_budget=0.01, last_step=last_step)
    walk(lv, [None, 0.010, 0.012])
    states = walk(lv, [0.010] * 22, start=250)
    if looks:  # (unknown run length, or 1000 steps left after the re-check's window at step 1200)
        assert states[19] is S.probe_off and not lv.final
        return
    assert states == [S.serving] * 22 and lv.final and lv.summary()["recheck_at_step"] is None
    held = [d for d in lv.decisions if d["from"] == d["to"]]
    assert len(held) == 1 and held[0] is lv.decisions[-1] and held[0]["step"] == 1200  # recorded once
    assert held[0]["reason"] == ("no re-check: 999 steps would be left after its window, fewer than the 1000 that "
                                 "keep its cost (a window 20% slower) within 1% of them: serving to the run's end")
    again = lever(recheck=2, look_budget=0.01, last_step=last_step)
    again.load_state_dict(lv.state_dict())
    assert again.final and again.summary()["recheck_at_step"] is None


def test_a_look_after_standing_down_needs_steps_after_it_too():
    # stood down where serving was 25% slower: a look waits 25 windows (due after step 1450) and
    # needs 1250 steps after its window
    for last_step, state in [(1450 + 50 + 1250, S.looking), (1450 + 50 + 1249, S.down)]:
        lv = lever(recheck=2, look_budget=0.01, last_step=last_step)
        walk(lv, [0.040, 0.050])
        assert lv.state is S.down and lv.span == 25
        assert walk(lv, [0.040] * 25, start=250)[-1] is state
        assert lv.final is (state is S.down)
    assert lv.decisions[-1]["reason"].startswith("no look: 1249 steps would be left after its window")


def test_a_slow_trial_window_does_not_set_the_recheck_the_serving_windows_do():
    # The trial window carries the replica's first whole syncs: serving 0.0115 against 0.012
    # without prices a re-check window at 4% (5 windows at a 1% budget); the serving windows
    # that follow measure 0.010, a re-check window at 20%: the re-check moves to 20 windows.
    lv = lever(recheck=2, look_budget=0.01)
    walk(lv, [None, 0.0115, 0.012])
    assert lv.state is S.serving and lv.span == 5 and lv.entered == 200
    assert lv.summary()["recheck_at_step"] == 200 + 5 * 50
    assert walk(lv, [0.010] * 20, start=250) == [S.serving] * 19 + [S.probe_off]
    assert lv.decisions[-1]["step"] == 200  # moving the re-check is no decision
    # stood down, the same: a look priced from serving 49% slower (49 windows) comes sooner as
    # the stood-down windows approach serving's figure (0.0149 against a mean of 0.0125: 20)
    lv = lever(recheck=2, look_budget=0.01)
    walk(lv, [None, 0.0149, 0.0100])
    assert lv.state is S.down and lv.span == 49
    assert walk(lv, [0.0125] * 20, start=250) == [S.down] * 19 + [S.looking]


def test_the_recheck_follows_the_mean_of_the_state_s_windows_not_its_latest():
    lv = lever(recheck=2, look_budget=0.01)
    walk(lv, [None, 0.010, 0.012])  # serving: 20 windows
    # a slow window (a hot-set refresh, a resync) among fast ones: the mean of ten windows, 0.01019,
    # keeps the re-check at 18 windows; the window alone (0.0119) would re-check now
    assert walk(lv, [0.010] * 9 + [0.0119], start=250) == [S.serving] * 10
    assert lv.span == 18 and lv.summary()["recheck_at_step"] == 200 + 18 * 50


def test_the_recheck_never_comes_before_the_confirmations_span():
    lv = lever(recheck=2, look_budget=0.01)
    walk(lv, [None, 0.0149, 0.0100])  # down, 49 windows
    walk(lv, [0.01] * 49 + [None, 0.0103], start=250)  # a look confirms: doubled to 98
    assert lv.state is S.down and lv.span == lv.base == 98
    # stood-down windows that make a look cheap (0.0102 against 0.0103: 1 window) keep the 98
    assert walk(lv, [0.0102] * 97 + [0.0102], start=2800) == [S.down] * 97 + [S.looking]


def test_the_state_s_mean_round_trips_and_an_older_state_resumes():
    lv = lever(recheck=2, look_budget=0.01)
    walk(lv, [None, 0.0115, 0.012] + [0.010] * 3)
    again = lever(recheck=2, look_budget=0.01)
    again.load_state_dict(lv.state_dict())
    assert (again.base, again.state_s, again.span) == (lv.base, lv.state_s, lv.span) == (2, pytest.approx(0.03), 20)
    assert walk(again, [0.010] * 17, start=400) == walk(lv, [0.010] * 17, start=400)
    # a state saved before the mean: its span is the base, its windows count at the last figure
    old = lv.state_dict()
    for key in ("base", "state_s"):
        old.pop(key)
    again = lever(recheck=2, look_budget=0.01)
    again.load_state_dict(old)
    assert again.base == again.span and again.state_s == pytest.approx(again.on_s * again.since)
