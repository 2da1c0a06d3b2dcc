"""Raising the project's standard error for a config value that is out of range."""

from __future__ import annotations

from typing import Any, Iterable, Tuple


def check_fields(prefix: str, cfg: Any, checks: Iterable[Tuple[str, bool, str]]) -> None:
    """``checks`` are (field, holds, fix); the first that does not hold raises a ValueError
    naming ``<prefix>.<field>``, its value and the fix."""
    for key, ok, fix in checks:
        if not ok:
            raise ValueError(f"{prefix}.{key}={getattr(cfg, key)!r} is invalid: use {fix}")
