"""Per-shard tracking and the global hot/stale sets, on 2 gloo ranks, for every sharding type.

Exact expectations: a shard's counts are the global id histogram of its feature sliced to its
rows (data-parallel shards count only their own batch until the all-reduce); the hot set is the
set of rows the histogram says; a known weight change is measured exactly and published
identically to every rank; a stale row that moves again is re-activated.
"""

from __future__ import annotations

import pytest
import torch

from tests._fixtures import FEATURES, LOCAL_BATCH, ROWS, WORLD, _slice_batch
from tests.dist_harness import run_workers
from tests.slipstream._fixtures import _sharded

KINDS = ["table_wise", "row_wise", "column_wise", "table_row_wise", "data_parallel"]


def _histograms(lo: int, hi: int):
    """Per feature, the id histogram of samples [lo, hi) of the global batch."""
    batch = _slice_batch(lo, hi)
    kjt = batch.sparse_features
    return {f: torch.bincount(kjt[f].values(), minlength=ROWS[i]) for i, f in enumerate(FEATURES)}


def counts_worker(env, kind: str):
    from slipstream_rec.slipstream.rows import RowIndex, RowState
    from slipstream_rec.slipstream.tracker import StalenessTracker

    dmp, modules = _sharded(kind)
    index = RowIndex(FEATURES, ROWS)
    tracker = StalenessTracker(modules, index, RowState(index.num_rows))
    lo, hi = env.rank * LOCAL_BATCH, (env.rank + 1) * LOCAL_BATCH
    tracker.set_counting(True)
    dmp.eval()
    with torch.no_grad():
        dmp(_slice_batch(hi % (WORLD * LOCAL_BATCH), hi % (WORLD * LOCAL_BATCH) + LOCAL_BATCH))  # not counted: eval
    dmp.train()
    loss, _ = dmp(_slice_batch(lo, hi))
    loss.backward()
    tracker.set_counting(False)
    dmp(_slice_batch(lo, hi))  # not counted: counting is off

    global_hist = _histograms(0, WORLD * LOCAL_BATCH)
    local_hist = _histograms(lo, hi)
    units = modules[0].units
    assert units, "every rank holds at least one shard here"
    for unit in units:
        hist = local_hist if unit.replicated else global_hist
        expected = hist[unit.feature][unit.row_offset : unit.row_offset + unit.rows]
        assert unit.counted_rows is not None, unit
        assert torch.equal(unit.count_table(), expected), f"{kind} {unit}"

    # Hot set with an ample budget and min count 1 = every row looked up in the global batch.
    selection = tracker.select_hot(budget_bytes=1 << 30, min_count=1)
    expected_keys = torch.cat(
        [index.to_flat(i, torch.nonzero(global_hist[f]).flatten()) for i, f in enumerate(FEATURES)]
    )
    assert torch.equal(torch.sort(tracker.hot_keys).values, torch.sort(expected_keys).values)
    assert selection.hot_rows == expected_keys.numel()
    return tracker.hot_keys.tolist()


@pytest.mark.parametrize("kind", KINDS)
def test_shard_counts_equal_the_global_histogram_sliced_to_the_shard(kind):
    hot = run_workers(counts_worker, WORLD, kind=kind)
    assert hot[0] == hot[1], "ranks disagree on the hot set"


def budget_worker(env):
    from slipstream_rec.slipstream.rows import RowIndex, RowState
    from slipstream_rec.slipstream.tracker import StalenessTracker

    dmp, modules = _sharded("row_wise")
    index = RowIndex(FEATURES, ROWS)
    tracker = StalenessTracker(modules, index, RowState(index.num_rows))
    tracker.set_counting(True)
    dmp(_slice_batch(env.rank * LOCAL_BATCH, (env.rank + 1) * LOCAL_BATCH))
    hist = _histograms(0, WORLD * LOCAL_BATCH)
    counts = torch.cat([hist[f] for f in FEATURES])
    # A budget for 10 rows of 8 floats (row-wise: each row lives on one rank, 32 bytes): the 10
    # most counted rows, ties broken by flat key, whichever rank holds them.
    selection = tracker.select_hot(budget_bytes=10 * 8 * 4, min_count=1)
    eligible = torch.nonzero(counts >= 1).flatten().tolist()
    expected = sorted(sorted(eligible, key=lambda k: (-int(counts[k]), k))[:10])
    assert tracker.hot_keys.tolist() == expected
    assert selection.hot_bytes == 10 * 8 * 4
    return tracker.hot_keys.tolist()


