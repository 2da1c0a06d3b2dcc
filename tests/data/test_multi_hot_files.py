"""The npy layout's multi-hot extension and the checks that run before training:
NpyBatchLoader's KJTs with real lengths, and every truncated or mismatched file named."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from slipstream_rec.data.convert.npy_writer import NpyAppender
from slipstream_rec.data.convert.vocab import VocabCounter
from slipstream_rec.data.loader import NpyBatchLoader
from slipstream_rec.data.meta import load_meta

SIZES = {"a": 50, "tags": 30, "b": 20}


def write_multi_hot(path: Path, n: int = 100, seed: int = 0) -> dict:
    """Features a (one-hot), tags (multi-hot, 0-4 ids), b (one-hot); dense col 0 = row index."""
    rng = np.random.default_rng(seed)
    path.mkdir(parents=True, exist_ok=True)
    lengths = rng.integers(0, 5, n)
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    values = rng.integers(0, SIZES["tags"], int(offsets[-1])).astype(np.int32)
    sparse = np.stack([rng.integers(0, SIZES["a"], n), rng.integers(0, SIZES["b"], n)], 1).astype(np.int32)
    dense = np.zeros((n, 2), dtype=np.float32)
    dense[:, 0] = np.arange(n)
    np.save(path / "train_dense.npy", dense)
    np.save(path / "train_sparse.npy", sparse)
    np.save(path / "train_labels.npy", (np.arange(n) % 2).astype(np.int32).reshape(n, 1))
    np.save(path / "train_tags_values.npy", values)
    np.save(path / "train_tags_offsets.npy", offsets)
    meta = {
        "format_version": 2, "num_dense": 2, "dense_feature_names": ["x", "y"],
        "sparse_feature_names": ["a", "tags", "b"], "multi_hot_feature_names": ["tags"],
        "num_embeddings_per_feature": [SIZES["a"], SIZES["tags"], SIZES["b"]], "rows": {"train": n},
    }  # fmt: skip
    (path / "meta.json").write_text(json.dumps(meta))
    return {"sparse": sparse, "values": values, "offsets": offsets}


@pytest.mark.parametrize("mmap", [False, True])
def test_loader_builds_kjts_with_real_lengths(tmp_path, mmap):
    raw = write_multi_hot(tmp_path / "d")
    loader = NpyBatchLoader(tmp_path / "d", "train", batch_size=16, rank=1, world_size=2, train=True, shuffle=True, mmap=mmap)
    for batch in loader:
        rows = batch.dense_features[:, 0].numpy().astype(np.int64)
        kjt = batch.sparse_features
        assert kjt.keys() == ["a", "tags", "b"] and kjt.stride() == 16
        d = kjt.to_dict()
        off = raw["offsets"]
        assert d["tags"].lengths().tolist() == (off[rows + 1] - off[rows]).tolist()
        want = np.concatenate([raw["values"][off[r] : off[r + 1]] for r in rows])
        assert d["tags"].values().tolist() == want.tolist()
        assert d["a"].values().tolist() == raw["sparse"][rows, 0].tolist()
        assert d["b"].values().tolist() == raw["sparse"][rows, 1].tolist()
        assert torch.equal(d["b"].lengths(), torch.ones(16, dtype=d["b"].lengths().dtype))
        assert all(r >= 50 for r in rows)  # rank 1's half


def test_eval_covers_every_bag_once(tmp_path):
    raw = write_multi_hot(tmp_path / "d", n=37)
    total = 0
    for r in range(3):
        for b in NpyBatchLoader(tmp_path / "d", "train", batch_size=5, rank=r, world_size=3, train=False):
            total += int(b.sparse_features.to_dict()["tags"].lengths().sum())
    assert total == raw["values"].size


def _edit_meta(path: Path, **changes) -> None:
    meta = json.loads((path / "meta.json").read_text())
    meta.update(changes)
    (path / "meta.json").write_text(json.dumps(meta))


def test_out_of_range_multi_hot_id_names_file_row_feature_and_size(tmp_path):
    raw = write_multi_hot(tmp_path / "d")
    values = raw["values"].copy()
    pos = int(raw["offsets"][42])  # first id of row 42 (row 42 has at least one: find one that does)
    row = int(np.searchsorted(raw["offsets"], pos, side="right")) - 1
    values[pos] = 30
    np.save(tmp_path / "d" / "train_tags_values.npy", values)
    with pytest.raises(ValueError, match=rf"train_tags_values\.npy: row {row}, feature 'tags': id 30 is outside its table \[0, 30\)"):
        NpyBatchLoader(tmp_path / "d", "train", batch_size=8, train=True)
    values[pos] = -1
    np.save(tmp_path / "d" / "train_tags_values.npy", values)
    with pytest.raises(ValueError, match="id -1 is outside"):
        NpyBatchLoader(tmp_path / "d", "train", batch_size=8, train=True)


def test_out_of_range_one_hot_id_names_the_row(tmp_path):
    raw = write_multi_hot(tmp_path / "d")
    sparse = raw["sparse"].copy()
    sparse[77, 1] = 20
    np.save(tmp_path / "d" / "train_sparse.npy", sparse)
    with pytest.raises(ValueError, match=r"train_sparse\.npy: row 77, feature 'b': id 20 is outside its table \[0, 20\)"):
        NpyBatchLoader(tmp_path / "d", "train", batch_size=8, train=True)


@pytest.mark.parametrize(
    "break_it, match",
    [
        (lambda d, raw: np.save(d / "train_tags_offsets.npy", raw["offsets"][:-1]), r"has 100 entries, expected rows \+ 1 = 101"),
        (lambda d, raw: np.save(d / "train_tags_values.npy", raw["values"][:-3]), "end at the length"),
        (lambda d, raw: np.save(d / "train_tags_values.npy", raw["values"].astype(np.int64)), "train_tags_values.npy has dtype int64"),
        (lambda d, raw: (d / "train_tags_offsets.npy").unlink(), "train_tags_offsets.npy is missing"),
        (lambda d, raw: _edit_meta(d, multi_hot_feature_names=["nope"]), r"multi_hot_feature_names \['nope'\]"),
        (lambda d, raw: _edit_meta(d, format_version=1), "needs 2"),
        (lambda d, raw: np.save(d / "train_sparse.npy", raw["sparse"][:, :1]), r"shape \(N, 2\)"),
        (lambda d, raw: _edit_meta(d, rows={"train": 0}), "empty dataset"),
    ],
)
def test_truncated_or_mismatched_files_fail_before_training(tmp_path, break_it, match):
    raw = write_multi_hot(tmp_path / "d")
    break_it(tmp_path / "d", raw)
    with pytest.raises((ValueError, FileNotFoundError), match=match):
        load_meta(tmp_path / "d")


def test_decreasing_offsets_are_caught_by_the_loader(tmp_path):
    raw = write_multi_hot(tmp_path / "d")
    off = raw["offsets"].copy()
    off[10], off[11] = off[11] + 2, off[10]
    np.save(tmp_path / "d" / "train_tags_offsets.npy", off)
    with pytest.raises(ValueError, match="offsets decrease at row 10"):
        NpyBatchLoader(tmp_path / "d", "train", batch_size=8, train=True)


def test_npy_appender_patches_the_header_and_resumes(tmp_path):
    part = tmp_path / "x.npy.part"
    w = NpyAppender(part, np.int32, (3,))
    w.append(np.arange(12).reshape(4, 3))
    w.sync()
    w.append(np.full((5, 3), 7))  # written after the "checkpoint": discarded on resume
    w.close()
    w = NpyAppender(part, np.int32, (3,), resume_rows=4)
    w.append(np.arange(6).reshape(2, 3) + 100)
    final = w.finish(tmp_path / "x.npy")
    assert not part.exists()
    got = np.load(final)
    assert got.shape == (6, 3) and got.dtype == np.int32
    assert np.array_equal(got, np.concatenate([np.arange(12).reshape(4, 3), np.arange(6).reshape(2, 3) + 100]))
    assert np.array_equal(np.load(final, mmap_mode="r"), got)
    with pytest.raises(ValueError, match="shorter than the checkpoint"):
        NpyAppender(tmp_path / "missing.part", np.int32, (3,), resume_rows=2)


def test_vocab_counter_equals_a_plain_count(tmp_path, monkeypatch):
    import slipstream_rec.data.convert.vocab as vocab_mod

    monkeypatch.setattr(vocab_mod, "_MERGE_MIN", 16)  # merge often
    rng = np.random.default_rng(0)
    counter = VocabCounter(["f"])
    chunks = [np.minimum(rng.zipf(1.3, 500), 10_000) - 2 for _ in range(20)]  # includes -1 (missing)
    for i, c in enumerate(chunks):
        counter.add("f", c)
        if i == 10:  # a checkpoint round trip in the middle
            counter.save(tmp_path / "c.npz")
            counter = VocabCounter.load(tmp_path / "c.npz", ["f"])
    keys, counts = counter.counts("f")
    allv = np.concatenate(chunks)
    want_k, want_c = np.unique(allv[allv >= 0], return_counts=True)
    assert np.array_equal(keys, want_k) and np.array_equal(counts, want_c)
