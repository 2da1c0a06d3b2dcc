"""``data.source=clicklog``: an entity-structured display-ad click log, simulated day by day.

Rows are impressions (user, ad, site, context) in time order: day 0..D-1, hour by hour within a
day (the hour's share of the day follows a diurnal cycle). The 26 categorical features are the
entities' attributes (world.py), the labels are clicks drawn from a hidden teacher (teacher.py),
and the 13 dense features (counters.py) are what a logging pipeline would know about the
entities from the hours before the row's hour:

    user_impressions, user_clicks        decayed counts (half-life counter_half_life_hours)
    user_impressions_today               since midnight
    hours_since_user_impression          0 if never seen
    ad_impressions, ad_clicks            decayed counts
    ad_age_days                          days the ad has been running
    campaign_impressions                 decayed count
    site_impressions, site_clicks        decayed counts
    slot_position                        0 = top
    ad_bid_cents                         the ad's bid
    user_tenure_days                     account age (0 for anonymous users)

Counts carry lognormal measurement noise (``dense_noise``); everything is stored as
log(max(x, 0) + 1) float32. The counters start from one simulated day before day 0 (same
process, not written), scaled to their steady level, so day 0 is not a cold start.

Splits like Criteo Kaggle: days 0..D-2 are train (in time order), the last day's first half is
val and its second half test. Written in TorchRec's npy layout + meta.json (format_version 1) by
writer.py, cached under ``{root}/{name}-{config hash}`` by ``datasets.ensure_dataset``.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import math
import time
from pathlib import Path
from typing import Any, Dict, Iterator, Tuple, Union

import numpy as np
import torch

from slipstream_rec.data.coerce import checked_number, coerce_dataclass
from slipstream_rec.data.config import ClicklogConfig
from slipstream_rec.data.generated.clicklog.counters import (
    DENSE_FEATURE_NAMES,
    ActivityCounters,
)
from slipstream_rec.data.generated.clicklog.teacher import ClicklogTeacher
from slipstream_rec.data.generated.clicklog.world import COL, FEATURES, World, hour_rows
from slipstream_rec.data.generated.clicklog.writer import (
    SplitWriter,
    top_rows_lookup_share,
)
from slipstream_rec.data.meta import FORMAT_VERSION, META_FILE, SPLITS
from slipstream_rec.metrics import auc

logger = logging.getLogger("slipstream_rec.data")

# Bump when the generated data changes for the same config: it is part of the cache hash.
GENERATOR_VERSION = 1
# At most this many rows are drawn at once (an hour is split into chunks above it): bounds memory.
# Each chunk has its own random stream, so changing this changes the data (bump the version).
CHUNK_ROWS = 131_072
# Hours of the simulated warm-up before day 0.
WARMUP_HOURS = 24
STREAM_ROWS, STREAM_WARMUP, STREAM_DENSE = 31, 32, 33


# -- config -------------------------------------------------------------------------------------


def normalize_clicklog_config(cfg: Any, key: str = "data.clicklog") -> ClicklogConfig:
    """Validate a ClicklogConfig (dataclass, DictConfig or mapping) and return a clean copy.

    Raises ValueError naming the offending key (``data.clicklog.<field>``) and the fix.
    """
    c = coerce_dataclass(cfg, ClicklogConfig, key)
    k = lambda name: f"{key}.{name}"  # noqa: E731
    ints = {  # field -> (lower bound, fix)
        "num_days": (2, "Fix: at least 2 days (train days, then the last day for val / test)."),
        "rows_per_day": (2, "Fix: at least 2 rows (the last day is halved into val and test)."),
        "num_users": (1, ""), "num_user_segments": (1, ""), "num_regions": (1, ""),
        "num_cities": (1, ""), "num_isps": (1, ""), "num_sites": (1, ""), "num_domains": (1, ""),
        "num_site_categories": (1, ""), "num_advertisers": (1, ""), "num_campaigns": (1, ""),
        "num_ad_categories": (1, ""), "num_initial_ads": (1, ""),
        "new_ads_per_day": (1, "Fix: ads must keep entering (the log's drift); use >= 1."),
        "teacher_rank": (0, "Fix: 0 disables the affinity terms."), "seed": (0, ""),
    }  # fmt: skip
    floats = {  # field -> (lower bound, lower bound open, upper bound, fix)
        "placements_per_site": (1.0, False, None, "Fix: every site has at least 1 placement."),
        "ad_lifetime_days": (1.0, False, None, "Fix: an ad runs at least 1 day."),
        "creatives_per_ad": (0.0, True, 1.0, "Fix: a share in (0, 1]: ads of a campaign share creatives."),
        "user_zipf_exponent": (0.0, False, None, "Fix: 0 is uniform, ~1 is web-like."),
        "site_zipf_exponent": (0.0, False, None, "Fix: 0 is uniform, ~1 is web-like."),
        "ad_zipf_exponent": (0.0, False, None, "Fix: 0 is uniform, ~1 is web-like."),
        "user_daily_jitter": (0.0, False, None, ""), "site_daily_jitter": (0.0, False, None, ""),
        "preferred_sites_mean": (1.0, False, 16.0, "Fix: between 1 and 16 sites."),
        "preferred_site_share": (0.0, False, 1.0, "Fix: a probability in [0, 1]."),
        "contextual_targeting_share": (0.0, False, 1.0, "Fix: a probability in [0, 1]."),
        "retargeting_share": (0.0, False, 1.0, "Fix: a probability in [0, 1]."),
        "advertisers_per_user_mean": (1.0, False, 16.0, "Fix: between 1 and 16 advertisers."),
        "direct_deal_share": (0.0, False, 1.0, "Fix: a probability in [0, 1]."),
        "deals_per_site_mean": (1.0, False, 16.0, "Fix: between 1 and 16 campaigns."),
        "counter_half_life_hours": (0.0, True, None, "Fix: a positive number of hours, e.g. 24."),
        "dense_noise": (0.0, False, None, ""),
        "teacher_entity_scale": (0.0, False, None, ""),
        "teacher_interaction_scale": (0.0, False, None, ""),
        "teacher_context_scale": (0.0, False, None, ""),
        "teacher_dense_scale": (0.0, False, None, ""),
    }  # fmt: skip
    values: Dict[str, Any] = {}
    for name, (lo, fix) in ints.items():
        values[name] = checked_number(getattr(c, name), k(name), int, lo=lo, fix=fix)
    for name, (lo, lo_open, hi, fix) in floats.items():
        values[name] = checked_number(getattr(c, name), k(name), float, lo=lo, lo_open=lo_open, hi=hi, fix=fix)
    values["base_ctr"] = checked_number(c.base_ctr, k("base_ctr"), float, lo=0, lo_open=True, hi=1,
                                        hi_open=True, fix="Fix: a click-through rate strictly between 0 and 1, e.g. 0.25.")
    if not isinstance(c.permute_ids, bool):
        raise ValueError(f"{k('permute_ids')} must be true or false, got {c.permute_ids!r}")
    values["permute_ids"] = c.permute_ids
    out = ClicklogConfig(**values)
    if out.retargeting_share + out.direct_deal_share > 1.0:
        raise ValueError(
            f"{k('retargeting_share')} + {k('direct_deal_share')} = "
            f"{out.retargeting_share + out.direct_deal_share} exceeds 1. Fix: lower one of them "
            f"(the rest of the impressions are targeted by category)."
        )
    # Every parent gets at least one child (no empty domain, advertiser, campaign, region).
    for child, parent in (("num_cities", "num_regions"), ("num_isps", "num_regions"),
                          ("num_sites", "num_domains"), ("num_domains", "num_site_categories"),
                          ("num_advertisers", "num_ad_categories"),
                          ("num_campaigns", "num_advertisers"), ("num_initial_ads", "num_campaigns")):
        if getattr(out, child) < getattr(out, parent):
            raise ValueError(
                f"{k(child)}={getattr(out, child)} is below {k(parent)}={getattr(out, parent)}: "
                f"each of the latter needs at least one of the former. Fix: raise {k(child)} or "
                f"lower {k(parent)}."
            )
    return out


def config_hash(cfg: Any) -> str:
    """Short stable hash of the (normalized) simulator config and the generator version."""
    cfg = normalize_clicklog_config(cfg)
    blob = json.dumps(
        {"generator": "clicklog", "generator_version": GENERATOR_VERSION, "config": dataclasses.asdict(cfg)},
        sort_keys=True,
    )
    return hashlib.sha256(blob.encode()).hexdigest()[:12]


def split_rows(cfg: ClicklogConfig) -> Dict[str, int]:
    last = cfg.rows_per_day
    return {"train": cfg.rows_per_day * (cfg.num_days - 1), "val": last // 2, "test": last - last // 2}


# -- generation ---------------------------------------------------------------------------------


def generate_dataset(cfg: Any, out_dir: Union[str, Path]) -> Dict[str, Any]:
    """Simulate the log of ``cfg`` into ``out_dir`` (must exist) and write meta.json last.

    Returns the meta dict. Not atomic by itself: ``datasets.ensure_dataset`` (data.source=
    clicklog) caches it atomically.
    """
    cfg = normalize_clicklog_config(cfg)
    out_dir = Path(out_dir)
    t0 = time.perf_counter()
    world = World(cfg)
    teacher = ClicklogTeacher(world)
    counters = ActivityCounters(world)
    logger.info("clicklog: world and teacher ready in %.1fs (tables %s, teacher %s)",
                time.perf_counter() - t0, dict(zip(FEATURES, world.cardinalities)), teacher.describe())
    per_hour = hour_rows(cfg.rows_per_day)
    rows = split_rows(cfg)
    writer = SplitWriter(out_dir, rows, world.cardinalities)

    def hour_chunks(hour: int) -> Iterator[Tuple[int, int]]:
        """(chunk number, rows) of an hour: bounded chunks, the same split every day."""
        for sub, start in enumerate(range(0, int(per_hour[hour]), CHUNK_ROWS)):
            yield sub, min(CHUNK_ROWS, int(per_hour[hour]) - start)

    # Warm-up: one day drawn from day 0's state, only counted (undecayed, then scaled).
    state = world.day_state(0)
    for hour in range(24):
        for sub, m in hour_chunks(hour):
            rng = np.random.default_rng([cfg.seed, STREAM_WARMUP, hour, sub])
            idx = world.sample(state, np.full(m, hour), rng)
            p = teacher.probability(idx, state.ad_age_days[idx[:, COL["ad_id"]]])
            counters.observe(idx, rng.random(m) < p)
        counters.end_hour(hour - WARMUP_HOURS, decay=False)
    counters.finish_warmup(WARMUP_HOURS)

    row = 0
    for day in range(cfg.num_days):
        state = world.day_state(day)
        counters.start_day()
        for hour in range(24):
            t = day * 24 + hour
            for sub, m in hour_chunks(hour):
                rng = np.random.default_rng([cfg.seed, STREAM_ROWS, day, hour, sub])
                idx = world.sample(state, np.full(m, hour), rng)
                age = state.ad_age_days[idx[:, COL["ad_id"]]]
                p = teacher.probability(idx, age)
                labels = (rng.random(m) < p).astype(np.int32)
                noise = np.random.default_rng([cfg.seed, STREAM_DENSE, day, hour, sub])
                dense = counters.dense(idx, age, day, t, noise)
                writer.write(row, dense, world.table_ids(idx), labels, p)
                counters.observe(idx, labels)
                row += m
            counters.end_hour(t)
        logger.info("clicklog: day %d done (%d rows, %.1fs)", day, row, time.perf_counter() - t0)
    assert row == sum(rows.values()), (row, rows)
    writer.finish()

    teacher_auc = auc(torch.from_numpy(np.concatenate(writer.val_p)),
                      torch.from_numpy(np.concatenate(writer.val_y)))
    ctr = {split: writer.positives[split] / rows[split] for split in SPLITS}
    seconds = time.perf_counter() - t0
    meta = {
        "format_version": FORMAT_VERSION,
        "num_dense": len(DENSE_FEATURE_NAMES),
        "num_sparse": len(FEATURES),
        "sparse_feature_names": FEATURES,
        "dense_feature_names": DENSE_FEATURE_NAMES,
        "num_embeddings_per_feature": world.cardinalities,
        "rows": rows,
        "ctr": ctr,
        "teacher_auc": None if math.isnan(teacher_auc) else teacher_auc,  # nan: one class only
        "teacher_auc_rows": writer.val_kept,
        "generator": {
            "name": "clicklog",
            "version": GENERATOR_VERSION,
            "hash": config_hash(cfg),
            "config": dataclasses.asdict(cfg),
            "days": {"train": list(range(cfg.num_days - 1)), "val": cfg.num_days - 1,
                     "test": cfg.num_days - 1},  # fmt: skip
            "rows_per_hour": [int(n) for n in per_hour],
            "teacher": teacher.describe(),
            # Over the train split: the share of lookups taken by the top 1% of all tables' rows.
            "train_top_1pct_rows_lookup_share": top_rows_lookup_share(writer.train_lookups),
        },
    }
    (out_dir / META_FILE).write_text(json.dumps(meta, indent=2) + "\n")
    logger.info(
        "clicklog: %d rows in %.1fs (%.0f rows/s) into %s; ctr %s, teacher_auc %.4f on val",
        row, seconds, row / seconds, out_dir, {k: round(v, 4) for k, v in ctr.items()}, teacher_auc,
    )
    return meta
