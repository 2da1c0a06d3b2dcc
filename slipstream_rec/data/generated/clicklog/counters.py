"""The click log's 13 dense features: what a logging pipeline knows about a row's entities from
the hours before the row's hour (decayed impression and click counts, recency, ad age, ...).

Counts carry lognormal measurement noise (``dense_noise``); everything is stored as
log(max(x, 0) + 1) float32. See generate.py for the list and how the counters warm up.
"""

from __future__ import annotations

from typing import List

import numpy as np

from slipstream_rec.data.generated.clicklog.world import COL, World

__all__ = ["DENSE_FEATURE_NAMES", "ActivityCounters"]

DENSE_FEATURE_NAMES: List[str] = [
    "user_impressions", "user_clicks", "user_impressions_today", "hours_since_user_impression",
    "ad_impressions", "ad_clicks", "ad_age_days", "campaign_impressions", "site_impressions",
    "site_clicks", "slot_position", "ad_bid_cents", "user_tenure_days",
]  # fmt: skip
# The dense features that are counts, observed with measurement noise.
NOISY_DENSE = np.array([0, 1, 2, 4, 5, 7, 8, 9])
NEVER = np.iinfo(np.int64).min // 2  # "hour of the user's last impression" before any


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
