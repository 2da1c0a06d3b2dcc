"""Criteo's raw TSV (Kaggle's train.txt, Terabyte's day_0..day_23; plain or .gz) as a Source.

A line is ``label \\t I1..I13 \\t C1..C26``: label 0/1, 13 integer counts (may be negative,
empty = missing), 26 categorical values as hex (usually 8 digits of a 32-bit hash, empty =
missing). Parsing is vectorised over a whole chunk with numpy (field boundaries from the tab
positions, digits through lookup tables), so no Python code runs per row.

As in the DLRM reference: a missing integer is 0 and dense features are log(max(x, 0) + 1);
a categorical value's key is its hex value (missing: -1 -> id 0; see data/convert/vocab.py).

Malformed lines (reasons, as counted in meta.json): ``wrong column count`` (not 40 fields),
``bad label`` (not 0/1), ``non-numeric dense value``, ``bad hex categorical value`` (a non-hex
character or more than 16 digits).
"""

from __future__ import annotations

from typing import Any, Dict, Iterator, Optional

import numpy as np

from slipstream_rec.data.config import CriteoConfig, NUM_DENSE, NUM_SPARSE
from slipstream_rec.data.convert.source import ParsedChunk, Source, check_split, encodings_for
from slipstream_rec.data.formats.rawfiles import DEFAULT_CHUNK_BYTES, count_lines, file_sizes, iter_text_chunks

__all__ = ["CriteoSource", "parse_criteo_lines", "SPARSE_NAMES", "DENSE_NAMES"]

SPARSE_NAMES = [f"cat_{i}" for i in range(NUM_SPARSE)]
DENSE_NAMES = [f"int_{i}" for i in range(NUM_DENSE)]
NUM_FIELDS = 1 + NUM_DENSE + NUM_SPARSE

_DEC = np.full(256, 255, dtype=np.uint8)
_DEC[np.frombuffer(b"0123456789", np.uint8)] = np.arange(10, dtype=np.uint8)
_HEX = _DEC.copy()
_HEX[np.frombuffer(b"abcdef", np.uint8)] = np.arange(10, 16, dtype=np.uint8)
_HEX[np.frombuffer(b"ABCDEF", np.uint8)] = np.arange(10, 16, dtype=np.uint8)
_MAX_DEC_DIGITS = 18  # fits int64
_MAX_HEX_DIGITS = 15  # keys stay positive int64


def _digits(buf: np.ndarray, starts: np.ndarray, lengths: np.ndarray, table: np.ndarray, base: int):
    """Value of each field's digits (int64) and whether all its characters are digits.

    The characters of every field are gathered right-aligned into a (..., W) uint8 block,
    mapped through ``table`` (255 = not a digit) and combined with one product by the powers
    of ``base`` (in float64 through BLAS where exact: W <= 13 digits): a handful of whole-array
    operations, no loop over rows or characters.
    """
    width = int(lengths.max()) if lengths.size else 0
    if width == 0:
        return np.zeros(starts.shape, dtype=np.int64), np.ones(starts.shape, dtype=bool)
    width = min(width, 16)
    idx = (starts + lengths)[..., None] + np.arange(-width, 0, dtype=np.int64)
    valid = idx >= starts[..., None]
    d = table[buf[np.clip(idx, 0, buf.size - 1)]]
    bad = valid & (d == 255)
    ok = ~bad.any(axis=-1)
    d[~valid | bad] = 0
    if width <= 13:  # base**12 * 15 < 2**53: float64 is exact
        powers = float(base) ** np.arange(width - 1, -1, -1, dtype=np.float64)
        return (d.astype(np.float64) @ powers).astype(np.int64), ok
    powers = base ** np.arange(width - 1, -1, -1, dtype=np.int64)
    return d.astype(np.int64) @ powers, ok


_LO = np.uint64(0x0F0F0F0F0F0F0F0F)
_ONES = np.uint64(0x0101010101010101)


