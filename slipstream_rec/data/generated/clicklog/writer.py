"""Rows of the simulated log into the splits' npy files, in time order, with the statistics
meta.json reports (click rate per split, train lookups per table row, the teacher's val scores).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Dict, List

import numpy as np

from slipstream_rec.data.convert.npy_writer import NpyAppender
from slipstream_rec.data.generated.clicklog.counters import DENSE_FEATURE_NAMES
from slipstream_rec.data.generated.clicklog.world import FEATURES
from slipstream_rec.data.meta import SPLITS, split_file

__all__ = ["SplitWriter", "top_rows_lookup_share", "MAX_AUC_ROWS"]

# teacher_auc is measured on at most this many validation rows (bounded memory).
MAX_AUC_ROWS = 4_000_000


class SplitWriter:
    """Appends rows in global (time) order to the splits' .npy files; keeps the statistics."""

    KINDS = (("dense", np.float32, (len(DENSE_FEATURE_NAMES),)), ("sparse", np.int32, (len(FEATURES),)),
             ("labels", np.int32, (1,)))

    def __init__(self, out_dir: Path, rows: Dict[str, int], cardinalities: List[int]) -> None:
        self.out_dir = out_dir
        self.bounds = []
        start = 0
        for split in SPLITS:
            self.bounds.append((split, start, start + rows[split]))
            start += rows[split]
        self.files = {
            split: {kind: NpyAppender(out_dir / f".{split}_{kind}.npy.part", dtype, shape)
                    for kind, dtype, shape in self.KINDS}
            for split in SPLITS
        }
        self.positives = {split: 0 for split in SPLITS}
        # Train lookups per row of all tables, the tables' rows back to back.
        self.table_offsets = np.concatenate([[0], np.cumsum(cardinalities)[:-1]]).astype(np.int64)
        self.train_lookups = np.zeros(int(sum(cardinalities)), dtype=np.int64)
        self.val_p: List[np.ndarray] = []
        self.val_y: List[np.ndarray] = []
        self.val_kept = 0

    def write(self, first_row: int, dense: np.ndarray, sparse: np.ndarray, labels: np.ndarray,
              p: np.ndarray) -> None:
        end = first_row + len(labels)
        for split, s0, s1 in self.bounds:
            a, b = max(first_row, s0), min(end, s1)
            if a >= b:
                continue
            src = slice(a - first_row, b - first_row)
            files = self.files[split]
            files["dense"].append(dense[src])
            files["sparse"].append(sparse[src])
            files["labels"].append(labels[src, None])
            self.positives[split] += int(labels[src].sum())
            if split == "train":
                self.train_lookups += np.bincount((sparse[src] + self.table_offsets).ravel(),
                                                  minlength=len(self.train_lookups))
            elif split == "val" and self.val_kept < MAX_AUC_ROWS:
                take = min(b - a, MAX_AUC_ROWS - self.val_kept)
                self.val_p.append(p[src][:take])
                self.val_y.append(labels[src][:take])
                self.val_kept += take

    def finish(self) -> None:
        for split, kinds in self.files.items():
            for kind, appender in kinds.items():
                appender.finish(split_file(self.out_dir, split, kind))


def top_rows_lookup_share(lookups: np.ndarray, fraction: float = 0.01) -> float:
    """Share of all lookups that go to the most looked-up ``fraction`` of the rows counted."""
    counts = np.sort(lookups)[::-1]
    top = max(1, int(math.ceil(fraction * len(counts))))
    total = counts.sum()
    return float(counts[:top].sum() / total) if total else 0.0
