"""The entity-structured click-log simulator (data.source=clicklog; slipstream_rec.data.generated.clicklog)."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Dict

import numpy as np
import pytest
import torch

from slipstream_rec.config import ConfigError, load_config
from slipstream_rec.data.config import ClicklogConfig, DataConfig
from slipstream_rec.data.datasets import dataset_dir, ensure_dataset, normalize_data_config
from slipstream_rec.data.generated.clicklog.counters import DENSE_FEATURE_NAMES
from slipstream_rec.data.generated.clicklog.generate import config_hash, generate_dataset, normalize_clicklog_config
from slipstream_rec.data.generated.clicklog.sampling import GroupedSampler
from slipstream_rec.data.generated.clicklog.world import COL, FEATURES, World
from slipstream_rec.data.generated.clicklog.writer import top_rows_lookup_share
from slipstream_rec.data.meta import SPLITS, load_meta
from slipstream_rec.metrics import auc

ROOT = Path(__file__).resolve().parents[3]
BIN = Path(sys.executable).parent
DAYS, PER_DAY = 4, 6000


def tiny(**overrides) -> ClicklogConfig:
    """4 days of 6000 rows over a small world (every table <= 2000 rows): ~0.3 s to generate."""
    base = dict(
        num_days=DAYS, rows_per_day=PER_DAY, num_users=2000, num_user_segments=20, num_regions=6,
        num_cities=60, num_isps=20, num_sites=400, num_domains=150, num_site_categories=8,
        num_advertisers=60, num_campaigns=200, num_ad_categories=12, num_initial_ads=600,
        new_ads_per_day=60,
    )  # fmt: skip
    base.update(overrides)
    return ClicklogConfig(**base)


def gen(tmp_path: Path, name: str, cfg: ClicklogConfig) -> Path:
    out = tmp_path / name
    out.mkdir()
    generate_dataset(cfg, out)
    return out


def read(path: Path) -> Dict[str, np.ndarray]:
    """All splits in time order (train, val, test): sparse, dense, labels."""
    return {
        kind: np.concatenate([np.load(path / f"{split}_{kind}.npy") for split in SPLITS])
        for kind in ("sparse", "dense", "labels")
    }


@pytest.fixture(scope="module")
def plain(tmp_path_factory) -> Path:
    """The tiny log with unpermuted ids: ids are the simulator's entity indices."""
    return gen(tmp_path_factory.mktemp("clicklog"), "plain", tiny(permute_ids=False))


def distinct(a: np.ndarray, b: np.ndarray) -> int:
    return len(np.unique(a.astype(np.int64) * (int(b.max()) + 1) + b))


def test_grouped_sampler_draws_members_of_the_group_by_weight() -> None:
    rng = np.random.default_rng(0)
    groups = 7
    group_of = rng.integers(0, groups - 1, 400)  # group 6 has no member
    weights = rng.pareto(1.0, 400) * (rng.random(400) < 0.8)  # heavy-tailed, some zero
    sampler = GroupedSampler(group_of, groups).set_weights(weights)
    asked = rng.integers(0, groups - 1, 200_000)
    asked = asked[sampler.totals[asked] > 0]
    u = rng.random(len(asked))
    drawn = sampler.sample(asked, u)
    # The guide table's answers are exactly the plain inverse-CDF search's.
    plain = sampler.order[np.minimum(np.searchsorted(sampler.cdf, asked + u, side="right"), 399)]
    assert np.array_equal(drawn, plain)
    assert (group_of[drawn] == asked).all() and (weights[drawn] > 0).all()
    g = int(np.argmax(np.bincount(asked)))  # frequencies within one group follow the weights
    members = np.flatnonzero(group_of == g)
    freq = np.bincount(drawn[asked == g], minlength=400)[members] / (asked == g).sum()
    assert np.abs(freq - weights[members] / weights[members].sum()).max() < 0.01


def test_same_seed_same_files_other_seed_different(tmp_path: Path) -> None:
    a = gen(tmp_path, "a", tiny(seed=3))
    b = gen(tmp_path, "b", tiny(seed=3))
    c = gen(tmp_path, "c", tiny(seed=4))
    for split in SPLITS:
        for kind in ("dense", "sparse", "labels"):
            fa = (a / f"{split}_{kind}.npy").read_bytes()
            assert fa == (b / f"{split}_{kind}.npy").read_bytes(), (split, kind)
            assert fa != (c / f"{split}_{kind}.npy").read_bytes(), (split, kind)
    assert (a / "meta.json").read_bytes() == (b / "meta.json").read_bytes()
    assert config_hash(tiny(seed=3)) != config_hash(tiny(seed=4))


