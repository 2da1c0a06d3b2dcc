"""A dataset directory in TorchRec's binary criteo npy layout: file names and ``meta.json``, checked.

Directory layout (written by the generators in ``data/generated/`` and by ``data/convert/``)::

    meta.json                 # see DatasetMeta
    {split}_dense.npy         # (N, 13) float32, already log(x + 1)-transformed
    {split}_sparse.npy        # (N, 26) int32, ids in [0, num_embeddings_per_feature[f])
    {split}_labels.npy        # (N, 1)  int32, 0/1

for split in train / val / test. Multi-valued (multi-hot) features, listed in meta.json's
``multi_hot_feature_names`` (format_version 2; written by slipstream-data), are not columns of
``{split}_sparse.npy`` (which then holds the other features, in sparse_feature_names order)
but a ragged pair per feature::

    {split}_{feature}_values.npy   # (nnz,)  int32 ids of all rows, back to back
    {split}_{feature}_offsets.npy  # (N + 1,) int64, row i's ids are values[offsets[i]:offsets[i+1]]

A dataset without multi-hot features is format_version 1, TorchRec's own layout.

``load_meta`` reads and checks ``meta.json`` and the files' headers before a rank reads a row
(``loader.NpyBatchLoader``), so a bad directory is one error naming the file and the fix.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Union

import numpy as np

META_FILE = "meta.json"
FORMAT_VERSION = 1
FORMAT_VERSIONS = (1, 2)  # 2: with multi_hot_feature_names (ragged files)
SPLITS = ("train", "val", "test")

_EXPECTED = {  # kind -> dtype of {split}_{kind}.npy
    "dense": np.dtype(np.float32),
    "sparse": np.dtype(np.int32),
    "labels": np.dtype(np.int32),
}


def split_file(path: Union[str, Path], split: str, kind: str) -> Path:
    """``{path}/{split}_{kind}.npy`` for kind in dense / sparse / labels."""
    return Path(path) / f"{split}_{kind}.npy"


@dataclass
class DatasetMeta:
    """The contents of a dataset directory's meta.json (plus where it was read from)."""

    path: Path  # the dataset directory
    format_version: int  # layout version (FORMAT_VERSION)
    num_dense: int  # columns of {split}_dense.npy
    sparse_feature_names: List[str]  # KJT keys, one per column of {split}_sparse.npy
    dense_feature_names: List[str]  # one per column of {split}_dense.npy
    num_embeddings_per_feature: List[int]  # table rows per sparse feature (ids are < this)
    rows: Dict[str, int]  # rows per split, e.g. {"train": N, "val": N, "test": N}
    teacher_auc: Optional[float] = None  # Bayes AUC of the generating teacher on val (synthetic)
    ctr: Dict[str, float] = field(default_factory=dict)  # observed mean label per split
    generator: Optional[Dict[str, Any]] = None  # how the data was made (name, config, hash)
    # Features stored as ragged values/offsets pairs (several ids per row); format_version 2.
    multi_hot_feature_names: List[str] = field(default_factory=list)

    @property
    def num_sparse(self) -> int:
        return len(self.sparse_feature_names)

    @property
    def one_hot_feature_names(self) -> List[str]:
        """The features that are columns of {split}_sparse.npy, in column order."""
        multi = set(self.multi_hot_feature_names)
        return [f for f in self.sparse_feature_names if f not in multi]

    @property
    def splits(self) -> List[str]:
        return list(self.rows)


# Names of raw click-log files (what slipstream-data converts), as opposed to a dataset's .npy.
_RAW_SUFFIX = re.compile(r"\.(csv|tsv|tab|txt|parquet|pq)(\.gz)?$", re.I)


def _meta_error(path: Path, problem: str) -> ValueError:
    return ValueError(
        f"{path / META_FILE}: {problem}. Fix: regenerate the dataset (delete the directory and let "
        f"ensure_dataset rebuild it), or for data.source=npy write a meta.json with keys "
        f"format_version, num_dense, sparse_feature_names, dense_feature_names, "
        f"num_embeddings_per_feature, rows (see slipstream_rec/data/meta.py)."
    )


def raw_file_given(path: Path) -> str:
    """The error for data.path naming a raw file instead of a converted directory, with the
    command that converts it (the trainer reads only the npy layout)."""
    stem = path.name.split(".")[0]
    if path.name.lower().removesuffix(".gz") == "train.txt" or stem.startswith("day_"):
        command = f"slipstream-data criteo --input {path} --out data/criteo"  # Criteo's raw TSV
        out = "data/criteo"
    else:
        command = f"slipstream-data tabular --schema SCHEMA.yaml --input {path} --out data/{stem}"
        out = f"data/{stem}"
    return (
        f"data.path={path} is a file, not a dataset directory: the trainer reads the npy directory "
        f"slipstream-data converts a raw file into. Fix: `{command}` (SCHEMA.yaml: README, "
        f"'Train on your own click log'), then data.path={out}"
    )


