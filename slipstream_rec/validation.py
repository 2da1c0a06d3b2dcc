"""Raising the project's standard error for a config value that is out of range."""

from __future__ import annotations

from enum import Enum
from typing import Any, Iterable, Tuple


def shown(value: Any) -> str:
    """A value as the user writes it in an override: an enum by its value (``bf16``, not
    ``<Precision.bf16: 'bf16'>``), a string quoted (so an empty one shows), the rest as is."""
    return str(value.value) if isinstance(value, Enum) else repr(value)


def check_fields(prefix: str, cfg: Any, checks: Iterable[Tuple[str, bool, str]]) -> None:
    """``checks`` are (field, holds, fix); the first that does not hold raises a ValueError
    naming ``<prefix>.<field>``, its value and the fix."""
    for key, ok, fix in checks:
        if not ok:
            raise ValueError(f"{prefix}.{key}={shown(getattr(cfg, key))} is invalid: use {fix}")
