"""The serve action's local parts, in one process: replica, split, served gradients.

Expected values come from plain Python loops over the samples and their ids (the independent
reference), never from the functions under test.
"""

from __future__ import annotations

import pytest
import torch
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from slipstream_rec.data.types import Batch
from slipstream_rec.slipstream.lockstep import lockstep
from slipstream_rec.slipstream.push import ServedGradients, served_rows
from slipstream_rec.slipstream.replica import StaleReplica
from slipstream_rec.slipstream.rows import RowIndex
from slipstream_rec.slipstream.serving import ServePlan
from slipstream_rec.slipstream.sharded import ShardUnit

FEATURES = ["a", "b", "c"]
ROWS = [6, 9, 4]
DIM = 3


def _tables():
    g = torch.Generator().manual_seed(3)
    return [torch.randn(n, DIM, generator=g) for n in ROWS]


def _units(tables, column_split: bool = False):
    """Local shards of every table as one rank would hold them: whole tables, or (column_split)
    two column shards of table b next to whole a and c."""
    units = []
    for name, w in zip(FEATURES, tables):
        if column_split and name == "b":
            for c0, c1 in ((0, 1), (1, DIM)):
                units.append(ShardUnit(f"t_{name}", name, "column_wise", 0, 0, 0, c0, w.shape[0], c1 - c0, False, weights=w[:, c0:c1]))
        else:
            units.append(ShardUnit(f"t_{name}", name, "table_wise", 0, 0, 0, 0, w.shape[0], DIM, False, weights=w))
    return units


# Samples (bags per feature a, b, c); the replica holds rows a:{0,1,2}, b:{0,5}, c:{1,3}.
SAMPLES = [
    ([0], [5], [1]),  # servable
    ([1, 2], [0, 0], []),  # servable (an empty bag is fine, a repeated id counts twice)
    ([3], [0], [1]),  # a=3 is not in the replica
    ([], [], []),  # no lookup: never servable
    ([2], [5, 0], [3, 1]),  # servable
    ([0], [8], [3]),  # b=8 is not in the replica
]
REPLICA = {"a": [0, 1, 2], "b": [0, 5], "c": [1, 3]}


def _kjt(samples):
    lengths, values = [], []
    for f in range(len(FEATURES)):
        for s in samples:
            lengths.append(len(s[f]))
            values.extend(s[f])
    return KeyedJaggedTensor(
        keys=FEATURES, values=torch.tensor(values, dtype=torch.int64),
        lengths=torch.tensor(lengths, dtype=torch.int32), stride=len(samples),
    )  # fmt: skip


def _batch(samples):
    n = len(samples)
    return Batch(
        dense_features=torch.arange(n * 2, dtype=torch.float32).view(n, 2),
        sparse_features=_kjt(samples),
        labels=torch.tensor([float(i % 2) for i in range(n)]),
    )


def _replica(column_split: bool = False):
    index = RowIndex(FEATURES, ROWS)
    tables = _tables()
    replica = StaleReplica(index, DIM, torch.device("cpu"))
    keys = torch.cat([index.to_flat(f, torch.tensor(REPLICA[name])) for f, name in enumerate(FEATURES)])
    replica.rebuild(_units(tables, column_split), keys, {n: i for i, n in enumerate(FEATURES)})
    return replica, tables, index


def _reference_pooled(samples, tables):
    out = torch.zeros(len(samples), len(FEATURES), DIM)
    for i, s in enumerate(samples):
        for f in range(len(FEATURES)):
            for row in s[f]:
                out[i, f] += tables[f][row]
    return out


SERVABLE = [0, 1, 4]


