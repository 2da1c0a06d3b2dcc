"""Any CSV / TSV / Parquet file with a schema -> npy (slipstream_rec.data.formats.tabular + convert)."""

from __future__ import annotations

import hashlib
import math
from pathlib import Path

import numpy as np
import pytest

from slipstream_rec.data.config import CategoricalEncoding, SplitConfig, TabularConfig
from slipstream_rec.data.convert.converter import convert
from slipstream_rec.data.convert.source import BadRowsError
from slipstream_rec.data.loader import NpyBatchLoader
from slipstream_rec.data.meta import load_meta
from slipstream_rec.data.formats.tabular import TabularSource
from slipstream_rec.data.convert.vocab import Vocabulary

from tests.data._clicks import make_clicks, write_csv, write_parquet


def schema(inputs, **kw) -> TabularConfig:
    base = dict(
        inputs=[str(p) for p in inputs],
        label_column="click",
        dense_columns=["price", "views"],
        categorical_columns=["user", "item"],
        multi_hot_columns=["tags"],
        split=SplitConfig(method="random", val_fraction=0.1, test_fraction=0.1, seed=3),
    )
    base.update(kw)
    return TabularConfig(**base)


def conv(cfg: TabularConfig, out: Path, **kw) -> Path:
    return convert(TabularSource(cfg, chunk_bytes=20_000), out, **kw)


def _key(text: str) -> int:
    """The documented key of a categorical text: a 63-bit BLAKE2b hash of its UTF-8 bytes."""
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "little") >> 1


def _id_map(texts) -> dict:
    """The documented ids: the kept values (min_count 1: all seen in train), sorted by key -> 2 + rank."""
    return {t: 2 + i for i, t in enumerate(sorted(set(texts), key=_key))}


def test_csv_with_multi_hot_converts_and_loads(tmp_path):
    n = 3000
    cols = make_clicks(n)
    cols["row"] = [str(i) for i in range(n)]  # a dense column that tells which CSV row each row is
    cfg = schema([write_csv(tmp_path / "c.csv", cols)], dense_columns=["price", "views", "row"])
    out = conv(cfg, tmp_path / "out")
    meta = load_meta(out)
    assert meta.format_version == 2
    assert meta.sparse_feature_names == ["user", "item", "tags"] and meta.multi_hot_feature_names == ["tags"]
    assert meta.dense_feature_names == ["price", "views", "row"]
    rows = {}
    for split in ("train", "val", "test"):
        batch = next(iter(NpyBatchLoader(out, split, batch_size=meta.rows[split], train=False)))
        rows[split] = (batch, np.rint(np.expm1(batch.dense_features[:, 2].numpy().astype(np.float64))).astype(int))
    # The random split: every CSV row in exactly one split, each split near its configured fraction
    # (binomial, 5 sigma), and the held-out rows spread over the file rather than one block.
    placed = np.concatenate([r for _, r in rows.values()])
    assert sorted(placed.tolist()) == list(range(n))
    for split, frac in (("val", cfg.split.val_fraction), ("test", cfg.split.test_fraction)):
        got = rows[split][1]
        assert abs(got.size - frac * n) < 5 * (n * frac * (1 - frac)) ** 0.5, (split, got.size)
        assert got.min() < n / 4 and got.max() > 3 * n / 4, split
    train_rows = rows["train"][1]
    assert np.all(np.diff(train_rows) > 0)  # file order
    user_ids = _id_map(cols["user"][i] for i in train_rows)
    item_ids = _id_map(cols["item"][i] for i in train_rows)
    tag_ids = _id_map(t for i in train_rows for t in cols["tags"][i].split("|") if t)
    assert len(Vocabulary.load(out).kept["tags"]) == len(tag_ids)
    for split, (batch, idx) in rows.items():
        d = batch.sparse_features.to_dict()
        assert batch.labels.numpy().tolist() == [float(cols["click"][i]) for i in idx], split
        want_dense = [[math.log1p(max(float(cols[c][i]), 0.0)) for c in ("price", "views", "row")] for i in idx]
        np.testing.assert_allclose(batch.dense_features.numpy(), want_dense, rtol=1e-6)
        assert d["user"].lengths().tolist() == [1] * idx.size
        assert d["user"].values().tolist() == [user_ids.get(cols["user"][i], 1) for i in idx], split
        assert d["item"].values().tolist() == [item_ids.get(cols["item"][i], 1) for i in idx], split
        bags = [[t for t in cols["tags"][i].split("|") if t] for i in idx]
        assert d["tags"].lengths().tolist() == [len(b) for b in bags], split
        assert d["tags"].values().tolist() == [tag_ids.get(t, 1) for b in bags for t in b], split
    assert 1 in rows["val"][0].sparse_features.to_dict()["user"].values().tolist()  # unseen users


