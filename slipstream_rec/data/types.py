"""The batch type every loader yields and every model consumes."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
from torchrec.datasets.utils import Batch as TorchRecBatch
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor


@dataclass
class ServedRows:
    """The rows a batch's served lookups hit, keyed on the host when the batch is split
    (slipstream/serve/push.py ``served_rows``): the lookups grouped by row, so that the training step
    sums their gradients with one SUM ``embedding_bag`` over the rows (a bag per row, its lookups'
    bags as the indices) into a buffer whose size the host already knows. Within a row the
    lookups keep their batch order, so the sums equal a sequential ``index_add_`` bit for bit;
    and unlike ``index_add_`` on CUDA (atomics) they are deterministic.

    ``keys`` and ``counts`` stay on the host (the push and the hot-set counts read them there);
    ``bags`` and ``offsets`` travel to the device with the batch.
    """

    keys: torch.Tensor  # (K,) int64 sorted distinct flat keys (slipstream/rows.py RowIndex)
    counts: torch.Tensor  # (K,) int64 lookups of each key
    # (lookups,) int64: each lookup's bag, feature-major (feature * B + sample), grouped by key
    # in ``keys`` order, batch order within a key
    bags: torch.Tensor
    offsets: torch.Tensor  # (K,) int64: where each key's lookups start in ``bags``

    def to(self, device: torch.device, non_blocking: bool = False) -> "ServedRows":
        move = lambda t: t.to(device=device, non_blocking=non_blocking)  # noqa: E731
        return ServedRows(self.keys, self.counts, move(self.bags), move(self.offsets))

    def pin_memory(self) -> "ServedRows":
        return ServedRows(self.keys, self.counts, self.bags.pin_memory(), self.offsets.pin_memory())

    def record_stream(self, stream: torch.Stream) -> None:
        self.bags.record_stream(stream)
        self.offsets.record_stream(stream)


@dataclass
class Served:
    """The lookups of a batch answered from Slipstream's local replica of stale rows, per lookup
    (slipstream/serve/split.py). A bag's pooled embedding is the sum of its replica part (``pooled``)
    and its sharded part (the bag's lookups outside the replica, sent through the shards).

    Before the ranks agree on the sharded sizes (annotated): ``local`` marks the lookups in the
    replica. After the split: the batch's ``sparse_features`` hold only the other lookups, each
    feature's bags that keep one packed into its first slots, a variable-batch KJT whose inverse
    indices put every bag's sharded part back in its sample's place; ``local`` is None.
    """

    pooled: torch.Tensor  # (F, B, D) float32, the KJT's bag order: each bag's replica rows summed (0: none)
    rows: ServedRows  # the rows those lookups hit
    # (lookups,) bool, KJT value order: the lookup is a replica row. Host; None once split.
    local: Optional[torch.Tensor] = None

    def _map(self, fn, rows_fn) -> "Served":  # type: ignore[no-untyped-def]
        return Served(
            pooled=fn(self.pooled), rows=rows_fn(self.rows), local=self.local,  # local: host bookkeeping
        )  # fmt: skip

    def record_stream(self, stream: torch.Stream) -> None:
        self.pooled.record_stream(stream)
        self.rows.record_stream(stream)


@dataclass
class Batch(TorchRecBatch):
    """TorchRec's criteo ``Batch`` plus a per-sample loss weight.

    ``weights`` is all ones for plain training. Slipstream's unbiased skipping keeps a skippable
    sample with probability p and sets its weight to 1/p, so the loss must be weighted per sample.
    Subclassing TorchRec's ``Batch`` keeps ``TrainPipelineSparseDist`` able to trace
    ``batch.sparse_features`` as a pipelined input.

    Every tensor of a batch the data side hands over is a host tensor: the pipeline pins it and
    copies it to the device (tests/training/test_fake_device.py).
    """

    weights: torch.Tensor = None  # type: ignore[assignment]  # (B,) float32; filled in __post_init__
    # Slipstream's serve action: the lookups answered from the local replica (``Served``); None:
    # every lookup goes through the shards.
    served: Optional[Served] = None

    def __post_init__(self) -> None:
        if self.weights is None:
            self.weights = torch.ones_like(self.labels, dtype=torch.float32)

    @property
    def batch_size(self) -> int:
        return int(self.labels.shape[0])

    @property
    def sharded_sizes(self) -> list[int]:
        """Slots of each feature sent through the sharded embeddings (the batch size each,
        unless split for serving)."""
        kjt = self.sparse_features
        if kjt.variable_stride_per_key():
            return [int(s) for s in kjt.stride_per_key()]
        return [int(kjt.stride())] * len(kjt.keys())

    def _map(self, fn, rows_fn) -> "Batch":  # type: ignore[no-untyped-def]
        return Batch(
            dense_features=fn(self.dense_features),
            sparse_features=fn(self.sparse_features),
            labels=fn(self.labels),
            weights=fn(self.weights),
            served=None if self.served is None else self.served._map(fn, rows_fn),
        )

    def to(self, device: torch.device, non_blocking: bool = False) -> "Batch":
        return self._map(
            lambda t: t.to(device=device, non_blocking=non_blocking),
            lambda r: r.to(device, non_blocking),
        )

    def record_stream(self, stream: torch.Stream) -> None:
        super().record_stream(stream)
        self.weights.record_stream(stream)
        if self.served is not None:
            self.served.record_stream(stream)

    def pin_memory(self) -> "Batch":
        return self._map(lambda t: t.pin_memory(), lambda r: r.pin_memory())


def _offsets(per_key: list[int]) -> list[int]:
    """Each key's first value (and the end): the running sums of its lengths per key."""
    offsets = [0]
    for n in per_key:
        offsets.append(offsets[-1] + int(n))
    return offsets


def host_kjt(
    keys: list[str],
    values: torch.Tensor,
    lengths: torch.Tensor,
    stride: int,
    weights: Optional[torch.Tensor] = None,
) -> KeyedJaggedTensor:
    """A KJT of host tensors whose lengths and offsets per key are computed here, on the host.

    TorchRec's input dist needs them (the splits of its all-to-all); a KJT without them makes it
    sum the lengths after the copy to the device and read the sums back, a host wait every step
    (TorchRec's own Criteo reader precomputes them for this reason). ``lengths`` must be a host
    tensor, feature-major (keys x stride).
    """
    assert lengths.device.type == "cpu", "host_kjt takes host lengths"
    per_key = lengths.view(len(keys), stride).sum(1, dtype=torch.int64).tolist() if keys else []
    offsets = _offsets(per_key)
    return KeyedJaggedTensor(
        keys=keys, values=values, lengths=lengths, weights=weights, stride=stride,
        length_per_key=[int(n) for n in per_key], offset_per_key=offsets,
    )  # fmt: skip


def host_vbe_kjt(
    keys: list[str],
    values: torch.Tensor,
    lengths: torch.Tensor,
    strides: list[int],
    inverse: torch.Tensor,
    weights: Optional[torch.Tensor] = None,
) -> KeyedJaggedTensor:
    """A variable-batch KJT (TorchRec's VBE) of host tensors: feature f has ``strides[f]`` bags
    (``lengths`` is feature-major, ``sum(strides)`` long) and ``inverse[f, b]`` is the bag of
    sample b, so the sharded EBC's output has a row per sample again. Lengths and offsets per key
    are computed here, on the host, as ``host_kjt``'s."""
    assert lengths.device.type == "cpu", "host_vbe_kjt takes host lengths"
    assert inverse.dim() == 2 and inverse.shape[0] == len(keys), "one row of inverse indices per key"
    per_key = [int(part.sum()) for part in lengths.split(strides)] if keys else []
    offsets = _offsets(per_key)
    return KeyedJaggedTensor(
        keys=keys, values=values, lengths=lengths, weights=weights,
        stride_per_key_per_rank=[[int(s)] for s in strides], inverse_indices=(list(keys), inverse),
        length_per_key=per_key, offset_per_key=offsets,
    )  # fmt: skip


def make_kjt(keys: list[str], ids: torch.Tensor) -> KeyedJaggedTensor:
    """One id per feature and sample: ``ids`` is (B, F) int64 -> a KJT with every length 1.

    TorchRec's KJT layout is feature-major: all samples of feature 0, then feature 1, ...
    """
    batch_size, num_features = ids.shape
    assert num_features == len(keys), (num_features, keys)
    lengths = torch.ones(batch_size * num_features, dtype=torch.int32)
    return host_kjt(keys, ids.t().contiguous().view(-1), lengths, batch_size)