def load_meta(path: Union[str, Path], *, check_files: bool = True) -> DatasetMeta:
    """Read and validate ``{path}/meta.json``; with ``check_files`` also the .npy headers.

    Checks (each error names the file and the fix): meta.json exists and has the required keys,
    every split's three files exist, have the right dtype and shape, and agree on the row count
    with each other and with meta.json. Only headers are read (mmap), so this is cheap.
    """
    path = Path(path)
    meta_path = path / META_FILE
    if path.is_file():
        raise ValueError(raw_file_given(path))
    if not path.is_dir():
        raise FileNotFoundError(
            f"dataset directory {path} does not exist. Fix: check data.path (for data.source=npy) "
            f"or use data.source=synthetic to generate one."
        )
    if not meta_path.is_file():
        raw_inputs = sorted(p.name for p in path.iterdir() if _RAW_SUFFIX.search(p.name))
        if not any(path.iterdir()) or raw_inputs:
            # An empty directory, or one of raw files: the user has not converted anything yet.
            given = str(path / raw_inputs[0]) if raw_inputs else "clicks.csv"
            out = f"data/{raw_inputs[0].split('.')[0]}" if raw_inputs else str(path)
            what = f"holds raw input ({', '.join(raw_inputs[:3])})" if raw_inputs else "is empty"
            raise FileNotFoundError(
                f"data.path={path} {what}, not a converted dataset (no {META_FILE}). Fix: convert "
                f"the click log first, `slipstream-data tabular --schema SCHEMA.yaml --input {given} "
                f"--out {out}` (SCHEMA.yaml: README, 'Train on your own click log'; `slipstream-data "
                f"criteo` for Criteo's TSV), then data.path={out}"
            )
        raise FileNotFoundError(
            f"{meta_path} is missing. Fix: a finished dataset directory always has meta.json; "
            f"regenerate it (data.source=synthetic) or, for data.source=npy, write a meta.json "
            f"with keys format_version, num_dense, sparse_feature_names, dense_feature_names, "
            f"num_embeddings_per_feature, rows (see slipstream_rec/data/meta.py)."
        )
    try:
        raw = json.loads(meta_path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise _meta_error(path, f"cannot be parsed as JSON ({e})") from e
    if not isinstance(raw, dict):
        raise _meta_error(path, "is not a JSON object")
    required = [
        "format_version", "num_dense", "sparse_feature_names", "dense_feature_names",
        "num_embeddings_per_feature", "rows",
    ]  # fmt: skip
    missing = [k for k in required if k not in raw]
    if missing:
        raise _meta_error(path, f"lacks the key(s) {missing}")
    if raw["format_version"] not in FORMAT_VERSIONS:
        raise _meta_error(
            path, f"has format_version {raw['format_version']!r}, expected one of {FORMAT_VERSIONS}"
        )
    meta = DatasetMeta(
        path=path,
        format_version=int(raw["format_version"]),
        num_dense=int(raw["num_dense"]),
        sparse_feature_names=[str(k) for k in raw["sparse_feature_names"]],
        dense_feature_names=[str(k) for k in raw["dense_feature_names"]],
        num_embeddings_per_feature=[int(n) for n in raw["num_embeddings_per_feature"]],
        rows={str(k): int(v) for k, v in dict(raw["rows"]).items()},
        teacher_auc=None if raw.get("teacher_auc") is None else float(raw["teacher_auc"]),
        ctr={str(k): float(v) for k, v in dict(raw.get("ctr") or {}).items()},
        generator=raw.get("generator"),
        multi_hot_feature_names=[str(k) for k in raw.get("multi_hot_feature_names") or []],
    )
    unknown = sorted(set(meta.multi_hot_feature_names) - set(meta.sparse_feature_names))
    if unknown:
        raise _meta_error(path, f"lists multi_hot_feature_names {unknown} that are not in sparse_feature_names")
    if meta.multi_hot_feature_names and meta.format_version < 2:
        raise _meta_error(path, "lists multi_hot_feature_names but has format_version 1 (needs 2)")
    if len(meta.num_embeddings_per_feature) != meta.num_sparse:
        raise _meta_error(
            path,
            f"has {len(meta.num_embeddings_per_feature)} num_embeddings_per_feature but "
            f"{meta.num_sparse} sparse_feature_names",
        )
    if any(n < 1 for n in meta.num_embeddings_per_feature):
        raise _meta_error(path, "has a num_embeddings_per_feature entry < 1")
    if len(meta.dense_feature_names) != meta.num_dense:
        raise _meta_error(
            path, f"has {len(meta.dense_feature_names)} dense_feature_names but num_dense={meta.num_dense}"
        )
    if len(set(meta.sparse_feature_names)) != meta.num_sparse:
        raise _meta_error(path, "has duplicate sparse_feature_names")
    if not meta.rows:
        raise _meta_error(path, "has no splits in rows")
    if check_files:
        for split in meta.rows:
            _check_split_files(meta, split)
    return meta


def _check_split_files(meta: DatasetMeta, split: str) -> None:
    if meta.rows[split] == 0:
        raise ValueError(
            f"{meta.path / META_FILE} says split {split!r} has 0 rows: an empty dataset cannot be "
            f"trained or evaluated. Fix: regenerate the dataset with rows in every split."
        )
    columns = {"dense": meta.num_dense, "sparse": len(meta.one_hot_feature_names), "labels": 1}
    counts = {}
    for kind, dtype in _EXPECTED.items():
        f = split_file(meta.path, split, kind)
        arr = _open_npy(
            f,
            f"meta.json lists split {split!r}",
            f"regenerate the dataset (delete {meta.path}) or provide the file in TorchRec's criteo npy layout",
        )
        want_shape = f"(N, {columns[kind]})"
        if arr.dtype != dtype or arr.ndim != 2 or arr.shape[1] != columns[kind]:
            raise ValueError(
                f"{f} has dtype {arr.dtype} and shape {arr.shape}, expected dtype {dtype} and "
                f"shape {want_shape}. Fix: convert it (e.g. np.save(path, arr.astype(np.{dtype})"
                f".reshape(-1, {columns[kind]}))) or regenerate the dataset."
            )
        counts[kind] = int(arr.shape[0])
        del arr
    if len(set(counts.values())) != 1:
        raise ValueError(
            f"split {split!r} of {meta.path}: row counts disagree between "
            + ", ".join(f"{split}_{k}.npy={n}" for k, n in counts.items())
            + ". Fix: the three files of a split must have one row per sample; regenerate them."
        )
    if counts["dense"] != meta.rows[split]:
        raise ValueError(
            f"{meta.path / META_FILE} says split {split!r} has {meta.rows[split]} rows but "
            f"{split_file(meta.path, split, 'dense')} has {counts['dense']}. Fix: correct rows "
            f"in meta.json or regenerate the dataset."
        )
    for feature in meta.multi_hot_feature_names:
        _check_multi_hot_files(meta, split, feature)


def _open_npy(f: Path, listed_because: str, fix: str) -> np.ndarray:
    """``f`` memory-mapped; a missing or unreadable file is an error naming it and the fix."""
    if not f.is_file():
        raise FileNotFoundError(f"{f} is missing ({listed_because}). Fix: {fix}.")
    try:
        return np.load(f, mmap_mode="r")
    except Exception as e:  # noqa: BLE001 - any unreadable file gets the same advice
        raise ValueError(f"{f} is not a readable .npy file ({e}). Fix: {fix}.") from e


def multi_hot_files(path: Union[str, Path], split: str, feature: str) -> tuple[Path, Path]:
    """``({split}_{feature}_values.npy, {split}_{feature}_offsets.npy)`` of a multi-hot feature."""
    return Path(path) / f"{split}_{feature}_values.npy", Path(path) / f"{split}_{feature}_offsets.npy"


def _check_multi_hot_files(meta: DatasetMeta, split: str, feature: str) -> None:
    n = meta.rows[split]
    values_f, offsets_f = multi_hot_files(meta.path, split, feature)
    arrays = {}
    for f, dtype in ((values_f, np.dtype(np.int32)), (offsets_f, np.dtype(np.int64))):
        arr = _open_npy(
            f,
            f"meta.json lists {feature!r} as a multi-hot feature of split {split!r}",
            "reconvert the dataset with slipstream-data",
        )
        if arr.dtype != dtype or arr.ndim != 1:
            raise ValueError(
                f"{f} has dtype {arr.dtype} and shape {arr.shape}, expected dtype {dtype} and "
                f"shape (M,). Fix: reconvert the dataset with slipstream-data."
            )
        arrays[f] = arr
    offsets, values = arrays[offsets_f], arrays[values_f]
    if offsets.shape[0] != n + 1:
        raise ValueError(
            f"{offsets_f} has {offsets.shape[0]} entries, expected rows + 1 = {n + 1} (split "
            f"{split!r} has {n} rows). Fix: the file is truncated or belongs to another split; "
            f"reconvert the dataset."
        )
    if int(offsets[0]) != 0 or int(offsets[-1]) != values.shape[0]:  # monotonic: NpyBatchLoader
        raise ValueError(
            f"{offsets_f}: offsets must start at 0, never decrease and end at the length of "
            f"{values_f.name} ({values.shape[0]}); they start at {int(offsets[0])} and end at "
            f"{int(offsets[-1])}. Fix: the files are truncated or mismatched; reconvert the dataset."
        )


__all__ = [
    "DatasetMeta", "load_meta", "split_file", "multi_hot_files", "raw_file_given", "FORMAT_VERSION",
    "FORMAT_VERSIONS", "META_FILE", "SPLITS",
]  # fmt: skip
