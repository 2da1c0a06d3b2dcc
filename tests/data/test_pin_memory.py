"""NpyBatchLoader(pin_memory=...): page-locked batches for CUDA runs."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from slipstream_rec.data.loader import NpyBatchLoader
from slipstream_rec.data.types import Batch
from tests._fixtures import write_dataset


def test_pin_memory_without_cuda_is_a_clear_error(tmp_path: Path, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    path = write_dataset(tmp_path / "d", {"train": 64})
    with pytest.raises(ValueError, match=r"pin_memory=True needs a visible CUDA device.*Fix: pin_memory=False"):
        NpyBatchLoader(path, "train", batch_size=16, train=True, pin_memory=True)
    assert NpyBatchLoader(path, "train", batch_size=16, train=True).pin_memory is False


def test_pin_memory_pins_every_batch_and_keeps_its_contents(tmp_path: Path, monkeypatch):
    # CPU-only stand-in for the page-locking: count Batch.pin_memory calls, keep the tensors
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    calls = []

    def fake_pin(self: Batch) -> Batch:
        calls.append(self.batch_size)
        return self

    monkeypatch.setattr(Batch, "pin_memory", fake_pin)
    path = write_dataset(tmp_path / "d", {"train": 100, "val": 30})
    for split, train in (("train", True), ("val", False)):
        pinned = NpyBatchLoader(path, split, batch_size=16, train=train, pin_memory=True, shuffle=train)
        plain = NpyBatchLoader(path, split, batch_size=16, train=train, shuffle=train)
        got, want = list(pinned), list(plain)
        assert len(got) == len(want) and sum(b.batch_size for b in got) == sum(calls[-len(got):])
        for a, b in zip(got, want):
            assert torch.equal(a.dense_features, b.dense_features)
            assert torch.equal(a.sparse_features.values(), b.sparse_features.values())
            assert torch.equal(a.labels, b.labels)


@pytest.mark.gpu
def test_batches_are_page_locked_on_cuda(tmp_path: Path):
    path = write_dataset(tmp_path / "d", {"train": 64})
    (batch, *_) = list(NpyBatchLoader(path, "train", batch_size=16, train=True, pin_memory=True))
    kjt = batch.sparse_features
    for t in (batch.dense_features, batch.labels, batch.weights, kjt.values(), kjt.lengths()):
        assert t.is_pinned()
    on_gpu = batch.to(torch.device("cuda"), non_blocking=True)
    torch.cuda.synchronize()
    assert torch.equal(on_gpu.dense_features.cpu(), batch.dense_features)
