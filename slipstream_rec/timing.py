"""One helper for every host timer: ``with timed(seconds, "forward"): ...``."""

from __future__ import annotations

import contextlib
import time
from typing import Any, Iterator

__all__ = ["timed"]


@contextlib.contextmanager
def timed(holder: Any, key: str) -> Iterator[None]:
    """Add the wall time of the block to ``holder[key]`` (a dict of seconds) or to the attribute
    ``key`` of ``holder`` (also when the block raises)."""
    start = time.perf_counter()
    try:
        yield
    finally:
        elapsed = time.perf_counter() - start
        if isinstance(holder, dict):
            holder[key] += elapsed
        else:
            setattr(holder, key, getattr(holder, key) + elapsed)
