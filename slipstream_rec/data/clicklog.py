"""``data.source=clicklog``: an entity-structured display-ad click log, simulated day by day.

Rows are impressions (user, ad, site, context) in time order: day 0..D-1, hour by hour within a
day (the hour's share of the day follows a diurnal cycle). The 26 categorical features are the
entities' attributes (slipstream_rec/data/clicklog_world.py), the labels are clicks drawn from a
hidden teacher (clicklog_teacher.py), and the 13 dense features are what a logging pipeline
would know about the entities from the hours before the row's hour:

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
val and its second half test. Written in TorchRec's npy layout + meta.json (format_version 1),
cached under ``{root}/{name}-{config hash}`` by ``synthetic.ensure_dataset``.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import logging
import math
import time
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional, Tuple, Union

import numpy as np
import torch

from slipstream_rec.data.clicklog_teacher import ClicklogTeacher
from slipstream_rec.data.clicklog_world import COL, FEATURES, World, hour_rows
from slipstream_rec.data.config import ClicklogConfig
from slipstream_rec.data.loader import FORMAT_VERSION, META_FILE, SPLITS, split_file
from slipstream_rec.data.npy_writer import NpyAppender
from slipstream_rec.data.synthetic import _coerce, _num
from slipstream_rec.training.metrics import auc

logger = logging.getLogger("slipstream_rec.data")

# Bump when the generated data changes for the same config: it is part of the cache hash.
GENERATOR_VERSION = 1
# At most this many rows are drawn at once (an hour is split into chunks above it): bounds memory.
# Each chunk has its own random stream, so changing this changes the data (bump the version).
CHUNK_ROWS = 131_072
# teacher_auc is measured on at most this many validation rows (bounded memory).
MAX_AUC_ROWS = 4_000_000
DENSE_FEATURE_NAMES: List[str] = [
    "user_impressions", "user_clicks", "user_impressions_today", "hours_since_user_impression",
    "ad_impressions", "ad_clicks", "ad_age_days", "campaign_impressions", "site_impressions",
    "site_clicks", "slot_position", "ad_bid_cents", "user_tenure_days",
]  # fmt: skip
# The dense features that are counts, observed with measurement noise.
NOISY_DENSE = np.array([0, 1, 2, 4, 5, 7, 8, 9])
# Hours of the simulated warm-up before day 0.
WARMUP_HOURS = 24
NEVER = np.iinfo(np.int64).min // 2  # "hour of the user's last impression" before any
STREAM_ROWS, STREAM_WARMUP, STREAM_DENSE = 31, 32, 33


# -- config -------------------------------------------------------------------------------------


def normalize_clicklog_config(cfg: Any, key: str = "data.clicklog") -> ClicklogConfig:
    """Validate a ClicklogConfig (dataclass, DictConfig or mapping) and return a clean copy.

    Raises ValueError naming the offending key (``data.clicklog.<field>``) and the fix.
    """
    c = _coerce(cfg, ClicklogConfig, key)
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
        values[name] = _num(getattr(c, name), k(name), int, lo=lo, fix=fix)
    for name, (lo, lo_open, hi, fix) in floats.items():
        values[name] = _num(getattr(c, name), k(name), float, lo=lo, lo_open=lo_open, hi=hi, fix=fix)
    values["base_ctr"] = _num(c.base_ctr, k("base_ctr"), float, lo=0, lo_open=True, hi=1, hi_open=True,
                              fix="Fix: a click-through rate strictly between 0 and 1, e.g. 0.25.")
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


# -- the dense features -------------------------------------------------------------------------


class ActivityCounters:
    """Decayed impression / click counts per entity as of the end of the previous hour."""

    def __init__(self, world: World) -> None:
        c = world.cfg
        self.world = world
        self.decay = 0.5 ** (1.0 / c.counter_half_life_hours)
        sizes = {"user": c.num_users, "ad": world.num_ads, "campaign": c.num_campaigns, "site": c.num_sites}
        self.column = {"user": COL["user_id"], "ad": COL["ad_id"], "campaign": COL["campaign"],
                       "site": COL["site_id"]}  # fmt: skip
        self.imps = {e: np.zeros(n) for e, n in sizes.items()}
        self.clicks = {e: np.zeros(sizes[e]) for e in ("user", "ad", "site")}
        self._new_imps = {e: np.zeros(n) for e, n in sizes.items()}
        self._new_clicks = {e: np.zeros(sizes[e]) for e in self.clicks}
        self.user_today = np.zeros(c.num_users)
        self.user_last_hour = np.full(c.num_users, NEVER, dtype=np.int64)

    def observe(self, idx: np.ndarray, labels: np.ndarray) -> None:
        """Count a chunk of the current hour (visible from the next hour on)."""
        weights = labels.astype(np.float64)
        for e, arr in self._new_imps.items():
            arr += np.bincount(idx[:, self.column[e]], minlength=len(arr))
        for e, arr in self._new_clicks.items():
            arr += np.bincount(idx[:, self.column[e]], weights=weights, minlength=len(arr))

    def end_hour(self, hour_index: int, *, decay: bool = True) -> None:
        seen = self._new_imps["user"] > 0
        self.user_last_hour[seen] = hour_index
        self.user_today += self._new_imps["user"]
        for total, new in ((self.imps, self._new_imps), (self.clicks, self._new_clicks)):
            for e in total:
                if decay:
                    total[e] *= self.decay
                total[e] += new[e]
                new[e][:] = 0.0

    def finish_warmup(self, hours: int) -> None:
        """Undecayed counts of ``hours`` warm-up hours -> the steady level rate / (1 - decay)."""
        factor = 1.0 / (hours * (1.0 - self.decay))
        for total in (self.imps, self.clicks):
            for arr in total.values():
                arr *= factor
        self.start_day()

    def start_day(self) -> None:
        self.user_today[:] = 0.0

    def dense(self, idx: np.ndarray, ad_age: np.ndarray, day: int, hour_index: int,
              rng: np.random.Generator) -> np.ndarray:
        """(n, 13) float32 log(max(x, 0) + 1) of DENSE_FEATURE_NAMES."""
        w = self.world
        user, ad = idx[:, COL["user_id"]], idx[:, COL["ad_id"]]
        site, campaign = idx[:, COL["site_id"]], idx[:, COL["campaign"]]
        x = np.empty((len(idx), len(DENSE_FEATURE_NAMES)))
        x[:, 0] = self.imps["user"][user]
        x[:, 1] = self.clicks["user"][user]
        x[:, 2] = self.user_today[user]
        last = self.user_last_hour[user]
        x[:, 3] = np.where(last == NEVER, 0, hour_index - last)
        x[:, 4] = self.imps["ad"][ad]
        x[:, 5] = self.clicks["ad"][ad]
        x[:, 6] = ad_age
        x[:, 7] = self.imps["campaign"][campaign]
        x[:, 8] = self.imps["site"][site]
        x[:, 9] = self.clicks["site"][site]
        x[:, 10] = idx[:, COL["slot_position"]]
        x[:, 11] = w.ad_bid[ad]
        tenure = w.user_tenure[user]
        x[:, 12] = np.where(tenure > 0, tenure + day, 0.0)
        noise = w.cfg.dense_noise
        if noise > 0:
            x[:, NOISY_DENSE] *= np.exp(noise * rng.standard_normal((len(idx), len(NOISY_DENSE))))
        np.maximum(x, 0.0, out=x)
        return np.log1p(x).astype(np.float32)


# -- writing ------------------------------------------------------------------------------------


class _SplitWriter:
    """Appends rows in global (time) order to the splits' .npy files; keeps the statistics."""

    KINDS = (("dense", np.float32, (len(DENSE_FEATURE_NAMES),)), ("sparse", np.int32, (len(FEATURES),)),
             ("labels", np.int32, (1,)))

    def __init__(self, out_dir: Path, rows: Dict[str, int], cardinalities: List[int]) -> None:
        self.out_dir = out_dir
        self.bounds = []
        start = 0
        for split in SPLITS:
            self.bounds.append((split, start, start + rows[split]))
            start += rows[split]
        self.files = {
            split: {kind: NpyAppender(out_dir / f".{split}_{kind}.npy.part", dtype, shape)
                    for kind, dtype, shape in self.KINDS}
            for split in SPLITS
        }
        self.positives = {split: 0 for split in SPLITS}
        # Train lookups per row of all tables, the tables' rows back to back.
        self.table_offsets = np.concatenate([[0], np.cumsum(cardinalities)[:-1]]).astype(np.int64)
        self.train_lookups = np.zeros(int(sum(cardinalities)), dtype=np.int64)
        self.val_p: List[np.ndarray] = []
        self.val_y: List[np.ndarray] = []
        self.val_kept = 0

    def write(self, first_row: int, dense: np.ndarray, sparse: np.ndarray, labels: np.ndarray,
              p: np.ndarray) -> None:
        end = first_row + len(labels)
        for split, s0, s1 in self.bounds:
            a, b = max(first_row, s0), min(end, s1)
            if a >= b:
                continue
            src = slice(a - first_row, b - first_row)
            files = self.files[split]
            files["dense"].append(dense[src])
            files["sparse"].append(sparse[src])
            files["labels"].append(labels[src, None])
            self.positives[split] += int(labels[src].sum())
            if split == "train":
                self.train_lookups += np.bincount((sparse[src] + self.table_offsets).ravel(),
                                                  minlength=len(self.train_lookups))
            elif split == "val" and self.val_kept < MAX_AUC_ROWS:
                take = min(b - a, MAX_AUC_ROWS - self.val_kept)
                self.val_p.append(p[src][:take])
                self.val_y.append(labels[src][:take])
                self.val_kept += take

    def finish(self) -> None:
        for split, kinds in self.files.items():
            for kind, appender in kinds.items():
                appender.finish(split_file(self.out_dir, split, kind))


