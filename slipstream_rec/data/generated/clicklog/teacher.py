"""The hidden teacher of the click-log simulator: P(click | impression).

    logit = bias + entity_scale      * E   (entity effects: user, segment, ad, campaign, advertiser,
                                             category, site, domain, placement, ...)
                 + interaction_scale * I   (<user, ad> + <ad, site>: low-rank latent affinities)
                 + context_scale     * X   (slot position bias, hour, weekday, connection type)
                 + dense_scale       * D   (users' activity level, the ad's age)

Each of E, I, X, D is divided by its standard deviation over a calibration sample of
impressions (all days, hours by traffic), so the ``teacher_*_scale`` settings are the terms'
standard deviations over impressions, and the bias is then fitted by bisection so that the mean
click probability is ``base_ctr`` (the pattern of data/generated/synthetic.py's Teacher).

Latent vectors are hierarchical: a user's is their segment's plus their own, an ad's is its
category's and advertiser's plus its own, a site's its category's plus its own; so the coarse
features carry part of the signal of the fine ones, as in real logs.
"""

from __future__ import annotations

import math
from typing import Dict

import numpy as np

from slipstream_rec.data.generated.clicklog.sampling import draw
from slipstream_rec.data.generated.clicklog.world import (
    AD_BLOCK,
    COL,
    FEATURES,
    HOURLY_TRAFFIC,
    NUM_CONNECTIONS,
    NUM_SLOTS,
    SITE_BLOCK,
    USER_BLOCK,
    World,
)
from slipstream_rec.data.generated.labels import fit_bias, sigmoid

# Relative standard deviation of each feature's per-id effect in E (assumed; the finest ids and
# the entities' owners matter most; the whole term is rescaled to teacher_entity_scale).
FIRST_ORDER: Dict[str, float] = {
    "user_id": 0.5, "user_segment": 0.35, "age_bucket": 0.15, "device_type": 0.15,
    "geo_region": 0.1, "ad_id": 0.5, "campaign": 0.35, "advertiser": 0.35, "ad_category": 0.3,
    "ad_format": 0.2, "site_id": 0.45, "domain": 0.2, "site_category": 0.25, "placement": 0.3,
    "app_or_web": 0.15,
}  # fmt: skip
# Rows of the calibration sample (spread evenly over the days; at most the log's rows).
CALIBRATION_ROWS = 210_000
STREAM_TEACHER, STREAM_CALIB = 21, 22


