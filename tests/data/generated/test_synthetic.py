"""The synthetic Criteo-like generator (slipstream_rec.data.generated.synthetic)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest
import torch

from slipstream_rec.data.config import CRITEO_KAGGLE_CARDINALITIES, DataConfig, SyntheticConfig
from slipstream_rec.data.datasets import ensure_dataset
from slipstream_rec.data.generated.synthetic import feature_cardinalities
from slipstream_rec.data.meta import SPLITS, load_meta
from slipstream_rec.metrics import auc
from tests._fixtures import gen, tiny



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
