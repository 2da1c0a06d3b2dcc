"""SkippingStream: constant batch size, accounting, weights, look-ahead."""

from __future__ import annotations

from collections import Counter
from typing import List

import pytest
import torch

from slipstream_rec.data.types import Batch
from slipstream_rec.data.batch_ops import select_rows
from slipstream_rec.slipstream.stream import SkippingStream
from tests.slipstream._util import random_batch, row_ids

KEYS = ["a", "b", "c"]
NUMS = [10, 4, 30]


def _source(sizes: List[int], seed: int = 0, max_len: int = 2) -> List[Batch]:
    gen = torch.Generator().manual_seed(seed)
    out, first = [], 0
    for n in sizes:
        out.append(random_batch(gen, KEYS, NUMS, n, first_row=first, max_len=max_len, empty_sample_every=5))
        first += n
    return out


def _decide_by_id(batch: Batch):
    """Skip rows whose id % 3 == 0; weight kept rows by 1 + id / 1000."""
    ids = batch.dense_features[:, 0]
    return (ids.long() % 3 != 0), 1.0 + ids / 1000


@pytest.mark.parametrize("sizes, batch_size, lookahead", [([16] * 10, 16, 0), ([16] * 10, 7, 2), ([5, 0, 33, 1, 9], 4, 1), ([3, 3], 50, 3)])
def test_packing_and_accounting(sizes, batch_size, lookahead) -> None:
    src = _source(sizes)
    by_id = {}
    for b in src:
        for i, r in enumerate(row_ids(b)):
            by_id[r] = (b, i)
    stream = SkippingStream(iter(src), batch_size, _decide_by_id, lookahead_batches=lookahead)
    out = list(stream)
    assert stream.exhausted
    assert all(o.batch_size == batch_size for o in out)
    emitted = [r for o in out for r in row_ids(o)]
    all_ids = [r for b in src for r in row_ids(b)]
    kept = [r for r in all_ids if r % 3 != 0]
    assert stream.samples_seen == len(all_ids) == stream.samples_kept + stream.samples_skipped
    assert stream.samples_skipped == len(all_ids) - len(kept)
    assert stream.samples_dropped_at_end == len(kept) - len(emitted) < batch_size
    assert emitted == kept[: len(emitted)]  # source order, the tail dropped
    # weights multiplied, rows intact
    for o in out:
        for j, r in enumerate(row_ids(o)):
            b, i = by_id[r]
            assert abs(float(o.weights[j]) - float(b.weights[i]) * (1 + r / 1000)) < 1e-5
            one = select_rows(b, torch.tensor([i]))
            got = select_rows(o, torch.tensor([j]))
            assert torch.equal(one.sparse_features.values(), got.sparse_features.values())
            assert torch.equal(one.sparse_features.lengths(), got.sparse_features.lengths())
            assert torch.equal(one.dense_features, got.dense_features)
            assert one.labels.item() == got.labels.item()
    with pytest.raises(StopIteration):
        next(stream)


def test_random_keep_multiset() -> None:
    gen = torch.Generator().manual_seed(5)
    skipped: List[int] = []

    def decide(b: Batch):
        keep = torch.rand(b.batch_size, generator=gen) < 0.6
        skipped.extend(r for r, k in zip(row_ids(b), keep.tolist()) if not k)
        return keep, torch.full((b.batch_size,), 2.0)

    src = _source([37] * 13, seed=9)
    stream = SkippingStream(src, 32, decide, lookahead_batches=2)
    out = list(stream)
    emitted = Counter(r for o in out for r in row_ids(o))
    rest = Counter(r for b in src for r in row_ids(b)) - Counter(skipped)
    assert sum(rest.values()) - sum(emitted.values()) == stream.samples_dropped_at_end
    assert not emitted - rest  # emitted is a sub-multiset of (source - skipped)
    src_w = {r: float(w) for b in src for r, w in zip(row_ids(b), b.weights)}
    for o in out:  # source weights scaled by decide's weights
        assert o.weights.tolist() == [pytest.approx(2 * src_w[r]) for r in row_ids(o)]
    assert max(emitted.values()) == 1


