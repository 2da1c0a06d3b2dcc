"""NpyBatchLoader and load_meta (slipstream_rec.data.loader)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from slipstream_rec.data.loader import NpyBatchLoader
from slipstream_rec.data.meta import load_meta
from slipstream_rec.data.types import Batch
from tests._fixtures import CARDS, write_dataset


def rows_of(batch: Batch) -> np.ndarray:
    return batch.dense_features[:, 0].numpy().astype(np.int64)


def loaders(path: Path, split: str, world: int, batch: int, train: bool, **kw) -> list[NpyBatchLoader]:
    return [
        NpyBatchLoader(path, split, batch_size=batch, rank=r, world_size=world, train=train, **kw)
        for r in range(world)
    ]


COMBOS = [(1000, 1, 64), (1000, 3, 64), (1001, 4, 10), (997, 8, 16), (257, 2, 300), (64, 4, 16), (10, 3, 4)]


@pytest.mark.parametrize("n, world, batch", COMBOS)
def test_train_equal_len_and_constant_batch_size(tmp_path: Path, n: int, world: int, batch: int) -> None:
    path = write_dataset(tmp_path / "d", {"train": n})
    if (n // world) // batch == 0:
        with pytest.raises(ValueError, match="too few"):
            loaders(path, "train", world, batch, train=True)
        return
    ls = loaders(path, "train", world, batch, train=True, shuffle=True, seed=1)
    assert len({len(l) for l in ls}) == 1
    assert len(ls[0]) == (n // world) // batch
    for r, l in enumerate(ls):
        lo, hi = r * n // world, (r + 1) * n // world
        batches = list(l)
        assert len(batches) == len(l)
        seen = np.concatenate([rows_of(b) for b in batches])
        assert all(b.batch_size == batch for b in batches)
        assert len(np.unique(seen)) == len(seen)  # no row twice in an epoch
        assert seen.min() >= lo and seen.max() < hi  # only this rank's contiguous part


@pytest.mark.parametrize("n, world, batch", COMBOS)
def test_eval_covers_every_row_once(tmp_path: Path, n: int, world: int, batch: int) -> None:
    path = write_dataset(tmp_path / "d", {"val": n})
    ls = loaders(path, "val", world, batch, train=False, shuffle=True)
    assert len({len(l) for l in ls}) == 1
    seen = []
    for l in ls:
        batches = list(l)
        assert len(batches) == len(l)
        assert all(0 < b.batch_size <= batch for b in batches)
        sizes = [b.batch_size for b in batches]
        assert max(sizes) - min(sizes) <= 1  # near-equal
        seen.extend(rows_of(b) for b in batches)
    assert np.array_equal(np.sort(np.concatenate(seen)), np.arange(n))


def test_eval_too_many_ranks_is_an_error(tmp_path: Path) -> None:
    path = write_dataset(tmp_path / "d", {"val": 3})
    with pytest.raises(ValueError, match="eval"):
        NpyBatchLoader(path, "val", batch_size=4, rank=0, world_size=4, train=False)


def test_shuffle_changes_order_not_rows(tmp_path: Path) -> None:
    path = write_dataset(tmp_path / "d", {"train": 1024})
    l = NpyBatchLoader(path, "train", batch_size=64, rank=1, world_size=2, train=True, shuffle=True, seed=5)
    order = {}
    for epoch in (0, 1, 0):
        l.set_epoch(epoch)
        order.setdefault(epoch, []).append(np.concatenate([rows_of(b) for b in l]))
    assert np.array_equal(order[0][0], order[0][1])  # deterministic per (seed, epoch, rank)
    assert not np.array_equal(order[0][0], order[1][0])
    assert np.array_equal(np.sort(order[0][0]), np.arange(512, 1024))
    assert np.array_equal(np.sort(order[1][0]), np.arange(512, 1024))
    # Another seed gives another order; no shuffle is file order.
    l2 = NpyBatchLoader(path, "train", batch_size=64, rank=1, world_size=2, train=True, shuffle=True, seed=6)
    assert not np.array_equal(np.concatenate([rows_of(b) for b in l2]), order[0][0])
    l3 = NpyBatchLoader(path, "train", batch_size=64, rank=1, world_size=2, train=True, shuffle=False)
    assert np.array_equal(np.concatenate([rows_of(b) for b in l3]), np.arange(512, 1024))


def test_batch_contents(tmp_path: Path) -> None:
    path = write_dataset(tmp_path / "d", {"train": 300})
    sparse = np.load(path / "train_sparse.npy")
    labels = np.load(path / "train_labels.npy")[:, 0]
    for mmap in (False, True):
        l = NpyBatchLoader(path, "train", batch_size=32, rank=0, world_size=1, train=True, shuffle=True, mmap=mmap)
        b = next(iter(l))
        assert isinstance(b, Batch)
        rows = rows_of(b)
        assert b.dense_features.dtype == torch.float32 and b.dense_features.shape == (32, 13)
        assert b.labels.dtype == torch.float32 and b.labels.shape == (32,)
        assert torch.equal(b.labels, torch.from_numpy(labels[rows].astype(np.float32)))
        assert torch.equal(b.weights, torch.ones(32))
        kjt = b.sparse_features
        assert kjt.keys() == [f"cat_{i}" for i in range(26)]
        assert kjt.values().dtype == torch.int64 and kjt.stride() == 32
        d = kjt.to_dict()
        for f in (0, 7, 25):
            jt = d[f"cat_{f}"]
            assert torch.equal(jt.lengths(), torch.ones(32, dtype=jt.lengths().dtype))
            assert torch.equal(jt.values(), torch.from_numpy(sparse[rows, f].astype(np.int64)))
    assert l.num_embeddings_per_feature == CARDS


def test_mmap_and_memory_agree(tmp_path: Path) -> None:
    path = write_dataset(tmp_path / "d", {"train": 500, "val": 333})
    for split, train in (("train", True), ("val", False)):
        a = NpyBatchLoader(path, split, batch_size=40, rank=1, world_size=3, train=train, shuffle=True, mmap=False)
        b = NpyBatchLoader(path, split, batch_size=40, rank=1, world_size=3, train=train, shuffle=True, mmap=True)
        for x, y in zip(a, b):
            assert torch.equal(x.dense_features, y.dense_features)
            assert torch.equal(x.sparse_features.values(), y.sparse_features.values())
            assert torch.equal(x.labels, y.labels)


# -- bad files -------------------------------------------------------------------------------


def test_missing_meta(tmp_path: Path) -> None:
    path = write_dataset(tmp_path / "d", {"train": 10})
    (path / "meta.json").unlink()
    with pytest.raises(FileNotFoundError, match=r"meta\.json is missing.*Fix"):
        load_meta(path)
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_meta(tmp_path / "nope")


def test_meta_missing_key_and_bad_json(tmp_path: Path) -> None:
    path = write_dataset(tmp_path / "d", {"train": 10})
    meta = json.loads((path / "meta.json").read_text())
    del meta["num_embeddings_per_feature"]
    (path / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(ValueError, match="num_embeddings_per_feature"):
        load_meta(path)
    (path / "meta.json").write_text("{not json")
    with pytest.raises(ValueError, match="JSON"):
        load_meta(path)


def test_missing_split_file(tmp_path: Path) -> None:
    path = write_dataset(tmp_path / "d", {"train": 10, "val": 10})
    (path / "val_labels.npy").unlink()
    with pytest.raises(FileNotFoundError, match="val_labels.npy is missing"):
        load_meta(path)


def test_row_counts_disagree(tmp_path: Path) -> None:
    path = write_dataset(tmp_path / "d", {"train": 10})
    np.save(path / "train_labels.npy", np.zeros((9, 1), dtype=np.int32))
    with pytest.raises(ValueError, match="row counts disagree"):
        load_meta(path)
    path = write_dataset(tmp_path / "e", {"train": 10})
    meta = json.loads((path / "meta.json").read_text())
    meta["rows"]["train"] = 11
    (path / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(ValueError, match="11 rows"):
        load_meta(path)


@pytest.mark.parametrize(
    "kind, arr, match",
    [
        ("dense", np.zeros((10, 13), dtype=np.float64), "train_dense.npy has dtype float64"),
        ("sparse", np.zeros((10, 26), dtype=np.int64), "train_sparse.npy has dtype int64"),
        ("sparse", np.zeros((10, 25), dtype=np.int32), r"expected dtype int32 and shape \(N, 26\)"),
        ("labels", np.zeros(10, dtype=np.int32), r"train_labels.npy .*shape \(10,\)"),
    ],
)
def test_wrong_dtype_or_shape(tmp_path: Path, kind: str, arr: np.ndarray, match: str) -> None:
    path = write_dataset(tmp_path / "d", {"train": 10})
    np.save(path / f"train_{kind}.npy", arr)
    with pytest.raises(ValueError, match=match):
        load_meta(path)


def test_ids_out_of_range(tmp_path: Path) -> None:
    path = write_dataset(tmp_path / "d", {"train": 10})
    sparse = np.load(path / "train_sparse.npy")
    sparse[7, 4] = CARDS[4]
    np.save(path / "train_sparse.npy", sparse)
    with pytest.raises(ValueError, match="cat_4"):
        NpyBatchLoader(path, "train", batch_size=2, train=True)


def test_unknown_split_and_bad_args(tmp_path: Path) -> None:
    path = write_dataset(tmp_path / "d", {"train": 10})
    with pytest.raises(ValueError, match="split 'test'"):
        NpyBatchLoader(path, "test", batch_size=2, train=False)
    with pytest.raises(ValueError, match="batch_size"):
        NpyBatchLoader(path, "train", batch_size=0, train=True)
    with pytest.raises(ValueError, match="rank"):
        NpyBatchLoader(path, "train", batch_size=2, rank=2, world_size=2, train=True)


def test_reads_a_generated_dataset(tmp_path: Path) -> None:
    from slipstream_rec.data.config import DataConfig, SyntheticConfig
    from slipstream_rec.data.datasets import ensure_dataset

    cfg = DataConfig(
        root=str(tmp_path),
        synthetic=SyntheticConfig(
            num_train=2000, num_val=500, num_test=500, cardinality_scale=0.001, max_cardinality=1000
        ),
    )
    path = ensure_dataset(cfg)
    meta = load_meta(path)
    l = NpyBatchLoader(path, "train", batch_size=256, rank=0, world_size=2, train=True, shuffle=True)
    assert l.num_embeddings_per_feature == meta.num_embeddings_per_feature
    assert len(list(l)) == len(l) == 3
