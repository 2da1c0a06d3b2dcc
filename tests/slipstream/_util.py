"""Random batches and naive per-sample references for the slipstream tests."""

from __future__ import annotations

import math
from typing import List, Optional, Sequence

import torch
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from slipstream_rec.data.types import Batch


def random_kjt(
    gen: torch.Generator,
    keys: Sequence[str],
    nums: Sequence[int],
    batch: int,
    max_len: int = 3,
    empty_sample_every: int = 0,
    weighted: bool = False,
) -> KeyedJaggedTensor:
    """Multi-hot KJT with bag sizes in [0, max_len]; every `empty_sample_every`-th sample has none."""
    f = len(keys)
    lengths = torch.randint(0, max_len + 1, (f, batch), generator=gen, dtype=torch.int32)
    if empty_sample_every:
        lengths[:, ::empty_sample_every] = 0
    values = []
    for i, n in enumerate(nums):
        values.append(torch.randint(0, n, (int(lengths[i].sum()),), generator=gen, dtype=torch.int64))
    vals = torch.cat(values) if values else torch.zeros(0, dtype=torch.int64)
    weights = torch.rand(vals.numel(), generator=gen) if weighted else None
    return KeyedJaggedTensor(keys=list(keys), values=vals, lengths=lengths.reshape(-1), weights=weights, stride=batch)


def random_batch(gen: torch.Generator, keys, nums, batch: int, first_row: int = 0, **kw) -> Batch:
    """A batch whose dense column 0 is a unique row id (first_row, first_row + 1, ...)."""
    dense = torch.rand(batch, 13, generator=gen)
    dense[:, 0] = torch.arange(first_row, first_row + batch, dtype=torch.float32)
    return Batch(
        dense_features=dense,
        sparse_features=random_kjt(gen, keys, nums, batch, **kw),
        labels=(torch.rand(batch, generator=gen) < 0.3).float(),
        weights=torch.rand(batch, generator=gen) + 0.5,
    )


def bags(kjt: KeyedJaggedTensor) -> List[List[List[int]]]:
    """bags[b][f] = list of ids of sample b, feature f (naive, from offsets)."""
    f, b = len(kjt.keys()), kjt.stride()
    off = kjt.offsets().tolist()
    vals = kjt.values().tolist()
    return [[vals[off[i * b + s]: off[i * b + s + 1]] for i in range(f)] for s in range(b)]


def bag_weights(kjt: KeyedJaggedTensor) -> Optional[List[List[List[float]]]]:
    w = kjt.weights_or_none()
    if w is None:
        return None
    f, b = len(kjt.keys()), kjt.stride()
    off = kjt.offsets().tolist()
    ws = w.tolist()
    return [[ws[off[i * b + s]: off[i * b + s + 1]] for i in range(f)] for s in range(b)]


def kjt_from_bags(keys, rows: List[List[List[int]]]) -> KeyedJaggedTensor:
    """Direct construction (naive) of a KJT from bags[b][f]."""
    f, b = len(keys), len(rows)
    vals, lens = [], []
    for i in range(f):
        for s in range(b):
            vals.extend(rows[s][i])
            lens.append(len(rows[s][i]))
    return KeyedJaggedTensor(
        keys=list(keys),
        values=torch.tensor(vals, dtype=torch.int64),
        lengths=torch.tensor(lens, dtype=torch.int32),
        stride=b,
    )


def row_ids(batch: Batch) -> List[int]:
    return batch.dense_features[:, 0].long().tolist()


def bf16_ceiling(x: float) -> float:
    """The smallest number >= x with 8 significant bits (bf16's), by its binary exponent: the
    reference for serve's int8 row scale (``wire_rows``)."""
    if x == 0:
        return 0.0
    quantum = 2.0 ** (math.floor(math.log2(x)) - 7)
    return math.ceil(x / quantum) * quantum


def int8_row(row: torch.Tensor) -> torch.Tensor:
    """The reference int8 rounding of a row, value by value: to the nearest multiple of its
    largest magnitude / 127 (in fp32) rounded up to 8 significant bits."""
    step = bf16_ceiling(float(row.abs().max().float() / 127))
    return torch.tensor([round(float(v) / step) * step if step else 0.0 for v in row])
