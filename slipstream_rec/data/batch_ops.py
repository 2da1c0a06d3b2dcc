"""Row selection and concatenation of ``Batch``es, KJTs rebuilt with plain torch ops.

fbgemm's ``keyed_jagged_index_select_dim1`` has no CPU kernel, so the feature-major KJT is
re-gathered here from lengths/offsets: for output bag s taken from input bag src(s), its values
are ``values[start[src(s)] : start[src(s)] + lengths[src(s)]]``, laid out back to back.
"""

from __future__ import annotations

from typing import Any, Dict, Optional, Sequence

import torch
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from slipstream_rec.data.types import Batch, Served, ServedRows, host_kjt, host_vbe_kjt

__all__ = [
    "select_rows", "slice_rows", "concat_batches", "select_kjt", "concat_kjts", "batch_to_state",
    "batch_from_state",
]  # fmt: skip


def _check_uniform(kjt: KeyedJaggedTensor) -> None:
    if kjt.variable_stride_per_key():
        raise ValueError("variable-stride KJTs are not supported by slipstream batch ops")


def _gather_index(lengths: torch.Tensor, starts: torch.Tensor, total: Optional[int] = None) -> torch.Tensor:
    """Value positions of bags with the given ``lengths`` starting at ``starts``, concatenated."""
    lengths = lengths.to(torch.int64)
    out_starts = torch.cumsum(lengths, 0) - lengths
    if total is None:
        total = int(lengths.sum())
    return torch.repeat_interleave(starts - out_starts, lengths, output_size=total) + torch.arange(
        total, dtype=torch.int64
    )


def select_kjt(kjt: KeyedJaggedTensor, idx: torch.Tensor) -> KeyedJaggedTensor:
    """The KJT of samples ``idx`` (in that order, repeats allowed), feature-major, weights kept."""
    _check_uniform(kjt)
    keys = kjt.keys()
    num_keys, stride = len(keys), kjt.stride()
    n = int(idx.numel())
    lengths = kjt.lengths()
    values = kjt.values()
    weights = kjt.weights_or_none()
    new_lengths = lengths.view(num_keys, stride).index_select(1, idx)
    if values.numel() == num_keys * stride and bool((lengths == 1).all()):
        # One id per bag: values are a (F, B) matrix.
        new_values = values.view(num_keys, stride).index_select(1, idx).reshape(-1)
        new_weights = (
            None if weights is None else weights.view(num_keys, stride).index_select(1, idx).reshape(-1)
        )
    else:
        ends = torch.cumsum(lengths, 0, dtype=torch.int64)
        starts_all = ends - lengths.to(torch.int64)
        bag = (torch.arange(num_keys, dtype=torch.int64).view(-1, 1) * stride + idx.view(1, -1)).reshape(-1)
        gather = _gather_index(new_lengths.reshape(-1), starts_all.index_select(0, bag))
        new_values = values.index_select(0, gather)
        new_weights = None if weights is None else weights.index_select(0, gather)
    return host_kjt(keys, new_values, new_lengths.reshape(-1), n, new_weights)


def _check_idx(idx: torch.Tensor, size: int) -> torch.Tensor:
    idx = torch.as_tensor(idx)
    if idx.dtype == torch.bool:
        raise ValueError("select_rows takes row indices (int64), not a bool mask; use mask.nonzero()")
    idx = idx.to(torch.int64).reshape(-1)
    if idx.numel() and (int(idx.min()) < 0 or int(idx.max()) >= size):
        raise IndexError(f"select_rows: row indices outside [0, {size})")
    return idx


def select_rows(batch: Batch, idx: torch.Tensor) -> Batch:
    """Rows ``idx`` of ``batch`` in the given order (repeats allowed); loss weights kept."""
    idx = _check_idx(idx, batch.batch_size)
    return Batch(
        dense_features=batch.dense_features.index_select(0, idx),
        sparse_features=select_kjt(batch.sparse_features, idx),
        labels=batch.labels.index_select(0, idx),
        weights=batch.weights.index_select(0, idx),
    )


def slice_rows(batch: Batch, start: int, stop: int) -> Batch:
    """Rows ``[start, stop)`` of ``batch`` (clipped to its size)."""
    b = batch.batch_size
    start, stop = max(0, min(start, b)), max(0, min(stop, b))
    stop = max(start, stop)
    if start == 0 and stop == b:
        return batch
    return select_rows(batch, torch.arange(start, stop, dtype=torch.int64))