def _hex8(buf: np.ndarray, starts: np.ndarray, lengths: np.ndarray):
    """Fast path for Criteo's 8-digit lower-case hex fields (others go through ``_digits``).

    Each field is loaded as one little-endian uint64 (an unaligned strided view of the chunk),
    decoded eight characters at a time with bit operations, and checked by re-encoding: a
    field whose text is not exactly what its value prints as (upper case, a non-hex character,
    another length) is parsed by ``_digits`` instead.
    """
    n_words = buf.size - 7
    value = np.zeros(starts.shape, dtype=np.int64)
    ok = np.ones(starts.shape, dtype=bool)
    if n_words <= 0:
        fast = np.zeros(starts.shape, dtype=bool)
    else:
        words_view = np.ndarray((n_words,), dtype="<u8", buffer=buf, strides=(1,))
        fast = (lengths == 8) & (starts < n_words)
        w = words_view[np.where(fast, starts, 0)]
        nib = (w & _LO) + ((w >> np.uint64(6)) & _ONES) * np.uint64(9)
        gt9 = ((nib + _ONES * np.uint64(6)) >> np.uint64(4)) & _ONES
        fast &= (nib + _ONES * np.uint64(0x30) + gt9 * np.uint64(0x27)) == w
        fast &= (nib & ~_LO) == 0  # 'g'..'o' would decode to 16..24
        x = nib.byteswap()  # first character in the most significant byte
        x = (x | (x >> np.uint64(4))) & np.uint64(0x00FF00FF00FF00FF)
        x = (x | (x >> np.uint64(8))) & np.uint64(0x0000FFFF0000FFFF)
        x = (x | (x >> np.uint64(16))) & np.uint64(0x00000000FFFFFFFF)
        value = np.where(fast, x.astype(np.int64), 0)
    slow = ~fast & (lengths > 0)
    if slow.any():
        v, o = _digits(buf, starts[slow], lengths[slow], _HEX, 16)
        value[slow], ok[slow] = v, o
    return value, ok


def _dec8(buf: np.ndarray, starts: np.ndarray, lengths: np.ndarray):
    """Fast path for decimal fields of 1 to 8 digits (others go through ``_digits``).

    The 8 bytes that end where the field ends are loaded as one little-endian uint64; the bytes
    before the field are zeroed (they become leading zeros), every field byte is checked to be
    '0'..'9', and the digits are combined in three multiply-and-shift steps.
    """
    value = np.zeros(starts.shape, dtype=np.int64)
    ok = np.ones(starts.shape, dtype=bool)
    ends = starts + lengths
    fast = (lengths >= 1) & (lengths <= 8) & (ends >= 8)
    if buf.size >= 8:
        words_view = np.ndarray((buf.size - 7,), dtype="<u8", buffer=buf, strides=(1,))
        w = words_view[np.where(fast, ends - 8, 0)]
        shift = (8 * (8 - np.clip(lengths, 1, 8))).astype(np.uint64)
        keep = ~((np.uint64(1) << shift) - np.uint64(1))
        x = w & keep
        hi = _ONES * np.uint64(0xF0)
        digit_ok = ((x & hi) == (_ONES * np.uint64(0x30) & keep)) & ((((x & _LO) + _ONES * np.uint64(6)) & hi) == 0)
        fast &= digit_ok
        d = x & _LO
        d = (d * np.uint64(10) + (d >> np.uint64(8))) & np.uint64(0x00FF00FF00FF00FF)
        d = (d * np.uint64(100) + (d >> np.uint64(16))) & np.uint64(0x0000FFFF0000FFFF)
        d = (d * np.uint64(10000) + (d >> np.uint64(32))) & np.uint64(0x00000000FFFFFFFF)
        value = np.where(fast, d.astype(np.int64), 0)
    else:
        fast[:] = False
    slow = ~fast & (lengths > 0)
    if slow.any():
        v, o = _digits(buf, starts[slow], lengths[slow], _DEC, 10)
        value[slow], ok[slow] = v, o
    return value, ok


