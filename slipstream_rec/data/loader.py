"""Reading a dataset directory in TorchRec's binary criteo npy layout, one rank's part at a time.

Directory layout (written by ``slipstream_rec.data.synthetic``)::

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
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional, Union

import numpy as np
import torch
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from slipstream_rec.data.types import Batch

logger = logging.getLogger("slipstream_rec.data")

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


def _meta_error(path: Path, problem: str) -> ValueError:
    return ValueError(
        f"{path / META_FILE}: {problem}. Fix: regenerate the dataset (delete the directory and let "
        f"ensure_dataset rebuild it), or for data.source=npy write a meta.json with keys "
        f"format_version, num_dense, sparse_feature_names, dense_feature_names, "
        f"num_embeddings_per_feature, rows (see slipstream_rec/data/loader.py)."
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
        raise FileNotFoundError(
            f"{meta_path} is missing. Fix: a finished dataset directory always has meta.json; "
            f"regenerate it (data.source=synthetic) or, for data.source=npy, write a meta.json "
            f"with keys format_version, num_dense, sparse_feature_names, dense_feature_names, "
            f"num_embeddings_per_feature, rows (see slipstream_rec/data/loader.py)."
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


def _check_ids(
    ids: np.ndarray, size: int, feature: str, file: Path, first_row: int,
    offsets: Optional[np.ndarray] = None,
) -> None:
    """Every id in [0, size); else an error naming the file, row, feature and table size.

    ``offsets`` (multi-hot): ``ids`` are the values of consecutive rows split by offsets.
    """
    if ids.size == 0 or (int(ids.min()) >= 0 and int(ids.max()) < size):
        return
    pos = int(np.flatnonzero((np.asarray(ids) < 0) | (np.asarray(ids) >= size))[0])
    row = pos if offsets is None else int(np.searchsorted(offsets, pos, side="right")) - 1
    raise ValueError(
        f"{file}: row {first_row + row}, feature {feature!r}: id {int(ids[pos])} is outside its "
        f"table [0, {size}) (num_embeddings_per_feature = {size}; TorchRec would silently clamp "
        f"it to row 0). Fix: correct num_embeddings_per_feature in meta.json or remap the ids "
        f"(slipstream-data encodes them within range)."
    )


def rank_rows(num_rows: int, rank: int, world_size: int) -> tuple[int, int]:
    """Contiguous part [lo, hi) of ``num_rows`` read by ``rank``: [r*N//W, (r+1)*N//W)."""
    return rank * num_rows // world_size, (rank + 1) * num_rows // world_size


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def num_batches_for(num_rows: int, world_size: int, batch_size: int, train: bool) -> int:
    """Batches per rank (identical on every rank).

    train: (N // W) // B (every batch exactly B rows, remainder dropped).
    eval: ceil(ceil(N / W) / B) (every row once; each rank's rows in that many near-equal batches).
    """
    if train:
        return (num_rows // world_size) // batch_size
    return _ceil_div(_ceil_div(num_rows, world_size), batch_size)


def check_split_fits(
    num_rows: int,
    split: str,
    *,
    batch_size: int,
    world_size: int,
    train: bool,
    where: str,
    more_rows: str = "use more data",
) -> None:
    """The error ``NpyBatchLoader`` raises when a split cannot be batched, without reading it.

    Training needs one full batch per rank: the error names ``trainer.batch_size`` and the
    largest value that works (rows // world size). Evaluation needs a non-empty batch on every
    rank. ``where`` names the data (a directory, or the config keys that set the row counts);
    ``more_rows`` is the other fix (e.g. which key adds rows).
    """
    per_rank = num_rows // world_size
    if per_rank == 0:
        raise ValueError(
            f"{where}: split {split!r} has {num_rows} rows, fewer than the {world_size} ranks "
            f"that each need some. Fix: run on at most {max(num_rows, 1)} rank(s), or {more_rows}."
        )
    if train and num_batches_for(num_rows, world_size, batch_size, train) == 0:
        raise ValueError(
            f"trainer.batch_size={batch_size} is too large for {where}: split {split!r} has "
            f"{num_rows} rows, {per_rank} per rank on {world_size} rank(s), too few for one "
            f"training batch. Fix: trainer.batch_size={per_rank} or smaller (the largest that "
            f"works here), or {more_rows}."
        )
    if not train and per_rank < num_batches_for(num_rows, world_size, batch_size, train):
        raise ValueError(
            f"{where}: split {split!r} has {num_rows} rows over {world_size} rank(s): the "
            f"smallest rank part ({per_rank} rows) cannot fill "
            f"{num_batches_for(num_rows, world_size, batch_size, train)} non-empty eval batches "
            f"of at most {batch_size}. Fix: trainer.eval_batch_size >= 2, or fewer ranks."
        )


class NpyBatchLoader:
    """Iterates one rank's ``Batch``es of one split of a criteo-npy dataset directory.

    * Every rank reads its contiguous part [r*N//W, (r+1)*N//W) of the split and ``len(self)`` is
      the same on every rank.
    * ``train=True``: every batch has exactly ``batch_size`` rows ((N//W)//B batches, the rest of
      the rank's part is dropped); with ``shuffle`` the rank's rows are permuted every epoch,
      seeded by (seed, epoch, rank) -- call ``set_epoch(e)`` before iterating epoch ``e``.
    * ``train=False``: every row of the split is yielded exactly once over all ranks; each rank
      splits its rows into ceil(ceil(N/W)/B) near-equal non-empty batches of at most B rows, in
      file order (``shuffle`` is ignored).

    Rows of a batch are in increasing file order (shuffling decides which rows share a batch), so
    mmap reads stay as local as possible. Tensors are CPU; ``Batch.to(device)`` moves them.
    ``pin_memory=True`` (CUDA runs) yields batches in page-locked memory, so that the
    ``non_blocking`` host-to-device copy of TorchRec's pipeline (on its side stream) and of
    evaluation is asynchronous instead of staged through a synchronous pageable copy.
    """

    def __init__(
        self,
        path: Union[str, Path],
        split: str,
        *,
        batch_size: int,
        rank: int = 0,
        world_size: int = 1,
        train: bool,
        shuffle: bool = False,
        seed: int = 0,
        mmap: bool = False,
        pin_memory: bool = False,
        meta: Optional[DatasetMeta] = None,
    ) -> None:
        self.meta = meta if meta is not None else load_meta(path)
        self.path = Path(path)
        if split not in self.meta.rows:
            raise ValueError(
                f"split {split!r} is not in {self.path / META_FILE} (has {self.meta.splits}). "
                f"Fix: use one of those."
            )
        if isinstance(batch_size, bool) or not isinstance(batch_size, (int, np.integer)) or batch_size < 1:
            raise ValueError(f"batch_size must be a positive int, got {batch_size!r}")
        if world_size < 1 or not 0 <= rank < world_size:
            raise ValueError(f"need 0 <= rank < world_size, got rank={rank} world_size={world_size}")
        if pin_memory and not torch.cuda.is_available():
            raise ValueError(
                "pin_memory=True needs a visible CUDA device (page-locked memory is for "
                "host-to-GPU copies); torch.cuda.is_available() is False. Fix: pin_memory=False."
            )
        self.pin_memory = bool(pin_memory)
        self.split = split
        self.batch_size = int(batch_size)
        self.rank = rank
        self.world_size = world_size
        self.train = train
        self.shuffle = shuffle and train
        self.seed = seed
        self.mmap = mmap
        self.epoch = 0
        self.keys = list(self.meta.sparse_feature_names)

        num_rows = self.meta.rows[split]
        self.num_rows = num_rows
        self.lo, self.hi = rank_rows(num_rows, rank, world_size)
        self.num_local_rows = self.hi - self.lo
        self._num_batches = num_batches_for(num_rows, world_size, batch_size, train)
        check_split_fits(
            num_rows, split, batch_size=batch_size, world_size=world_size, train=train,
            where=str(self.path),
        )  # fmt: skip

        self._load()

    # -- data -------------------------------------------------------------------------------

    def _load(self) -> None:
        lo, hi = self.lo, self.hi
        dense = np.load(split_file(self.path, self.split, "dense"), mmap_mode="r")[lo:hi]
        sparse = np.load(split_file(self.path, self.split, "sparse"), mmap_mode="r")[lo:hi]
        labels = np.load(split_file(self.path, self.split, "labels"), mmap_mode="r")[lo:hi, 0]
        if not self.mmap:
            # Read this rank's rows into memory once (np.array copies out of the mmap).
            dense, sparse, labels = np.array(dense), np.array(sparse), np.array(labels)
        sizes = dict(zip(self.meta.sparse_feature_names, self.meta.num_embeddings_per_feature))
        # Out-of-range ids would be clamped to row 0 (or become device-side asserts) deep inside
        # FBGEMM, corrupting training without a word: every id is checked here, once.
        for j, f in enumerate(self.meta.one_hot_feature_names):
            _check_ids(sparse[:, j], sizes[f], f, split_file(self.path, self.split, "sparse"), lo)
        # Multi-hot features: this rank's offsets (rebased to 0, in memory) and values.
        self._multi: Dict[str, tuple[np.ndarray, np.ndarray]] = {}
        for f in self.meta.multi_hot_feature_names:
            values_f, offsets_f = multi_hot_files(self.path, self.split, f)
            offsets = np.array(np.load(offsets_f, mmap_mode="r")[lo : hi + 1], dtype=np.int64)
            dec = np.flatnonzero(np.diff(offsets) < 0)
            if dec.size:
                raise ValueError(
                    f"{offsets_f}: offsets decrease at row {lo + int(dec[0])} (a corrupt or "
                    f"truncated file). Fix: reconvert the dataset with slipstream-data."
                )
            values = np.load(values_f, mmap_mode="r")[int(offsets[0]) : int(offsets[-1])]
            if not self.mmap:
                values = np.array(values)
            offsets -= offsets[0]
            _check_ids(values, sizes[f], f, values_f, lo, offsets)
            self._multi[f] = (offsets, values)
        self._dense, self._sparse, self._labels = dense, sparse, labels
        self._columns = {f: j for j, f in enumerate(self.meta.one_hot_feature_names)}

    def _batch_from_rows(self, rows: Union[slice, np.ndarray]) -> Batch:
        """``rows``: local row indices (slice or sorted int64 array) of one batch.

        numpy gathers on the row-major arrays are the fastest path measured (faster than torch
        index_select on a feature-major copy); the one (B, F) -> feature-major int64 copy is what
        the KJT needs anyway. Multi-hot features add their bags with their real lengths.
        """
        if isinstance(rows, slice):
            dense = np.array(self._dense[rows])
            sparse = self._sparse[rows]
            labels = self._labels[rows]
        else:
            dense = self._dense.take(rows, axis=0)
            sparse = self._sparse.take(rows, axis=0)
            labels = self._labels.take(rows, axis=0)
        b = int(labels.shape[0])
        if not self._multi:
            values = sparse.T.astype(np.int64, order="C").reshape(-1)  # feature-major, as KJT wants
            lengths = torch.ones(b * len(self.keys), dtype=torch.int32)
        else:
            idx = np.arange(rows.start, rows.stop) if isinstance(rows, slice) else np.asarray(rows)
            parts, lens = [], []
            for f in self.keys:
                if f in self._multi:
                    offsets, vals = self._multi[f]
                    starts = offsets[idx]
                    n_f = offsets[idx + 1] - starts
                    total = int(n_f.sum())
                    pos = np.repeat(starts - (np.cumsum(n_f) - n_f), n_f) + np.arange(total)
                    parts.append(np.asarray(vals[pos], dtype=np.int64))
                    lens.append(n_f.astype(np.int32))
                else:
                    parts.append(sparse[:, self._columns[f]].astype(np.int64))
                    lens.append(np.ones(b, dtype=np.int32))
            values = np.concatenate(parts)
            lengths = torch.from_numpy(np.concatenate(lens))
        kjt = KeyedJaggedTensor(
            keys=self.keys,
            values=torch.from_numpy(values),
            lengths=lengths,
            stride=b,
        )
        return Batch(
            dense_features=torch.from_numpy(dense),
            sparse_features=kjt,
            labels=torch.from_numpy(labels.astype(np.float32)),
        )

    # -- iteration --------------------------------------------------------------------------

    def set_epoch(self, epoch: int) -> None:
        """Select the shuffle of epoch ``epoch`` (train mode with shuffle only)."""
        self.epoch = int(epoch)

    def __len__(self) -> int:
        return self._num_batches

    @property
    def num_embeddings_per_feature(self) -> List[int]:
        return list(self.meta.num_embeddings_per_feature)

    def batch_rows(self) -> List[Union[slice, np.ndarray]]:
        """Local row selections of this epoch's batches (global row = self.lo + local row)."""
        n, nb, b = self.num_local_rows, self._num_batches, self.batch_size
        if self.train:
            if self.shuffle:
                rng = np.random.default_rng([self.seed, self.epoch, self.rank])
                perm = rng.permutation(n)[: nb * b].reshape(nb, b)
                perm.sort(axis=1)
                return list(perm)
            return [slice(i * b, (i + 1) * b) for i in range(nb)]
        # Eval: np.array_split sizes (first n % nb batches one row larger), as contiguous slices.
        base, extra = divmod(n, nb)
        out, start = [], 0
        for i in range(nb):
            stop = start + base + (1 if i < extra else 0)
            out.append(slice(start, stop))
            start = stop
        return out

    def __iter__(self) -> Iterator[Batch]:
        return self.iter_from(0)

    def iter_from(self, start: int) -> Iterator[Batch]:
        """This epoch's batches from batch ``start`` on: how a checkpointed run resumes an
        interrupted epoch (the batch order depends only on seed, epoch and rank)."""
        if not 0 <= start <= self._num_batches:
            raise ValueError(
                f"cannot start {self.split!r} at batch {start}: the epoch has {self._num_batches} "
                "batches per rank (a checkpoint from another dataset or batch size?)"
            )
        for rows in self.batch_rows()[start:]:
            batch = self._batch_from_rows(rows)
            yield batch.pin_memory() if self.pin_memory else batch


__all__ = [
    "Batch", "DatasetMeta", "NpyBatchLoader", "load_meta", "num_batches_for", "check_split_fits",
    "rank_rows", "split_file", "multi_hot_files", "FORMAT_VERSION", "META_FILE", "SPLITS",
]  # fmt: skip
