"""MovieLens-1M as CTR (slipstream_rec.data.movielens) from GroupLens-format files."""

from __future__ import annotations

import zipfile
from pathlib import Path

import numpy as np
import pytest

from slipstream_rec.data.config import DataConfig, MovieLensConfig, SplitConfig
from slipstream_rec.data.loader import NpyBatchLoader, load_meta
from slipstream_rec.data.synthetic import ensure_dataset


def write_grouplens(d: Path, n_users: int = 40, n_movies: int = 30, seed: int = 0) -> Path:
    rng = np.random.default_rng(seed)
    d.mkdir(parents=True)
    genres = ["Action", "Comedy", "Drama", "Horror", "Children's"]
    movies = [f"{m}::Movie {m} ({1990 + m % 10})::{'|'.join(rng.choice(genres, rng.integers(1, 4), replace=False))}" for m in range(1, n_movies + 1)]
    users = [f"{u}::{'MF'[u % 2]}::{[1, 18, 25][u % 3]}::{u % 21}::{10000 + u * 37}" for u in range(1, n_users + 1)]
    ratings = []
    for u in range(1, n_users + 1):
        for m in rng.choice(np.arange(1, n_movies + 1), 15, replace=False):
            ratings.append(f"{u}::{m}::{rng.integers(1, 6)}::{978300000 + int(rng.integers(0, 10**7))}")
    (d / "movies.dat").write_text("\n".join(movies) + "\n", encoding="latin-1")
    (d / "users.dat").write_text("\n".join(users) + "\n")
    (d / "ratings.dat").write_text("\n".join(ratings) + "\n")
    return d


def test_grouplens_files_give_attributes_and_multi_hot_genres(tmp_path):
    src = write_grouplens(tmp_path / "ml-1m")
    cfg = DataConfig(name="ml", root=str(tmp_path / "data"), source="movielens_1m",
                     movielens=MovieLensConfig(source=str(src), pip_fallback=False))
    out = ensure_dataset(cfg)
    meta = load_meta(out)
    assert meta.sparse_feature_names == ["user", "movie", "hour", "weekday", "gender", "age", "occupation", "zip3", "year", "genres"]
    assert meta.multi_hot_feature_names == ["genres"] and meta.num_dense == 2
    assert sum(meta.rows.values()) == 40 * 15
    assert meta.rows["test"] == 60 and meta.rows["val"] == 60  # time split 10% / 10%
    batch = next(iter(NpyBatchLoader(out, "train", batch_size=64, train=True)))
    lengths = batch.sparse_features.to_dict()["genres"].lengths()
    assert 1 <= int(lengths.min()) and int(lengths.max()) <= 3
    # the same files zipped (as GroupLens ships them) give the same dataset
    z = tmp_path / "ml-1m.zip"
    with zipfile.ZipFile(z, "w") as zf:
        for f in src.iterdir():
            zf.write(f, f"ml-1m/{f.name}")
    out2 = ensure_dataset(DataConfig(name="ml", root=str(tmp_path / "data2"), source="movielens_1m",
                                     movielens=MovieLensConfig(source=str(z), pip_fallback=False)))
    for f in out.glob("*.npy"):
        assert np.array_equal(np.load(f), np.load(out2 / f.name)), f.name


def test_missing_files_without_fallback_say_where_to_put_them(tmp_path):
    cfg = DataConfig(root=str(tmp_path), source="movielens_1m", movielens=MovieLensConfig(pip_fallback=False))
    with pytest.raises(ValueError, match=r"grouplens\.org.*downloads"):
        ensure_dataset(cfg)
    with pytest.raises(ValueError, match="holds no GroupLens ratings.dat"):
        ensure_dataset(DataConfig(root=str(tmp_path), source="movielens_1m", movielens=MovieLensConfig(source=str(tmp_path))))
    with pytest.raises(ValueError, match="MovieLens is one file"):
        ensure_dataset(DataConfig(root=str(tmp_path), source="movielens_1m",
                                  movielens=MovieLensConfig(source=str(write_grouplens(tmp_path / "g")), split=SplitConfig(method="files"))))
