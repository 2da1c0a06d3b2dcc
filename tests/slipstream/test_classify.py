"""classify.py against naive per-sample Python loops."""

from __future__ import annotations

import math

import pytest
import torch

from slipstream_rec.data.types import make_kjt
from slipstream_rec.slipstream.classify import (
    lookups_per_sample,
    per_sample_max_change,
    skippable,
    skippable_by_threshold,
    stale_fraction_per_sample,
)
from slipstream_rec.slipstream.rows import RowIndex, RowState
from tests.slipstream._util import bags, random_kjt
from tests.slipstream.reference import dense_change, lookup_changes, stale_mask

KEYS = [f"f{i}" for i in range(5)]
NUMS = [11, 3, 20, 1, 8]


def _state(gen: torch.Generator, idx: RowIndex, hot_frac: float = 0.7) -> RowState:
    st = RowState(idx.num_rows, idx)
    hot = (torch.rand(idx.num_rows, generator=gen) < hot_frac).nonzero().view(-1)
    # Quantised changes so ties and exact-threshold hits happen.
    st.set_changes(hot, torch.randint(0, 10, (hot.numel(),), generator=gen).float() / 4)
    return st


def _naive(kjt, idx, change, stale, alpha):
    mx, frac, skip = [], [], []
    for sample in bags(kjt):
        keys = [int(idx.offsets[f]) + v for f, bag in enumerate(sample) for v in bag]
        if not keys:
            mx.append(math.inf), frac.append(0.0), skip.append(False)
            continue
        mx.append(max(float(change[k]) for k in keys))
        n_stale = sum(bool(stale[k]) for k in keys)
        frac.append(n_stale / len(keys))
        skip.append(n_stale == len(keys) if alpha == 1.0 else n_stale / len(keys) >= alpha)
    return mx, frac, skip


@pytest.mark.parametrize("max_len, empty_every", [(1, 0), (3, 0), (3, 5), (0, 0), (2, 1)])
@pytest.mark.parametrize("alpha", [1.0, 0.5, 0.3, 0.01])
def test_against_naive_loop(max_len: int, empty_every: int, alpha: float) -> None:
    gen = torch.Generator().manual_seed(max_len * 100 + empty_every)
    idx = RowIndex(KEYS, NUMS)
    for trial in range(5):  # each threshold once, the infinite one included
        st = _state(gen, idx)
        kjt = random_kjt(gen, KEYS, NUMS, batch=37, max_len=max_len, empty_sample_every=empty_every)
        if max_len == 1:  # also the loader's layout: exactly one id per bag
            kjt = make_kjt(KEYS, torch.stack([torch.randint(0, n, (37,), generator=gen) for n in NUMS], 1))
        thr = [0.0, 0.5, 1.25, 2.5, math.inf][trial % 5]
        change, stale = dense_change(st), stale_mask(st, thr)
        mx, frac, skip = _naive(kjt, idx, change, stale, alpha)
        # The RowState (sparse keys, per-table lookup view) gives every lookup the dense
        # reference's change, and decides as the loop over the dense reference does.
        assert torch.equal(st.lookup_changes(idx, kjt), lookup_changes(kjt, idx, change))
        got_mx = per_sample_max_change(kjt, idx, st)
        assert got_mx.tolist() == mx
        got_frac = stale_fraction_per_sample(kjt, idx, stale)
        assert got_frac.dtype == torch.float32
        assert torch.allclose(got_frac, torch.tensor(frac, dtype=torch.float32))
        assert skippable(kjt, idx, stale, alpha).tolist() == skip
        assert skippable_by_threshold(kjt, idx, st, thr, alpha).tolist() == skip
        assert lookups_per_sample(kjt).tolist() == [sum(len(b) for b in s) for s in bags(kjt)]


def test_alpha_one_never_drops_a_sample_with_a_fresh_lookup() -> None:
    gen = torch.Generator().manual_seed(7)
    idx = RowIndex(KEYS, NUMS)
    st = _state(gen, idx, hot_frac=0.95)
    kjt = random_kjt(gen, KEYS, NUMS, batch=500, max_len=4, empty_sample_every=7)
    for thr in [0.25, 1.0, 2.0, 100.0]:
        stale = stale_mask(st, thr)
        sk = skippable(kjt, idx, stale, 1.0)
        if thr == 100.0:
            assert sk.any() and not sk.all()
        for s, sample in enumerate(bags(kjt)):
            keys = [int(idx.offsets[f]) + v for f, bag in enumerate(sample) for v in bag]
            if any(not bool(stale[k]) for k in keys) or not keys:
                assert not bool(sk[s])
        # all stale <=> max change < T
        assert torch.equal(sk, per_sample_max_change(kjt, idx, st) < thr)


def test_empty_samples_never_skippable_even_at_infinite_threshold() -> None:
    idx = RowIndex(["a", "b"], [3, 3])
    st = RowState(6)
    st.set_changes(torch.arange(6), torch.zeros(6))
    from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

    kjt = KeyedJaggedTensor(
        keys=["a", "b"], values=torch.tensor([0, 1]), lengths=torch.tensor([1, 0, 0, 1], dtype=torch.int32), stride=2
    )
    kjt_empty = KeyedJaggedTensor(
        keys=["a", "b"], values=torch.tensor([0]), lengths=torch.tensor([1, 0, 0, 0], dtype=torch.int32), stride=2
    )
    for alpha in [1.0, 0.5]:
        assert skippable_by_threshold(kjt, idx, st, math.inf, alpha).tolist() == [True, True]
        assert skippable_by_threshold(kjt_empty, idx, st, math.inf, alpha).tolist() == [True, False]
        assert skippable(kjt_empty, idx, stale_mask(st, math.inf), alpha).tolist() == [True, False]
    assert per_sample_max_change(kjt_empty, idx, st).tolist() == [0.0, math.inf]
    assert skippable_by_threshold(kjt, idx, st, None).tolist() == [False, False]


def test_alpha_validation() -> None:
    idx = RowIndex(["a"], [2])
    kjt = make_kjt(["a"], torch.zeros(3, 1, dtype=torch.int64))
    for bad in [0.0, -0.1, 1.5, math.nan]:
        with pytest.raises(ValueError, match="slipstream.alpha"):
            skippable(kjt, idx, torch.zeros(2, dtype=torch.bool), bad)
