"""The one-process serving case: three small tables, a replica of some of their rows, six samples.

tests/slipstream/serve/test_split.py computes its expectations from these in plain loops;
tests/training/test_fake_device.py runs the same batch with the model on ``meta``.
"""

from __future__ import annotations

import torch
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from slipstream_rec.data.types import Batch

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