def test_parquet_tsv_and_csv_give_the_same_dataset(tmp_path):
    cols = make_clicks(2500, seed=1)
    a = conv(schema([write_csv(tmp_path / "c.csv", cols)]), tmp_path / "a")
    b = conv(schema([write_parquet(tmp_path / "c.parquet", cols)]), tmp_path / "b")
    c = conv(schema([write_csv(tmp_path / "c.tsv", cols, "\t", header=False)], header=False, column_names=list(cols)), tmp_path / "c")
    files = sorted(p.name for p in a.glob("*.npy"))
    assert "train_tags_values.npy" in files and "train_tags_offsets.npy" in files
    for f in files:
        assert np.array_equal(np.load(a / f), np.load(b / f)), f
        assert np.array_equal(np.load(a / f), np.load(c / f)), f


def test_time_split_puts_the_latest_rows_in_test(tmp_path):
    cols = make_clicks(4000, seed=2)
    order = np.random.default_rng(0).permutation(4000)  # rows not in time order in the file
    shuffled = {k: [v[i] for i in order] for k, v in cols.items()}
    out = conv(schema([write_csv(tmp_path / "c.csv", shuffled)], time_column="ts", split=SplitConfig(method="time", val_fraction=0.1, test_fraction=0.2)), tmp_path / "out")
    meta = load_meta(out)
    assert meta.rows == {"train": 2800, "val": 400, "test": 800}
    # test rows are exactly the 800 latest timestamps: their views/labels match those rows
    ts = np.array(shuffled["ts"], dtype=np.int64)
    latest = np.sort(ts)[-800:]
    test_labels = np.load(out / "test_labels.npy")[:, 0]
    file_order_latest = [i for i in range(4000) if ts[i] >= latest[0]]
    assert test_labels.tolist() == [int(shuffled["click"][i]) for i in file_order_latest]


def test_label_rules(tmp_path):
    cols = make_clicks(500)
    cols["click"] = [str(1 + (i % 5)) for i in range(500)]  # ratings 1..5
    out = conv(schema([write_csv(tmp_path / "c.csv", cols)], label_rule="threshold", label_threshold=4), tmp_path / "t")
    assert load_meta(out).ctr["train"] == pytest.approx(0.4, abs=0.05)
    out = conv(schema([write_csv(tmp_path / "c.csv", cols)], label_rule="positive_values", label_positive_values=["5"]), tmp_path / "p")
    assert load_meta(out).ctr["train"] == pytest.approx(0.2, abs=0.05)
    with pytest.raises(BadRowsError, match=r"c\.csv, line 3: bad label"):
        conv(schema([write_csv(tmp_path / "c.csv", cols)]), tmp_path / "b")  # binary: 2..5 are bad


def test_bad_rows_are_counted_or_rejected(tmp_path):
    cols = make_clicks(400)
    cols["price"][10] = "cheap"
    cols["views"][20] = "nan"
    path = write_csv(tmp_path / "c.csv", cols)
    with path.open("a") as f:
        f.write("1,2,3\n")  # wrong column count
    with pytest.raises(BadRowsError, match=r"line 12: non-numeric dense value"):
        conv(schema([path]), tmp_path / "x")
    out = conv(schema([path]), tmp_path / "y", bad_rows="skip")
    meta = load_meta(out)
    assert sum(meta.rows.values()) == 398
    assert meta.generator["bad_rows"] == {"non-numeric dense value": 2, "wrong column count": 1}


def test_schema_naming_a_missing_column_fails_before_writing(tmp_path):
    path = write_csv(tmp_path / "c.csv", make_clicks(50))
    with pytest.raises(ValueError, match=r"c\.csv has no column\(s\) \['brand'\].*it has \['click'"):
        TabularSource(schema([path], categorical_columns=["user", "brand"]))
    with pytest.raises(ValueError, match="label_rule"):
        TabularSource(schema([path], label_rule="maybe"))
    with pytest.raises(ValueError, match="more than once"):
        TabularSource(schema([path], dense_columns=["user"]))
    with pytest.raises(ValueError, match=r"feature_encoding names column\(s\) \['nope'\]"):
        TabularSource(schema([path], feature_encoding={"nope": CategoricalEncoding()}))
    assert not list(tmp_path.glob("*partial*"))


def test_slipstream_data_tabular_cli_with_a_schema_file(tmp_path):
    from slipstream_rec.data_cli import main

    path = write_csv(tmp_path / "c.csv", make_clicks(600))
    schema_file = tmp_path / "schema.yaml"
    schema_file.write_text(
        "label_column: click\ndense_columns: [price, views]\ncategorical_columns: [user, item]\n"
        "multi_hot_columns: [tags]\nsplit: {method: random, val_fraction: 0.2, test_fraction: 0.2}\n"
    )
    out = tmp_path / "out"
    rc = main(["tabular", "--schema", str(schema_file), "--input", str(path), "--out", str(out),
               "--no-progress", "data.tabular.encoding.min_count=2"])
    assert rc == 0
    meta = load_meta(out)
    assert meta.multi_hot_feature_names == ["tags"] and sum(meta.rows.values()) == 600
    assert meta.generator["config"]["encoding"]["min_count"] == 2
    assert main(["tabular", "--input", str(path), "--out", str(tmp_path / "o2"), "--no-progress"]) == 2  # default schema: columns missing
