"""Reading a dataset directory (layout and meta.json: ``slipstream_rec.data.meta``) for training,
one rank's part at a time, with the same number of equal-sized batches on every rank.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Dict, Iterator, List, Optional, Union

import numpy as np
import torch
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from slipstream_rec.data.meta import (
    META_FILE,
    DatasetMeta,
    load_meta,
    multi_hot_files,
    split_file,
)
from slipstream_rec.data.types import Batch, host_kjt

logger = logging.getLogger("slipstream_rec.data")


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
        kjt = host_kjt(self.keys, torch.from_numpy(values), lengths, b)
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


__all__ = ["NpyBatchLoader", "num_batches_for", "check_split_fits", "rank_rows"]
