"""The dataset registry (slipstream_rec.data.datasets): cache directories, atomic generation,
the lock between concurrent callers, source=npy, and data.* errors."""

from __future__ import annotations

import dataclasses
import os
import shutil
from pathlib import Path

import pytest

from slipstream_rec.data import datasets
from slipstream_rec.data.config import DataConfig
from slipstream_rec.data.datasets import ensure_dataset
from slipstream_rec.data.generated import synthetic
from slipstream_rec.data.generated.synthetic import config_hash
from slipstream_rec.data.meta import load_meta
from tests._fixtures import gen, tiny


def test_ensure_dataset_caches(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = DataConfig(root=str(tmp_path), synthetic=tiny())
    path = ensure_dataset(cfg)
    assert path == tmp_path / f"synthetic_criteo-{config_hash(cfg.synthetic)}"
    mtime = (path / "meta.json").stat().st_mtime_ns

    def fail(*args, **kwargs):
        raise AssertionError("regenerated a cached dataset")

    monkeypatch.setattr(synthetic, "generate_dataset", fail)
    assert ensure_dataset(cfg) == path
    assert (path / "meta.json").stat().st_mtime_ns == mtime
    # A different config is a different directory.
    monkeypatch.undo()
    other = ensure_dataset(dataclasses.replace(cfg, synthetic=tiny(seed=1)))
    assert other != path and other.parent == path.parent


def test_crash_mid_generation_leaves_no_finished_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = DataConfig(root=str(tmp_path), synthetic=tiny())
    real_write = synthetic._write_chunk
    calls = {"n": 0}

    def crashing_write(arrays, start, chunk):
        calls["n"] += 1
        if calls["n"] == 2:  # the first chunk of the val split
            raise OSError("disk full (simulated)")
        real_write(arrays, start, chunk)

    monkeypatch.setattr(synthetic, "_write_chunk", crashing_write)
    with pytest.raises(OSError, match="simulated"):
        ensure_dataset(cfg)
    final = tmp_path / f"synthetic_criteo-{config_hash(cfg.synthetic)}"
    assert not final.exists()
    assert [p for p in tmp_path.iterdir() if p.is_dir()] == []  # the temporary dir was removed too

    # A hard crash (no cleanup) leaves only a hidden .tmp directory, which does not block a rerun.
    (tmp_path / f".{final.name}.tmp-deadbeef").mkdir()
    monkeypatch.setattr(synthetic, "_write_chunk", real_write)
    assert ensure_dataset(cfg) == final
    assert load_meta(final).rows["train"] == 6000


def test_losing_the_rename_race_discards_our_copy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = DataConfig(root=str(tmp_path), synthetic=tiny())
    real_rename = os.rename

    def rename_after_competitor(src, dst):
        shutil.copytree(src, dst)  # another process finished first
        real_rename(src, dst)  # -> OSError: destination exists and is not empty

    monkeypatch.setattr(datasets.os, "rename", rename_after_competitor)
    final = ensure_dataset(cfg)
    assert load_meta(final).generator["hash"] == config_hash(cfg.synthetic)
    assert [p.name for p in tmp_path.iterdir() if p.is_dir()] == [final.name]


def test_concurrent_callers_generate_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import threading

    cfg = DataConfig(root=str(tmp_path), synthetic=tiny())
    real_generate = synthetic.generate_dataset
    calls = []

    def counting_generate(*args, **kwargs):
        calls.append(1)
        return real_generate(*args, **kwargs)

    monkeypatch.setattr(synthetic, "generate_dataset", counting_generate)
    results = []
    threads = [threading.Thread(target=lambda: results.append(ensure_dataset(cfg))) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(results) == 2 and results[0] == results[1]
    assert len(calls) == 1  # the second caller waited on the lock and found the cache


def test_invalid_existing_dir_is_reported(tmp_path: Path) -> None:
    cfg = DataConfig(root=str(tmp_path), synthetic=tiny())
    final = tmp_path / f"synthetic_criteo-{config_hash(cfg.synthetic)}"
    final.mkdir()
    with pytest.raises(ValueError, match="delete"):
        ensure_dataset(cfg)


def test_source_npy(tmp_path: Path) -> None:
    path = gen(tmp_path, "n", tiny())
    assert ensure_dataset(DataConfig(source="npy", path=str(path))) == path
    # data.synthetic is irrelevant for source=npy, even if it would be invalid.
    bad = dataclasses.replace(tiny(), base_ctr=2.0)
    assert ensure_dataset(DataConfig(source="npy", path=str(path), synthetic=bad)) == path
    with pytest.raises(ValueError, match="data.path"):
        ensure_dataset(DataConfig(source="npy"))
    with pytest.raises(FileNotFoundError, match="meta.json"):
        ensure_dataset(DataConfig(source="npy", path=str(tmp_path)))


def test_data_config_errors(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="data.source"):
        ensure_dataset(DataConfig(root=str(tmp_path), source="parquet"))
    with pytest.raises(ValueError, match="data.name"):
        ensure_dataset(DataConfig(root=str(tmp_path), name="a/b"))


def test_accepts_omegaconf_structured_config(tmp_path: Path) -> None:
    from omegaconf import OmegaConf

    dc = OmegaConf.structured(DataConfig(root=str(tmp_path), synthetic=tiny()))
    dc.synthetic.seed = 7
    assert config_hash(dc.synthetic) == config_hash(tiny(seed=7))
    path = ensure_dataset(dc)
    assert path.name.endswith(config_hash(tiny(seed=7)))
