"""One helper for every host timer: ``with timed(seconds, "forward"): ...``."""

from __future__ import annotations

import contextlib
import time
from typing import Any, Callable, Iterator

__all__ = ["timed"]


@contextlib.contextmanager
def timed(holder: Any, key: str, clock: Callable[[], float] = time.perf_counter) -> Iterator[None]:
    """Add the time of the block to ``holder[key]`` (a dict of seconds) or to the attribute
    ``key`` of ``holder`` (also when the block raises): wall time, or ``clock``'s (e.g.
    ``time.process_time``: the process's CPU time, all its threads)."""
    start = clock()
    try:
        yield
    finally:
        elapsed = clock() - start
        if isinstance(holder, dict):
            holder[key] += elapsed
        else:
            setattr(holder, key, getattr(holder, key) + elapsed)
