"""One helper for every host timer: ``with timed(seconds, "forward"): ...``."""

from __future__ import annotations

import contextlib
import time
from typing import Dict, Iterator

__all__ = ["timed"]


@contextlib.contextmanager
def timed(seconds: Dict[str, float], key: str) -> Iterator[None]:
    """Add the wall time of the block to ``seconds[key]`` (also when it raises)."""
    start = time.perf_counter()
    try:
        yield
    finally:
        seconds[key] += time.perf_counter() - start
