"""The synthetic Criteo-like generator and its cache (slipstream_rec.data.synthetic)."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from slipstream_rec.data import synthetic
from slipstream_rec.data.config import CRITEO_KAGGLE_CARDINALITIES, DataConfig, SyntheticConfig
from slipstream_rec.data.loader import SPLITS, load_meta
from slipstream_rec.training.metrics import auc
from slipstream_rec.data.synthetic import (
    config_hash,
    ensure_dataset,
    feature_cardinalities,
    generate_dataset,
)


def tiny(**overrides) -> SyntheticConfig:
    """A few thousand rows and tables of at most 2000 rows: generation takes well under 1 s."""
    base = dict(
        num_train=6000, num_val=3000, num_test=1000, cardinality_scale=0.001,
        min_cardinality=8, max_cardinality=2000,
    )  # fmt: skip
    base.update(overrides)
    return SyntheticConfig(**base)


def gen(tmp_path: Path, name: str, cfg: SyntheticConfig) -> Path:
    out = tmp_path / name
    out.mkdir()
    generate_dataset(cfg, out)
    return out


def test_default_config_is_criteo_like() -> None:
    cfg = SyntheticConfig()
    assert (cfg.num_train, cfg.num_val, cfg.num_test) == (4_000_000, 200_000, 200_000)
    cards = feature_cardinalities(cfg)
    assert len(cards) == 26
    assert max(cards) == 100_000  # the 10M-row Criteo table, scaled 0.01 and clamped
    assert cards[8] == 3  # never above the Criteo cardinality
    assert all(c >= min(cfg.min_cardinality, crit) for c, crit in zip(cards, CRITEO_KAGGLE_CARDINALITIES))


def test_same_seed_same_files_other_seed_different(tmp_path: Path) -> None:
    a = gen(tmp_path, "a", tiny(seed=3))
    b = gen(tmp_path, "b", tiny(seed=3))
    c = gen(tmp_path, "c", tiny(seed=4))
    for split in SPLITS:
        for kind in ("dense", "sparse", "labels"):
            fa = (a / f"{split}_{kind}.npy").read_bytes()
            assert fa == (b / f"{split}_{kind}.npy").read_bytes(), (split, kind)
            assert fa != (c / f"{split}_{kind}.npy").read_bytes(), (split, kind)
    assert json.loads((a / "meta.json").read_text()) == json.loads((b / "meta.json").read_text())


def test_files_layout_and_id_ranges(tmp_path: Path) -> None:
    cfg = tiny()
    path = gen(tmp_path, "d", cfg)
    meta = load_meta(path)  # validates every file's dtype / shape / row count
    cards = feature_cardinalities(cfg)
    assert meta.num_embeddings_per_feature == cards
    assert meta.sparse_feature_names == [f"cat_{i}" for i in range(26)]
    assert meta.rows == {"train": 6000, "val": 3000, "test": 1000}
    for split in SPLITS:
        sparse = np.load(path / f"{split}_sparse.npy")
        assert sparse.dtype == np.int32 and sparse.shape == (meta.rows[split], 26)
        assert (sparse >= 0).all() and (sparse < np.asarray(cards)).all()
        dense = np.load(path / f"{split}_dense.npy")
        assert dense.dtype == np.float32 and dense.shape == (meta.rows[split], 13)
        assert np.isfinite(dense).all() and (dense >= 0).all()  # log(max(x, 0) + 1)
        labels = np.load(path / f"{split}_labels.npy")
        assert labels.dtype == np.int32 and labels.shape == (meta.rows[split], 1)
        assert set(np.unique(labels)) <= {0, 1}
    # The dense features look like log-counts: many exact zeros and a long tail.
    dense = np.load(path / "train_dense.npy")
    assert (dense == 0).mean() > 0.05
    assert dense.max() > 8  # exp(8) ~ 3000: heavy-tailed raw counts


def test_zipf_skew_and_permutation(tmp_path: Path) -> None:
    exps = [1.1] * 26
    exps[3] = 0.0  # feature 3: uniform
    cfg = tiny(num_train=40_000, zipf_exponents=exps, permute_ids=True)
    path = gen(tmp_path, "z", cfg)
    sparse = np.load(path / "train_sparse.npy")
    cards = feature_cardinalities(cfg)
    assert cards[2] == cards[3] == 2000

    def top1pct_share(f: int) -> float:
        counts = np.sort(np.bincount(sparse[:, f], minlength=cards[f]))[::-1]
        return counts[: cards[f] // 100].sum() / counts.sum()

    assert top1pct_share(2) > 0.3  # skewed: top 1% of ids get far more than 1% of lookups
    assert top1pct_share(3) < 0.03  # exponent 0: ~uniform
    hot = np.argsort(np.bincount(sparse[:, 2], minlength=cards[2]))[::-1][:20]
    assert hot.max() > 100  # permuted: hot ids are scattered over the table

    path2 = gen(tmp_path, "zp", dataclasses.replace(cfg, permute_ids=False))
    sparse2 = np.load(path2 / "train_sparse.npy")
    hot2 = np.argsort(np.bincount(sparse2[:, 2], minlength=cards[2]))[::-1][:5]
    assert set(hot2.tolist()) <= set(range(10))  # unpermuted: the hottest ids are 0, 1, 2, ...


def test_mean_label_matches_base_ctr(tmp_path: Path) -> None:
    path = gen(tmp_path, "ctr", tiny(num_train=40_000, base_ctr=0.1))
    meta = load_meta(path)
    labels = np.load(path / "train_labels.npy")
    assert abs(labels.mean() - 0.1) < 0.01
    assert abs(meta.ctr["train"] - labels.mean()) < 1e-9


def test_teacher_gives_learnable_signal(tmp_path: Path) -> None:
    path = gen(tmp_path, "sig", tiny(num_train=30_000, num_val=10_000))
    meta = load_meta(path)
    assert meta.teacher_auc is not None and meta.teacher_auc > 0.7
    # A model fit on train data only (smoothed per-id log-odds, summed over features: naive Bayes)
    # must beat chance on val: the signal is learnable, not just present in the teacher.
    tr_x, tr_y = np.load(path / "train_sparse.npy"), np.load(path / "train_labels.npy")[:, 0]
    va_x, va_y = np.load(path / "val_sparse.npy"), np.load(path / "val_labels.npy")[:, 0]
    prior = tr_y.mean()
    score = np.zeros(len(va_y))
    for f, card in enumerate(meta.num_embeddings_per_feature):
        pos = np.bincount(tr_x[:, f], weights=tr_y, minlength=card)
        cnt = np.bincount(tr_x[:, f], minlength=card)
        p = (pos + 10 * prior) / (cnt + 10)
        score += np.log(p / (1 - p))[va_x[:, f]]
    assert auc(torch.from_numpy(score), torch.from_numpy(va_y)) > 0.65


def test_ensure_dataset_caches(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = DataConfig(root=str(tmp_path), synthetic=tiny())
    path = ensure_dataset(cfg)
    assert path == tmp_path / f"synthetic_criteo-{config_hash(cfg.synthetic)}"
    mtime = (path / "meta.json").stat().st_mtime_ns

    def fail(*args, **kwargs):
        raise AssertionError("regenerated a cached dataset")

    monkeypatch.setattr(synthetic, "generate_dataset", fail)
    assert ensure_dataset(cfg) == path
    assert (path / "meta.json").stat().st_mtime_ns == mtime
    # A different config is a different directory.
    monkeypatch.undo()
    other = ensure_dataset(dataclasses.replace(cfg, synthetic=tiny(seed=1)))
    assert other != path and other.parent == path.parent


def test_crash_mid_generation_leaves_no_finished_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = DataConfig(root=str(tmp_path), synthetic=tiny())
    real_write = synthetic._write_chunk
    calls = {"n": 0}

    def crashing_write(arrays, start, chunk):
        calls["n"] += 1
        if calls["n"] == 2:  # the first chunk of the val split
            raise OSError("disk full (simulated)")
        real_write(arrays, start, chunk)

    monkeypatch.setattr(synthetic, "_write_chunk", crashing_write)
    with pytest.raises(OSError, match="simulated"):
        ensure_dataset(cfg)
    final = tmp_path / f"synthetic_criteo-{config_hash(cfg.synthetic)}"
    assert not final.exists()
    assert [p for p in tmp_path.iterdir() if p.is_dir()] == []  # the temporary dir was removed too

    # A hard crash (no cleanup) leaves only a hidden .tmp directory, which does not block a rerun.
    (tmp_path / f".{final.name}.tmp-deadbeef").mkdir()
    monkeypatch.setattr(synthetic, "_write_chunk", real_write)
    assert ensure_dataset(cfg) == final
    assert load_meta(final).rows["train"] == 6000


def test_losing_the_rename_race_discards_our_copy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = DataConfig(root=str(tmp_path), synthetic=tiny())
    real_rename = os.rename

    def rename_after_competitor(src, dst):
        shutil.copytree(src, dst)  # another process finished first
        real_rename(src, dst)  # -> OSError: destination exists and is not empty

    monkeypatch.setattr(synthetic.os, "rename", rename_after_competitor)
    final = ensure_dataset(cfg)
    assert load_meta(final).generator["hash"] == config_hash(cfg.synthetic)
    assert [p.name for p in tmp_path.iterdir() if p.is_dir()] == [final.name]


def test_concurrent_callers_generate_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import threading

    cfg = DataConfig(root=str(tmp_path), synthetic=tiny())
    real_generate = synthetic.generate_dataset
    calls = []

    def counting_generate(*args, **kwargs):
        calls.append(1)
        return real_generate(*args, **kwargs)

    monkeypatch.setattr(synthetic, "generate_dataset", counting_generate)
    results = []
    threads = [threading.Thread(target=lambda: results.append(ensure_dataset(cfg))) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(results) == 2 and results[0] == results[1]
    assert len(calls) == 1  # the second caller waited on the lock and found the cache


def test_invalid_existing_dir_is_reported(tmp_path: Path) -> None:
    cfg = DataConfig(root=str(tmp_path), synthetic=tiny())
    final = tmp_path / f"synthetic_criteo-{config_hash(cfg.synthetic)}"
    final.mkdir()
    with pytest.raises(ValueError, match="delete"):
        ensure_dataset(cfg)


def test_source_npy(tmp_path: Path) -> None:
    path = gen(tmp_path, "n", tiny())
    assert ensure_dataset(DataConfig(source="npy", path=str(path))) == path
    # data.synthetic is irrelevant for source=npy, even if it would be invalid.
    bad = dataclasses.replace(tiny(), base_ctr=2.0)
    assert ensure_dataset(DataConfig(source="npy", path=str(path), synthetic=bad)) == path
    with pytest.raises(ValueError, match="data.path"):
        ensure_dataset(DataConfig(source="npy"))
    with pytest.raises(FileNotFoundError, match="meta.json"):
        ensure_dataset(DataConfig(source="npy", path=str(tmp_path)))


@pytest.mark.parametrize(
    "overrides, key",
    [
        ({"zipf_exponents": [1.0] * 25}, "data.synthetic.zipf_exponents"),
        ({"zipf_exponents": [1.0] * 25 + [-1.0]}, r"data.synthetic.zipf_exponents\[25\]"),
        ({"zipf_exponent": -0.5}, "data.synthetic.zipf_exponent"),
        ({"base_ctr": 1.5}, "data.synthetic.base_ctr"),
        ({"min_cardinality": 1}, "data.synthetic.min_cardinality"),
        ({"min_cardinality": 500, "max_cardinality": 100}, "data.synthetic.max_cardinality"),
        ({"cardinality_scale": 0.0}, "data.synthetic.cardinality_scale"),
        ({"num_val": 0}, "data.synthetic.num_val"),
        ({"teacher_rank": -1}, "data.synthetic.teacher_rank"),
    ],
)
def test_config_errors_name_the_key(tmp_path: Path, overrides: dict, key: str) -> None:
    cfg = DataConfig(root=str(tmp_path), synthetic=dataclasses.replace(tiny(), **overrides))
    with pytest.raises(ValueError, match=key):
        ensure_dataset(cfg)
    assert not any(tmp_path.iterdir())


def test_data_config_errors(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="data.source"):
        ensure_dataset(DataConfig(root=str(tmp_path), source="parquet"))
    with pytest.raises(ValueError, match="data.name"):
        ensure_dataset(DataConfig(root=str(tmp_path), name="a/b"))


def test_accepts_omegaconf_structured_config(tmp_path: Path) -> None:
    from omegaconf import OmegaConf

    dc = OmegaConf.structured(DataConfig(root=str(tmp_path), synthetic=tiny()))
    dc.synthetic.seed = 7
    assert config_hash(dc.synthetic) == config_hash(tiny(seed=7))
    path = ensure_dataset(dc)
    assert path.name.endswith(config_hash(tiny(seed=7)))
