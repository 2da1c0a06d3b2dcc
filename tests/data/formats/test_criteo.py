"""Criteo TSV -> npy (slipstream_rec.data.formats.criteo + convert): parsing, vocabulary, splits,
gzip, bad rows, a crash mid-conversion, and training on the result."""

from __future__ import annotations

import gzip
import json
import math
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from slipstream_rec.data.convert import converter as convert_mod
from slipstream_rec.data.config import CategoricalEncoding, CriteoConfig, SplitConfig, SyntheticConfig
from slipstream_rec.data.convert.converter import convert
from slipstream_rec.data.convert.source import BadRowsError
from slipstream_rec.data.formats.criteo import CriteoSource, parse_criteo_lines
from slipstream_rec.data.generated.criteo_text import write_criteo_text
from slipstream_rec.data.loader import NpyBatchLoader
from slipstream_rec.data.meta import load_meta
from slipstream_rec.data.convert.vocab import Vocabulary

TEACHER = SyntheticConfig(cardinality_scale=0.0005, min_cardinality=8, max_cardinality=400, zipf_exponent=1.2)


def line(label="1", dense=None, cats=None) -> str:
    dense = dense if dense is not None else [str(i) for i in range(13)]
    cats = cats if cats is not None else [f"{i:08x}" for i in range(26)]
    return "\t".join([label, *dense, *cats])


def write_tsv(path: Path, rows: int, seed: int = 0, gz: bool = False) -> Path:
    with (gzip.open(path, "wb") if gz else open(path, "wb")) as f:
        write_criteo_text(f, rows, TEACHER, seed=seed, chunk_rows=5000)
    return path


def src(inputs, chunk_bytes=200_000, **kw) -> CriteoSource:
    return CriteoSource(CriteoConfig(inputs=[str(p) for p in inputs], **kw), chunk_bytes=chunk_bytes)


def test_parse_fields_missing_values_and_negatives():
    text = "\n".join(
        [
            line("1", ["5", "-2", "", "0", "123456789012"] + [""] * 8, ["68fd1e64"] * 25 + [""]),
            line("0", [""] * 13, ["ABCDEF01", "a", *["00000000"] * 24]),
        ]
    ) + "\r\n"
    lines, labels, dense, keys, bad = parse_criteo_lines(text.encode(), 0, 10)
    assert lines.tolist() == [10, 11] and labels.tolist() == [1, 0]
    assert all(v.size == 0 for v in bad.values())
    # log(max(x, 0) + 1); missing is 0; negatives clamp to 0
    np.testing.assert_allclose(dense[0, :5], np.log1p([5, 0, 0, 0, 123456789012]).astype(np.float32))
    assert (dense[1] == 0).all()
    assert keys[0, 0] == 0x68FD1E64 and keys[0, 25] == -1  # empty categorical = missing
    assert keys[1, 0] == 0xABCDEF01 and keys[1, 1] == 0xA  # upper case and short hex parse too


@pytest.mark.parametrize(
    "bad_line, reason",
    [
        ("1\t2\t3", "wrong column count"),
        (line(label="2"), "bad label"),
        (line(dense=["1.5"] + ["1"] * 12), "non-numeric dense value"),
        (line(dense=["-"] + ["1"] * 12), "non-numeric dense value"),
        (line(cats=["xyz00000"] + ["0"] * 25), "bad hex categorical value"),
        (line(cats=["0000000g"] + ["0"] * 25), "bad hex categorical value"),
        ("", "wrong column count"),
    ],
)
def test_parse_reports_each_malformed_row(bad_line, reason):
    text = "\n".join([line(), bad_line, line()]) + "\n"
    lines, *_, bad = parse_criteo_lines(text.encode(), 0, 0)
    assert lines.tolist() == [0, 2]
    assert bad[reason].tolist() == [1]
    assert sum(v.size for v in bad.values()) == 1


def test_gz_and_plain_convert_to_the_same_files(tmp_path):
    plain = write_tsv(tmp_path / "day.txt", 6000)
    gz = write_tsv(tmp_path / "day.txt.gz", 6000, gz=True)
    a = convert(src([plain]), tmp_path / "a")
    b = convert(src([gz]), tmp_path / "b")
    meta = load_meta(a)
    assert meta.rows == {"train": 5142, "val": 429, "test": 429}  # ordered: round(6000 / 14) each
    assert meta.sparse_feature_names == [f"cat_{i}" for i in range(26)] and meta.num_dense == 13
    for f in sorted(p.name for p in a.glob("*.npy")):
        assert np.array_equal(np.load(a / f), np.load(b / f)), f
    assert not list(tmp_path.glob(".*partial*"))  # work directories renamed away


