"""Appending rows to a ``.npy`` file whose final length is not known in advance.

``NpyAppender`` writes a fixed-size placeholder header, appends raw rows, and at ``finish``
rewrites the header in place with the real shape (same header length, padded with spaces, which
``np.load`` accepts) and renames the part file to its final name. No copy of the data is ever
made, so a 40 GB split costs no extra disk or time at the end.

Resuming: ``NpyAppender(part, ..., resume_rows=n)`` truncates the part file to its header plus
``n`` rows (the rows of the last checkpoint; anything written after it is discarded) and goes
on appending from there.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Tuple, Union

import numpy as np

__all__ = ["NpyAppender", "HEADER_BYTES"]

MAGIC = b"\x93NUMPY\x01\x00"  # format version 1.0: 2-byte little-endian header length
HEADER_BYTES = 128  # magic (8) + length (2) + dict text padded with spaces and a final newline


def _header(dtype: np.dtype, shape: Tuple[int, ...]) -> bytes:
    text = repr(
        {"descr": np.lib.format.dtype_to_descr(dtype), "fortran_order": False, "shape": tuple(shape)}
    )
    body_len = HEADER_BYTES - len(MAGIC) - 2
    if len(text) + 1 > body_len:  # cannot happen for shapes of at most 3 dims of int64 sizes
        raise ValueError(f"npy header too long for shape {shape}")
    body = text.ljust(body_len - 1).encode("latin1") + b"\n"
    return MAGIC + len(body).to_bytes(2, "little") + body


class NpyAppender:
    """Rows of ``row_shape`` and ``dtype`` appended to ``part_path`` (C order)."""

    def __init__(
        self,
        part_path: Union[str, Path],
        dtype: np.dtype,
        row_shape: Tuple[int, ...] = (),
        resume_rows: int = 0,
    ) -> None:
        self.path = Path(part_path)
        self.dtype = np.dtype(dtype)
        self.row_shape = tuple(int(d) for d in row_shape)
        self.row_bytes = self.dtype.itemsize * int(np.prod(self.row_shape, dtype=np.int64))
        if resume_rows:
            size = HEADER_BYTES + resume_rows * self.row_bytes
            if not self.path.is_file() or self.path.stat().st_size < size:
                raise ValueError(
                    f"{self.path}: cannot resume at {resume_rows} rows, the part file is shorter "
                    f"than the checkpoint says. Fix: delete the partial directory "
                    f"{self.path.parent} and convert again."
                )
            self._f = open(self.path, "r+b")
            self._f.truncate(size)
            self._f.seek(size)
        else:
            self._f = open(self.path, "wb")
            self._f.write(_header(self.dtype, (0, *self.row_shape)))
        self.rows = int(resume_rows)

    def append(self, arr: np.ndarray) -> None:
        arr = np.ascontiguousarray(arr, dtype=self.dtype)
        if arr.shape[1:] != self.row_shape:
            raise ValueError(f"{self.path}: rows of shape {arr.shape[1:]}, expected {self.row_shape}")
        self._f.write(arr.data)
        self.rows += int(arr.shape[0])

    def sync(self) -> None:
        """Flush to disk (called before a checkpoint records ``rows``)."""
        self._f.flush()
        os.fsync(self._f.fileno())

    def finish(self, final_path: Union[str, Path]) -> Path:
        """Write the real header, sync, close and rename to ``final_path``."""
        self._f.seek(0)
        self._f.write(_header(self.dtype, (self.rows, *self.row_shape)))
        self.sync()
        self._f.close()
        final_path = Path(final_path)
        os.replace(self.path, final_path)
        return final_path

    def close(self) -> None:
        if not self._f.closed:
            self._f.close()
