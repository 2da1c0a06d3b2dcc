"""Generated and converted datasets are byte-identical to the ones main wrote before data/ was
reorganised (issue 21, main at 35961c5).

The expected digests are not computed by the code under test: they were recorded by running the
code of main 35961c5 (the flat data/ layout) on exactly the inputs ``_write_small`` writes, with
this file's ``_digest``. A dataset's digest covers the relative path and sha256 of every file
under it; ``meta.json`` is hashed as sorted JSON without its wall-clock ``seconds`` (the
converter records how long it ran), everything else byte for byte. Inputs are named by relative
paths from the working directory because the converters hash their input paths into the cache
name and meta.json.

The digests pin numpy's float64 exp / log / tanh results, which may differ in the last bit on
another numpy version or CPU (numpy picks SIMD code paths by CPU): recorded with numpy 2.4.6 on
an x86-64 AMD EPYC with AVX-512. Elsewhere a failure says "the data changed" only after the
recording (``_write_small`` run on main 35961c5's code) is redone on that machine.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path
from typing import Any, Dict

import pytest

from slipstream_rec.data.config import (
    ClicklogConfig,
    CriteoConfig,
    DataConfig,
    MovieLensConfig,
    SplitConfig,
    SyntheticConfig,
    TabularConfig,
)
from slipstream_rec.data.convert.converter import convert
from slipstream_rec.data.datasets import ensure_dataset
from slipstream_rec.data.formats.criteo import CriteoSource
from slipstream_rec.data.formats.tabular import TabularSource
from slipstream_rec.data.generated import synthetic
from slipstream_rec.data.generated.clicklog import generate as clicklog
from slipstream_rec.data.generated.criteo_text import write_criteo_text
from tests.data._clicks import make_clicks, write_csv

FIXTURES = Path(__file__).parent / "fixtures"

# Recorded on main 35961c5 (see the module docstring).
SMALL = {
    "synthetic": "56c6332f227503ea1725bc37508edc561366a5f758b218075b505e8601d8d4b6",
    "clicklog": "1e682f574ee7ae3b6d4687ab8497330d94313496e5ccb89bae5a5221790288a5",
    "criteo_text": "41a05eb7c32e0ad110ec8ed719af5abeb2996817067bb9297f87befdb9fde78a",
    "criteo": "175e2a18ca83544eac2dad0e3fdacee73af5aabbd94ef0e84ad96d45e27ba103",
    "tabular": "445ad806f93c20dbab142394f7dcfe28ec76a64a237a5a9add0b211a1d0ad8b0",
    "movielens": "85a3c3589f5c4de7e2b3535abda885a04139029db69eb59ca0b2a73e2466c1a3",
}
# The full-size defaults and clicklog_quick: digests of main's data/ cache, written by main's code
# (data/clicklog-0b6cbbc4e9cc, data/synthetic_criteo-7faf7f9ebfd5, data/clicklog_quick-44b459e0d67d;
# clicklog_quick was also regenerated from 35961c5's code, with the same digest).
FULL = {
    "clicklog": "47134f93ef15d1fc01bc5d5df4d4cf36415eef40b83729a57ecf149a12ac673c",
    "clicklog_quick": "e73233f230f3bb999d3c71c63c2376f22b1c4a9d298e4c23e583dd80a79c6ba5",
    "synthetic": "5203f7ae7fc462d057f2e907f65325937e0fd8de5908b5dfef34fae8509dfd3d",
}


def _timeless(x: Any) -> Any:
    if isinstance(x, dict):
        return {k: _timeless(v) for k, v in x.items() if k != "seconds"}
    return [_timeless(v) for v in x] if isinstance(x, list) else x


def _file_hash(path: Path) -> str:
    data = path.read_bytes()
    if path.name == "meta.json":
        data = json.dumps(_timeless(json.loads(data)), sort_keys=True).encode()
    return hashlib.sha256(data).hexdigest()


def _digest(root: Path, *, only: str = "") -> str:
    """sha256 over ``relative path:sha256`` of every file under ``root`` (or just ``only``)."""
    files = [root / only] if only else [p for p in root.rglob("*") if p.is_file()]
    lines = sorted(f"{p.relative_to(root).as_posix()}:{_file_hash(p)}" for p in files)
    return hashlib.sha256("\n".join(lines).encode()).hexdigest()


def _tiny_clicklog() -> ClicklogConfig:
    """tests/data/generated/test_clicklog.py's tiny() as it was when the digests were recorded: a
    copy on purpose (like the other inputs here), so that a change to that helper cannot change
    what these digests pin."""
    return ClicklogConfig(
        num_days=4, rows_per_day=6000, num_users=2000, num_user_segments=20, num_regions=6,
        num_cities=60, num_isps=20, num_sites=400, num_domains=150, num_site_categories=8,
        num_advertisers=60, num_campaigns=200, num_ad_categories=12, num_initial_ads=600,
        new_ads_per_day=60,
    )  # fmt: skip


def _write_small(work: Path) -> Dict[str, str]:
    """Every small dataset under ``work`` (the working directory); their digests by name."""
    for name in ("synthetic", "clicklog", "raw"):
        (work / name).mkdir()
    synthetic.generate_dataset(
        SyntheticConfig(num_train=6000, num_val=3000, num_test=1000, cardinality_scale=0.001,
                        min_cardinality=8, max_cardinality=2000),
        work / "synthetic",
    )
    clicklog.generate_dataset(_tiny_clicklog(), work / "clicklog")
    teacher = SyntheticConfig(cardinality_scale=0.0005, min_cardinality=8, max_cardinality=400, zipf_exponent=1.2)
    with open("raw/day.txt", "wb") as f:
        write_criteo_text(f, 6000, teacher, seed=0, chunk_rows=5000)
    convert(CriteoSource(CriteoConfig(inputs=["raw/day.txt"]), chunk_bytes=200_000), Path("criteo"))
    tab = TabularConfig(
        inputs=[str(write_csv(Path("raw/c.csv"), make_clicks(3000)))], label_column="click",
        dense_columns=["price", "views"], categorical_columns=["user", "item"], multi_hot_columns=["tags"],
        split=SplitConfig(method="random", val_fraction=0.1, test_fraction=0.1, seed=3),
    )  # fmt: skip
    convert(TabularSource(tab, chunk_bytes=20_000), Path("tabular"))
    shutil.copytree(FIXTURES / "ml-tiny", "ml-tiny")
    ensure_dataset(DataConfig(name="ml", root="mlroot", source="movielens_1m",
                              movielens=MovieLensConfig(source="ml-tiny", pip_fallback=False)))
    return {
        "synthetic": _digest(work / "synthetic"),
        "clicklog": _digest(work / "clicklog"),
        "criteo_text": _digest(work / "raw", only="day.txt"),
        "criteo": _digest(work / "criteo"),
        "tabular": _digest(work / "tabular"),
        "movielens": _digest(work / "mlroot"),  # includes the cache directory's name (its hash)
    }


def test_small_generated_and_converted_datasets_are_unchanged(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert _write_small(tmp_path) == SMALL


@pytest.mark.slow
def test_default_and_quick_datasets_are_unchanged(tmp_path: Path) -> None:
    """data=clicklog, data=synthetic and experiment=clicklog_quick at full size (~1.5 GB, ~1 min)."""
    from slipstream_rec.config import load_config

    found = {}
    for name, cfg, gen in (
        ("clicklog", ClicklogConfig(), clicklog.generate_dataset),
        ("clicklog_quick", load_config(["experiment=clicklog_quick"]).data.clicklog, clicklog.generate_dataset),
        ("synthetic", SyntheticConfig(), synthetic.generate_dataset),
    ):
        out = tmp_path / name
        out.mkdir()
        gen(cfg, out)
        found[name] = _digest(out)
        shutil.rmtree(out)
    assert found == FULL
