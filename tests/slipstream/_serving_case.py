"""The one-process serving case: three small tables, a replica of some of their rows, six samples.

tests/slipstream/serve/test_split.py computes its expectations from these in plain loops;
tests/training/test_fake_device.py runs the same batch with the model on ``meta``;
tests/slipstream/test_lockstep_dist.py agrees on its split across two ranks.
"""

from __future__ import annotations

import torch
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from slipstream_rec.data.types import Batch
from slipstream_rec.sharding.sharded import ShardUnit
from slipstream_rec.slipstream.rows import RowIndex
from slipstream_rec.slipstream.serve.replica import StaleReplica

FEATURES = ["a", "b", "c"]
ROWS = [6, 9, 4]
DIM = 3

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


def _replica_keys(index):
    """The flat keys of the case's replica rows (``REPLICA``), in ``index``'s numbering."""
    return torch.cat([index.to_flat(f, torch.tensor(REPLICA[name])) for f, name in enumerate(FEATURES)])


def _replica(column_split: bool = False):
    index = RowIndex(FEATURES, ROWS)
    tables = _tables()
    replica = StaleReplica(index, DIM, torch.device("cpu"))
    replica.rebuild(_units(tables, column_split), _replica_keys(index), {n: i for i, n in enumerate(FEATURES)})
    return replica, tables, index