@pytest.mark.parametrize("column_split", [False, True])
def test_replica_rows_servable_samples_and_pooled_embeddings(column_split):
    replica, tables, _ = _replica(column_split)
    assert replica.rows == 7 and replica.joined == 7 and replica.left == 0
    for key, value in zip(replica.keys.tolist(), replica.values):
        f = 0 if key < 6 else (1 if key < 15 else 2)
        row = key - [0, 6, 15][f]
        assert torch.equal(value, tables[f][row])  # full rows, columns assembled from the shards
    mask = replica.servable(_kjt(SAMPLES))
    assert mask.tolist() == [i in SERVABLE for i in range(len(SAMPLES))]
    served = [SAMPLES[i] for i in SERVABLE]
    torch.testing.assert_close(replica.pooled(_kjt(served)), _reference_pooled(served, tables))


def test_a_rebuild_reports_the_rows_that_joined_and_left():
    replica, tables, index = _replica()
    units = _units(tables)
    keys = torch.cat([index.to_flat(0, torch.tensor([0, 4])), index.to_flat(2, torch.tensor([1, 3]))])
    replica.rebuild(units, keys, {n: i for i, n in enumerate(FEATURES)})
    # before: a0 a1 a2 b0 b5 c1 c3; after: a0 a4 c1 c3
    assert (replica.joined, replica.left, replica.rows) == (1, 4, 4)
    assert not replica.servable(_kjt(SAMPLES)).any()  # every sample touched a row that left, or b


def test_split_orders_sharded_samples_first_and_serves_the_rest():
    replica, tables, _ = _replica()
    plan = ServePlan(replica)
    batch = _batch(SAMPLES)
    needed = plan.annotate(batch)
    assert needed == 3 and batch.servable.tolist() == [i in SERVABLE for i in range(len(SAMPLES))]
    # Another rank needed 4: one servable sample (the first, sample 0) goes through the shards too.
    out = plan.split(batch, 4)
    order = [2, 3, 5, 0, 1, 4]  # needed (in order), then servable (in order)
    assert out.batch_size == 6 and out.sharded_size == 4
    assert out.dense_features[:, 0].tolist() == [2.0 * i for i in order]
    assert out.labels.tolist() == [float(i % 2) for i in order]
    served = [SAMPLES[i] for i in order[4:]]
    torch.testing.assert_close(out.served_pooled, _reference_pooled(served, tables))
    assert out.sparse_features.stride() == 4
    assert out.sparse_features.lengths().view(3, 4).tolist() == [[len(SAMPLES[i][f]) for i in order[:4]] for f in range(3)]
    assert out.served_features.stride() == 2
    assert plan.samples_served == 2 and plan.lookups_served == 4 + 5  # samples 1 (4 ids) and 4 (5 ids)


def test_without_a_replica_every_sample_goes_through_the_shards():
    plan = ServePlan(None)
    batch = _batch(SAMPLES)
    assert plan.annotate(batch) == len(SAMPLES)
    out = next(lockstep(iter([batch]), plan=plan))  # one process: the agreement is local
    assert out is batch and out.served_pooled is None and plan.samples_served == 0


def test_one_process_lockstep_sends_exactly_the_needed_samples():
    replica, _, _ = _replica()
    plan = ServePlan(replica)
    out = next(lockstep(iter([_batch(SAMPLES)]), plan=plan))
    assert out.sharded_size == 3 and out.served_pooled.shape == (3, 3, DIM)


def test_served_gradients_sum_per_row_over_every_occurrence():
    index = RowIndex(FEATURES, ROWS)
    grads = ServedGradients(index, DIM)
    served = [SAMPLES[i] for i in SERVABLE]
    g = torch.Generator().manual_seed(5)
    bag_grads = [torch.randn(len(served), len(FEATURES), DIM, generator=g) for _ in range(2)]
    for bg in bag_grads:  # two steps
        grads.add(served_rows(_kjt(served), index), bg)
    expected = {}
    for bg in bag_grads:
        for i, s in enumerate(served):
            for f in range(len(FEATURES)):
                for row in s[f]:
                    key = int(index.offsets[f]) + row
                    expected[key] = expected.get(key, torch.zeros(DIM)) + bg[i, f]
    assert grads.keys.tolist() == sorted(expected)
    torch.testing.assert_close(grads.grads, torch.stack([expected[k] for k in sorted(expected)]))
