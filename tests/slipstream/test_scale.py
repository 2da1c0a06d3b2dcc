"""Slipstream at production scale (issue 12): exact hot budget over the rows a shard offers, int64
counts with exact ties, bounded window statistics, per-rank random streams on any resume.

Single-process tests of the tracker use hand-built shard units (no DMP): with no process group
every collective of the tracker is the identity, so the selection is exactly the local one.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import List

import torch

from slipstream_rec.data.types import Batch, make_kjt
from slipstream_rec.slipstream.rows import RowIndex, RowState
from slipstream_rec.slipstream.decide import SkipDecider
from slipstream_rec.sharding.sharded import ShardUnit
from slipstream_rec.slipstream.tracker import StalenessTracker

COLS = 4  # float32 columns: 16 bytes a row


def _unit(feature: str, rows: int, counts: List[int], row_offset: int = 0) -> ShardUnit:
    unit = ShardUnit(
        table=f"t_{feature}", feature=feature, sharding_type="table_wise", group=0, position=0,
        row_offset=row_offset, col_offset=0, rows=rows, cols=COLS, replicated=False,
        weights=torch.zeros(rows, COLS),
    )  # fmt: skip
    unit.add_counts(torch.repeat_interleave(torch.arange(rows), torch.tensor(counts)))
    assert unit.count_table().tolist() == counts
    return unit


def _tracker(units: List[ShardUnit], features: List[str], nums: List[int]) -> StalenessTracker:
    module = SimpleNamespace(units=units, register_post_lookup_tracker_fn=lambda fn: None)
    index = RowIndex(features, nums)
    return StalenessTracker([module], index, RowState(index.num_rows))  # type: ignore[list-item]


def test_one_shard_never_gets_more_hot_rows_than_fit():
    # The example: 10 rows counted 10..1, room for 3 rows.
    unit = _unit("a", 10, list(range(10, 0, -1)))
    tracker = _tracker([unit], ["a"], [10])
    sel = tracker.select_hot(budget_bytes=3 * 4 * COLS, min_count=1)
    assert unit.hot_rows.tolist() == [0, 1, 2]
    assert tracker.hot_keys.tolist() == [0, 1, 2]
    assert sel.hot_rows == 3 and sel.hot_bytes == 3 * 4 * COLS


def test_ties_at_the_boundary_fill_the_budget_exactly_by_key_order():
    # Counts past float32's exact range of +1e-3: 32768 + 1e-3 rounds back to 32768 in float32.
    a = _unit("a", 3, [40000, 32768, 32768])
    b = _unit("b", 2, [32768, 32768])
    tracker = _tracker([a, b], ["a", "b"], [3, 2])
    sel = tracker.select_hot(budget_bytes=3 * 4 * COLS, min_count=1)
    # (count desc, key asc): a0 (40000), then the ties a1, a2, b0, b1 in key order.
    assert tracker.hot_keys.tolist() == [0, 1, 2]
    assert a.hot_rows.tolist() == [0, 1, 2] and b.hot_rows.tolist() == []
    assert sel.hot_bytes == 3 * 4 * COLS and sel.min_count_used == 32768


def test_a_budget_of_several_shards_is_exact_over_the_offers():
    gen = torch.Generator().manual_seed(0)
    counts = [torch.randint(1, 6, (50,), generator=gen) for _ in range(3)]
    units = [_unit(f, 50, c.tolist()) for f, c in zip("abc", counts)]
    tracker = _tracker(units, list("abc"), [50, 50, 50])
    tracker.select_hot(budget_bytes=37 * 4 * COLS, min_count=2)
    flat = torch.cat(counts)
    eligible = torch.nonzero(flat >= 2).flatten()
    order = sorted(eligible.tolist(), key=lambda k: (-int(flat[k]), k))
    assert tracker.hot_keys.tolist() == sorted(order[:37])


def test_counts_are_int64_past_float32_precision():
    n = (1 << 24) + 3  # float32 counts stop at 2**24
    unit = ShardUnit(
        table="t_a", feature="a", sharding_type="table_wise", group=0, position=0, row_offset=0,
        col_offset=0, rows=4, cols=COLS, replicated=False, weights=torch.zeros(4, COLS),
    )  # fmt: skip
    tracker = _tracker([unit], ["a"], [4])
    kjt = make_kjt(["a"], torch.zeros(n, 1, dtype=torch.int64))
    tracker.counter.count_lookups(tracker.modules[0], kjt)
    counts = unit.count_table()
    assert counts[0] == n and counts.dtype == torch.int64


def _batch(n: int) -> Batch:
    ids = torch.arange(n) % 10
    return Batch(dense_features=torch.zeros(n, 13), sparse_features=make_kjt(["a"], ids.view(-1, 1)), labels=torch.zeros(n))


def test_completed_windows_are_bounded_without_a_reader():
    index = RowIndex(["a"], [10])
    dec = SkipDecider(index, RowState(10), threshold=1.0, window_samples=2, keep_windows=8)
    for _ in range(50):
        dec(_batch(10))  # 5 windows a batch, 250 in all, nobody pops them
    wins = dec.pop_completed_windows()
    assert len(wins) == 8 and [w.index for w in wins] == list(range(242, 250))
    assert dec.windows_dropped == 242 and dec.totals.samples == 500


def test_a_resumed_rank_keeps_its_own_random_stream():
    index = RowIndex(["a"], [10])
    state = RowState(10)
    kw = dict(threshold=1.0, keep_probability=0.5, random_fraction=0.0)
    rank0 = SkipDecider(index, state, seed=1000, **kw)
    rank0(_batch(100))
    saved = rank0.state_dict()
    # Same rank, same seed: the stream continues exactly.
    again = SkipDecider(index, state, seed=1000, **kw)
    again.load_state_dict(saved)
    assert torch.equal(again._gen.get_state(), rank0._gen.get_state())
    # Another world size: every rank loads rank 0's file. Rank 1 must not draw rank 0's stream,
    # and two ranks that load the same file must not draw the same numbers either.
    rank1 = SkipDecider(index, state, seed=1001, **kw)
    rank1.load_state_dict(saved)
    rank2 = SkipDecider(index, state, seed=1002, **kw)
    rank2.load_state_dict(saved)
    a, b, c = (torch.rand(64, generator=d._gen) for d in (again, rank1, rank2))
    assert not torch.equal(a, b) and not torch.equal(b, c) and not torch.equal(a, c)
    # The negative downsampler's stream (its own module) follows the same rule.
    from slipstream_rec.training.downsampling import NegativeDownsampler

    down0 = NegativeDownsampler(0.5, seed=1000)
    down0.drop_mask(torch.zeros(100))
    saved_down = down0.state_dict()
    own, other = NegativeDownsampler(0.5, seed=1000), NegativeDownsampler(0.5, seed=1001)
    own.load_state_dict(saved_down)
    other.load_state_dict(saved_down)
    assert torch.equal(own.drop_mask(torch.zeros(64)), down0.drop_mask(torch.zeros(64)))
    assert not torch.equal(torch.rand(64, generator=other._gen), torch.rand(64, generator=own._gen))
    # What is not random carries over.
    assert rank1.totals == rank0.totals and rank1.current_window == rank0.current_window
    # Reseeding is reproducible: the same rank loading the same file draws the same numbers.
    twin = SkipDecider(index, state, seed=1001, **kw)
    twin.load_state_dict(saved)
    assert torch.equal(torch.rand(64, generator=twin._gen), b)


def _state_bytes_after_two_snapshots(rows: int) -> tuple:
    from slipstream_rec.slipstream.controller import SlipstreamController  # noqa: F401 (import check)

    gen = torch.Generator().manual_seed(3)
    units = []
    for f in "ab":
        unit = ShardUnit(
            table=f"t_{f}", feature=f, sharding_type="table_wise", group=0, position=0,
            row_offset=0, col_offset=0, rows=rows, cols=COLS, replicated=False,
            weights=torch.zeros(1, COLS).expand(rows, COLS),  # no memory for the rows themselves
        )  # fmt: skip
        unit.add_counts(torch.randint(0, 2000, (20_000,), generator=gen))
        units.append(unit)
    tracker = _tracker(units, ["a", "b"], [rows, rows])
    sel = tracker.select_hot(budget_bytes=1500 * 4 * COLS, min_count=1)
    tracker.snapshot()
    tracker.snapshot()
    kjt = make_kjt(["a", "b"], torch.randint(0, 3000, (64, 2), generator=gen))
    tracker.row_state.lookup_changes(tracker.index, kjt)  # builds the lookup view
    held = tracker.state_bytes() + tracker.row_state.nbytes()
    return sel.hot_bytes, held, tracker.peak_bytes


def test_tracking_state_grows_with_the_hot_rows_not_the_tables():
    hot_small, held_small, peak_small = _state_bytes_after_two_snapshots(5_000_000)
    hot_big, held_big, peak_big = _state_bytes_after_two_snapshots(50_000_000)
    assert hot_small == hot_big == 1500 * 4 * COLS
    # 50M-row tables: a dense float32 change vector alone would be 400 MB.
    assert held_big == held_small and peak_big == peak_small
    assert peak_big <= 3 * hot_big + (1 << 20)


class _CachingTBE:
    """Stands in for a fused_uvm_caching TBE: the newest values of the rows sit in a cache until
    flush() writes them back to the host copy the weights view shows."""

    def __init__(self, weights: torch.Tensor) -> None:
        self.host = weights
        self.cache = weights.clone()  # what training updates
        self.lxu_cache_weights = torch.ones(1)
        self.flushes = 0

    def flush(self) -> None:
        self.host.copy_(self.cache)
        self.flushes += 1


def test_snapshots_flush_the_gpu_cache_first():
    unit = _unit("a", 6, [5, 5, 5, 1, 1, 1])
    tbe = _CachingTBE(unit.weights)
    unit.kernel = SimpleNamespace(emb_module=tbe)  # as TorchRec's kernel module wraps the TBE
    tracker = _tracker([unit], ["a"], [6])
    tracker.select_hot(budget_bytes=1 << 20, min_count=2)
    tracker.snapshot()
    tbe.cache[0] += 0.5  # trained: only in the cache
    assert tracker.snapshot()
    change = tracker.row_state.changes_of(torch.tensor([0, 1, 2]))
    assert change.tolist() == [0.5, 0.0, 0.0] and tbe.flushes == 2


def test_key_value_kernels_are_refused_with_the_fix():
    import pytest

    from slipstream_rec.sharding.sharded import discover_units

    table = SimpleNamespace(name="t_a")
    config = SimpleNamespace(embedding_tables=[table], compute_kernel=SimpleNamespace(value="key_value"))
    module = SimpleNamespace(split_embedding_weights=lambda: ([object()], torch.zeros(1), None))
    ebc = SimpleNamespace(
        _lookups=[SimpleNamespace(grouped_configs=[config], _emb_modules=[module])],
        _sharding_types=["row_wise"],
    )
    with pytest.raises(ValueError, match="sharding.compute_kernel=fused"):
        discover_units(ebc)  # type: ignore[arg-type]


def test_fp16_rows_are_budgeted_at_two_bytes_and_compared_in_fp32():
    unit = _unit("a", 4, [3, 3, 3, 3])
    unit.weights = torch.zeros(4, COLS, dtype=torch.float16)
    tracker = _tracker([unit], ["a"], [4])
    sel = tracker.select_hot(budget_bytes=2 * 2 * COLS, min_count=1)  # room for 2 fp16 rows
    assert sel.hot_rows == 2 and sel.hot_bytes == 2 * 2 * COLS
    tracker.snapshot()
    unit.weights[1, 0] += 0.25
    assert tracker.snapshot()
    assert tracker.row_state.changes_of(torch.tensor([0, 1])).tolist() == [0.0, 0.25]
