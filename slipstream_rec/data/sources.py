"""The raw-data sources behind ``data.source``: which converter, where its output lives.

``data.source`` = ``criteo`` / ``tabular`` / ``movielens_1m``: the dataset directory is
``{data.root}/{data.name}-{hash}``, the hash covering the converter's settings and the sizes of
its input files, so ``slipstream-data <cmd> OVERRIDES`` and ``slipstream-train OVERRIDES`` with
the same overrides name the same directory. The trainer (``ensure_dataset``) converts
``movielens_1m`` and ``tabular`` on first use; ``criteo`` is converted beforehand with
``slipstream-data criteo`` (hours for the Terabyte days: far longer than the other ranks wait).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Optional

from slipstream_rec.data.config import DataConfig
from slipstream_rec.data.convert import Source, convert, source_digest

logger = logging.getLogger("slipstream_rec.data")

__all__ = ["RAW_SOURCES", "make_source", "ensure_converted", "COMMANDS"]

RAW_SOURCES = ("criteo", "tabular", "movielens_1m")
# data.source -> the slipstream-data subcommand that converts it
COMMANDS = {"criteo": "criteo", "tabular": "tabular", "movielens_1m": "movielens-1m"}
CONVERT_ON_FIRST_USE = ("tabular", "movielens_1m")


def make_source(cfg: DataConfig) -> Source:
    """The Source of ``cfg.source`` (validates its settings; may fetch MovieLens)."""
    if cfg.source == "criteo":
        from slipstream_rec.data.criteo import CriteoSource

        return CriteoSource(cfg.criteo)
    if cfg.source == "tabular":
        from slipstream_rec.data.tabular import TabularSource

        return TabularSource(cfg.tabular)
    if cfg.source == "movielens_1m":
        from slipstream_rec.data.movielens import MovieLensSource

        return MovieLensSource(cfg.movielens, root=cfg.root)
    raise ValueError(f"data.source={cfg.source!r} has no converter. Fix: one of {list(RAW_SOURCES)}.")


def ensure_converted(
    cfg: DataConfig,
    *,
    out: Optional[Path] = None,
    progress: bool = False,
    from_trainer: bool = True,
) -> Path:
    """The converted directory of ``cfg`` (``out``, or the cache directory), converting if needed.

    ``from_trainer``: a ``criteo`` source that is not converted yet is an error naming the
    ``slipstream-data`` command (instead of a conversion longer than the ranks wait).
    """
    from slipstream_rec.data.synthetic import _lock  # one lock convention for every dataset

    source = make_source(cfg)
    digest = source_digest(source, cfg.bad_rows)
    root = Path(cfg.root)
    final = Path(out) if out is not None else root / f"{cfg.name}-{digest}"
    if final.exists():
        return convert(source, final, bad_rows=cfg.bad_rows)  # validates the settings' hash
    if from_trainer and cfg.source not in CONVERT_ON_FIRST_USE:
        raise ValueError(
            f"data.source={cfg.source}: {final} is not converted yet. Fix: run `slipstream-data "
            f"{COMMANDS[cfg.source]}` with the same data overrides first (it can take hours and is "
            f"resumable), then train."
        )
    final.parent.mkdir(parents=True, exist_ok=True)
    with _lock(final.parent / f".{final.name}.lock"):
        logger.info("dataset: converting %s into %s", cfg.source, final)
        return convert(source, final, bad_rows=cfg.bad_rows, progress=progress)
