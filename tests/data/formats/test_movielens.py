"""MovieLens-1M as CTR (slipstream_rec.data.formats.movielens) from GroupLens-format files."""

from __future__ import annotations

import math
import zipfile
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import pytest

from slipstream_rec.data.config import DataConfig, MovieLensConfig, SplitConfig
from slipstream_rec.data.datasets import ensure_dataset
from slipstream_rec.data.loader import NpyBatchLoader
from slipstream_rec.data.meta import load_meta

FIXTURE = Path(__file__).parents[1] / "fixtures" / "ml-tiny"  # invented ratings, GroupLens's format


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


def _by_hand(name: str):
    return [line.split("::") for line in (FIXTURE / name).read_text(encoding="latin-1").splitlines()]


def _ids(train_keys, keys) -> list:
    """The vocabulary's documented ids: keys seen in train, sorted -> 2 + rank; unseen 1; missing 0."""
    rank = {k: 2 + i for i, k in enumerate(sorted({k for k in train_keys if k is not None}))}
    return [0 if k is None else rank.get(k, 1) for k in keys]


def test_fixture_labels_user_attributes_and_genres_against_a_hand_reading(tmp_path):
    cfg = DataConfig(name="ml", root=str(tmp_path), source="movielens_1m",
                     movielens=MovieLensConfig(source=str(FIXTURE), pip_fallback=False))
    out = ensure_dataset(cfg)
    meta = load_meta(out)
    names = meta.sparse_feature_names
    assert names == ["user", "movie", "hour", "weekday", "gender", "age", "occupation", "zip3", "year", "genres"]
    users = {int(u[0]): u for u in _by_hand("users.dat")}
    movies = {int(m[0]): m for m in _by_hand("movies.dat")}
    genre_key = {}  # genres numbered in order of first appearance in movies.dat
    for m in movies.values():
        for g in m[2].split("|"):
            genre_key.setdefault(g, len(genre_key))
    ratings = [tuple(int(x) for x in r) for r in _by_hand("ratings.dat")]
    # time split, 10% / 10%: the 3 latest ratings are test, the 3 before them val, in file order
    order = sorted(ts for *_, ts in ratings)
    n = len(ratings)
    test_from = order[n - round(n * cfg.movielens.split.test_fraction)]
    val_from = order[n - round(n * (cfg.movielens.split.test_fraction + cfg.movielens.split.val_fraction))]
    split_of = lambda ts: "test" if ts >= test_from else "val" if ts >= val_from else "train"  # noqa: E731
    rows = {s: [r for r in ratings if split_of(r[3]) == s] for s in ("train", "val", "test")}
    assert meta.rows == {s: len(r) for s, r in rows.items()} == {"train": 24, "val": 3, "test": 3}

    def raw(r):
        u, m, _, ts = r
        _, gender, age, occ, zipcode = users[u]
        title = movies[m][1]
        t = datetime.fromtimestamp(ts, tz=timezone.utc)
        return {"user": u, "movie": m, "hour": t.hour, "weekday": t.weekday(), "gender": gender,
                "age": int(age), "occupation": int(occ), "zip3": int(zipcode[:3]) if zipcode[:3].isdigit() else None,
                "year": int(title[-5:-1]) if title.endswith(")") else None}

    first_ts = min(order)
    user_first = {u: min(ts for uu, _, _, ts in ratings if uu == u) for u in users}
    for split, rs in rows.items():
        labels = np.load(out / f"{split}_labels.npy")[:, 0]
        assert labels.tolist() == [int(rating >= 4) for _, _, rating, _ in rs], split
        sparse = np.load(out / f"{split}_sparse.npy")
        for j, f in enumerate(names[:-1]):
            want = _ids([raw(r)[f] for r in rows["train"]], [raw(r)[f] for r in rs])
            assert sparse[:, j].tolist() == want, (split, f)
        dense = np.load(out / f"{split}_dense.npy")
        want_dense = [[math.log1p((ts - first_ts) / 86400), math.log1p((ts - user_first[u]) / 86400)] for u, _, _, ts in rs]
        np.testing.assert_allclose(dense, want_dense, rtol=1e-5, atol=1e-6)
        values, offsets = np.load(out / f"{split}_genres_values.npy"), np.load(out / f"{split}_genres_offsets.npy")
        bags = [values[offsets[i]:offsets[i + 1]].tolist() for i in range(len(rs))]
        assert bags == [[2 + genre_key[g] for g in movies[m][2].split("|")] for _, m, _, _ in rs], split
    # named movies, as a reader of movies.dat sees them (every genre is rated in train)
    train_bags = np.load(out / "train_genres_values.npy"), np.load(out / "train_genres_offsets.npy")
    first = {m: i for i, (_, m, _, _) in reversed(list(enumerate(rows["train"])))}
    bag = lambda m: train_bags[0][train_bags[1][first[m]]:train_bags[1][first[m] + 1]].tolist()  # noqa: E731
    assert bag(1) == [2, 3, 4]  # Harbor Lights: Animation, Children's, Comedy
    assert bag(4) == [4, 8]  # Paper Moons: Comedy (as Harbor Lights), Romance
    assert bag(3) == [6, 7]  # The Long Field: Drama, War
    # user 4 (F, 45, occupation 7, zip 02460) on Paper Moons (rated 3): not a click
    i = next(i for i, r in enumerate(rows["train"]) if r[:2] == (4, 4))
    row = np.load(out / "train_sparse.npy")[i]
    assert np.load(out / "train_labels.npy")[i, 0] == 0
    assert row[names.index("gender")] == 2 and row[names.index("zip3")] == 2  # F < M; 024 the smallest zip3
    # Glass River (1972) is rated only in val/test: its movie and year are unseen (1); user 5's
    # zip "T6G2V" is not a number: missing (0)
    test_sparse = np.load(out / "test_sparse.npy")
    assert set(test_sparse[:, names.index("movie")].tolist()) == {1}
    assert set(test_sparse[:, names.index("year")].tolist()) == {1}
    u5 = [k for k, r in enumerate(rows["test"]) if r[0] == 5]
    assert u5 and test_sparse[u5, names.index("zip3")].tolist() == [0] * len(u5)
