"""The world of the click-log simulator: entities, their attributes and popularity, day by day.

An impression is (user, ad, site, context). Each of the 26 categorical features is an attribute
of one of those at some granularity (``FEATURES``); attributes are fixed per entity, so the
hierarchies are consistent (an ad always has the same creative, campaign, advertiser, category;
a user the same segment, city, region; a site the same domain and category).

How one impression is drawn (``World.sample``), all by vectorized inverse-CDF sampling:

1. the user, by activity (Zipf over users, times a per-day lognormal jitter);
2. the site: with probability ``preferred_site_share`` one of the user's few preferred sites
   (chosen once per user, half by the user's segment's favourite site categories, half by site
   popularity), else any site by popularity (Zipf, per-day jitter); a placement of that site;
3. the ad, by one of three routes: retargeting (an ad of one of the few advertisers the user
   has visited), a direct deal of the site (an ad of one of its few deal campaigns), or
   targeting: an ad category by the site's category (contextual) or the user's segment
   (behavioural), weighted by the category's live ad volume that day, then an ad of that
   category. Within the route, ads are drawn by popularity among the ads live that day. Ads
   enter (some at the head: a new ad's popularity comes from the same heavy tail) and retire
   over the days: popularity drifts;
4. context: the hour (given), weekday, slot position (geometric), connection type (given the
   device), ISP (given the region).

So (user, site), (user, advertiser), (ad, site) and whole tuples recur (tests/data/generated/
test_clicklog.py measures it against independent pairing), and hot entities make hot rows in every
table they touch. ``GroupedSampler`` (sampling.py) is the one primitive: "a member of group g, by
weight".
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import List

import numpy as np

from slipstream_rec.data.config import ClicklogConfig
from slipstream_rec.data.generated.clicklog.sampling import (
    GroupedSampler,
    apportion,
    assign_all,
    draw,
    ranked_weights,
    single,
    zipf_weights,
)

# The 26 categorical features, in column order, by entity.
USER_FEATURES = ["user_id", "user_segment", "geo_region", "city", "device_type", "os", "browser",
                 "age_bucket", "language"]  # fmt: skip
AD_FEATURES = ["ad_id", "creative", "campaign", "advertiser", "ad_category", "ad_format", "ad_size"]
SITE_FEATURES = ["site_id", "domain", "site_category", "placement", "app_or_web"]
CONTEXT_FEATURES = ["hour", "weekday", "slot_position", "connection_type", "isp"]
FEATURES: List[str] = USER_FEATURES + AD_FEATURES + SITE_FEATURES + CONTEXT_FEATURES
COL = {name: i for i, name in enumerate(FEATURES)}
USER_BLOCK = slice(0, len(USER_FEATURES))
AD_BLOCK = slice(USER_BLOCK.stop, USER_BLOCK.stop + len(AD_FEATURES))
SITE_BLOCK = slice(AD_BLOCK.stop, AD_BLOCK.stop + len(SITE_FEATURES))
CONTEXT_BLOCK = slice(SITE_BLOCK.stop, len(FEATURES))
assert len(FEATURES) == 26

# Small vocabularies (fixed; shares assumed, shaped like public ad-log summaries: mobile is the
# majority of display traffic, banners the most common format, a few values dominate each).
# Device types: desktop, phone, tablet, connected TV, console, other.
DEVICE_SHARES = np.array([0.36, 0.50, 0.09, 0.03, 0.01, 0.01])
# Operating systems per device type (os -> device is fixed) and browsers per os (browser ->
# os fixed; a browser row is a browser family on one os, as user-agent parsers report them).
OS_PER_DEVICE = [4, 3, 3, 2, 1, 1]
BROWSERS_PER_OS = [4, 3, 2, 1, 4, 3, 1, 2, 1, 1, 1, 1, 1, 1]
AGE_SHARES = np.array([0.08, 0.16, 0.22, 0.20, 0.15, 0.10, 0.06, 0.03])  # 8 age buckets
NUM_LANGUAGES = 40
# Share of a region's users speaking the region's main language (the rest: any language).
MAIN_LANGUAGE_SHARE = 0.9
# Ad formats (banner, native, video, interstitial, rich media, audio) and sizes per format.
FORMAT_SHARES = np.array([0.45, 0.25, 0.12, 0.10, 0.05, 0.03])
SIZES_PER_FORMAT = [5, 3, 3, 3, 2, 2]
# Slot position k (0 = top) has share ~ 0.6^k over 10 positions: most impressions are in the
# first slots.
NUM_SLOTS = 10
SLOT_SHARES = 0.6 ** np.arange(NUM_SLOTS)
# Connection types (wifi, ethernet, 4g, 5g, 3g, unknown) per device type (rows: DEVICE_SHARES).
CONNECTION_SHARES = np.array([
    [0.55, 0.40, 0.00, 0.00, 0.00, 0.05],  # desktop
    [0.45, 0.00, 0.35, 0.12, 0.05, 0.03],  # phone
    [0.80, 0.00, 0.12, 0.03, 0.02, 0.03],  # tablet
    [0.70, 0.28, 0.00, 0.00, 0.00, 0.02],  # connected TV
    [0.60, 0.38, 0.00, 0.00, 0.00, 0.02],  # console
    [0.40, 0.10, 0.20, 0.05, 0.05, 0.20],  # other
])  # fmt: skip
NUM_CONNECTIONS = CONNECTION_SHARES.shape[1]
# Share of domains that are apps (the rest web sites): Avazu-style logs mix both. Assumed.
APP_SHARE = 0.5
# Relative traffic per hour of day: the diurnal cycle of web traffic, trough before dawn and
# peak in the evening, peak/trough about 5. Assumed shape.
HOURLY_TRAFFIC = np.array([
    0.55, 0.40, 0.30, 0.24, 0.22, 0.25, 0.35, 0.55, 0.75, 0.85, 0.90, 0.95,
    1.00, 0.98, 0.95, 0.95, 0.98, 1.02, 1.08, 1.15, 1.18, 1.10, 0.95, 0.75,
])  # fmt: skip
# At most this many preferred sites / visited advertisers per user, direct deals per site.
MAX_LIST = 16
# Share of a user's preferred sites chosen by the segment's favourite site categories (the
# others by overall site popularity).
SEGMENT_SITE_SHARE = 0.5
# Dirichlet concentration of the targeting and interest preferences (< 1: each segment / site
# category favours a few categories).
PREFERENCE_CONCENTRATION = 0.2
# Floor added to every targeting preference (relative to the mean preference 1 / categories), so
# that every live category can be shown anywhere.
TARGETING_FLOOR = 0.05
# Zipf exponent of the sizes of the groupings (regions' populations and city counts, segments,
# domains' site counts, advertisers' campaign counts, categories): Zipf's law for city sizes
# (Gabaix, QJE 1999) and firm sizes (Axtell, Science 2001), used for every grouping.
GROUP_ZIPF = 1.0
# Users that are logged in (they have an account age, dense feature user_tenure_days); the
# others are anonymous (the feature is missing, 0). Assumed.
LOGGED_IN_SHARE = 0.7

# Random streams: np.random.default_rng([seed, stream, ...]).
STREAM_WORLD, STREAM_DAY, STREAM_PERM = 11, 12, 13


def hour_rows(rows_per_day: int) -> np.ndarray:
    """Rows of each hour of a day: rows_per_day split by HOURLY_TRAFFIC (largest remainders)."""
    share = HOURLY_TRAFFIC / HOURLY_TRAFFIC.sum() * rows_per_day
    out = np.floor(share).astype(np.int64)
    out[np.argsort(-(share - out), kind="stable")[: rows_per_day - int(out.sum())]] += 1
    return out


@dataclass
class DayState:
    """What changes from day to day: who is active, which ads are live, and the samplers."""

    day: int
    users: GroupedSampler
    sites: GroupedSampler
    targeting: GroupedSampler  # group: site category, or num_site_categories + segment
    ads: GroupedSampler  # group: ad category
    ads_of_advertiser: GroupedSampler  # group: advertiser
    ads_of_campaign: GroupedSampler  # group: campaign
    ad_age_days: np.ndarray  # per ad, float (days the ad has run before this day)
    ad_live: np.ndarray  # per ad, bool


class World:
    """Every entity and its fixed attributes; deterministic by config (stream STREAM_WORLD)."""

    def __init__(self, cfg: ClicklogConfig) -> None:
        self.cfg = c = cfg
        rng = np.random.default_rng([c.seed, STREAM_WORLD])

        # Geography: regions with Zipf populations; cities and ISPs apportioned to regions.
        self.region_weight = zipf_weights(c.num_regions, GROUP_ZIPF, rng)
        cities = apportion(c.num_cities, self.region_weight)
        self.city_region = np.repeat(np.arange(c.num_regions), cities)
        city_in_region = GroupedSampler(self.city_region, c.num_regions).set_weights(
            ranked_weights(cities, GROUP_ZIPF))
        isps = apportion(c.num_isps, self.region_weight)
        self.isp_region = np.repeat(np.arange(c.num_regions), isps)
        self.isp_in_region = GroupedSampler(self.isp_region, c.num_regions).set_weights(
            ranked_weights(isps, GROUP_ZIPF))
        language_weight = zipf_weights(NUM_LANGUAGES, GROUP_ZIPF, rng)
        region_language = draw(language_weight, rng.random(c.num_regions))

        # Users: activity (Zipf), segment, where they are, what they use.
        U = c.num_users
        self.user_weight = zipf_weights(U, c.user_zipf_exponent, rng)
        self.user_segment = draw(zipf_weights(c.num_user_segments, GROUP_ZIPF, rng), rng.random(U))
        self.user_region = draw(self.region_weight, rng.random(U))
        self.user_city = city_in_region.sample(self.user_region, rng.random(U))
        self.user_device = draw(DEVICE_SHARES, rng.random(U))
        os_per_device = np.array(OS_PER_DEVICE)
        self.os_device = np.repeat(np.arange(len(OS_PER_DEVICE)), os_per_device)
        self.user_os = GroupedSampler(self.os_device, len(OS_PER_DEVICE)).set_weights(
            ranked_weights(os_per_device, GROUP_ZIPF)).sample(self.user_device, rng.random(U))
        browsers_per_os = np.array(BROWSERS_PER_OS)
        self.browser_os = np.repeat(np.arange(len(BROWSERS_PER_OS)), browsers_per_os)
        self.user_browser = GroupedSampler(self.browser_os, len(BROWSERS_PER_OS)).set_weights(
            ranked_weights(browsers_per_os, GROUP_ZIPF)).sample(self.user_os, rng.random(U))
        self.user_age = draw(AGE_SHARES, rng.random(U))
        self.user_language = np.where(rng.random(U) < MAIN_LANGUAGE_SHARE,
                                      region_language[self.user_region],
                                      draw(language_weight, rng.random(U)))
        # Account age in days at day 0 for logged-in users (lognormal, median ~ 1 year), else 0.
        self.user_tenure = np.where(rng.random(U) < LOGGED_IN_SHARE,
                                    np.exp(np.log(365.0) + rng.standard_normal(U)), 0.0)
        self.connection = GroupedSampler(
            np.repeat(np.arange(len(DEVICE_SHARES)), NUM_CONNECTIONS), len(DEVICE_SHARES)
        ).set_weights(CONNECTION_SHARES.ravel())

        # Sites: domain -> category and app/web; site -> domain; placements per site.
        self.domain_category = assign_all(c.num_domains, c.num_site_categories,
                                          zipf_weights(c.num_site_categories, GROUP_ZIPF, rng), rng)
        self.domain_app = (rng.random(c.num_domains) < APP_SHARE).astype(np.int64)
        self.site_domain = assign_all(c.num_sites, c.num_domains,
                                      zipf_weights(c.num_domains, GROUP_ZIPF, rng), rng)
        self.site_category = self.domain_category[self.site_domain]
        self.site_app = self.domain_app[self.site_domain]
        self.site_weight = zipf_weights(c.num_sites, c.site_zipf_exponent, rng)
        self.site_placements = 1 + np.minimum(rng.poisson(c.placements_per_site - 1, c.num_sites), 7)
        self.placement_offset = np.cumsum(self.site_placements) - self.site_placements
        self.num_placements = int(self.site_placements.sum())

        # Each user's preferred sites: half from the segment's favourite site categories, half
        # by overall popularity (both weighted by site popularity within the choice).
        segment_interest = rng.dirichlet(np.full(c.num_site_categories, PREFERENCE_CONCENTRATION),
                                         c.num_user_segments)
        interest = GroupedSampler(np.repeat(np.arange(c.num_user_segments), c.num_site_categories),
                                  c.num_user_segments).set_weights(segment_interest.ravel())
        sites_in_category = GroupedSampler(self.site_category, c.num_site_categories).set_weights(
            self.site_weight)
        K = MAX_LIST
        seg = np.repeat(self.user_segment, K)
        cat = interest.sample(seg, rng.random(U * K)) % c.num_site_categories
        by_interest = sites_in_category.sample(cat, rng.random(U * K))
        by_popularity = single(self.site_weight).sample(None, rng.random(U * K))
        self.preferred_sites = np.where(rng.random(U * K) < SEGMENT_SITE_SHARE, by_interest,
                                        by_popularity).reshape(U, K)
        self.num_preferred = 1 + np.minimum(rng.poisson(c.preferred_sites_mean - 1, U), K - 1)

        # Advertisers -> category, campaigns -> advertiser, ads -> campaign.
        self.advertiser_category = assign_all(c.num_advertisers, c.num_ad_categories,
                                              zipf_weights(c.num_ad_categories, GROUP_ZIPF, rng), rng)
        self.campaign_advertiser = assign_all(c.num_campaigns, c.num_advertisers,
                                              zipf_weights(c.num_advertisers, GROUP_ZIPF, rng), rng)
        A = self.num_ads = c.num_initial_ads + c.new_ads_per_day * (c.num_days - 1)
        campaign_weight = zipf_weights(c.num_campaigns, GROUP_ZIPF, rng)
        initial = assign_all(c.num_initial_ads, c.num_campaigns, campaign_weight, rng)
        later = draw(campaign_weight, rng.random(A - c.num_initial_ads))
        self.ad_campaign = np.concatenate([initial, later])
        self.ad_advertiser = self.campaign_advertiser[self.ad_campaign]
        self.ad_category = self.advertiser_category[self.ad_advertiser]
        # Lifecycle: start day, days run before day 0 (initial ads: a live ad's age is geometric
        # like its remaining life), end day (exclusive; geometric lifetime, mean ad_lifetime_days).
        self.ad_start = np.concatenate([np.zeros(c.num_initial_ads, dtype=np.int64),
                                        np.repeat(np.arange(1, c.num_days), c.new_ads_per_day)])
        p_end = 1.0 / c.ad_lifetime_days
        self.ad_prior_age = np.where(self.ad_start == 0, rng.geometric(p_end, A) - 1, 0)
        self.ad_end = self.ad_start + rng.geometric(p_end, A)
        # Popularity: a rank among all ads ever, so a new ad is as likely to be a head ad as an
        # old one.
        self.ad_weight = zipf_weights(A, c.ad_zipf_exponent, rng)
        # Creatives: a pool per campaign (creatives_per_ad x its ads), each ad picks one.
        ads_per_campaign = np.bincount(self.ad_campaign, minlength=c.num_campaigns)
        pool = np.maximum(1, np.round(ads_per_campaign * c.creatives_per_ad)).astype(np.int64)
        self.num_creatives = int(pool.sum())
        self.ad_creative = (np.cumsum(pool) - pool)[self.ad_campaign] + np.minimum(
            (rng.random(A) * pool[self.ad_campaign]).astype(np.int64), pool[self.ad_campaign] - 1)
        self.ad_format = draw(FORMAT_SHARES, rng.random(A))
        sizes = np.array(SIZES_PER_FORMAT)
        self.ad_size = GroupedSampler(np.repeat(np.arange(len(sizes)), sizes), len(sizes)).set_weights(
            ranked_weights(sizes, GROUP_ZIPF)).sample(self.ad_format, rng.random(A))
        # Bid in cents, lognormal (median 50), higher for the ads that win more impressions.
        z = np.log(self.ad_weight)
        z = (z - z.mean()) / (z.std() or 1.0)
        self.ad_bid = np.exp(np.log(50.0) + 0.5 * z + 0.8 * rng.standard_normal(A))

        # Targeting: each site category and each segment favours a few ad categories.
        rows = c.num_site_categories + c.num_user_segments
        pref = rng.dirichlet(np.full(c.num_ad_categories, PREFERENCE_CONCENTRATION), rows)
        self.targeting_preference = pref + TARGETING_FLOOR / c.num_ad_categories
        self.targeting_rows = rows

        # Retargeting: the advertisers each user has visited (categories by the user's segment's
        # targeting preference, advertisers within a category by their ads' total popularity).
        advertiser_weight = np.bincount(self.ad_advertiser, self.ad_weight, c.num_advertisers)
        advertisers = GroupedSampler(self.advertiser_category, c.num_ad_categories).set_weights(
            advertiser_weight)
        category_of = GroupedSampler(np.repeat(np.arange(rows), c.num_ad_categories), rows
                                     ).set_weights(self.targeting_preference.ravel())
        seg = np.repeat(c.num_site_categories + self.user_segment, K)
        cat = category_of.sample(seg, rng.random(U * K)) % c.num_ad_categories
        self.user_advertisers = advertisers.sample(cat, rng.random(U * K)).reshape(U, K)
        self.num_user_advertisers = 1 + np.minimum(rng.poisson(c.advertisers_per_user_mean - 1, U), K - 1)
        # Direct deals: the campaigns each site sells part of its impressions to (categories by
        # the site category's targeting preference, campaigns by their ads' total popularity).
        campaign_weight = np.bincount(self.ad_campaign, self.ad_weight, c.num_campaigns)
        campaign_category = self.advertiser_category[self.campaign_advertiser]
        campaigns = GroupedSampler(campaign_category, c.num_ad_categories).set_weights(campaign_weight)
        cat = category_of.sample(np.repeat(self.site_category, K), rng.random(c.num_sites * K))
        self.site_deals = campaigns.sample(cat % c.num_ad_categories,
                                           rng.random(c.num_sites * K)).reshape(c.num_sites, K)
        self.num_site_deals = 1 + np.minimum(rng.poisson(c.deals_per_site_mean - 1, c.num_sites), K - 1)

        # Each entity's features as one row (internal indices), gathered at once per impression.
        i32 = lambda cols: np.stack(cols, axis=1).astype(np.int32)  # noqa: E731
        self.user_attrs = i32([np.arange(U), self.user_segment, self.user_region, self.user_city,
                               self.user_device, self.user_os, self.user_browser, self.user_age,
                               self.user_language])  # fmt: skip
        self.ad_attrs = i32([np.arange(A), self.ad_creative, self.ad_campaign, self.ad_advertiser,
                             self.ad_category, self.ad_format, self.ad_size])  # fmt: skip
        self.site_attrs = i32([np.arange(c.num_sites), self.site_domain, self.site_category,
                               self.placement_offset[np.arange(c.num_sites)], self.site_app])

        self.cardinalities = self._cardinalities()
        prng = np.random.default_rng([c.seed, STREAM_PERM])
        self.id_maps = [prng.permutation(n).astype(np.int32) if c.permute_ids else None
                        for n in self.cardinalities]
        # The same rows with written ids (for table_ids; placement is permuted per impression).
        self.user_ids = self._written(self.user_attrs, USER_BLOCK)
        self.ad_ids = self._written(self.ad_attrs, AD_BLOCK)
        self.site_ids = self._written(self.site_attrs, SITE_BLOCK)

    def _written(self, attrs: np.ndarray, block: slice) -> np.ndarray:
        out = attrs.copy()
        for j, f in enumerate(range(block.start, block.stop)):
            if self.id_maps[f] is not None and FEATURES[f] != "placement":
                out[:, j] = self.id_maps[f][attrs[:, j]]
        return out

    def _cardinalities(self) -> List[int]:
        c = self.cfg
        sizes = {
            "user_id": c.num_users, "user_segment": c.num_user_segments,
            "geo_region": c.num_regions, "city": c.num_cities, "device_type": len(DEVICE_SHARES),
            "os": len(self.os_device), "browser": len(self.browser_os),
            "age_bucket": len(AGE_SHARES), "language": NUM_LANGUAGES,
            "ad_id": self.num_ads, "creative": self.num_creatives, "campaign": c.num_campaigns,
            "advertiser": c.num_advertisers, "ad_category": c.num_ad_categories,
            "ad_format": len(FORMAT_SHARES), "ad_size": int(sum(SIZES_PER_FORMAT)),
            "site_id": c.num_sites, "domain": c.num_domains,
            "site_category": c.num_site_categories, "placement": self.num_placements,
            "app_or_web": 2, "hour": 24, "weekday": 7, "slot_position": NUM_SLOTS,
            "connection_type": NUM_CONNECTIONS, "isp": c.num_isps,
        }  # fmt: skip
        return [int(sizes[f]) for f in FEATURES]

    def day_state(self, day: int) -> DayState:
        """The samplers of ``day`` (0-based; the warm-up day uses day 0's state)."""
        c = self.cfg
        rng = np.random.default_rng([c.seed, STREAM_DAY, day])
        jitter = lambda n, s: np.exp(s * rng.standard_normal(n) - 0.5 * s * s)  # noqa: E731 (mean 1)
        users = single(self.user_weight * jitter(c.num_users, c.user_daily_jitter))
        sites = single(self.site_weight * jitter(c.num_sites, c.site_daily_jitter))
        live = (self.ad_start <= day) & (day < self.ad_end)
        ad_weight = np.where(live, self.ad_weight, 0.0)
        ads = GroupedSampler(self.ad_category, c.num_ad_categories).set_weights(ad_weight)
        # P(category | site category or segment) ~ preference x the category's live ad volume.
        volume = ads.totals
        targeting = GroupedSampler(
            np.repeat(np.arange(self.targeting_rows), c.num_ad_categories), self.targeting_rows
        ).set_weights((self.targeting_preference * volume[None, :]).ravel())
        age = np.maximum(day - self.ad_start + self.ad_prior_age, 0).astype(np.float64)
        by_advertiser = GroupedSampler(self.ad_advertiser, c.num_advertisers).set_weights(ad_weight)
        by_campaign = GroupedSampler(self.ad_campaign, c.num_campaigns).set_weights(ad_weight)
        return DayState(day, users, sites, targeting, ads, by_advertiser, by_campaign, age, live)

    def sample(self, state: DayState, hour: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """Internal indices (n, 26) int32 of ``len(hour)`` impressions of ``state.day``."""
        c = self.cfg
        n = len(hour)
        u = rng.random((13, n))
        out = np.empty((n, len(FEATURES)), dtype=np.int32)
        user = state.users.sample(None, u[0])
        out[:, USER_BLOCK] = self.user_attrs[user]  # every user feature is the user's attribute

        pick = (u[2] * self.num_preferred[user]).astype(np.int64)
        site = np.where(u[1] < c.preferred_site_share, self.preferred_sites[user, pick],
                        state.sites.sample(None, u[3]))
        out[:, SITE_BLOCK] = self.site_attrs[site]  # placement holds the site's first placement
        count = self.site_placements[site]  # the site's first placements get most impressions
        out[:, COL["placement"]] += np.minimum((u[4] * u[4] * count).astype(np.int32), count - 1)

        # The ad: retargeted (an advertiser the user visited), a direct deal of the site, or
        # targeted by category; the first two fall back to the third when nothing of that
        # advertiser / campaign is live today.
        ad = np.empty(n, dtype=np.int64)
        retarget = u[11] < c.retargeting_share
        deal = ~retarget & (u[11] < c.retargeting_share + c.direct_deal_share)
        targeted = ~(retarget | deal)
        # Retargeting picks one of the user's advertisers, a direct deal one of the site's
        # campaigns; then an ad of that owner. An owner with no live ad falls back to targeting.
        routes = (
            (retarget, user, self.user_advertisers, self.num_user_advertisers, state.ads_of_advertiser),
            (deal, site, self.site_deals, self.num_site_deals, state.ads_of_campaign),
        )
        for mask, entity, owners, num_owners, ads_of_owner in routes:
            if mask.any():
                rows = np.flatnonzero(mask)
                who = entity[rows]
                owner = owners[who, (u[12, rows] * num_owners[who]).astype(np.int64)]
                live = ads_of_owner.totals[owner] > 0
                ad[rows[live]] = ads_of_owner.sample(owner[live], u[7, rows[live]])
                targeted[rows[~live]] = True
        rows = np.flatnonzero(targeted)
        by = np.where(u[5, rows] < c.contextual_targeting_share, out[rows, COL["site_category"]],
                      c.num_site_categories + out[rows, COL["user_segment"]])
        category = state.targeting.sample(by, u[6, rows]) % c.num_ad_categories
        ad[rows] = state.ads.sample(category, u[7, rows])
        out[:, AD_BLOCK] = self.ad_attrs[ad]

        out[:, COL["hour"]] = hour
        out[:, COL["weekday"]] = state.day % 7
        out[:, COL["slot_position"]] = draw(SLOT_SHARES, u[8])
        out[:, COL["connection_type"]] = self.connection.sample(
            out[:, COL["device_type"]], u[9]) % NUM_CONNECTIONS
        out[:, COL["isp"]] = self.isp_in_region.sample(out[:, COL["geo_region"]], u[10])
        return out

    def table_ids(self, idx: np.ndarray) -> np.ndarray:
        """Internal indices (n, 26) -> the written ids (n, 26) int32 (seeded permutation per table)."""
        out = np.empty(idx.shape, dtype=np.int32)
        out[:, USER_BLOCK] = self.user_ids[idx[:, COL["user_id"]]]
        out[:, AD_BLOCK] = self.ad_ids[idx[:, COL["ad_id"]]]
        out[:, SITE_BLOCK] = self.site_ids[idx[:, COL["site_id"]]]
        for f in [COL["placement"], *range(CONTEXT_BLOCK.start, CONTEXT_BLOCK.stop)]:
            perm = self.id_maps[f]
            out[:, f] = idx[:, f] if perm is None else perm[idx[:, f]]
        return out
