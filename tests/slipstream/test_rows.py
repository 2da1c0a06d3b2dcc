"""RowIndex and RowState (slipstream_rec.slipstream.rows)."""

from __future__ import annotations

import math

import pytest
import torch

from slipstream_rec.data.types import make_kjt
from slipstream_rec.slipstream.rows import RowIndex, RowState
from tests.slipstream._util import bags, random_kjt

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
    assert st.change.dtype == torch.float32 and bool(torch.isinf(st.change).all())
    assert not bool(st.hot_mask.any()) and not bool(st.stale_mask(1e30).any())
    st.set_changes(torch.tensor([1, 4, 12]), torch.tensor([0.5, 0.0, 2.0]))
    assert st.hot_mask.nonzero().view(-1).tolist() == [1, 4, 12]
    assert st.stale_mask(0.5).nonzero().view(-1).tolist() == [4]  # strict
    assert st.stale_mask(2.0).nonzero().view(-1).tolist() == [1, 4]
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
