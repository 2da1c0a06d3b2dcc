"""Checkpoint directories on disk: atomic publication, integrity manifest, retention.

Layout under the checkpoint root (``<run_dir>/checkpoints`` by default)::

    step_000000120/            # a complete checkpoint: only ever created by a rename
        .metadata              # torch.distributed.checkpoint's index
        __0_0.distcp ...       # DCP data, one file per rank
        rank0.pt ...           # per-rank state that is not a model tensor (data position, ...)
        MANIFEST.json          # written last: step, world size, every file's size and CRC32
    step_000000180.partial/    # a save in progress (or a crashed one): never loaded

A checkpoint is written under ``<name>.partial`` and renamed to ``<name>`` only after every file,
the manifest last, is on disk, so a crash at any moment leaves either the previous set of
complete checkpoints or the new one, never a directory that looks complete but is not. Loading
re-checks the manifest, so a file truncated or damaged later is found before it is read.
Nothing here is a collective: ``checkpoint/manager.py`` decides which rank calls what.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

logger = logging.getLogger(__name__)

MANIFEST = "MANIFEST.json"
PARTIAL_SUFFIX = ".partial"
MANIFEST_VERSION = 1
_NAME = re.compile(r"^step_(\d{9})$")


def step_name(step: int) -> str:
    return f"step_{step:09d}"


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:  # some filesystems do not allow opening directories
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def file_crc32(path: Path, chunk: int = 8 << 20) -> int:
    crc = 0
    with open(path, "rb") as f:
        while True:
            block = f.read(chunk)
            if not block:
                return crc
            crc = zlib.crc32(block, crc)


@dataclass
class CheckpointInfo:
    """A complete checkpoint directory and what its manifest says."""

    path: Path
    step: int
    manifest: Dict[str, Any]

    @property
    def world_size(self) -> int:
        return int(self.manifest["world_size"])


class CheckpointStore:
    """The checkpoint root of one run."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)

    def partial_dir(self, step: int) -> Path:
        return self.root / (step_name(step) + PARTIAL_SUFFIX)

    def final_dir(self, step: int) -> Path:
        return self.root / step_name(step)

    # ---- writing (rank 0 only, the caller makes sure) ----------------------------------------
    def prepare(self, step: int) -> Path:
        """An empty ``.partial`` directory for ``step`` (a leftover from a crashed save is removed)."""
        self.root.mkdir(parents=True, exist_ok=True)
        partial = self.partial_dir(step)
        if partial.exists():
            shutil.rmtree(partial)
        partial.mkdir()
        return partial

    def publish(self, step: int, meta: Dict[str, Any]) -> Path:
        """Write the manifest of the ``.partial`` directory and rename it into place.

        Every file is fsynced before the manifest is written, the manifest before the rename, the
        root after it: after a power loss the rename is either absent or refers to complete files.
        """
        partial, final = self.partial_dir(step), self.final_dir(step)
        files: Dict[str, Dict[str, int]] = {}
        for f in sorted(partial.iterdir()):
            if f.name == MANIFEST or not f.is_file():
                continue
            with open(f, "rb+") as fh:
                os.fsync(fh.fileno())
            files[f.name] = {"bytes": f.stat().st_size, "crc32": file_crc32(f)}
        manifest = {"manifest_version": MANIFEST_VERSION, "step": step, **meta, "files": files}
        tmp = partial / (MANIFEST + ".tmp")
        with open(tmp, "w") as fh:
            json.dump(manifest, fh, indent=1)
            fh.flush()
            os.fsync(fh.fileno())
        tmp.replace(partial / MANIFEST)
        _fsync_dir(partial)
        if final.exists():  # a checkpoint of the same step from an earlier attempt
            shutil.rmtree(final)
        partial.rename(final)
        _fsync_dir(self.root)
        return final

    def prune(self, keep_last: int) -> List[Path]:
        """Delete complete checkpoints beyond the newest ``keep_last`` and leftover partial ones."""
        removed: List[Path] = []
        for info in self.complete()[:-keep_last] if keep_last else []:
            shutil.rmtree(info.path, ignore_errors=True)
            removed.append(info.path)
        if self.root.is_dir():
            for p in self.root.iterdir():
                if p.name.endswith(PARTIAL_SUFFIX) and p.is_dir():
                    shutil.rmtree(p, ignore_errors=True)
                    removed.append(p)
        return removed

    # ---- reading -----------------------------------------------------------------------------
    def complete(self) -> List[CheckpointInfo]:
        """Directories named ``step_N`` with a readable manifest, oldest first (not verified)."""
        out: List[CheckpointInfo] = []
        if not self.root.is_dir():
            return out
        for p in self.root.iterdir():
            m = _NAME.match(p.name)
            if not m or not p.is_dir():
                continue
            manifest = read_manifest(p)
            if manifest is not None:
                out.append(CheckpointInfo(p, int(m.group(1)), manifest))
        return sorted(out, key=lambda i: i.step)

    def newest_valid(self, verify: bool = True) -> Tuple[Optional[CheckpointInfo], List[str]]:
        """The newest checkpoint that passes ``check`` and the reasons the newer ones did not."""
        skipped: List[str] = []
        names = sorted(p.name for p in self.root.iterdir() if _NAME.match(p.name)) if self.root.is_dir() else []
        for name in reversed(names):
            path = self.root / name
            problem = check(path, verify)
            if problem is None:
                manifest = read_manifest(path)
                assert manifest is not None
                return CheckpointInfo(path, int(manifest["step"]), manifest), skipped
            skipped.append(f"{path}: {problem}")
        return None, skipped


def read_manifest(path: Path) -> Optional[Dict[str, Any]]:
    try:
        manifest = json.loads((Path(path) / MANIFEST).read_text())
    except (OSError, ValueError):
        return None
    return manifest if isinstance(manifest, dict) and "files" in manifest else None


def check(path: Path, verify: bool = True) -> Optional[str]:
    """Why the checkpoint at ``path`` must not be loaded, or None when it is sound.

    Checks the manifest exists and parses, and that every file it lists exists with its size;
    with ``verify`` also its CRC32 (finds damage that keeps the size).
    """
    path = Path(path)
    if not path.is_dir():
        return "not a directory"
    manifest = read_manifest(path)
    if manifest is None:
        return f"no readable {MANIFEST} (an interrupted or foreign directory)"
    if manifest.get("manifest_version") != MANIFEST_VERSION:
        return f"{MANIFEST} has version {manifest.get('manifest_version')!r}, expected {MANIFEST_VERSION}"
    for name, want in manifest["files"].items():
        f = path / name
        if not f.is_file():
            return f"{name} is missing"
        size = f.stat().st_size
        if size != want["bytes"]:
            return f"{name} has {size} bytes, the manifest says {want['bytes']} (truncated or overwritten)"
        if verify and file_crc32(f) != want["crc32"]:
            return f"{name} fails its CRC32 check (damaged)"
    return None


def resolve(path: Path, verify: bool = True) -> Tuple[Optional[CheckpointInfo], List[str]]:
    """``path`` is one checkpoint (has a manifest) or a checkpoint root: the checkpoint to load."""
    path = Path(path)
    if (path / MANIFEST).exists() or _NAME.match(path.name):
        problem = check(path, verify)
        if problem is not None:
            return None, [f"{path}: {problem}"]
        manifest = read_manifest(path)
        assert manifest is not None
        return CheckpointInfo(path, int(manifest["step"]), manifest), []
    return CheckpointStore(path).newest_valid(verify)
