"""Reading raw text files (plain or gzip) in chunks of whole lines, resumable at a byte offset.

Every chunk holds complete lines (each ending in ``\\n``; a last line without one gets one) and
never spans two files. Its ``end`` position (file index, decompressed byte offset, line number)
is where a resumed read starts: plain files seek there, gzip files are decompressed up to it.
Memory is one chunk plus one partial line.

A gzip file that is truncated or corrupt fails with ``TruncatedInputError`` naming the file and
its last complete line, wherever it is read (header, line count, chunks), instead of gzip's
``EOFError`` that names neither.
"""

from __future__ import annotations

import gzip
import os
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Dict, Iterator, List, Sequence

__all__ = ["TextChunk", "TruncatedInputError", "open_raw", "iter_text_chunks", "count_lines", "file_sizes"]

DEFAULT_CHUNK_BYTES = 32 << 20


@dataclass
class TextChunk:
    file_index: int  # which input file
    data: bytes  # complete lines, each ending in b"\n"
    first_line: int  # 0-based line number (in the file) of the first line of data
    num_lines: int
    end: Dict[str, int]  # position after this chunk: {"file", "offset", "line"}
    progress: int  # bytes of the (compressed) input files consumed so far, over all files


def _is_gzip(path: Path) -> bool:
    with open(path, "rb") as f:
        return f.read(2) == b"\x1f\x8b"


class TruncatedInputError(ValueError):
    """An input file that cannot be read to its end (a truncated or corrupt gzip stream)."""


# What gzip raises for a stream cut short (EOFError), a bad CRC or header (BadGzipFile, an
# OSError) or damaged compressed data (zlib.error).
_GZIP_READ_ERRORS = (EOFError, gzip.BadGzipFile, zlib.error)


def complete_lines(path: str | os.PathLike) -> int:
    """How many complete lines of a damaged gzip file can be read (its last good line number)."""
    n = 0
    try:
        with gzip.GzipFile(filename=path, mode="rb") as f:
            while True:
                block = f.read1(1 << 20)
                if not block:
                    break
                n += block.count(b"\n")
    except _GZIP_READ_ERRORS:
        pass
    return n


def truncated_error(path: str | os.PathLike, error: BaseException) -> TruncatedInputError:
    """The error for ``path``, unreadable past some point: the file, its last good line, the fix."""
    good = complete_lines(path)
    where = f"after line {good}, its last complete line" if good else "before its first complete line"
    return TruncatedInputError(
        f"{path} is truncated or corrupt: gzip cannot read it {where} "
        f"({' '.join(str(error).split()) or type(error).__name__}). Fix: replace it with a "
        f"complete copy (`gzip -t {path}` tests one), then rerun the same command"
    )


class _CheckedGzipFile(gzip.GzipFile):
    """A GzipFile whose read errors are ``TruncatedInputError``s naming the file."""

    def __init__(self, path: Path, fileobj: BinaryIO) -> None:
        super().__init__(fileobj=fileobj, mode="rb")
        self.myfileobj = fileobj  # closed with this file (GzipFile closes only what it opened)
        self._path = path

    def _checked(self, read, *args):  # type: ignore[no-untyped-def]
        try:
            return read(*args)
        except _GZIP_READ_ERRORS as e:
            raise truncated_error(self._path, e) from e

    def read(self, size: int | None = -1) -> bytes:
        return self._checked(super().read, size)

    def read1(self, size: int = -1) -> bytes:
        return self._checked(super().read1, size)

    def readline(self, size: int | None = -1) -> bytes:
        return self._checked(super().readline, size)


class _Raw:
    """A binary reader over a plain or gzip file that also reports compressed bytes read."""

    def __init__(self, path: Path) -> None:
        self._raw = open(path, "rb")
        self.gzip = _is_gzip(path)
        self._f: BinaryIO = _CheckedGzipFile(path, self._raw) if self.gzip else self._raw  # type: ignore[assignment]

    def read(self, n: int) -> bytes:
        return self._f.read(n)

    def skip_to(self, offset: int) -> None:
        if offset <= 0:
            return
        if not self.gzip:
            self._raw.seek(offset)
            return
        left = offset
        while left > 0:  # gzip cannot seek: decompress and discard
            got = self._f.read(min(left, 16 << 20))
            if not got:
                raise ValueError(f"{self._raw.name} is shorter than the resume offset {offset}")
            left -= len(got)

    def compressed_pos(self) -> int:
        return self._raw.tell()

    def close(self) -> None:
        self._f.close()
        self._raw.close()


def open_raw(path: str | os.PathLike) -> BinaryIO:
    """A binary file object over ``path``, transparently gunzipped (by magic bytes)."""
    p = Path(path)
    return _CheckedGzipFile(p, open(p, "rb")) if _is_gzip(p) else open(p, "rb")  # type: ignore[return-value]


def file_sizes(paths: Sequence[str]) -> List[int]:
    """On-disk sizes; a missing input is an error naming it."""
    out = []
    for p in paths:
        if not Path(p).is_file():
            raise FileNotFoundError(f"input file {p} does not exist. Fix: check the path in the data config.")
        out.append(Path(p).stat().st_size)
    return out


def iter_text_chunks(
    paths: Sequence[str],
    start: Dict[str, int] | None = None,
    chunk_bytes: int = DEFAULT_CHUNK_BYTES,
) -> Iterator[TextChunk]:
    """Chunks of whole lines of ``paths`` in order, from position ``start`` (None: the beginning)."""
    start = start or {"file": 0, "offset": 0, "line": 0}
    sizes = file_sizes(paths)
    done_before = sum(sizes[: start["file"]])
    for fi in range(start["file"], len(paths)):
        offset = start["offset"] if fi == start["file"] else 0
        line = start["line"] if fi == start["file"] else 0
        raw = _Raw(Path(paths[fi]))
        try:
            raw.skip_to(offset)
            carry = b""
            while True:
                block = raw.read(chunk_bytes)
                if block:
                    block = carry + block
                    cut = block.rfind(b"\n") + 1
                    if cut == 0:  # a line longer than the chunk: keep reading
                        carry = block
                        continue
                    data, carry = block[:cut], block[cut:]
                    size = len(data)
                else:  # end of file: what is left is a last line without a newline
                    data, size, carry = carry + b"\n" if carry else b"", len(carry), b""
                if data:
                    n = data.count(b"\n")
                    offset += size
                    yield TextChunk(
                        file_index=fi,
                        data=data,
                        first_line=line,
                        num_lines=n,
                        end={"file": fi, "offset": offset, "line": line + n},
                        progress=done_before + raw.compressed_pos(),
                    )
                    line += n
                if not block:
                    break
        finally:
            raw.close()
        done_before += sizes[fi]


def count_lines(path: str) -> int:
    """Lines of a plain or gzip text file (a last line without a newline counts)."""
    n, last = 0, b"\n"
    with open_raw(path) as f:
        while True:
            block = f.read(16 << 20)
            if not block:
                break
            n += block.count(b"\n")
            last = block[-1:]
    return n + (last != b"\n")
