"""RowIndex and RowState (slipstream_rec.slipstream.rows)."""

from __future__ import annotations

import math

import pytest
import torch

from slipstream_rec.data.types import make_kjt
from slipstream_rec.slipstream.rows import RowIndex, RowState
from tests.slipstream._util import bags, random_kjt
from tests.slipstream.reference import dense_change, hot_mask, lookup_changes, stale_mask

KEYS = ["a", "b", "c"]
NUMS = [5, 1, 7]


def test_offsets_round_trip() -> None:
    idx = RowIndex(KEYS, NUMS)
    assert idx.num_rows == 13
    assert idx.offsets.tolist() == [0, 5, 6]
    assert idx.to_flat(2, torch.tensor([0, 6])).tolist() == [6, 12]
    keys = torch.arange(13)
    f, r = idx.from_flat(keys)
    assert f.tolist() == [0] * 5 + [1] + [2] * 7
    assert r.tolist() == [0, 1, 2, 3, 4, 0, 0, 1, 2, 3, 4, 5, 6]
    assert torch.equal(idx.to_flat(f, r), keys)
    with pytest.raises(ValueError):
        idx.from_flat(torch.tensor([13]))


def test_flat_keys_multi_hot_and_one_hot() -> None:
    gen = torch.Generator().manual_seed(0)
    idx = RowIndex(KEYS, NUMS)
    kjt = random_kjt(gen, KEYS, NUMS, batch=9, max_len=3, empty_sample_every=4)
    want = []
    bb = bags(kjt)
    for f in range(3):
        for s in range(9):
            want.extend(int(idx.offsets[f]) + v for v in bb[s][f])
    assert idx.flat_keys(kjt, validate=True).tolist() == want
    one = make_kjt(KEYS, torch.tensor([[1, 0, 6], [4, 0, 2]]))
    assert idx.flat_keys(one).tolist() == [1, 4, 5, 5, 12, 8]


def test_flat_keys_rejects_unknown_key_and_bad_ids() -> None:
    idx = RowIndex(KEYS, NUMS)
    with pytest.raises(ValueError, match="'z'"):
        idx.flat_keys(make_kjt(["a", "z", "c"], torch.zeros(2, 3, dtype=torch.int64)))
    with pytest.raises(ValueError, match="'b'"):
        idx.flat_keys(make_kjt(KEYS, torch.tensor([[0, 1, 0]])), validate=True)


def test_row_state() -> None:
    st = RowState(13)
    assert dense_change(st).dtype == torch.float32 and bool(torch.isinf(dense_change(st)).all())
    assert not bool(hot_mask(st).any()) and not bool(stale_mask(st, 1e30).any())
    st.set_changes(torch.tensor([1, 4, 12]), torch.tensor([0.5, 0.0, 2.0]))
    assert hot_mask(st).nonzero().view(-1).tolist() == [1, 4, 12]
    assert stale_mask(st, 0.5).nonzero().view(-1).tolist() == [4]  # strict
    assert stale_mask(st, 2.0).nonzero().view(-1).tolist() == [1, 4]
    st.set_changes(torch.tensor([4]), torch.tensor([math.inf]))  # back to not hot
    assert st.num_hot == 2
    with pytest.raises(ValueError):
        st.set_changes(torch.tensor([0]), torch.tensor([-1.0]))
    with pytest.raises(ValueError):
        st.set_changes(torch.tensor([0]), torch.tensor([math.nan]))
    with pytest.raises(ValueError):
        st.set_changes(torch.tensor([13]), torch.tensor([1.0]))
    st.reset()
    assert st.num_hot == 0


def test_flat_keys_with_keys_in_another_order_or_a_subset() -> None:
    idx = RowIndex(KEYS, NUMS)
    kjt = make_kjt(["c", "a"], torch.tensor([[6, 4], [0, 1]]))
    assert idx.flat_keys(kjt).tolist() == [12, 6, 4, 1]
    assert idx.feature_indices(["c", "a"]).tolist() == [2, 0]


def test_to_flat_rejects_rows_outside_the_table() -> None:
    idx = RowIndex(KEYS, NUMS)
    with pytest.raises(ValueError, match="'b'"):
        idx.to_flat(1, torch.tensor([1]))
    with pytest.raises(ValueError):
        idx.to_flat(torch.tensor([0, 1]), torch.tensor([4, 1]))


def test_row_state_is_sparse_and_lookups_match_the_dense_reference() -> None:
    # One small table (dense view), one large with few hot rows (sorted keys, binary search).
    RowState.DENSE_SMALL_BYTES, saved = 64, RowState.DENSE_SMALL_BYTES
    try:
        idx = RowIndex(["small", "large"], [10, 100_000])
        st = RowState(idx.num_rows, idx)
        gen = torch.Generator().manual_seed(0)
        hot = torch.cat([torch.tensor([1, 3, 9]), 10 + torch.randperm(100_000, generator=gen)[:50]])
        st.set_changes(hot, torch.rand(hot.numel(), generator=gen))
        st.set_changes(torch.tensor([3]), torch.tensor([math.inf]))  # row 3 is no longer hot
        assert st.num_hot == 52 and st.keys.tolist() == sorted(st.keys.tolist())
        ids = torch.stack([torch.randint(0, 10, (200,), generator=gen), hot[3 + torch.arange(200) % 50] - 10])
        ids[1, ::3] = torch.randint(0, 100_000, (67,), generator=gen)  # mostly not hot
        kjt = make_kjt(["small", "large"], ids.t())
        want = lookup_changes(kjt, idx, dense_change(st))
        assert torch.equal(st.lookup_changes(idx, kjt), want)
        assert torch.equal(st.changes_of(idx.flat_keys(kjt)), want)
        assert set(st._dense) == {0} and set(st._sparse) == {1}
        # Memory follows the hot rows, not the 100k rows of the large table.
        assert st.nbytes() <= 52 * 12 * 2 + 10 * 4
        saved_state = st.state_dict()
        other = RowState(idx.num_rows, idx)
        other.load_state_dict(saved_state)
        assert torch.equal(dense_change(other), dense_change(st))
    finally:
        RowState.DENSE_SMALL_BYTES = saved
