"""The one place a ``DataConfig`` becomes a ready npy directory.

``normalize_data_config`` checks ``data.*``; ``dataset_dir`` names the directory and
``ensure_dataset`` makes sure it exists, for every ``data.source``:

* ``synthetic`` / ``clicklog`` (generated, ``data/generated/``): ``{root}/{name}-{config hash}``,
  generated into a temporary sibling and renamed into place only when complete;
* ``criteo`` / ``tabular`` / ``movielens_1m`` (converted, ``data/formats/`` read by
  ``data/convert/``): ``{root}/{name}-{hash}``, the hash covering the converter's settings and the
  sizes of its input files, so ``slipstream-data <cmd> OVERRIDES`` and ``slipstream-train
  OVERRIDES`` with the same overrides name the same directory. The trainer converts
  ``movielens_1m`` and ``tabular`` on first use; ``criteo`` is converted beforehand with
  ``slipstream-data criteo`` (hours for the Terabyte days: far longer than the other ranks wait);
* ``npy``: ``data.path``, validated.

Ranks on one host serialize on a lock file (``_lock``), one convention for every source.
Generators and converters know nothing of this module.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import logging
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any, Callable, Iterator, List, Optional, Tuple

from slipstream_rec.data.coerce import coerce_dataclass
from slipstream_rec.data.config import ClicklogConfig, DataConfig, SyntheticConfig
from slipstream_rec.data.convert.converter import convert, source_digest
from slipstream_rec.data.convert.source import Source
from slipstream_rec.data.generated import synthetic
from slipstream_rec.data.generated.clicklog import generate as clicklog
from slipstream_rec.data.generated.clicklog.generate import normalize_clicklog_config
from slipstream_rec.data.generated.synthetic import normalize_synthetic_config
from slipstream_rec.data.meta import META_FILE, load_meta

logger = logging.getLogger("slipstream_rec.data")

__all__ = [
    "GENERATED_SOURCES", "RAW_SOURCES", "COMMANDS", "normalize_data_config", "dataset_dir",
    "ensure_dataset", "make_source", "ensure_converted",
]  # fmt: skip

# data.source values generated into the cache by ensure_dataset.
GENERATED_SOURCES = ("synthetic", "clicklog")
# data.source values converted from raw files (data/formats/).
RAW_SOURCES = ("criteo", "tabular", "movielens_1m")
# data.source -> the slipstream-data subcommand that converts it
COMMANDS = {"criteo": "criteo", "tabular": "tabular", "movielens_1m": "movielens-1m"}
CONVERT_ON_FIRST_USE = ("tabular", "movielens_1m")
# DataConfig fields coerced strictly (unknown keys name data.<field>) / typed through OmegaConf.
_NESTED = {"synthetic": SyntheticConfig, "clicklog": ClicklogConfig}
_CONVERTER_SETTINGS = ("criteo", "tabular", "movielens")


# -- config --------------------------------------------------------------------------------------


def normalize_data_config(cfg: Any, key: str = "data") -> DataConfig:
    """Validate a DataConfig (dataclass, DictConfig or mapping) and return a clean copy."""
    c = coerce_dataclass(cfg, DataConfig, key, nested=_NESTED, typed=_CONVERTER_SETTINGS)
    if c.source not in (*GENERATED_SOURCES, "npy", *RAW_SOURCES):
        raise ValueError(
            f"{key}.source={c.source!r} is unknown. Fix: use one of "
            f"{[*GENERATED_SOURCES, 'npy', *RAW_SOURCES]}."
        )
    if c.bad_rows not in ("error", "skip"):
        raise ValueError(f"{key}.bad_rows={c.bad_rows!r} is unknown. Fix: 'error' or 'skip'.")
    if not isinstance(c.name, str) or not c.name or "/" in c.name or c.name.startswith("."):
        raise ValueError(
            f"{key}.name={c.name!r} is not a valid directory-name prefix. Fix: a non-empty name "
            f"without '/' that does not start with '.'."
        )
    if c.source == "npy" and not c.path:
        raise ValueError(
            f"{key}.path must be set when {key}.source=npy. Fix: {key}.path=/dir/with/meta.json "
            f"(or {key}.source=synthetic to generate the default dataset)."
        )
    if c.path and c.source != "npy":
        # Ignoring it would train on the data.source dataset instead (the default click log is
        # generated, 730 MB, and trained for 2000 steps) while the user thinks it reads data.path.
        raise ValueError(
            f"{key}.path={c.path} is only read with {key}.source=npy, and {key}.source={c.source}. "
            f"Fix: add {key}.source=npy to train on {c.path}, or drop {key}.path."
        )
    if c.source == "clicklog":
        return dataclasses.replace(c, clicklog=normalize_clicklog_config(c.clicklog, f"{key}.clicklog"))
    if c.source != "synthetic":
        return c  # data.synthetic is unused (and not validated) when reading other data
    return dataclasses.replace(
        c, synthetic=normalize_synthetic_config(c.synthetic, f"{key}.synthetic")
    )


def dataset_dir(cfg: Any) -> Path:
    """``{root}/{name}-{hash}`` of a generated or converted source, ``path`` for source=npy."""
    c = normalize_data_config(cfg)
    if c.source == "npy":
        return Path(c.path)  # type: ignore[arg-type]
    if c.source in GENERATED_SOURCES:
        return Path(c.root) / f"{c.name}-{_generator(c)[0]}"
    return Path(c.root) / f"{c.name}-{source_digest(make_source(c), c.bad_rows)}"


# -- generated and npy sources -------------------------------------------------------------


def _is_valid_cache(path: Path, expected_hash: str) -> bool:
    try:
        meta = load_meta(path)
    except (OSError, ValueError):
        return False
    return bool(meta.generator) and meta.generator.get("hash") == expected_hash


def ensure_dataset(cfg: Any) -> Path:
    """Return the dataset directory of ``cfg`` (a DataConfig), generating it first if needed.

    source=synthetic / clicklog: ``{root}/{name}-{hash of cfg.synthetic / cfg.clicklog}``
    (generated by data/generated/synthetic.py / data/generated/clicklog/); reused if it holds a valid
    meta.json for that hash, else generated into a temporary sibling directory and renamed into
    place only when complete (a crash leaves only a ``.{name}-{hash}.tmp-*`` directory; a
    concurrent generator that loses the rename race discards its copy).
    source=npy: validates ``cfg.path`` (meta.json and file headers) and returns it.
    source=criteo / tabular / movielens_1m: the directory slipstream-data converts into
    (``ensure_converted``; tabular and movielens_1m are converted on first use).
    """
    c = normalize_data_config(cfg)
    if c.source not in (*GENERATED_SOURCES, "npy"):
        return ensure_converted(c)
    if c.source == "npy":
        path = Path(c.path)  # type: ignore[arg-type]
        load_meta(path)
        logger.info("dataset: using npy directory %s", path)
        return path

    h, generate = _generator(c)
    root = Path(c.root)
    final = root / f"{c.name}-{h}"
    if _cached(final, h):
        return final
    root.mkdir(parents=True, exist_ok=True)
    # Ranks on one host serialize on a lock file, so only one of them generates and the others
    # then find the cache; across hosts (or where flock is unsupported) the rename race decides.
    with _lock(root / f".{final.name}.lock"):
        if _cached(final, h):
            return final
        tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.tmp-", dir=root))
        logger.info("dataset: generating %s (via %s)", final, tmp.name)
        try:
            generate(tmp)
            os.chmod(tmp, 0o755)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        try:
            os.rename(tmp, final)
        except OSError:
            # Lost the race to a concurrent generator (final now exists and is non-empty).
            shutil.rmtree(tmp, ignore_errors=True)
            if not _is_valid_cache(final, h):
                raise
            logger.info("dataset: another process finished %s first; discarded our copy", final)
    return final


def _generator(c: DataConfig) -> Tuple[str, Callable[[Path], Any]]:
    """(config hash, generate into a directory) of a normalized generated-data config."""
    if c.source == "clicklog":
        return clicklog.config_hash(c.clicklog), lambda out: clicklog.generate_dataset(c.clicklog, out)
    return synthetic.config_hash(c.synthetic), lambda out: synthetic.generate_dataset(c.synthetic, out)


def _cached(final: Path, h: str) -> bool:
    """True if ``final`` is a finished dataset for hash ``h``; error if it exists but is not."""
    if not final.exists():
        return False
    if _is_valid_cache(final, h):
        logger.info("dataset: reusing cached %s", final)
        return True
    raise ValueError(
        f"{final} exists but is not a complete dataset for this config (bad or missing "
        f"{META_FILE}, missing/mismatched .npy files, or a different hash). Fix: delete "
        f"{final}; the next run regenerates it."
    )


@contextlib.contextmanager
def _lock(path: Path) -> Iterator[None]:
    """Exclusive flock on ``path`` while generating; a no-op where flock is unavailable.

    The holder removes the lock file when done, so data/ keeps no ``.X.lock`` files. That is
    safe because a process that got the lock on a file already unlinked (it opened it before the
    removal) sees that the path no longer names its file and takes the lock again on the new one.
    """
    try:
        import fcntl
    except ImportError:
        yield
        return
    while True:
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError:
            yield
            return
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
        except OSError:  # e.g. some network filesystems: fall back to the rename race
            os.close(fd)
            yield
            return
        try:
            same = os.stat(path).st_ino == os.fstat(fd).st_ino
        except FileNotFoundError:
            same = False
        if same:
            break
        os.close(fd)  # the holder before us removed it: lock the current file instead
    try:
        yield
    finally:
        with contextlib.suppress(OSError):
            os.unlink(path)  # while still holding the lock (see above)
        os.close(fd)  # closing releases the lock


# -- converted sources ---------------------------------------------------------------------


def make_source(cfg: DataConfig) -> Source:
    """The Source of ``cfg.source`` (validates its settings; may fetch MovieLens)."""
    if cfg.source == "criteo":
        from slipstream_rec.data.formats.criteo import CriteoSource

        return CriteoSource(cfg.criteo)
    if cfg.source == "tabular":
        from slipstream_rec.data.formats.tabular import TabularSource

        return TabularSource(cfg.tabular)
    if cfg.source == "movielens_1m":
        from slipstream_rec.data.formats.movielens import MovieLensSource

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


def main(argv: Optional[List[str]] = None) -> None:
    """``python -m slipstream_rec.data.datasets [--root data]``: build the default (synthetic) dataset."""
    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("--root", default=DataConfig.root)
    parser.add_argument("--name", default=DataConfig.name)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s", force=True)
    path = ensure_dataset(DataConfig(root=args.root, name=args.name))
    meta = load_meta(path)
    print(json.dumps({"path": str(path), "rows": meta.rows, "teacher_auc": meta.teacher_auc, "ctr": meta.ctr}))


if __name__ == "__main__":
    main()
