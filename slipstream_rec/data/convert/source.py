"""What a raw format gives the converter: a ``Source`` that parses its inputs into ``ParsedChunk``s,
with the checks every format shares (its split settings, its per-feature encodings).

Formats (data/formats/) subclass ``Source``; ``converter.convert`` does the rest.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple

import numpy as np

from slipstream_rec.data.config import CategoricalEncoding, SplitConfig
from slipstream_rec.data.convert.vocab import check_encoding

__all__ = ["BadRowsError", "ParsedChunk", "Source", "check_split", "encodings_for"]


class BadRowsError(ValueError):
    """A malformed input row under ``bad_rows=error``."""


@dataclass
class ParsedChunk:
    """The good rows of one chunk of one input file, parsed but not yet encoded."""

    file_index: int  # input file the rows come from
    lines: np.ndarray  # (n,) int64 0-based row number in that file of each good row
    labels: np.ndarray  # (n,) int32, 0 or 1
    dense: np.ndarray  # (n, num_dense) float32, already transformed
    keys: List[np.ndarray]  # per one-hot feature: (n,) int64 raw keys, -1 = missing
    multi: List[Tuple[np.ndarray, np.ndarray]]  # per multi-hot feature: (values int64, lengths (n,))
    end: Dict[str, int]  # input position after this chunk (resume point)
    progress: int  # progress units consumed so far (bytes or rows)
    # reason -> 0-based row numbers (in file_index) of the rows that were malformed
    bad: Dict[str, np.ndarray] = field(default_factory=dict)
    time: Optional[np.ndarray] = None  # (n,) float64 timestamps (split method "time")
    line_offset: int = 0  # 0-based file line of row 0 (1 for a CSV header), for messages
    # reason -> what is wrong and the fix, where the source can tell (e.g. a label column of
    # yes/no under label_rule=binary: the label_rule that reads it); else the generic fix
    hints: Dict[str, str] = field(default_factory=dict)


class Source:
    """What a raw format provides to ``convert`` (subclassed by criteo / tabular / movielens)."""

    name: str = "source"
    progress_unit: str = "B"

    def __init__(self) -> None:
        self.paths: List[str] = []  # every input file: training inputs, then eval inputs
        self.num_train_files: int = 0  # paths[:num_train_files] are the training inputs
        self.dense_names: List[str] = []
        self.onehot: List[Tuple[str, CategoricalEncoding]] = []
        self.multihot: List[Tuple[str, CategoricalEncoding]] = []
        self.split: SplitConfig = SplitConfig()

    def chunks(self, start: Optional[Dict[str, int]]) -> Iterator[ParsedChunk]:
        raise NotImplementedError

    def count_lines(self, file_index: int) -> int:
        raise NotImplementedError

    def progress_total(self) -> int:
        raise NotImplementedError

    def describe(self) -> Dict[str, Any]:
        """Settings that define the output (hashed into the cache name, kept in meta.json)."""
        raise NotImplementedError


def check_split(cfg: SplitConfig, key: str, *, has_eval_inputs: bool, time_column: bool) -> None:
    methods = ("ordered", "time", "random", "files")
    if cfg.method not in methods:
        raise ValueError(f"{key}.method={cfg.method!r} is unknown. Fix: one of {list(methods)}.")
    for name in ("val_fraction", "test_fraction"):
        v = getattr(cfg, name)
        if not isinstance(v, (int, float)) or isinstance(v, bool) or not 0 < v < 1:
            raise ValueError(f"{key}.{name}={v!r} is invalid. Fix: a fraction strictly between 0 and 1.")
    if cfg.method != "files" and cfg.val_fraction + cfg.test_fraction >= 1:
        raise ValueError(
            f"{key}.val_fraction + {key}.test_fraction = {cfg.val_fraction + cfg.test_fraction} "
            f"leaves no training rows. Fix: make their sum < 1."
        )
    if cfg.method == "files" and not has_eval_inputs:
        raise ValueError(f"{key}.method=files needs eval_inputs (the files of val and test). Fix: set them, or use method=ordered.")
    if cfg.method != "files" and has_eval_inputs:
        raise ValueError(f"eval_inputs are only used with {key}.method=files. Fix: set {key}.method=files or remove them.")
    if cfg.method == "time" and not time_column:
        raise ValueError(f"{key}.method=time needs a timestamp column. Fix: set time_column, or use method=ordered.")


def encodings_for(
    features: Sequence[str], default: CategoricalEncoding, per_feature: Dict[str, CategoricalEncoding], key: str
) -> List[Tuple[str, CategoricalEncoding]]:
    """(feature, encoding) pairs; an override for an unknown feature is an error naming it."""
    unknown = sorted(set(per_feature) - set(features))
    if unknown:
        raise ValueError(f"{key}.feature_encoding names unknown feature(s) {unknown}. Fix: use some of {list(features)}.")
    out = []
    for f in features:
        enc = per_feature.get(f, default)
        if isinstance(enc, dict):
            enc = CategoricalEncoding(**enc)
        where = f"{key}.feature_encoding.{f}" if f in per_feature else f"{key}.encoding"
        out.append((f, check_encoding(dataclasses.replace(enc), where)))
    return out