def test_layout_meta_and_value_ranges(plain: Path) -> None:
    meta = load_meta(plain)  # validates every file's dtype / shape / row count
    assert meta.format_version == 1 and meta.num_dense == 13 and meta.num_sparse == 26
    assert meta.sparse_feature_names == FEATURES and meta.dense_feature_names == DENSE_FEATURE_NAMES
    assert meta.rows == {"train": (DAYS - 1) * PER_DAY, "val": PER_DAY // 2, "test": PER_DAY // 2}
    assert meta.num_embeddings_per_feature == World(tiny(permute_ids=False)).cardinalities
    assert 0.6 < meta.teacher_auc < 0.95  # labels carry signal and are not deterministic
    assert meta.generator["name"] == "clicklog"
    assert meta.generator["hash"] == config_hash(tiny(permute_ids=False))
    cards = np.asarray(meta.num_embeddings_per_feature)
    for split in SPLITS:
        sparse = np.load(plain / f"{split}_sparse.npy")
        assert (sparse >= 0).all() and (sparse < cards).all()
        dense = np.load(plain / f"{split}_dense.npy")
        assert np.isfinite(dense).all() and (dense >= 0).all()  # log(max(x, 0) + 1)
        labels = np.load(plain / f"{split}_labels.npy")
        assert set(np.unique(labels)) == {0, 1}
    # slot_position is both a categorical and a dense feature: the same value.
    data = read(plain)
    slot = data["sparse"][:, COL["slot_position"]]
    assert np.array_equal(data["dense"][:, DENSE_FEATURE_NAMES.index("slot_position")],
                          np.log1p(slot).astype(np.float32))


def functional(data: np.ndarray, a: str, b: str) -> bool:
    """Every value of feature a occurs with exactly one value of feature b."""
    pairs = np.unique(data[:, [COL[a], COL[b]]], axis=0)
    return len(pairs) == len(np.unique(pairs[:, 0]))


@pytest.mark.parametrize("permute", [False, True])
def test_hierarchies_are_consistent(tmp_path: Path, plain: Path, permute: bool) -> None:
    path = gen(tmp_path, "p", tiny()) if permute else plain
    sparse = read(path)["sparse"]
    consistent = [
        ("user_id", f) for f in ("user_segment", "geo_region", "city", "device_type", "os",
                                 "browser", "age_bucket", "language")
    ] + [
        ("ad_id", f) for f in ("creative", "campaign", "advertiser", "ad_category", "ad_format", "ad_size")
    ] + [
        ("site_id", f) for f in ("domain", "site_category", "app_or_web")
    ] + [
        ("city", "geo_region"), ("isp", "geo_region"), ("os", "device_type"), ("browser", "os"),
        ("creative", "campaign"), ("campaign", "advertiser"), ("advertiser", "ad_category"),
        ("domain", "site_category"), ("placement", "site_id"), ("ad_size", "ad_format"),
    ]  # fmt: skip
    for a, b in consistent:
        assert functional(sparse, a, b), (a, b)
    # ... and these are not functions (they are drawn per impression).
    for a, b in (("user_id", "site_id"), ("user_id", "ad_id"), ("site_id", "ad_id"), ("user_id", "isp")):
        assert not functional(sparse, a, b), (a, b)


def test_combinations_recur_beyond_chance(plain: Path) -> None:
    sparse = read(plain)["sparse"]
    rng = np.random.default_rng(0)
    n = len(sparse)
    for a, b, at_most in (("user_id", "site_id", 0.7), ("ad_id", "site_id", 0.95),
                          ("user_id", "ad_id", 0.95), ("user_id", "advertiser", 0.95)):
        x, y = sparse[:, COL[a]], sparse[:, COL[b]]
        seen = distinct(x, y)
        # The same marginals, paired independently: what the default synthetic data does.
        independent = distinct(x, rng.permutation(y))
        assert seen < at_most * independent, (a, b, seen, independent)
        assert seen < 0.6 * n, (a, b, seen, n)  # pairs repeat
    full = np.unique(sparse[:, [COL["user_id"], COL["ad_id"], COL["site_id"]]], axis=0)
    assert len(full) < 0.8 * n


def test_popularity_drifts_over_days(plain: Path) -> None:
    cfg = tiny(permute_ids=False)
    ads = read(plain)["sparse"][:, COL["ad_id"]]
    days = [ads[d * PER_DAY:(d + 1) * PER_DAY] for d in range(DAYS)]
    for d, day in enumerate(days):  # an ad appears only from its start day on
        assert day.max() < cfg.num_initial_ads + d * cfg.new_ads_per_day
    last_train = days[DAYS - 2]
    new_share = np.mean(last_train >= cfg.num_initial_ads)
    assert new_share > 0.08, new_share  # ads that entered after day 0 take a real share

    def head(day: np.ndarray, k: int = 30) -> set:
        ids, counts = np.unique(day, return_counts=True)
        return set(ids[np.argsort(-counts, kind="stable")[:k]])

    # Head ads of day 0 retire: some are never shown on the last train day.
    assert head(days[0]) - set(np.unique(last_train))
    assert len(head(days[1]) & head(last_train)) < 27


def test_splits_by_day_in_time_order(plain: Path) -> None:
    meta = load_meta(plain)
    weekday, hour = COL["weekday"], COL["hour"]
    train = np.load(plain / "train_sparse.npy")
    for d in range(DAYS - 1):
        rows = train[d * PER_DAY:(d + 1) * PER_DAY]
        assert (rows[:, weekday] == d).all()
        assert (np.diff(rows[:, hour]) >= 0).all()  # hour by hour within a day
    val, test = np.load(plain / "val_sparse.npy"), np.load(plain / "test_sparse.npy")
    assert (val[:, weekday] == DAYS - 1).all() and (test[:, weekday] == DAYS - 1).all()
    last_day = np.concatenate([val[:, hour], test[:, hour]])
    assert (np.diff(last_day) >= 0).all()  # val is the first half of the last day, test the second
    assert val[:, hour].max() <= test[:, hour].min()
    assert len(val) + len(test) == PER_DAY and meta.generator["days"] == {
        "train": list(range(DAYS - 1)), "val": DAYS - 1, "test": DAYS - 1}


def test_click_rate_near_the_configured_base(tmp_path: Path, plain: Path) -> None:
    labels = read(plain)["labels"]
    assert abs(labels.mean() - 0.25) < 0.02
    low = read(gen(tmp_path, "low", tiny(base_ctr=0.05)))["labels"]
    assert abs(low.mean() - 0.05) < 0.01


def test_dense_features_follow_the_entities(plain: Path) -> None:
    data = read(plain)
    sparse, dense, labels = data["sparse"], data["dense"], data["labels"][:, 0]
    col = DENSE_FEATURE_NAMES.index
    # A user's recent impressions grow with how often the user appears in the log.
    users, inverse, counts = np.unique(sparse[:, COL["user_id"]], return_inverse=True, return_counts=True)
    frequency = counts[inverse]
    ranks = lambda x: np.argsort(np.argsort(x, kind="stable"), kind="stable")  # noqa: E731
    rho = np.corrcoef(ranks(frequency), ranks(dense[:, col("user_impressions")]))[0, 1]
    assert rho > 0.5, rho
    # The ad's past click rate (decayed clicks vs impressions) predicts its clicks.
    past_ctr = np.expm1(dense[:, col("ad_clicks")]) / (np.expm1(dense[:, col("ad_impressions")]) + 1)
    assert auc(torch.from_numpy(past_ctr), torch.from_numpy(labels)) > 0.55
    # A new ad (entered on day d >= 1) is less than a day old on its first day.
    cfg = tiny(permute_ids=False)
    day1 = slice(PER_DAY, 2 * PER_DAY)
    new = sparse[day1, COL["ad_id"]] >= cfg.num_initial_ads
    assert new.any() and (dense[day1][new, col("ad_age_days")] == 0).all()


def test_top_one_percent_of_rows_take_most_lookups(tmp_path: Path) -> None:
    # The default world (table sizes, popularity), fewer rows: 3 days of 40k.
    path = gen(tmp_path, "default_shape", ClicklogConfig(num_days=3, rows_per_day=40_000))
    meta = load_meta(path)
    train = np.load(path / "train_sparse.npy")
    lookups = np.concatenate([
        np.bincount(train[:, f], minlength=n) for f, n in enumerate(meta.num_embeddings_per_feature)
    ])
    assert len(lookups) == sum(meta.num_embeddings_per_feature)
    share = top_rows_lookup_share(lookups, 0.01)
    assert share > 0.5, share
    assert meta.generator["train_top_1pct_rows_lookup_share"] == pytest.approx(share)


def test_default_config_shape() -> None:
    cfg = normalize_clicklog_config(ClicklogConfig())
    assert cfg.num_days == 7 and cfg.rows_per_day * (cfg.num_days - 1) == 4_098_000
    assert cfg.base_ctr == 0.25
    cards = World(cfg).cardinalities
    assert len(cards) == 26 and max(cards) == 100_000
    assert 200_000 < sum(cards) < 500_000
    # Criteo-like shape: a few very large tables, many small ones.
    assert sum(c >= 10_000 for c in cards) >= 5 and sum(c < 100 for c in cards) >= 10


@pytest.mark.parametrize(
    "key, value",
    [
        ("num_days", 1), ("rows_per_day", 1), ("num_users", 0), ("num_users", 2.5),
        ("base_ctr", 1.0), ("base_ctr", 0.0), ("teacher_rank", -1), ("creatives_per_ad", 0.0),
        ("preferred_site_share", 1.5), ("counter_half_life_hours", 0.0), ("new_ads_per_day", 0),
        ("ad_lifetime_days", 0.5), ("user_zipf_exponent", -1.0), ("dense_noise", float("nan")),
        ("permute_ids", "yes"), ("num_domains", 500),  # more domains than sites
        ("direct_deal_share", 0.8),  # + retargeting_share 0.3 > 1
    ],
)  # fmt: skip
def test_bad_values_name_the_key(key: str, value) -> None:
    cfg = dataclasses.replace(tiny(), **{key: value})
    with pytest.raises(ValueError, match=rf"data\.clicklog\.{key}") as e:
        normalize_data_config(DataConfig(source="clicklog", clicklog=cfg))
    assert "Fix" in str(e.value) or "must be" in str(e.value)


def test_unknown_key_in_a_mapping_is_rejected() -> None:
    with pytest.raises(ValueError, match=r"data\.clicklog has unknown key\(s\) \['num_user'\]"):
        normalize_data_config({"source": "clicklog", "clicklog": {"num_user": 5}})


def test_composes_through_hydra() -> None:
    job = load_config(["data=clicklog"])
    assert job.data.source == "clicklog" and job.data.name == "clicklog"
    assert isinstance(job.data.clicklog, ClicklogConfig)
    assert job.data.clicklog == ClicklogConfig()  # the yaml only restates the defaults
    quick = load_config(["experiment=clicklog_quick"])
    assert quick.data.source == "clicklog" and quick.trainer.batch_size == 1024
    c = quick.data.clicklog
    assert c.rows_per_day * (c.num_days - 1) == 409_800 and c.num_users == 10_000
    normalize_data_config(quick.data)  # valid
    with pytest.raises(ConfigError, match="bogus"):
        load_config(["data=clicklog", "data.clicklog.bogus=1"])
    with pytest.raises(ConfigError, match="num_days"):
        load_config(["data=clicklog", "data.clicklog.num_days=many"])


def test_ensure_dataset_generates_once_into_the_cache(tmp_path: Path) -> None:
    cfg = DataConfig(name="cl", root=str(tmp_path), source="clicklog", clicklog=tiny())
    path = ensure_dataset(cfg)
    assert path == dataset_dir(cfg) == tmp_path / f"cl-{config_hash(tiny())}"
    stamp = (path / "meta.json").stat().st_mtime_ns
    assert ensure_dataset(cfg) == path
    assert (path / "meta.json").stat().st_mtime_ns == stamp  # reused, not regenerated
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".cl-") and "tmp" in p.name] == []
    other = dataclasses.replace(cfg, clicklog=tiny(seed=1))
    assert dataset_dir(other) != path


def test_two_process_training_on_clicklog_quick(tmp_path: Path) -> None:
    env = dict(os.environ, OMP_NUM_THREADS="1", PATH=f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}")
    run_dir = tmp_path / "run"
    cmd = [
        str(BIN / "torchrun"), "--standalone", "--nproc_per_node", "2", "-m", "slipstream_rec.train",
        "experiment=clicklog_quick", f"data.root={tmp_path / 'data'}", f"trainer.run_dir={run_dir}",
        "data.clicklog.rows_per_day=20000", "trainer.max_steps=40", "trainer.progress_bar=false",
    ]  # fmt: skip
    result = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-4000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["world_size"] == 2 and summary["steps"] == 40
    assert summary["samples_trained"] == 40 * 2 * 1024
    assert summary["test_auc"] > 0.6, summary  # learns from the click log