def test_hot_rows_respect_the_global_budget():
    hot = run_workers(budget_worker, WORLD)
    assert hot[0] == hot[1] and len(hot[0]) == 10


def staleness_worker(env, kind: str):
    from slipstream_rec.slipstream.rows import RowIndex, RowState
    from slipstream_rec.slipstream.tracker import StalenessTracker
    from tests.slipstream.reference import dense_change, stale_mask

    dmp, modules = _sharded(kind)
    index = RowIndex(FEATURES, ROWS)
    state = RowState(index.num_rows)
    tracker = StalenessTracker(modules, index, state)
    tracker.set_counting(True)
    dmp(_slice_batch(env.rank * LOCAL_BATCH, (env.rank + 1) * LOCAL_BATCH))
    tracker.set_counting(False)
    tracker.select_hot(budget_bytes=1 << 30, min_count=1)
    assert tracker.snapshot() is False  # the first snapshot has nothing to compare with

    def move(delta_of_key):
        # Change each hot row's first local column by a known amount (every shard of the row,
        # so that column-wise and replicated shards agree on the row's largest change).
        with torch.no_grad():
            for unit in modules[0].units:
                keys = tracker._global_keys(unit, unit.hot_rows)
                unit.weights[unit.hot_rows, 0] += delta_of_key(keys)

    def published():
        return dense_change(state)

    # odd keys move down: the change is the largest absolute move, whatever its sign
    move(lambda k: 0.001 * (k % 7).float() * (1 - 2 * (k % 2)).float())
    assert tracker.snapshot() is True
    first = published()
    hot = tracker.hot_keys
    torch.testing.assert_close(first[hot], 0.001 * (hot % 7).float(), atol=1e-6, rtol=1e-4)
    not_hot = torch.ones(index.num_rows, dtype=torch.bool)
    not_hot[hot] = False
    assert torch.isinf(first[not_hot]).all()
    stale_before = stale_mask(state, 0.0005)
    assert stale_before[hot].sum() == (hot % 7 == 0).sum()  # rows that did not move are stale

    # Re-activation: rows that were stale start moving a lot; the next snapshot un-stales them.
    move(lambda k: torch.where(k % 7 == 0, torch.full_like(k, 5, dtype=torch.float32), torch.zeros(k.shape)))
    assert tracker.snapshot() is True
    second = published()
    stale_after = stale_mask(state, 0.0005)
    reactivated = hot[hot % 7 == 0]
    assert not stale_after[reactivated].any()
    assert stale_after[hot[hot % 7 != 0]].all()  # and those that stopped moving became stale
    return first.tolist(), second.tolist()


@pytest.mark.parametrize("kind", ["row_wise", "column_wise", "data_parallel"])
def test_stale_set_is_exact_and_identical_on_every_rank_and_reactivates(kind):
    results = run_workers(staleness_worker, WORLD, kind=kind)
    assert results[0] == results[1], "ranks hold different change values"


def metered_worker(env, kind: str):
    from slipstream_rec.slipstream.rows import RowIndex, RowState
    from slipstream_rec.slipstream.tracker import StalenessTracker

    dmp, modules = _sharded(kind)
    index = RowIndex(FEATURES, ROWS)
    tracker = StalenessTracker(modules, index, RowState(index.num_rows))
    given = []
    tracker.meter = given.append
    tracker.set_counting(True)
    dmp(_slice_batch(env.rank * LOCAL_BATCH, (env.rank + 1) * LOCAL_BATCH))
    tracker.set_counting(False)
    replicated = sum(u.sparse_counts()[0].numel() for u in modules[0].units if u.replicated)
    tracker.select_hot(budget_bytes=1 << 30, min_count=1)
    chosen = list(given)
    tracker.snapshot()
    first = given[len(chosen):]
    with torch.no_grad():
        for unit in modules[0].units:
            unit.weights[unit.hot_rows, 0] += 0.01
    tracker.snapshot()
    measured = given[len(chosen) + len(first):]
    held = sum(u.hot_rows.numel() for u in modules[0].units)  # ample budget: every offered row is hot
    return {"chosen": chosen, "first": first, "measured": measured, "replicated": replicated, "held": held,
            "units": len(modules[0].units)}  # fmt: skip


