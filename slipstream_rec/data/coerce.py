"""Config coercion shared by every data config normalizer (data, synthetic, clicklog).

A normalizer accepts its dataclass, an OmegaConf ``DictConfig`` or a plain mapping (what tests
and the CLI pass), turns it into the dataclass with ``coerce_dataclass`` (unknown keys fail,
naming them), then checks each number with ``checked_number``, whose error names the config key
(``data.clicklog.num_days``) and the fix, as the house rule for bad input asks.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Mapping, Optional, Sequence

import numpy as np

__all__ = ["to_mapping", "coerce_dataclass", "checked_number"]


def to_mapping(cfg: Any) -> Any:
    """DictConfig -> dict (resolved); anything else unchanged."""
    try:
        from omegaconf import DictConfig, OmegaConf
    except ImportError:  # pragma: no cover - omegaconf ships with hydra
        return cfg
    if isinstance(cfg, DictConfig):
        return OmegaConf.to_container(cfg, resolve=True)
    return cfg


def coerce_dataclass(
    cfg: Any,
    cls: type,
    key: str,
    *,
    nested: Optional[Mapping[str, type]] = None,
    typed: Sequence[str] = (),
) -> Any:
    """``cfg`` as a ``cls`` instance; a mapping's unknown keys raise ValueError naming ``key``.

    ``nested``: fields whose mapping values are coerced the same way (strictly, errors naming
    ``key.field``); ``typed``: fields whose mapping values are merged into their default's
    structured OmegaConf schema (OmegaConf converts enums and nested dataclasses and rejects
    unknown keys). Other fields are passed through as given; the normalizer checks them.
    """
    cfg = to_mapping(cfg)
    if isinstance(cfg, cls):
        return cfg
    if not isinstance(cfg, Mapping):
        raise ValueError(f"{key} must be a {cls.__name__} or a mapping, got {type(cfg).__name__}")
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(cfg) - names)
    if unknown:
        raise ValueError(f"{key} has unknown key(s) {unknown}. Fix: use only {sorted(names)}.")
    kwargs = dict(cfg)
    for name, kind in (nested or {}).items():
        if name in kwargs:
            kwargs[name] = coerce_dataclass(kwargs[name], kind, f"{key}.{name}")
    if typed:
        from omegaconf import OmegaConf

        for name in typed:
            if isinstance(kwargs.get(name), Mapping):
                kind = type(getattr(cls(), name))
                kwargs[name] = OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(kind), kwargs[name]))
    return cls(**kwargs)


def checked_number(value: Any, key: str, kind: type, *, lo: Optional[float] = None, lo_open: bool = False,
                   hi: Optional[float] = None, hi_open: bool = False, fix: str = "") -> Any:
    """``value`` as a finite ``kind`` (int or float) in the optional range, else ValueError.

    The error names ``key`` and ends with ``fix``; bools are not numbers here (``true`` for a
    row count is a typo, not 1).
    """
    ok_type = (kind is int and isinstance(value, (int, np.integer)) and not isinstance(value, bool)) or (
        kind is float and isinstance(value, (int, float, np.integer, np.floating))
        and not isinstance(value, bool)
    )
    if not ok_type or (kind is float and not math.isfinite(float(value))):
        raise ValueError(f"{key} must be a finite {kind.__name__}, got {value!r}. {fix}".rstrip())
    v = kind(value)
    if lo is not None and (v <= lo if lo_open else v < lo):
        raise ValueError(f"{key} must be {'>' if lo_open else '>='} {lo}, got {v!r}. {fix}".rstrip())
    if hi is not None and (v >= hi if hi_open else v > hi):
        raise ValueError(f"{key} must be {'<' if hi_open else '<='} {hi}, got {v!r}. {fix}".rstrip())
    return v
