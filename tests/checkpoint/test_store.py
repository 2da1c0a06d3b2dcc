"""Checkpoint directories: atomic publication, manifest checks, retention, choosing what to load."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from slipstream_rec.checkpoint.store import (
    MANIFEST,
    CheckpointStore,
    check,
    file_crc32,
    resolve,
)


def _save(store: CheckpointStore, step: int, payload: bytes = b"x" * 1000) -> Path:
    partial = store.prepare(step)
    (partial / "__0_0.distcp").write_bytes(payload)
    (partial / "rank0.pt").write_bytes(payload[::-1] + b"rank")
    return store.publish(step, {"world_size": 1})


def test_publish_renames_a_complete_directory_with_sizes_and_crcs(tmp_path):
    store = CheckpointStore(tmp_path / "ck")
    final = _save(store, 7)
    assert final.name == "step_000000007" and final.is_dir()
    assert not store.partial_dir(7).exists()
    manifest = json.loads((final / MANIFEST).read_text())
    assert manifest["step"] == 7 and manifest["world_size"] == 1
    assert manifest["files"]["__0_0.distcp"] == {"bytes": 1000, "crc32": file_crc32(final / "__0_0.distcp")}
    assert check(final) is None


def test_a_partial_directory_is_never_a_checkpoint(tmp_path):
    store = CheckpointStore(tmp_path / "ck")
    _save(store, 1)
    partial = store.prepare(2)  # a save that crashed before publishing
    (partial / "__0_0.distcp").write_bytes(b"half")
    assert [i.step for i in store.complete()] == [1]
    found, skipped = store.newest_valid()
    assert found is not None and found.step == 1 and skipped == []


def test_truncated_and_damaged_files_are_detected_and_skipped(tmp_path):
    store = CheckpointStore(tmp_path / "ck")
    _save(store, 1)
    newest = _save(store, 2)
    data = newest / "__0_0.distcp"
    data.write_bytes(data.read_bytes()[:500])  # truncated
    assert "500 bytes" in check(newest)
    found, skipped = store.newest_valid()
    assert found.step == 1 and len(skipped) == 1 and "truncated" in skipped[0]

    data.write_bytes(b"y" * 1000)  # same size, other bytes
    assert "CRC32" in check(newest)
    assert check(newest, verify=False) is None  # size-only check cannot see it
    assert store.newest_valid()[0].step == 1

    newest = _save(store, 2)
    (newest / "rank0.pt").unlink()
    assert "missing" in check(newest)
    (newest / MANIFEST).write_text("{not json")
    assert "MANIFEST" in check(newest)


def test_prune_keeps_the_newest_k_and_removes_leftover_partials(tmp_path):
    store = CheckpointStore(tmp_path / "ck")
    for step in (10, 20, 30, 40):
        _save(store, step)
    store.prepare(50)
    removed = store.prune(keep_last=2)
    assert sorted(p.name for p in removed) == ["step_000000010", "step_000000020", "step_000000050.partial"]
    assert [i.step for i in store.complete()] == [30, 40]


def test_publishing_a_step_again_replaces_it(tmp_path):
    store = CheckpointStore(tmp_path / "ck")
    _save(store, 5, b"a" * 10)
    final = _save(store, 5, b"b" * 20)
    assert (final / "__0_0.distcp").read_bytes() == b"b" * 20 and check(final) is None


def test_resolve_accepts_one_checkpoint_or_a_root(tmp_path):
    store = CheckpointStore(tmp_path / "ck")
    first = _save(store, 1)
    _save(store, 2)
    assert resolve(tmp_path / "ck")[0].step == 2
    assert resolve(first)[0].step == 1
    (first / "rank0.pt").write_bytes(b"")
    found, why = resolve(first)
    assert found is None and "rank0.pt" in why[0]
    assert resolve(tmp_path / "nothing-here")[0] is None


@pytest.mark.parametrize("keep", [1, 3])
def test_keep_last_bounds_what_stays_on_disk(tmp_path, keep):
    store = CheckpointStore(tmp_path / "ck")
    for step in range(1, 6):
        _save(store, step)
        store.prune(keep)
    assert [i.step for i in store.complete()] == list(range(6 - keep, 6))