@pytest.mark.parametrize("kind", ["table_wise", "column_wise", "data_parallel"])
def test_the_tracking_gathers_give_their_bytes_to_the_meter(kind):
    """Each gather gives the meter its size (8 bytes, where the sizes are not known) and its
    part padded to the longest rank's: the hot set's keys as int32 (the test's rows fit), counts
    as int32, a unit's (offers, row bytes) as two int64; a snapshot's flag (4 bytes), then every
    rank's units once (first key, rows: two int64 a unit), each unit's measured rows (an int32)
    and one float a row, no key (linf sends no second part)."""
    r = run_workers(metered_worker, WORLD, kind=kind)
    dp, held, units = (max(x[k] for x in r) for k in ("replicated", "held", "units"))
    assert held > 0 and (dp > 0) == (kind == "data_parallel")
    for x in r:
        assert x["chosen"] == [8 + 4 * dp, 8 + 4 * dp, 8 + 4 * held, 8 + 4 * held, 8 + 16 * units]
        assert x["first"] == [4]  # nothing to compare with: the flag alone
        assert x["measured"] == [4, 8 + 16 * units, 4 * units, 4 * held]


def lockstep_worker(env):
    from slipstream_rec.data.types import Batch, make_kjt
    from slipstream_rec.slipstream.controller import lockstep
    from slipstream_rec.slipstream.stream import SkippingStream

    def source():
        for i in range(20):
            ids = torch.arange(64).view(32, 2) % 5
            yield Batch(dense_features=torch.zeros(32, 13), sparse_features=make_kjt(["a", "b"], ids), labels=torch.zeros(32))

    # Rank 0 skips 60% of its samples, rank 1 none: rank 0's stream runs dry first.
    skip = 0.6 if env.rank == 0 else 0.0
    gen = torch.Generator().manual_seed(env.rank)

    def decide(batch):
        keep = torch.rand(batch.batch_size, generator=gen) >= skip
        return keep, torch.ones(batch.batch_size)

    stream = SkippingStream(source(), 16, decide)
    sizes = [b.batch_size for b in lockstep(stream)]
    return sizes, stream.samples_seen, stream.samples_skipped


def test_ranks_with_different_skip_rates_end_on_the_same_step_with_full_batches():
    (sizes0, seen0, skipped0), (sizes1, seen1, skipped1) = run_workers(lockstep_worker, WORLD)
    assert len(sizes0) == len(sizes1) > 0
    assert set(sizes0) == set(sizes1) == {16}
    assert skipped1 == 0 and skipped0 > 0.4 * seen0


def lockstep_every_worker(env, every: int):
    import slipstream_rec.slipstream.lockstep as controller
    from slipstream_rec.data.types import Batch, make_kjt
    from slipstream_rec.slipstream.stream import SkippingStream

    calls = []
    real = controller.all_reduce_

    def counting(t, op=None):
        calls.append(len(sizes))  # the step at which an agreement ran
        return real(t, op)

    controller.all_reduce_ = counting

    def source():
        for i in range(20):
            ids = torch.arange(64).view(32, 2) % 5
            yield Batch(dense_features=torch.full((32, 13), float(i)), sparse_features=make_kjt(["a", "b"], ids), labels=torch.zeros(32))

    skip = 0.6 if env.rank == 0 else 0.0  # rank 0 runs dry first, rank 1 holds more
    gen = torch.Generator().manual_seed(env.rank)

    def decide(batch):
        return torch.rand(batch.batch_size, generator=gen) >= skip, torch.ones(batch.batch_size)

    stream = SkippingStream(source(), 16, decide)
    sizes, firsts = [], []
    for b in controller.lockstep(stream, every=every):
        sizes.append(b.batch_size)
        firsts.append(float(b.dense_features[0, 0]))
    return sizes, firsts, calls, stream.samples_dropped_at_end


def test_lockstep_every_k_steps_agrees_k_steps_ahead_and_ends_on_the_same_step():
    per_step = run_workers(lockstep_every_worker, WORLD, every=1)
    every4 = run_workers(lockstep_every_worker, WORLD, every=4)
    steps = len(per_step[0][0])
    for rank in range(WORLD):
        sizes, firsts, calls, dropped = every4[rank]
        # The same batches, the same number of steps as agreeing every step.
        assert sizes == per_step[rank][0] and firsts == per_step[rank][1]
        # One agreement every 4 steps: at steps 0, 4, 8, ... and none in between.
        assert calls == list(range(0, steps, 4)), calls
        assert len(per_step[rank][2]) == steps + 1  # the per-step path: one every step
    assert len(every4[0][0]) == len(every4[1][0]) == steps > 4
    assert steps % 4 != 0, "rank 0 runs out inside a window of 4: the case under test"
    assert every4[1][3] > 0  # rank 1 built batches ahead that nobody trains: dropped
