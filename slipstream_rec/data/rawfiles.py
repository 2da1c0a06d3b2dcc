"""Reading raw text files (plain or gzip) in chunks of whole lines, resumable at a byte offset.

Every chunk holds complete lines (each ending in ``\\n``; a last line without one gets one) and
never spans two files. Its ``end`` position (file index, decompressed byte offset, line number)
is where a resumed read starts: plain files seek there, gzip files are decompressed up to it.
Memory is one chunk plus one partial line.
"""

from __future__ import annotations

import gzip
import os
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Dict, Iterator, List, Sequence

__all__ = ["TextChunk", "open_raw", "iter_text_chunks", "count_lines", "file_sizes"]

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


class _Raw:
    """A binary reader over a plain or gzip file that also reports compressed bytes read."""

    def __init__(self, path: Path) -> None:
        self._raw = open(path, "rb")
        self.gzip = _is_gzip(path)
        self._f: BinaryIO = gzip.GzipFile(fileobj=self._raw, mode="rb") if self.gzip else self._raw  # type: ignore[assignment]

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
    return gzip.open(p, "rb") if _is_gzip(p) else open(p, "rb")  # type: ignore[return-value]


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
