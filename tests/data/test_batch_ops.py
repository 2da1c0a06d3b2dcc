"""select_rows / concat_batches against direct construction."""

from __future__ import annotations

import pytest
import torch

from slipstream_rec.data.types import Batch, make_kjt
from slipstream_rec.data.batch_ops import concat_batches, select_rows, slice_rows
from tests.slipstream._util import bag_weights, bags, kjt_from_bags, random_batch

KEYS = ["a", "b", "c", "d"]
NUMS = [10, 4, 30, 2]


def _same(x: Batch, y: Batch) -> None:
    assert torch.equal(x.dense_features, y.dense_features)
    assert torch.equal(x.labels, y.labels)
    assert torch.equal(x.weights, y.weights)
    kx, ky = x.sparse_features, y.sparse_features
    assert kx.keys() == ky.keys() and kx.stride() == ky.stride()
    assert torch.equal(kx.lengths().int(), ky.lengths().int())
    assert torch.equal(kx.values(), ky.values())


@pytest.mark.parametrize("max_len, empty_every, weighted", [(1, 0, False), (3, 0, False), (3, 4, True), (0, 0, False)])
def test_select_rows_matches_direct_construction(max_len: int, empty_every: int, weighted: bool) -> None:
    gen = torch.Generator().manual_seed(1)
    b = random_batch(gen, KEYS, NUMS, 23, max_len=max_len, empty_sample_every=empty_every, weighted=weighted)
    for idx in [torch.tensor([5, 0, 22, 5, 7]), torch.arange(23).flip(0), torch.zeros(0, dtype=torch.int64)]:
        got = select_rows(b, idx)
        rows = bags(b.sparse_features)
        il = idx.tolist()
        want = Batch(
            dense_features=b.dense_features[idx],
            sparse_features=kjt_from_bags(KEYS, [rows[i] for i in il]),
            labels=b.labels[idx],
            weights=b.weights[idx],
        )
        _same(got, want)
        if weighted:
            w = bag_weights(b.sparse_features)
            assert bag_weights(got.sparse_features) == [w[i] for i in il]
    with pytest.raises(IndexError):
        select_rows(b, torch.tensor([23]))


@pytest.mark.parametrize("max_len", [1, 3])
def test_concat_round_trip(max_len: int) -> None:
    gen = torch.Generator().manual_seed(2)
    empty = 3 if max_len > 1 else 0
    parts = [
        random_batch(gen, KEYS, NUMS, n, first_row=100 * i, max_len=max_len, empty_sample_every=empty, weighted=True)
        for i, n in enumerate([5, 1, 9, 0])
    ]
    got = concat_batches(parts)
    rows = [r for p in parts for r in bags(p.sparse_features)]
    want = Batch(
        dense_features=torch.cat([p.dense_features for p in parts]),
        sparse_features=kjt_from_bags(KEYS, rows),
        labels=torch.cat([p.labels for p in parts]),
        weights=torch.cat([p.weights for p in parts]),
    )
    _same(got, want)
    assert bag_weights(got.sparse_features) == [w for p in parts for w in bag_weights(p.sparse_features)]
    # split back with slice_rows
    start = 0
    for p in parts:
        _same(slice_rows(got, start, start + p.batch_size), p)
        start += p.batch_size


def test_concat_rejects_different_keys() -> None:
    x = Batch(torch.zeros(2, 13), make_kjt(["a", "b"], torch.zeros(2, 2, dtype=torch.int64)), torch.zeros(2))
    y = Batch(torch.zeros(2, 13), make_kjt(["b", "a"], torch.zeros(2, 2, dtype=torch.int64)), torch.zeros(2))
    with pytest.raises(ValueError, match="keys"):
        concat_batches([x, y])