def test_peek_upcoming_is_what_gets_classified_next_and_is_not_consumed() -> None:
    classified: List[List[int]] = []

    def decide(b: Batch):
        classified.append(row_ids(b))
        return torch.ones(b.batch_size, dtype=torch.bool), torch.ones(b.batch_size)

    src = _source([10] * 6)
    stream = SkippingStream(iter(src), 10, decide, lookahead_batches=2)
    peek = stream.peek_upcoming(15)
    assert row_ids(peek) == list(range(15)) and classified == []  # nothing classified yet
    assert row_ids(stream.peek_upcoming(15)) == list(range(15))  # idempotent
    assert row_ids(stream.peek_upcoming(100)) == list(range(20))  # bounded by the look-ahead
    first = next(stream)
    assert row_ids(first) == list(range(10)) and classified == [list(range(10))]
    assert row_ids(stream.peek_upcoming(15)) == list(range(10, 25))
    next(stream)
    assert classified[-1] == list(range(10, 20))
    out = list(stream)
    assert len(out) == 4 and stream.peek_upcoming(5) is None
    assert SkippingStream(iter(_source([4])), 2, decide).peek_upcoming(3) is None  # no look-ahead


def test_classification_is_late() -> None:
    """A decision rule changed between steps applies to every batch not yet classified."""
    state = {"skip": False}

    def decide(b: Batch):
        n = b.batch_size
        return torch.full((n,), not state["skip"]), torch.ones(n)

    stream = SkippingStream(iter(_source([8] * 4)), 8, decide, lookahead_batches=3)
    stream.peek_upcoming(100)
    next(stream)
    state["skip"] = True
    assert list(stream) == []
    assert stream.samples_skipped == 24 and stream.samples_kept == 8


def test_validation() -> None:
    with pytest.raises(ValueError, match="lookahead_batches"):
        SkippingStream(iter([]), 4, _decide_by_id, lookahead_batches=-1)
    with pytest.raises(ValueError):
        SkippingStream(iter([]), 0, _decide_by_id)
    bad = SkippingStream(iter(_source([4])), 2, lambda b: (torch.ones(3, dtype=torch.bool), torch.ones(3)))
    with pytest.raises(ValueError, match="keep"):
        next(bad)


@pytest.mark.parametrize("stop_after, prepared", [(0, 0), (1, 0), (4, 0), (5, 2), (7, 1)])
def test_state_dict_resumes_the_same_batches_weights_and_counters(stop_after, prepared) -> None:
    """A fresh stream loading the state, over a source restarted after source_batches_pulled
    batches, emits what the uninterrupted stream emits next (rows, weights) and ends with the
    same counters: the look-ahead, the carried rows and the batches built ahead come back."""
    src = _source([11, 16, 5, 23, 16, 9, 16, 30, 2, 16, 16], seed=3)

    def make(source):
        return SkippingStream(iter(source), 12, _decide_by_id, lookahead_batches=2)

    whole = list(make(src))
    first = make(src)
    head = [next(first) for _ in range(stop_after)]
    first.prepare(prepared)
    if stop_after in (1, 4):  # these stops hold kept rows carried into the next batch
        assert first.counters()["samples_carried"] > 0
    state = first.state_dict()
    resumed = make(src[first.source_batches_pulled:])
    resumed.load_state_dict(state)
    tail = list(resumed)
    got = head + tail
    assert [row_ids(b) for b in got] == [row_ids(b) for b in whole]
    assert [b.weights.tolist() for b in got] == [b.weights.tolist() for b in whole]
    reference = make(src)
    list(reference)
    assert resumed.counters() == reference.counters()
    assert resumed.samples_dropped_at_end == reference.samples_dropped_at_end
