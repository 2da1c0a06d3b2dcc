"""Any CSV / TSV / Parquet file with a schema -> npy (slipstream_rec.data.tabular + convert)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from slipstream_rec.data.config import CategoricalEncoding, SplitConfig, TabularConfig
from slipstream_rec.data.convert import BadRowsError, convert
from slipstream_rec.data.loader import NpyBatchLoader, load_meta
from slipstream_rec.data.tabular import TabularSource, text_key
from slipstream_rec.data.vocab import Vocabulary

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


def test_csv_with_multi_hot_converts_and_loads(tmp_path):
    cols = make_clicks(3000)
    out = conv(schema([write_csv(tmp_path / "c.csv", cols)]), tmp_path / "out")
    meta = load_meta(out)
    assert sum(meta.rows.values()) == 3000 and all(n > 200 for n in meta.rows.values())
    assert meta.format_version == 2
    assert meta.sparse_feature_names == ["user", "item", "tags"] and meta.multi_hot_feature_names == ["tags"]
    assert meta.dense_feature_names == ["price", "views"]
    # Every row, read back through the loader, has its tags as a bag of the right ids.
    vocab = Vocabulary.load(out)
    lines = []  # the loader's rows of train are the CSV rows assigned to train, in file order
    loader = NpyBatchLoader(out, "train", batch_size=meta.rows["train"], train=True)
    batch = next(iter(loader))
    d = batch.sparse_features.to_dict()
    labels = np.array(cols["click"], dtype=np.float32)
    # find the train rows: match on (user id) sequence is ambiguous; rebuild the split instead
    from slipstream_rec.data.convert import _uniform

    u = _uniform(3, 0, np.arange(3000))
    train_rows = np.flatnonzero(u >= 0.2)
    assert np.array_equal(batch.labels.numpy(), labels[train_rows])
    tags = [cols["tags"][i] for i in train_rows]
    want_len = [len([t for t in s.split("|") if t]) for s in tags]
    assert d["tags"].lengths().tolist() == want_len
    want_vals = np.concatenate([vocab.encode("tags", np.array([text_key(t) for t in s.split("|") if t], dtype=np.int64)) for s in tags])
    assert d["tags"].values().tolist() == want_vals.tolist()
    assert d["user"].lengths().tolist() == [1] * len(train_rows)
    want_users = vocab.encode("user", np.array([text_key(cols["user"][i]) for i in train_rows]))
    assert d["user"].values().tolist() == want_users.tolist()
    np.testing.assert_allclose(batch.dense_features[:, 1].numpy(), np.log1p([float(cols["views"][i]) for i in train_rows]), rtol=1e-6)
    del lines


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
    from slipstream_rec.data.cli import main

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