def parse_criteo_lines(data: bytes, file_index: int, first_line: int):
    """Parse complete lines; returns (lines, labels, dense, keys (n, 26), bad: reason -> lines)."""
    buf = np.frombuffer(data, dtype=np.uint8)
    nl = np.flatnonzero(buf == 10)
    n = nl.size
    starts = np.empty(n, dtype=np.int64)
    starts[:1] = 0
    starts[1:] = nl[:-1] + 1
    ends = nl.astype(np.int64)
    cr = (ends > starts) & (buf[np.maximum(ends - 1, 0)] == 13)
    ends[cr] -= 1
    tabs = np.flatnonzero(buf == 9)
    first_tab = np.searchsorted(tabs, starts)
    ntabs = np.searchsorted(tabs, ends) - first_tab
    line_no = first_line + np.arange(n, dtype=np.int64)
    bad: Dict[str, np.ndarray] = {}
    good = ntabs == NUM_FIELDS - 1
    bad["wrong column count"] = line_no[~good]
    g_idx = np.flatnonzero(good)
    t = tabs[first_tab[g_idx, None] + np.arange(NUM_FIELDS - 1)]
    fs = np.concatenate([starts[g_idx, None], t + 1], axis=1)
    fe = np.concatenate([t, ends[g_idx, None]], axis=1)
    flen = fe - fs
    last = max(buf.size - 1, 0)

    lab_char = buf[np.minimum(fs[:, 0], last)]
    ok_label = (flen[:, 0] == 1) & ((lab_char == 48) | (lab_char == 49))
    labels = (lab_char == 49).astype(np.int32)

    # Column by column (contiguous columns): the temporaries stay (rows x digits).
    g = g_idx.size
    fs, flen = np.ascontiguousarray(fs.T), np.ascontiguousarray(flen.T)
    dval = np.empty((g, NUM_DENSE), dtype=np.int64)
    ok_dense = np.ones(g, dtype=bool)
    for j in range(NUM_DENSE):
        ds, dl = fs[1 + j], flen[1 + j]
        neg = (dl > 0) & (buf[np.minimum(ds, last)] == 45)
        ds, dl = ds + neg, dl - neg
        v, ok = _dec8(buf, ds, dl)
        ok_dense &= ok & ~(neg & (dl == 0)) & (dl <= _MAX_DEC_DIGITS)
        dval[:, j] = np.where(neg, -v, v)

    cval = np.empty((g, NUM_SPARSE), dtype=np.int64)
    ok_hex = np.ones(g, dtype=bool)
    for j in range(NUM_SPARSE):
        cs, cl = fs[1 + NUM_DENSE + j], flen[1 + NUM_DENSE + j]
        v, ok = _hex8(buf, cs, cl)
        ok_hex &= ok & (cl <= _MAX_HEX_DIGITS)
        cval[:, j] = np.where(cl == 0, -1, v)

    bad["bad label"] = line_no[g_idx[~ok_label]]
    bad["non-numeric dense value"] = line_no[g_idx[ok_label & ~ok_dense]]
    bad["bad hex categorical value"] = line_no[g_idx[ok_label & ok_dense & ~ok_hex]]
    keep = ok_label & ok_dense & ok_hex
    dense = np.log1p(np.maximum(dval[keep], 0).astype(np.float64)).astype(np.float32)
    keys = cval[keep]
    return line_no[g_idx[keep]], labels[keep], dense, keys, bad


class CriteoSource(Source):
    name = "criteo"
    progress_unit = "B"

    def __init__(self, cfg: CriteoConfig, key: str = "data.criteo", chunk_bytes: int = DEFAULT_CHUNK_BYTES) -> None:
        super().__init__()
        if not cfg.inputs:
            raise ValueError(
                f"{key}.inputs is empty. Fix: {key}.inputs=[/path/train.txt] (Kaggle) or the "
                f"Terabyte days, e.g. {key}.inputs=[/data/day_0.gz,...,/data/day_22.gz]."
            )
        check_split(cfg.split, f"{key}.split", has_eval_inputs=bool(cfg.eval_inputs), time_column=False)
        self.cfg = cfg
        self.paths = [str(p) for p in list(cfg.inputs) + list(cfg.eval_inputs)]
        self.sizes = file_sizes(self.paths)
        self.num_train_files = len(cfg.inputs)
        self.dense_names = list(DENSE_NAMES)
        self.onehot = encodings_for(SPARSE_NAMES, cfg.encoding, dict(cfg.feature_encoding), key)
        self.multihot = []
        self.split = cfg.split
        self.chunk_bytes = chunk_bytes

    def chunks(self, start: Optional[Dict[str, int]]) -> Iterator[ParsedChunk]:
        for c in iter_text_chunks(self.paths, start, self.chunk_bytes):
            lines, labels, dense, keys, bad = parse_criteo_lines(c.data, c.file_index, c.first_line)
            yield ParsedChunk(
                file_index=c.file_index,
                lines=lines,
                labels=labels,
                dense=dense,
                keys=[keys[:, f] for f in range(NUM_SPARSE)],
                multi=[],
                end=c.end,
                progress=c.progress,
                bad=bad,
            )

    def count_lines(self, file_index: int) -> int:
        return count_lines(self.paths[file_index])

    def progress_total(self) -> int:
        return sum(self.sizes)

    def describe(self) -> Dict[str, Any]:
        from dataclasses import asdict

        d = asdict(self.cfg)
        d["input_sizes"] = self.sizes
        d["inputs"] = [str(p) for p in self.cfg.inputs]
        d["eval_inputs"] = [str(p) for p in self.cfg.eval_inputs]
        return d