def top_rows_lookup_share(lookups: np.ndarray, fraction: float = 0.01) -> float:
    """Share of all lookups that go to the most looked-up ``fraction`` of the rows counted."""
    counts = np.sort(lookups)[::-1]
    top = max(1, int(math.ceil(fraction * len(counts))))
    total = counts.sum()
    return float(counts[:top].sum() / total) if total else 0.0


# -- generation ---------------------------------------------------------------------------------


def generate_dataset(cfg: Any, out_dir: Union[str, Path]) -> Dict[str, Any]:
    """Simulate the log of ``cfg`` into ``out_dir`` (must exist) and write meta.json last.

    Returns the meta dict. Not atomic by itself: ``synthetic.ensure_dataset`` (data.source=
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
    writer = _SplitWriter(out_dir, rows, world.cardinalities)

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


def main(argv: Optional[List[str]] = None) -> None:
    """``python -m slipstream_rec.data.clicklog [--out DIR] [OVERRIDES]``: simulate a click log.

    Without --out: the cached ``data=clicklog`` dataset (with ``data.clicklog.*`` overrides);
    with --out: a fresh directory. Prints the path, rows, generation rows/s and the statistics.
    """
    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("--out", help="generate into this new directory instead of the cache")
    parser.add_argument("overrides", nargs="*", help="e.g. data.clicklog.rows_per_day=100000")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s", force=True)
    from slipstream_rec.config import load_config
    from slipstream_rec.data.synthetic import ensure_dataset

    data = load_config(["data=clicklog", *args.overrides]).data
    wall, cpu = time.perf_counter(), time.process_time()
    if args.out:
        path = Path(args.out)
        path.mkdir(parents=True)
        generate_dataset(data.clicklog, path)
    else:
        path = ensure_dataset(data)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    meta = json.loads((path / META_FILE).read_text())
    rows = sum(meta["rows"].values())
    print(json.dumps({
        "path": str(path), "rows": meta["rows"], "seconds": round(wall, 2), "cpu_seconds": round(cpu, 2),
        "rows_per_second": round(rows / wall), "ctr": meta["ctr"], "teacher_auc": meta["teacher_auc"],
        "train_top_1pct_rows_lookup_share": meta["generator"]["train_top_1pct_rows_lookup_share"],
        "tables": dict(zip(meta["sparse_feature_names"], meta["num_embeddings_per_feature"])),
    }))


if __name__ == "__main__":
    main()