def _read_tsv_by_hand(path: Path):
    """The reference: the TSV as Criteo documents it (label, 13 integers, 26 hex values; empty =
    missing), read line by line with Python's own int(), not with the parser under test."""
    labels, dense, keys = [], [], []
    for text in path.read_text().splitlines():
        f = text.split("\t")
        labels.append(int(f[0]))
        dense.append([math.log1p(max(int(v), 0)) if v else 0.0 for v in f[1:14]])
        keys.append([int(v, 16) if v else None for v in f[14:40]])
    return np.array(labels), np.array(dense), keys


def _expected_ids(train_values, all_values, min_count: int):
    """Ids as the encoding documents them: the values seen >= min_count times in the training rows,
    sorted, get 2, 3, ...; every other value 1; missing 0."""
    counts = Counter(v for v in train_values if v is not None)
    kept = sorted(v for v, c in counts.items() if c >= min_count)
    rank = {v: 2 + i for i, v in enumerate(kept)}
    return [0 if v is None else rank.get(v, 1) for v in all_values], len(kept)


def test_vocabulary_ids_dense_labels_and_split_against_a_hand_reading(tmp_path):
    path = write_tsv(tmp_path / "d.txt", 5000)
    out = convert(src([path], encoding=CategoricalEncoding(min_count=3)), tmp_path / "out")
    labels, dense, keys = _read_tsv_by_hand(path)
    meta = load_meta(out)
    # ordered split (the default): the last test_fraction of the rows to test, val before them
    split = CriteoConfig().split
    n_test, n_val = round(5000 * split.test_fraction), round(5000 * split.val_fraction)
    assert meta.rows == {"train": 5000 - n_val - n_test, "val": n_val, "test": n_test}
    n_train = meta.rows["train"]
    stored = np.concatenate([np.load(out / f"{s}_sparse.npy") for s in ("train", "val", "test")])
    stored_dense = np.concatenate([np.load(out / f"{s}_dense.npy") for s in ("train", "val", "test")])
    stored_labels = np.concatenate([np.load(out / f"{s}_labels.npy") for s in ("train", "val", "test")])
    assert stored_labels.reshape(-1).tolist() == labels.tolist()
    np.testing.assert_allclose(stored_dense, dense, rtol=1e-6)  # every one of the 13 columns
    rare_seen = 0
    for f in range(26):
        column = [row[f] for row in keys]
        want, n_kept = _expected_ids(column[:n_train], column, min_count=3)
        assert meta.num_embeddings_per_feature[f] == 2 + n_kept, f
        assert stored[:, f].tolist() == want, f"cat_{f}"
        rare_seen += want.count(1)
    assert rare_seen > 0  # the data has rare and unseen values, so id 1 is exercised
    # one id per kept value (injective): distinct kept values never share an id
    column = [row[0] for row in keys[:n_train]]
    pairs = {(v, int(i)) for v, i in zip(column, stored[:n_train, 0]) if v is not None}
    kept_pairs = {p for p in pairs if p[1] >= 2}
    assert len({v for v, _ in kept_pairs}) == len({i for _, i in kept_pairs}) == len(kept_pairs)
    # the saved vocabulary encodes the raw file to the same ids (what later files are encoded with)
    vocab = Vocabulary.load(out)
    _, _, _, parsed, _ = parse_criteo_lines(path.read_bytes(), 0, 0)
    assert np.array_equal(np.stack([vocab.encode(f"cat_{f}", parsed[:, f]) for f in range(26)], 1), stored)


def test_hash_encoding_and_max_size_cap(tmp_path):
    path = write_tsv(tmp_path / "d.txt", 3000)
    enc = {"cat_3": CategoricalEncoding(mode="hash", max_size=17), "cat_4": CategoricalEncoding(max_size=10)}
    out = convert(src([path], feature_encoding=enc), tmp_path / "out")
    meta = load_meta(out)
    assert meta.num_embeddings_per_feature[3] == 17 and meta.num_embeddings_per_feature[4] == 10
    sparse = np.load(out / "train_sparse.npy")
    assert sparse[:, 3].max() < 17 and sparse[:, 4].max() < 10
    # the cap keeps the most frequent values: they get their own ids, the others share id 1
    _, _, _, keys, _ = parse_criteo_lines(path.read_bytes(), 0, 0)
    k = keys[: meta.rows["train"], 4]
    values, counts = np.unique(k[k >= 0], return_counts=True)
    top = values[np.lexsort((values, -counts))[:8]]
    assert np.array_equal(np.sort(Vocabulary.load(out).kept["cat_4"]), np.sort(top))


def test_split_by_files_halves_the_eval_day(tmp_path):
    days = [write_tsv(tmp_path / f"day_{i}.gz", 1000, seed=i, gz=True) for i in range(3)]
    out = convert(
        src(days[:2], eval_inputs=[str(days[2])], split=SplitConfig(method="files")), tmp_path / "out"
    )
    assert load_meta(out).rows == {"train": 2000, "val": 500, "test": 500}


