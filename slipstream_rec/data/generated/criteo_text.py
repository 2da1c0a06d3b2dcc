"""Raw Criteo-format text drawn from the synthetic teacher: test and benchmark input for the
Criteo converter (``slipstream-data criteo``), with real signal in the labels.

Each row is the teacher's sample (generated/synthetic.py) written the way Criteo's files are: the
label, 13 integer counts (the teacher's dense values before the log, ``round(exp(x) - 1)``) and
26 categorical values as 8 lower-case hex digits of a 32-bit hash of (feature, id). A fraction
of the fields is left empty (missing), as in Criteo. Formatting is vectorised: every row is
laid out at fixed width with NUL padding, which is then dropped.

``python -m slipstream_rec.data.generated.criteo_text --out day_0.tsv --size-gb 2`` writes a 2 GB file.
"""

from __future__ import annotations

import argparse
import gzip
import os
from pathlib import Path
from typing import BinaryIO, Optional

import numpy as np

from slipstream_rec.data.config import NUM_DENSE, NUM_SPARSE, SyntheticConfig
from slipstream_rec.data.generated.synthetic import Teacher, normalize_synthetic_config

__all__ = ["format_criteo_lines", "write_criteo_text", "criteo_keys"]

_HEXCHARS = np.frombuffer(b"0123456789abcdef", dtype=np.uint8)
_DEC_WIDTH = 10  # digits of a dense value (values are clipped to 10 digits)


def criteo_keys(ids: np.ndarray) -> np.ndarray:
    """(n, 26) teacher ids -> the 32-bit keys written as hex (distinct per feature and id)."""
    f = np.arange(ids.shape[1], dtype=np.uint64)[None, :]
    z = ids.astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15) + f * np.uint64(0xD1B54A32D192ED03)
    z = (z ^ (z >> np.uint64(31))) * np.uint64(0xBF58476D1CE4E5B9)
    return ((z ^ (z >> np.uint64(29))) & np.uint64(0xFFFFFFFF)).astype(np.int64)


def format_criteo_lines(labels: np.ndarray, dense: np.ndarray, keys: np.ndarray) -> bytes:
    """Criteo TSV lines: ``dense`` (n, 13) int64 (``MISSING`` = -(2**62) is an empty field),
    ``keys`` (n, 26) int64 in [0, 2**32) or -1 for an empty field."""
    n = labels.shape[0]
    width = 1 + NUM_DENSE * (2 + _DEC_WIDTH) + NUM_SPARSE * 9 + 1
    m = np.zeros((n, width), dtype=np.uint8)
    m[:, 0] = 48 + labels.astype(np.uint8)
    col = 1
    pow10 = 10 ** np.arange(_DEC_WIDTH - 1, -1, -1, dtype=np.int64)
    for j in range(NUM_DENSE):
        v = dense[:, j]
        miss = v == MISSING
        m[:, col] = 9
        neg = (v < 0) & ~miss
        m[:, col + 1] = np.where(neg, 45, 0)  # '-' (padding between it and the digits is dropped)
        a = np.minimum(np.abs(np.where(miss, 0, v)), 10**_DEC_WIDTH - 1)
        digits = (a[:, None] // pow10[None, :]) % 10
        lead = a[:, None] < pow10[None, :]
        lead[:, -1] = False  # "0" has one digit
        block = np.where(lead | miss[:, None], 0, 48 + digits).astype(np.uint8)
        m[:, col + 2 : col + 2 + _DEC_WIDTH] = block
        col += 2 + _DEC_WIDTH
    for j in range(NUM_SPARSE):
        k = keys[:, j]
        m[:, col] = 9
        nib = (k[:, None] >> (4 * np.arange(7, -1, -1, dtype=np.int64))[None, :]) & 15
        block = _HEXCHARS[nib]
        block[k < 0] = 0
        m[:, col + 1 : col + 9] = block
        col += 9
    m[:, col] = 10
    flat = m.reshape(-1)
    return flat[flat != 0].tobytes()


MISSING = -(2**62)


def write_criteo_text(
    out: BinaryIO,
    rows: int,
    cfg: Optional[SyntheticConfig] = None,
    *,
    seed: int = 0,
    dense_missing: float = 0.2,
    sparse_missing: float = 0.05,
    chunk_rows: int = 200_000,
    teacher: Optional[Teacher] = None,
) -> int:
    """Write ``rows`` Criteo-format lines to the binary file ``out``; returns bytes written."""
    cfg = normalize_synthetic_config(cfg or SyntheticConfig())
    teacher = teacher or Teacher(cfg)
    written = 0
    for i, start in enumerate(range(0, rows, chunk_rows)):
        m = min(chunk_rows, rows - start)
        rng = np.random.default_rng([seed, 7, i])
        dense, ids, _, labels = teacher.sample(rng, m)
        counts = np.rint(np.expm1(dense.astype(np.float64))).astype(np.int64)
        counts[:, 1] -= (rng.random(m) < 0.1).astype(np.int64) * 2  # Criteo's I2 has negatives
        counts[rng.random(counts.shape) < dense_missing] = MISSING
        keys = criteo_keys(ids)
        keys[rng.random(keys.shape) < sparse_missing] = -1
        data = format_criteo_lines(labels[:, 0], counts, keys)
        out.write(data)
        written += len(data)
    return written


def main(argv: Optional[list] = None) -> None:
    p = argparse.ArgumentParser(description="Write a Criteo-format TSV drawn from the synthetic teacher.")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--rows", type=int, help="rows to write")
    p.add_argument("--size-gb", type=float, help="write whole chunks until the file has this size")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--gz", action="store_true")
    args = p.parse_args(argv)
    cfg = normalize_synthetic_config(SyntheticConfig())
    teacher = Teacher(cfg)
    tmp = args.out.with_name(args.out.name + ".tmp")
    opener = gzip.open if args.gz else open
    with opener(tmp, "wb") as f:  # type: ignore[operator]
        total, part = 0, 0
        while True:
            rows = 200_000 if args.size_gb else int(args.rows)
            total += write_criteo_text(f, rows, cfg, seed=args.seed * 100_003 + part, teacher=teacher)
            part += 1
            if not args.size_gb or total >= args.size_gb * 1e9:
                break
    os.replace(tmp, args.out)
    print(f"{args.out}: {total} bytes (uncompressed)")


if __name__ == "__main__":
    main()
