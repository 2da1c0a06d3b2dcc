"""The serve lever's windows on a fake trainer clock (slipstream/serve/lever_clock.py): what is
timed (not the precision probe's steps, the tracking taken out without serving), when a window
gives no figure, and a window on trial that loses by far cut short a quarter of the way in."""

from types import SimpleNamespace

import pytest

from slipstream_rec.slipstream.schedule import Schedule
from slipstream_rec.slipstream.serve.lever import LeverState, ServeLever
from slipstream_rec.slipstream.serve.lever_clock import WindowClock, lever_window_step

S = LeverState


def lever():
    return ServeLever(auto=True, min_gain=0.02, recheck_windows=3, window=50, look_budget=1.0)


class _Clock:
    """A trainer clock: 1 s a step through the precision probe's steps (5-36), 0.5 s after, of
    which 0.1 s is Slipstream's tracking (counting, in the forward) up to step 70."""

    def __init__(self):
        self.now = 0.0
        self.tracker = None
        self.probe_until = 36  # the probe's last step

    def step(self, n):
        self.now += 1.0 if n <= self.probe_until else 0.5
        if n <= 70:
            self.tracker.count_seconds += 0.1


def _controller(lv, clock):
    wc = WindowClock()
    wc.clock = lambda: clock.now
    rebuilt = []
    return SimpleNamespace(
        lever=lv, window_clock=wc, timed_from=37, is_rank0=False, count_control=lambda n: None,
        rebuilt=rebuilt,  # the steps the replica was rebuilt (or emptied) at
        schedule=Schedule(tracks=True, serves=True, count_steps=20, count_every=4, snapshot_interval=50,
                          sync_every=10, hot_refresh_steps=0, lever_window=50, settle=2),
        seconds={"classify": 0.0, "snapshot": 0.0, "sync": 0.0, "lever": 0.0},
        tracker=SimpleNamespace(count_seconds=0.0, snapshot=lambda: None, set_counting=lambda on: None),
        quality=SimpleNamespace(seconds=0.0),
        server=SimpleNamespace(push_seconds=0.0, sum_seconds=0.0, rows=0,
                               rebuild=lambda k, s, resumed=False: rebuilt.append(s)),
        plan=SimpleNamespace(paused=False), threshold=SimpleNamespace(stale_now=lambda s: None),
    )  # fmt: skip


def test_the_lever_times_no_step_of_the_trainers_precision_probe():
    lv, clock = lever(), _Clock()
    ctl = _controller(lv, clock)
    clock.tracker = ctl.tracker
    for n in range(1, 71):  # the window 20-70: marked after step 22, the probe's steps to 36
        clock.step(n)
        ctl.server.rows = int(n >= 70)  # the first stale rows at step 70's snapshot
        lever_window_step(ctl, n)
    # timed from step 37 only, as a window without serving: less the tracking
    assert lv.state is S.probe_on and lv.off_s == pytest.approx(0.4)
    # a window that starts after the probe is timed from its own mark; serving: the whole step
    for n in range(71, 121):
        clock.step(n)
        lever_window_step(ctl, n)
    assert lv.state is S.down and lv.on_s == pytest.approx(0.5)  # (0.5 is not 2% faster than 0.4)


def test_every_agreed_figure_is_kept_window_by_window():
    # the run of the test above: the wait timed from step 37 to 70 without serving, then the
    # window serving cut at its quarter check (13 steps after its mark at 72); the window after
    # the cut has no mark before its end (120) and gives no figure
    lv, clock = lever(), _Clock()
    ctl = _controller(lv, clock)
    clock.tracker = ctl.tracker
    taken = []
    for n in range(1, 121):
        clock.step(n)
        ctl.server.rows = int(n >= 70)
        lever_window_step(ctl, n)
        taken += ctl.window_clock.take_new()
    expected = [
        {"step": 70, "state": "waiting", "timed_steps": 34, "ms_per_step": 400.0},
        {"step": 85, "state": "probe_on", "timed_steps": 13, "ms_per_step": 500.0},
    ]
    assert list(ctl.window_clock.figures) == expected and ctl.window_clock.measured == 2
    assert taken == expected  # each once, for the metric log
    assert ctl.window_clock.take_new() == []


def test_the_kept_figures_are_the_latest():
    wc = WindowClock()
    for n in range(WindowClock.KEPT + 3):
        wc.note(n, S.serving, 40, 0.001)
    wc.note(10**6, S.serving, 40, None)  # not measured: nothing kept
    assert wc.measured == WindowClock.KEPT + 3 and len(wc.figures) == WindowClock.KEPT
    assert wc.figures[0]["step"] == 3 and wc.figures[-1] == {"step": WindowClock.KEPT + 2, "state": "serving",
                                                             "timed_steps": 40, "ms_per_step": 1.0}  # fmt: skip
    assert len(wc.take_new()) == WindowClock.KEPT + 3


def test_the_lever_times_from_where_the_precision_probe_decided_early():
    # the probe planned to time steps 5-36 and decided at step 28: the steps after it are the
    # run's own (0.5 s, 0.1 of it tracking), timed from a mark after step 28, not step 36
    lv, clock = lever(), _Clock()
    clock.probe_until = 28
    ctl = _controller(lv, clock)
    clock.tracker = ctl.tracker
    for n in range(1, 71):
        clock.step(n)
        ctl.server.rows = int(n >= 70)
        if n == 28:
            ctl.timed_from = 29  # the trainer's bind reads the probe's end after every step
        lever_window_step(ctl, n)
        if n == 30:
            assert ctl.window_clock.mark_step == 28
    assert lv.state is S.probe_on and lv.off_s == pytest.approx(0.4)


