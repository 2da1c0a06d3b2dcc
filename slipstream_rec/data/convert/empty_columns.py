"""Columns that convert but carry nothing: a dense column with one value in every training row
(an all-empty column is all 0), a categorical one that is missing (id 0) in every row, a
multi-hot one whose bags are all empty. Usually a wrong column name or an export that lost
the column; the conversion still succeeds, with one warning line per such column."""

from __future__ import annotations

from typing import List

import numpy as np

from slipstream_rec.data.meta import DatasetMeta, multi_hot_files, split_file


def empty_columns(meta: DatasetMeta, fix: str) -> List[str]:
    """One warning line per column of the train split that holds no information."""
    out: List[str] = []
    dense = np.load(split_file(meta.path, "train", "dense"), mmap_mode="r")
    if dense.shape[0]:
        for j, name in enumerate(meta.dense_feature_names):
            column = np.asarray(dense[:, j])
            if column.min() == column.max():
                out.append(f"dense column {name!r} has the same value in every training row (an empty "
                           f"field is 0): it teaches the model nothing. {fix}")
    sparse = np.load(split_file(meta.path, "train", "sparse"), mmap_mode="r")
    if sparse.shape[0]:
        for j, name in enumerate(meta.one_hot_feature_names):
            if not np.asarray(sparse[:, j]).any():
                out.append(f"categorical column {name!r} is empty (missing) in every training row: its "
                           f"embedding table learns nothing. {fix}")
    for name in meta.multi_hot_feature_names:
        _, offsets = multi_hot_files(meta.path, "train", name)
        if int(np.load(offsets, mmap_mode="r")[-1]) == 0:
            out.append(f"multi-hot column {name!r} has no value in any training row: its embedding "
                       f"table learns nothing. {fix}")
    return out
