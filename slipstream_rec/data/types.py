"""The batch type every loader yields and every model consumes."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
from torchrec.datasets.utils import Batch as TorchRecBatch
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor


@dataclass
class Batch(TorchRecBatch):
    """TorchRec's criteo ``Batch`` plus a per-sample loss weight.

    ``weights`` is all ones for plain training. Slipstream's unbiased skipping keeps a skippable
    sample with probability p and sets its weight to 1/p, so the loss must be weighted per sample.
    Subclassing TorchRec's ``Batch`` keeps ``TrainPipelineSparseDist`` able to trace
    ``batch.sparse_features`` as a pipelined input.
    """

    weights: torch.Tensor = None  # type: ignore[assignment]  # (B,) float32; filled in __post_init__
    # Slipstream's serve action (slipstream/serving.py). Before the ranks agree on the split:
    # ``servable`` (B,) bool marks the samples whose lookups all hit the local replica of stale
    # rows, ``served_pooled`` holds their pooled embeddings (n_servable, F, D) in sample order.
    # After the split: ``sparse_features`` holds only the first S samples (the sharded part, S
    # agreed by all ranks), the last B - S samples are answered by ``served_pooled``
    # (B - S, F, D) and ``served_features`` (their ids, B - S samples; their gradients are pushed
    # to the shards later, slipstream/push.py), and ``servable`` is None. All None: every sample
    # goes through the shards.
    servable: Optional[torch.Tensor] = None
    served_pooled: Optional[torch.Tensor] = None
    served_features: Optional[KeyedJaggedTensor] = None

    def __post_init__(self) -> None:
        if self.weights is None:
            self.weights = torch.ones_like(self.labels, dtype=torch.float32)

    @property
    def batch_size(self) -> int:
        return int(self.labels.shape[0])

    @property
    def sharded_size(self) -> int:
        """Samples that go through the sharded embeddings (all of them unless split for serving)."""
        return int(self.sparse_features.stride())

    def _map(self, fn) -> "Batch":  # type: ignore[no-untyped-def]
        return Batch(
            dense_features=fn(self.dense_features),
            sparse_features=fn(self.sparse_features),
            labels=fn(self.labels),
            weights=fn(self.weights),
            servable=None if self.servable is None else fn(self.servable),
            served_pooled=None if self.served_pooled is None else fn(self.served_pooled),
            served_features=None if self.served_features is None else fn(self.served_features),
        )

    def to(self, device: torch.device, non_blocking: bool = False) -> "Batch":
        return self._map(lambda t: t.to(device=device, non_blocking=non_blocking))

    def record_stream(self, stream: torch.Stream) -> None:
        super().record_stream(stream)
        self.weights.record_stream(stream)
        if self.served_pooled is not None:
            self.served_pooled.record_stream(stream)

    def pin_memory(self) -> "Batch":
        return self._map(lambda t: t.pin_memory())


def make_kjt(keys: list[str], ids: torch.Tensor) -> KeyedJaggedTensor:
    """One id per feature and sample: ``ids`` is (B, F) int64 -> a KJT with every length 1.

    TorchRec's KJT layout is feature-major: all samples of feature 0, then feature 1, ...
    """
    batch_size, num_features = ids.shape
    assert num_features == len(keys), (num_features, keys)
    return KeyedJaggedTensor(
        keys=keys,
        values=ids.t().contiguous().view(-1),
        lengths=torch.ones(batch_size * num_features, dtype=torch.int32),
        stride=batch_size,
    )