class ClicklogTeacher:
    """The click model of a World; deterministic by config (streams STREAM_TEACHER / _CALIB)."""

    def __init__(self, world: World) -> None:
        self.world = w = world
        c = w.cfg
        rng = np.random.default_rng([c.seed, STREAM_TEACHER])
        card = w.cardinalities
        effects = {f: rng.standard_normal(card[COL[f]]) * s for f, s in FIRST_ORDER.items()}
        # Summed per entity (every user feature is an attribute of the user, ...): one gather
        # per entity per impression instead of one per feature.
        self.entity_effects = []
        for entity, attrs, block in (("user_id", w.user_attrs, USER_BLOCK), ("ad_id", w.ad_attrs, AD_BLOCK),
                                     ("site_id", w.site_attrs, SITE_BLOCK)):
            total = np.zeros(len(attrs))
            for j, f in enumerate(FEATURES[block]):
                if f in effects and f != "placement":
                    total += effects.pop(f)[attrs[:, j]]
            self.entity_effects.append((COL[entity], total.astype(np.float32)))
        self.entity_effects += [(COL[f], e.astype(np.float32)) for f, e in effects.items()]
        r = self.rank = c.teacher_rank
        if r > 0:
            def latent(n: int) -> np.ndarray:
                return rng.standard_normal((n, r))

            seg, cat, adv, cat2, site_cat = (latent(c.num_user_segments), latent(c.num_ad_categories),
                                             latent(c.num_advertisers), latent(c.num_ad_categories),
                                             latent(c.num_site_categories))  # fmt: skip
            f32 = lambda a: a.astype(np.float32)  # noqa: E731
            self.user_vec = f32((seg[w.user_segment] + latent(c.num_users)) / math.sqrt(2))
            ad_own = latent(w.num_ads)
            self.ad_user_vec = f32((cat[w.ad_category] + adv[w.ad_advertiser] + ad_own) / math.sqrt(3))
            self.ad_site_vec = f32((cat2[w.ad_category] + latent(w.num_ads)) / math.sqrt(2))
            self.site_vec = f32((site_cat[w.site_category] + latent(c.num_sites)) / math.sqrt(2))
        # Position bias: the chance an ad is looked at falls with its slot (Craswell et al. 2008).
        self.slot_effect = -np.log1p(np.arange(NUM_SLOTS))
        # Hour, weekday and connection effects are small next to the position bias (assumed).
        hour = 0.5 * rng.standard_normal(24)
        self.hour_effect = (np.roll(hour, 1) + hour + np.roll(hour, -1)) / 3.0  # smooth over the day
        self.weekday_effect = 0.1 * rng.standard_normal(7)
        self.connection_effect = 0.3 * rng.standard_normal(NUM_CONNECTIONS)
        self.log_activity = np.log(w.user_weight)

        # Calibration: standardize the four terms and the two dense drivers, then fit the bias.
        self.scales = np.ones(4)
        self.driver_mean, self.driver_std = np.zeros(2), np.ones(2)
        crng = np.random.default_rng([c.seed, STREAM_CALIB])
        parts, ages = [], []
        per_day = -(-min(CALIBRATION_ROWS, c.num_days * c.rows_per_day) // c.num_days)
        for day in range(c.num_days):
            state = w.day_state(day)
            hours = draw(HOURLY_TRAFFIC, crng.random(per_day))
            idx = w.sample(state, hours, crng)
            parts.append(idx)
            ages.append(state.ad_age_days[idx[:, COL["ad_id"]]])
        idx, age = np.concatenate(parts), np.concatenate(ages)
        drivers = self._drivers(idx, age)
        self.driver_mean = drivers.mean(axis=0)
        self.driver_std = np.where(drivers.std(axis=0) > 1e-9, drivers.std(axis=0), 1.0)
        terms = self.terms(idx, age)
        std = terms.std(axis=0)
        target = np.array([c.teacher_entity_scale, c.teacher_interaction_scale,
                           c.teacher_context_scale, c.teacher_dense_scale])
        self.scales = np.where(std > 1e-9, target / np.where(std > 1e-9, std, 1.0), 0.0)
        z = terms @ self.scales
        self.bias = fit_bias(z, c.base_ctr)
        self.logit_std = float(z.std())

    def _drivers(self, idx: np.ndarray, ad_age: np.ndarray) -> np.ndarray:
        """(n, 2): the user's activity level and the ad's age (both lower the click rate)."""
        return np.stack([self.log_activity[idx[:, COL["user_id"]]], np.log1p(ad_age)], axis=1)

    def terms(self, idx: np.ndarray, ad_age: np.ndarray) -> np.ndarray:
        """(n, 4) float64: E, I, X, D before scaling."""
        n = idx.shape[0]
        out = np.zeros((n, 4))
        entity = np.zeros(n)
        for col, effect in self.entity_effects:
            entity += effect[idx[:, col]]
        out[:, 0] = entity
        if self.rank > 0:
            user, ad, site = idx[:, COL["user_id"]], idx[:, COL["ad_id"]], idx[:, COL["site_id"]]
            out[:, 1] = np.einsum("ij,ij->i", self.user_vec[user], self.ad_user_vec[ad])
            out[:, 1] += np.einsum("ij,ij->i", self.site_vec[site], self.ad_site_vec[ad])
        out[:, 2] = (self.slot_effect[idx[:, COL["slot_position"]]]
                     + self.hour_effect[idx[:, COL["hour"]]]
                     + self.weekday_effect[idx[:, COL["weekday"]]]
                     + self.connection_effect[idx[:, COL["connection_type"]]])
        z = (self._drivers(idx, ad_age) - self.driver_mean) / self.driver_std
        out[:, 3] = -z.sum(axis=1)
        return out

    def probability(self, idx: np.ndarray, ad_age: np.ndarray) -> np.ndarray:
        """P(click) per impression, float64 (n,)."""
        return sigmoid(self.bias + self.terms(idx, ad_age) @ self.scales)

    def describe(self) -> Dict[str, float]:
        names = ("entity", "interaction", "context", "dense")
        out: Dict[str, float] = {"bias": self.bias, "logit_std": self.logit_std}
        out.update({f"{k}_factor": float(s) for k, s in zip(names, self.scales)})
        return out

