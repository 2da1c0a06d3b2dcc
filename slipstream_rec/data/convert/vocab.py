"""Categorical value -> embedding row: counting, the kept vocabulary, hashing (one place).

Raw values are int64 *keys* >= 0 (Criteo: the 32-bit hex value; tabular: a 63-bit hash of the
text; MovieLens: the id), -1 meaning missing. Ids, per feature:

* 0: missing (an empty field);
* 1: rare or unseen (mode ``vocab``: counted fewer than ``min_count`` times in the training rows,
  beyond the ``max_size`` cap, or never seen in them);
* mode ``vocab``: 2 + position of the key among the kept keys, sorted by key (so frequent values
  are spread over the table, which keeps row-wise shards balanced);
* mode ``hash``: 1 + key mod (max_size - 1).

``VocabCounter`` counts keys with memory proportional to the number of *distinct* values, never
to the number of rows: per feature a sorted key array with counts, plus a bounded buffer of new
keys merged in when it grows. ``Vocabulary`` is what is kept next to the data (``vocab/``) so
that validation, test and later files are encoded with the training mapping.
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import asdict
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Union

import numpy as np

from slipstream_rec.data.config import CategoricalEncoding

__all__ = [
    "MISSING_KEY", "MISSING_ID", "RARE_ID", "VocabCounter", "Vocabulary", "check_encoding",
]  # fmt: skip

MISSING_KEY = -1
MISSING_ID = 0
RARE_ID = 1
VOCAB_DIR = "vocab"
VOCAB_FILE = "vocab.json"
_MERGE_MIN = 1 << 20  # merge the buffer of new keys once it holds this many (or 1/4 of the table)


def check_encoding(enc: CategoricalEncoding, key: str) -> CategoricalEncoding:
    """Validate one encoding; errors name the config key (e.g. data.criteo.encoding.max_size)."""
    if enc.mode not in ("vocab", "hash"):
        raise ValueError(f"{key}.mode={enc.mode!r} is unknown. Fix: use 'vocab' or 'hash'.")
    if isinstance(enc.min_count, bool) or not isinstance(enc.min_count, int) or enc.min_count < 1:
        raise ValueError(f"{key}.min_count={enc.min_count!r} is invalid. Fix: an int >= 1 (1 keeps every value).")
    if enc.max_size is not None and (isinstance(enc.max_size, bool) or not isinstance(enc.max_size, int) or enc.max_size < 2):
        raise ValueError(f"{key}.max_size={enc.max_size!r} is invalid. Fix: an int >= 2 (table rows), or null.")
    if enc.mode == "hash" and enc.max_size is None:
        raise ValueError(f"{key}.max_size must be set for mode=hash. Fix: {key}.max_size=<table rows>, e.g. 40000000.")
    return enc


class _FeatureCounts:
    def __init__(self) -> None:
        self.keys = np.empty(0, dtype=np.int64)
        self.counts = np.empty(0, dtype=np.int64)
        self._new_keys: List[np.ndarray] = []
        self._new_counts: List[np.ndarray] = []
        self._new_size = 0

    def add(self, keys: np.ndarray) -> None:
        keys = keys[keys >= 0]
        if keys.size == 0:
            return
        u, c = np.unique(keys, return_counts=True)
        if self.keys.size:
            idx = np.searchsorted(self.keys, u)
            hit = idx < self.keys.size
            hit[hit] = self.keys[idx[hit]] == u[hit]
            self.counts[idx[hit]] += c[hit]  # idx values are distinct: u is unique
            u, c = u[~hit], c[~hit]
        if u.size:
            self._new_keys.append(u)
            self._new_counts.append(c)
            self._new_size += u.size
            if self._new_size >= max(_MERGE_MIN, self.keys.size // 4):
                self.merge()

    def merge(self) -> None:
        if not self._new_keys:
            return
        k = np.concatenate([self.keys, *self._new_keys])
        c = np.concatenate([self.counts, *self._new_counts])
        order = np.argsort(k, kind="stable")
        k, c = k[order], c[order]
        first = np.ones(k.size, dtype=bool)
        first[1:] = k[1:] != k[:-1]
        starts = np.flatnonzero(first)
        self.keys, self.counts = k[starts], np.add.reduceat(c, starts)
        self._new_keys, self._new_counts, self._new_size = [], [], 0


class VocabCounter:
    """Occurrence counts of the keys of several features (memory ~ distinct values)."""

    def __init__(self, features: Sequence[str]) -> None:
        self.features = list(features)
        self._counts = {f: _FeatureCounts() for f in self.features}

    def add(self, feature: str, keys: np.ndarray) -> None:
        self._counts[feature].add(np.asarray(keys, dtype=np.int64))

    def counts(self, feature: str) -> tuple[np.ndarray, np.ndarray]:
        """(sorted distinct keys, their counts) of ``feature``."""
        fc = self._counts[feature]
        fc.merge()
        return fc.keys, fc.counts

    def save(self, path: Union[str, Path]) -> None:
        """Write all counts to ``path`` (an .npz; written to a temp name, then renamed)."""
        path = Path(path)
        arrays = {}
        for i, f in enumerate(self.features):
            keys, counts = self.counts(f)
            arrays[f"k{i}"], arrays[f"c{i}"] = keys, counts
        tmp = path.with_name(path.name + ".tmp.npz")
        np.savez(tmp, **arrays)
        os.replace(tmp, path)

    @classmethod
    def load(cls, path: Union[str, Path], features: Sequence[str]) -> "VocabCounter":
        out = cls(features)
        with np.load(path) as z:
            for i, f in enumerate(out.features):
                out._counts[f].keys, out._counts[f].counts = z[f"k{i}"], z[f"c{i}"]
        return out


def _mix(keys: np.ndarray) -> np.ndarray:
    """splitmix64 finaliser: spreads keys that share low bits before the modulo."""
    z = keys.astype(np.uint64) + np.uint64(0x9E3779B97F4A7C15)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


class Vocabulary:
    """Per-feature encodings and, for mode vocab, the kept keys (sorted)."""

    def __init__(
        self,
        encodings: Dict[str, CategoricalEncoding],
        kept: Optional[Dict[str, np.ndarray]] = None,
        counted: Optional[Dict[str, int]] = None,
    ) -> None:
        self.encodings = dict(encodings)
        self.kept = dict(kept or {})  # feature -> sorted int64 keys (mode vocab only)
        self.counted = dict(counted or {})  # feature -> distinct values seen in training rows
        for f, enc in self.encodings.items():
            if enc.mode == "vocab" and f not in self.kept:
                raise ValueError(f"vocabulary of feature {f!r} (mode vocab) is missing")

    @classmethod
    def from_counts(cls, encodings: Dict[str, CategoricalEncoding], counter: Optional[VocabCounter]) -> "Vocabulary":
        kept, counted = {}, {}
        for f, enc in encodings.items():
            if enc.mode != "vocab":
                continue
            assert counter is not None
            keys, counts = counter.counts(f)
            counted[f] = int(keys.size)
            sel = counts >= enc.min_count
            keys, counts = keys[sel], counts[sel]
            if enc.max_size is not None and keys.size > enc.max_size - 2:
                # The most frequent max_size - 2 values (ties: smaller key first), then by key.
                order = np.lexsort((keys, -counts))[: enc.max_size - 2]
                keys = np.sort(keys[order])
            kept[f] = keys
        return cls(encodings, kept, counted)

    def num_embeddings(self, feature: str) -> int:
        enc = self.encodings[feature]
        if enc.mode == "hash":
            return int(enc.max_size)  # type: ignore[arg-type]
        return 2 + int(self.kept[feature].size)

    def encode(self, feature: str, keys: np.ndarray) -> np.ndarray:
        """int64 keys (-1 missing) -> int32 ids in [0, num_embeddings(feature))."""
        keys = np.asarray(keys, dtype=np.int64)
        enc = self.encodings[feature]
        if enc.mode == "hash":
            ids = (_mix(keys) % np.uint64(enc.max_size - 1)).astype(np.int64) + 1
        else:
            kept = self.kept[feature]
            idx = np.searchsorted(kept, keys)
            found = idx < kept.size
            found[found] = kept[idx[found]] == keys[found]
            ids = np.where(found, idx + 2, RARE_ID)
        ids[keys < 0] = MISSING_ID
        return ids.astype(np.int32)

    def save(self, out_dir: Union[str, Path]) -> Path:
        """Write ``out_dir/vocab/`` (vocab.json + one keys .npy per vocab feature), atomically."""
        out_dir = Path(out_dir)
        final = out_dir / VOCAB_DIR
        tmp = out_dir / (VOCAB_DIR + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        info = {}
        for i, (f, enc) in enumerate(self.encodings.items()):
            entry = {"encoding": asdict(enc), "num_embeddings": self.num_embeddings(f)}
            if enc.mode == "vocab":
                entry["keys_file"] = f"{i}_keys.npy"
                entry["distinct_in_train"] = self.counted.get(f)
                np.save(tmp / entry["keys_file"], self.kept[f])
            info[f] = entry
        (tmp / VOCAB_FILE).write_text(json.dumps({"features": info}, indent=1) + "\n")
        shutil.rmtree(final, ignore_errors=True)
        os.replace(tmp, final)
        return final

    @classmethod
    def load(cls, out_dir: Union[str, Path]) -> "Vocabulary":
        """Read what ``save`` wrote (``out_dir`` is the dataset directory or its vocab/)."""
        d = Path(out_dir)
        if (d / VOCAB_DIR / VOCAB_FILE).is_file():
            d = d / VOCAB_DIR
        if not (d / VOCAB_FILE).is_file():
            raise FileNotFoundError(
                f"{d / VOCAB_FILE} is missing. Fix: pass a directory written by slipstream-data."
            )
        info = json.loads((d / VOCAB_FILE).read_text())["features"]
        encodings, kept, counted = {}, {}, {}
        for f, entry in info.items():
            encodings[f] = CategoricalEncoding(**entry["encoding"])
            if encodings[f].mode == "vocab":
                kept[f] = np.load(d / entry["keys_file"])
                counted[f] = entry.get("distinct_in_train")
        return cls(encodings, kept, counted)