def test_bad_rows_error_or_skip_never_silent(tmp_path):
    good = [line(cats=[f"{(i * 7 + f) % 50:08x}" for f in range(26)]) for i in range(200)]
    rows = good[:50] + ["1\t2"] + good[50:120] + [line(dense=["x"] * 13)] + good[120:]
    path = tmp_path / "bad.txt"
    path.write_text("\n".join(rows) + "\n")
    with pytest.raises(BadRowsError, match=r"bad\.txt, line 51: wrong column count.*data\.bad_rows=skip"):
        convert(src([path]), tmp_path / "out")
    assert not (tmp_path / "out").exists()
    out = convert(src([path], split=SplitConfig(method="random", val_fraction=0.2, test_fraction=0.2)), tmp_path / "out2", bad_rows="skip")
    meta = load_meta(out)
    assert sum(meta.rows.values()) == 200
    assert meta.generator["bad_rows"] == {"wrong column count": 1, "non-numeric dense value": 1}


def test_crash_mid_conversion_leaves_nothing_finished_and_rerun_completes(tmp_path, monkeypatch):
    path = write_tsv(tmp_path / "d.txt", 8000)
    reference = convert(src([path], encoding=CategoricalEncoding(min_count=2)), tmp_path / "ref")

    monkeypatch.setattr(convert_mod, "CHECKPOINT_SECONDS", 0.0)
    calls = {"n": 0}

    def crash(chunk):
        calls["n"] += 1
        if calls["n"] == 5:
            raise KeyboardInterrupt("simulated crash")

    monkeypatch.setattr(convert_mod, "_after_chunk", crash)
    final = tmp_path / "out"
    with pytest.raises(KeyboardInterrupt):
        convert(src([path], encoding=CategoricalEncoding(min_count=2)), final)
    assert not final.exists()
    work = tmp_path / ".out.partial"
    assert not (work / "meta.json").exists() and not list(work.glob("*.npy"))  # only .part files
    state = json.loads((work / "state.json").read_text())
    assert state["stage"] == "encode" and state["position"]["offset"] > 0

    monkeypatch.setattr(convert_mod, "_after_chunk", lambda chunk: calls.__setitem__("resumed", calls.get("resumed", 0) + 1))
    convert(src([path], encoding=CategoricalEncoding(min_count=2)), final)
    total_chunks = calls["n"] - 1 + calls["resumed"]
    assert calls["resumed"] < total_chunks  # resumed, did not start over
    assert not work.exists()
    for f in sorted(p.name for p in reference.glob("*.npy")):
        assert (reference / f).read_bytes() == (final / f).read_bytes(), f
    assert load_meta(final).num_embeddings_per_feature == load_meta(reference).num_embeddings_per_feature


def test_existing_output_with_other_settings_is_an_error(tmp_path):
    path = write_tsv(tmp_path / "d.txt", 2000)
    out = convert(src([path]), tmp_path / "out")
    assert convert(src([path]), out) == out  # same settings: reused
    with pytest.raises(ValueError, match="other settings"):
        convert(src([path], encoding=CategoricalEncoding(min_count=5)), out)


@pytest.mark.parametrize(
    "cfg, match",
    [
        (CriteoConfig(), r"data\.criteo\.inputs is empty"),
        (CriteoConfig(inputs=["/nonexistent/day_0"]), "does not exist"),
        (CriteoConfig(inputs=["x"], encoding=CategoricalEncoding(mode="hash")), r"data\.criteo\.encoding\.max_size must be set"),
        (CriteoConfig(inputs=["x"], feature_encoding={"cat_99": CategoricalEncoding()}), "cat_99"),
        (CriteoConfig(inputs=["x"], split=SplitConfig(method="files")), "eval_inputs"),
        (CriteoConfig(inputs=["x"], split=SplitConfig(val_fraction=0.6, test_fraction=0.5)), "no training rows"),
    ],
)
def test_bad_settings_name_the_key(tmp_path, cfg, match):
    (tmp_path / "x").write_text(line() + "\n")
    cfg.inputs = [str(tmp_path / p) if not p.startswith("/") else p for p in cfg.inputs]
    with pytest.raises((ValueError, FileNotFoundError), match=match):
        CriteoSource(cfg)


def test_empty_input_is_an_error(tmp_path):
    (tmp_path / "empty.txt").write_bytes(b"")
    with pytest.raises(ValueError, match="empty dataset"):
        convert(src([tmp_path / "empty.txt"]), tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_converted_data_loads_in_range(tmp_path):
    out = convert(src([write_tsv(tmp_path / "d.txt", 3000)]), tmp_path / "out")
    loader = NpyBatchLoader(out, "train", batch_size=256, rank=1, world_size=2, train=True)
    batch = next(iter(loader))
    assert batch.sparse_features.keys() == [f"cat_{i}" for i in range(26)]
    assert batch.dense_features.shape == (256, 13)
