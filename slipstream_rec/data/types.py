"""The batch type every loader yields and every model consumes."""

from __future__ import annotations

from dataclasses import dataclass

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

    def __post_init__(self) -> None:
        if self.weights is None:
            self.weights = torch.ones_like(self.labels, dtype=torch.float32)

    @property
    def batch_size(self) -> int:
        return int(self.labels.shape[0])

    def to(self, device: torch.device, non_blocking: bool = False) -> "Batch":
        return Batch(
            dense_features=self.dense_features.to(device=device, non_blocking=non_blocking),
            sparse_features=self.sparse_features.to(device=device, non_blocking=non_blocking),
            labels=self.labels.to(device=device, non_blocking=non_blocking),
            weights=self.weights.to(device=device, non_blocking=non_blocking),
        )

    def record_stream(self, stream: torch.Stream) -> None:
        super().record_stream(stream)
        self.weights.record_stream(stream)

    def pin_memory(self) -> "Batch":
        return Batch(
            dense_features=self.dense_features.pin_memory(),
            sparse_features=self.sparse_features.pin_memory(),
            labels=self.labels.pin_memory(),
            weights=self.weights.pin_memory(),
        )


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