def concat_kjts(kjts: Sequence[KeyedJaggedTensor]) -> KeyedJaggedTensor:
    """Samples of all ``kjts`` one after the other (same keys required), feature-major."""
    if not kjts:
        raise ValueError("concat_kjts needs at least one KJT")
    keys = kjts[0].keys()
    for k in kjts:
        _check_uniform(k)
        if k.keys() != keys:
            raise ValueError(f"concat_batches: KJT keys differ: {keys} vs {k.keys()}")
    if len(kjts) == 1:
        return kjts[0]
    num_keys = len(keys)
    strides = [k.stride() for k in kjts]
    has_w = [k.weights_or_none() is not None for k in kjts]
    if any(has_w) and not all(has_w):
        raise ValueError("concat_batches: some KJTs have per-id weights and some do not")
    lengths = torch.cat([k.lengths().view(num_keys, s) for k, s in zip(kjts, strides)], 1).reshape(-1)
    all_ones = all(
        k.values().numel() == num_keys * s and bool((k.lengths() == 1).all()) for k, s in zip(kjts, strides)
    )
    if all_ones:
        values = torch.cat([k.values().view(num_keys, s) for k, s in zip(kjts, strides)], 1).reshape(-1)
        weights = (
            torch.cat([k.weights().view(num_keys, s) for k, s in zip(kjts, strides)], 1).reshape(-1)
            if has_w[0]
            else None
        )
    else:
        # Per KJT, the number of values of each key; then interleave: key 0 of every KJT, key 1 ...
        per_key = [k.lengths().view(num_keys, s).sum(1) for k, s in zip(kjts, strides)]
        counts = torch.stack(per_key, 0).tolist()  # [kjt][key]
        v_parts = [torch.split(k.values(), c) for k, c in zip(kjts, counts)]
        values = torch.cat([v_parts[j][f] for f in range(num_keys) for j in range(len(kjts))])
        if has_w[0]:
            w_parts = [torch.split(k.weights(), c) for k, c in zip(kjts, counts)]
            weights = torch.cat([w_parts[j][f] for f in range(num_keys) for j in range(len(kjts))])
        else:
            weights = None
    return host_kjt(keys, values, lengths, sum(strides), weights)


def concat_batches(batches: Sequence[Batch]) -> Batch:
    """Rows of all ``batches`` one after the other (same sparse keys required); weights kept."""
    batches = list(batches)
    if not batches:
        raise ValueError("concat_batches needs at least one batch")
    if len(batches) == 1:
        return batches[0]
    return Batch(
        dense_features=torch.cat([b.dense_features for b in batches], 0),
        sparse_features=concat_kjts([b.sparse_features for b in batches]),
        labels=torch.cat([b.labels for b in batches], 0),
        weights=torch.cat([b.weights for b in batches], 0),
    )


def batch_to_state(batch: Batch) -> Dict[str, Any]:
    """A ``Batch`` as plain CPU tensors (for checkpoints): exactly what ``batch_from_state`` needs."""
    return {
        "dense": batch.dense_features.detach().cpu().clone(),
        **_kjt_to_state(batch.sparse_features),
        "labels": batch.labels.detach().cpu().clone(),
        "weights": batch.weights.detach().cpu().clone(),
        # serving (slipstream/serve/split.py): the annotation of a batch built ahead, or the served
        # part of a split batch; None for every other batch
        "served": None if batch.served is None else _served_to_state(batch.served),
    }


def _served_to_state(served: Served) -> Dict[str, Any]:
    copy = lambda t: None if t is None else t.detach().cpu().clone()  # noqa: E731
    return {
        "pooled": copy(served.pooled), "local": copy(served.local),
        "rows": {k: copy(t) for k, t in vars(served.rows).items()},
    }  # fmt: skip


def _served_from_state(state: Dict[str, Any]) -> Served:
    return Served(
        pooled=state["pooled"], rows=ServedRows(**state["rows"]), local=state["local"]
    )


def _kjt_to_state(kjt: KeyedJaggedTensor) -> Dict[str, Any]:
    state = {
        "keys": list(kjt.keys()),
        "values": kjt.values().detach().cpu().clone(),
        "lengths": kjt.lengths().detach().cpu().clone(),
        "stride": int(kjt.stride()),
    }
    if kjt.variable_stride_per_key():  # a batch split for serving (slipstream/serve/split.py)
        state["strides"] = [int(s) for s in kjt.stride_per_key()]
        state["inverse"] = kjt.inverse_indices()[1].detach().cpu().clone()
    return state


def _kjt_from_state(state: Dict[str, Any]) -> KeyedJaggedTensor:
    if "strides" in state:
        return host_vbe_kjt(
            list(state["keys"]), state["values"], state["lengths"], state["strides"], state["inverse"]
        )
    return host_kjt(list(state["keys"]), state["values"], state["lengths"], state["stride"])


def batch_from_state(state: Dict[str, Any]) -> Batch:
    """Inverse of ``batch_to_state``."""
    served = state["served"]
    return Batch(
        dense_features=state["dense"], sparse_features=_kjt_from_state(state), labels=state["labels"],
        weights=state["weights"], served=None if served is None else _served_from_state(served),
    )