def test_a_window_that_ends_inside_the_probes_steps_gives_no_figure():
    # the precision probe to step 36, then the comms probe's turns to 100 (fp32 and quantized
    # comms, 1 s a step): the wait 20-70 ends inside them and measures nothing, however it was
    # marked (the lever then serves on trial with no figure without serving, to time one after
    # it); the window serving is timed from where the probes end (a mark after step 100)
    lv, clock = lever(), _Clock()
    clock.probe_until = 100
    ctl = _controller(lv, clock)
    ctl.timed_from = 101
    clock.tracker = ctl.tracker
    for n in range(1, 121):
        clock.step(n)
        ctl.server.rows = int(n >= 70)
        lever_window_step(ctl, n)
        if n == 70:
            assert lv.state is S.probe_on and lv.off_s is None and not ctl.window_clock.figures
    assert list(ctl.window_clock.figures) == [{"step": 120, "state": "probe_on", "timed_steps": 20, "ms_per_step": 500.0}]
    assert lv.on_s == pytest.approx(0.5) and lv.state is S.probe_off


def test_the_controller_reads_the_first_timed_step_after_every_step():
    from torch import nn

    from slipstream_rec.slipstream.config import SlipstreamConfig
    from slipstream_rec.slipstream.controller import SlipstreamController

    ctl = SlipstreamController(SlipstreamConfig(), nn.Linear(1, 1), ["a"], [10], 4, seed=0, rank=0)
    end = [36]
    ctl.bind(scorer=lambda b: b, clock=lambda: 0.0, timed_from=lambda: end[0] + 1, last_step=1000)
    assert ctl.timed_from == 37 and ctl.lever.last_step == 1000  # (the lever's looks need steps after them)
    end[0] = 28  # the trainer's probe decided early
    assert ctl.timed_from == 29


def test_a_window_timed_over_too_few_steps_gives_no_figure():
    wc, now = WindowClock(), [0.0]
    wc.clock = lambda: now[0]
    wc.mark(10, 0.0)
    now[0] = 5.0
    assert wc.measure(20, True, 0.0, lambda n: None, least=11) is None
    assert wc.measure(20, True, 0.0, lambda n: None, least=10) == 0.5


def test_the_controller_cuts_a_losing_window_serving_after_a_quarter_of_it():
    # a quarter of 50 steps: 13 after the mark (72), half: 25 after it; past the line (0.4 s less
    # 2%) by over 10% at the quarter, by over 5% at half, else at the window's end
    for slower, decided, checked in [(1.25, 85, 85), (1.05, 97, 97), (1.02, 120, 97)]:
        lv, clock = lever(), _Clock()
        ctl = _controller(lv, clock)
        clock.tracker = ctl.tracker
        for n in range(1, 121):
            clock.step(n)
            if n > 70:
                clock.now += 0.4 * slower - 0.5  # serving: the step takes `slower` times 0.4 s
            ctl.server.rows = int(n >= 70)
            lever_window_step(ctl, n)
            if lv.state is S.down:
                break
        assert lv.state is S.down and lv.decisions[-1]["step"] == decided == n
        assert ctl.window_clock.checked == checked  # its last check, cut or not: a lever step
        assert lv.on_s == pytest.approx(0.4 * slower) and ctl.plan.paused and ctl.rebuilt[-1] == decided


def test_the_controller_cuts_a_recheck_without_serving_short_by_the_step_less_the_tracking():
    # serving decided at step 120 (0.3 s a step against 0.4), re-checked by the window 270-320;
    # its steps take 0.5 s, of which `tracking` is Slipstream's (counted, taken out)
    # (0.17: 0.33 s less the tracking, 7.8% past serving's 0.3 s over 0.98: cut at half, not at the quarter)
    for tracking, decided, to in [(0.0, 285, S.serving), (0.17, 297, S.serving), (0.2, 320, S.down)]:
        lv, clock = lever(), _Clock()
        ctl = _controller(lv, clock)
        clock.tracker = ctl.tracker
        for n in range(1, 321):
            state = lv.state
            clock.step(n)
            if n > 70 and state.serves:
                clock.now += 0.3 - 0.5
            elif state is S.probe_off:
                ctl.tracker.count_seconds += tracking
            ctl.server.rows = int(n >= 70)
            lever_window_step(ctl, n)
            if lv.decisions and lv.decisions[-1]["step"] == n and n > 270:
                break
        assert [d["to"] for d in lv.decisions] == ["serving", to.value] and n == decided
        # 13 steps after the re-check's mark (272), then 25 where the quarter did not cut
        assert ctl.window_clock.checked == min(decided, 297)
        # without serving less its tracking: 0.5 s (far past the line: cut at the quarter, serving
        # resumes and the replica is rebuilt there), 0.33 s (nearer it: cut at half) or 0.3 s
        # (not past it: runs on, and serving no longer pays)
        # (to the lever's own real microseconds, which count as Slipstream's work)
        assert lv.off_s == pytest.approx(0.5 - tracking, abs=1e-4)
        assert (ctl.rebuilt[-1] == decided and not ctl.plan.paused) if to is S.serving else ctl.plan.paused
