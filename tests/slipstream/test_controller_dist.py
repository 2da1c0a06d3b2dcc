"""The controller's schedule and policies on 2 gloo ranks, with weights moved by hand.

Counting on the sampled steps, hot-row selection at ``count_steps``, a snapshot every
``snapshot_interval`` steps, the threshold from the look-ahead sample of every rank, the warm-up,
and the difference between ``reactivate`` (paper_plus) and stale-forever (paper).
"""

from __future__ import annotations

import pytest
import torch

from tests._fixtures import FEATURES, LOCAL_BATCH, ROWS, WORLD
from tests.dist_harness import run_workers
from tests.slipstream._fixtures import _sharded, _source


def controller_worker(env, reactivate: bool, warmup_steps: int):
    from slipstream_rec.slipstream.classify import per_sample_max_change
    from slipstream_rec.slipstream.threshold import threshold_for_target
    from slipstream_rec.slipstream.config import Policy, SlipstreamConfig
    from slipstream_rec.slipstream.controller import SlipstreamController
    from slipstream_rec.distributed import gather_varlen

    dmp, modules = _sharded("row_wise")
    cfg = SlipstreamConfig(
        policy=Policy.paper_plus if reactivate else Policy.paper,
        count_steps=2, count_fraction=0.5, min_count=1, snapshot_interval=2,
        target_skip_fraction=0.5, max_threshold=1.0, reactivate=reactivate,
        refresh_threshold=reactivate, keep_probability=0.0, warmup_steps=warmup_steps,
        threshold_sample_size=1000, lookahead_batches=2,
    )
    ctl = SlipstreamController(cfg, dmp, FEATURES, ROWS, LOCAL_BATCH, seed=0, rank=env.rank)
    stream = ctl.wrap(_source(env.rank))
    unit_rows = {id(u): u for m in modules for u in m.units}

    def step(n):
        batch = next(stream)
        loss, _ = dmp(batch)
        loss.backward()
        return dict(ctl.on_step_end(n)).get("slipstream")

    def move(rows_of_feature0: float, others: float):
        with torch.no_grad():
            for unit in unit_rows.values():
                if unit.hot_rows is not None and unit.hot_rows.numel():
                    delta = rows_of_feature0 if unit.feature == "f0" else others
                    unit.weights[unit.hot_rows, 0] += delta

    log = []
    assert ctl.tracker.counting is False  # step 1 is not a counted step (every 2nd step)
    step(1)
    assert ctl.tracker.counting is True  # step 2 is
    record = step(2)  # hot rows chosen + first snapshot
    assert record is not None and record["hot_rows"] > 0 and record["threshold"] is None
    assert ctl.tracker.counting is False
    hot_before = record["hot_rows"]
    assert step(3) is None
    # Between snapshots 1 and 2: f0's hot rows move a lot, every other hot row barely.
    move(0.5, 0.001)
    record = step(4)
    log.append(record)
    # T: half of the sampled hot inputs; every sampled input touches f0 (change 0.5 + SGD), so
    # the quantile lies at or above f0's change and T is 0.5-ish, never reached by 0.001 rows.
    peek = ctl.stream.peek_upcoming(cfg.threshold_sample_size)
    values = gather_varlen(per_sample_max_change(peek.sparse_features, ctl.index, ctl.row_state))
    expected_t, _ = threshold_for_target(values, cfg.target_skip_fraction, cfg.max_threshold)
    assert ctl.threshold.value == pytest.approx(expected_t)
    stale_rows_4 = record["stale_rows"]
    assert record["hot_rows"] == hot_before and stale_rows_4 > 0
    active = ctl.threshold.active(ctl.step)
    assert (active is None) == (warmup_steps > 4)

    # Between snapshots 2 and 3 every hot row moves a lot: with re-activation nothing small
    # stays stale; stale-forever keeps what was stale.
    assert step(5) is None
    move(5.0, 5.0)
    record = step(6)
    log.append(record)
    return ctl.threshold.value, stale_rows_4, record["stale_rows"], hot_before


@pytest.mark.parametrize("reactivate", [True, False])
def test_controller_schedule_threshold_and_reactivation(reactivate):
    results = run_workers(controller_worker, WORLD, reactivate=reactivate, warmup_steps=0)
    assert results[0] == results[1], "ranks disagree on the threshold or the stale set"
    threshold, stale_at_4, stale_at_6, hot = results[0]
    assert 0 < stale_at_4 < hot
    if reactivate:
        assert stale_at_6 == 0  # every row moved by 5 > max_threshold: all re-activated
        assert threshold == 1.0  # refreshed, and capped by max_threshold
    else:
        assert stale_at_6 == stale_at_4  # once stale, stale for the rest of training
        assert 0.49 < threshold < 0.51  # chosen once at the second snapshot: f0 moved by 0.5 (+ SGD)


def test_warmup_holds_the_threshold_back():
    results = run_workers(controller_worker, WORLD, reactivate=True, warmup_steps=100)
    assert results[0] == results[1]
