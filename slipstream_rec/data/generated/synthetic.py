"""The default dataset: a deterministic, Criteo-like CTR dataset drawn from a hidden teacher.

Rows have 13 dense features and 26 categorical features with one id each, like Criteo Kaggle:

* ids of feature f are drawn from a Zipf-like law over its (scaled) cardinality C_f,
  p(popularity rank k) ~ k^-s_f, by inverse-CDF sampling (np.searchsorted on a precomputed cdf),
  then optionally mapped through a seeded permutation of [0, C_f) so hot ids are spread over the
  table (row-wise shards all get some hot rows);
* dense features are heavy-tailed integer counts (zero-inflated log-normal), some correlated with
  the teacher's sparse logit, stored as log(max(x, 0) + 1) float32 like TorchRec's DLRM
  preprocessing;
* labels are Bernoulli(sigmoid(logit)) with the teacher's logit

      bias + sum_f w_f[id_f]                                   (per-id effects)
           + sum_{f<g} <u_f[id_f], u_g[id_g]>                  (low-rank pairwise interactions)
           + dense_scale * <c, standardized dense features>     (dense term)

  where the pairwise sum is computed as (||sum_f u_f||^2 - sum_f ||u_f||^2) / 2, and ``bias`` is
  found by bisection on a calibration sample so that the mean label is ``base_ctr``.

Each split is written in TorchRec's binary criteo npy layout (see slipstream_rec/data/meta.py)
plus ``meta.json``; ``datasets.ensure_dataset`` caches it under ``{root}/{name}-{config hash}``
and only renames a complete directory into place.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import math
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple, Union

import numpy as np
import torch

from slipstream_rec.data.coerce import checked_number, coerce_dataclass
from slipstream_rec.data.config import (
    CRITEO_KAGGLE_CARDINALITIES,
    NUM_DENSE,
    NUM_SPARSE,
    SyntheticConfig,
)
from slipstream_rec.data.generated.labels import fit_bias, sigmoid
from slipstream_rec.data.meta import FORMAT_VERSION, META_FILE, SPLITS, split_file
from slipstream_rec.metrics import auc

logger = logging.getLogger("slipstream_rec.data")

# Bump when the generated data changes for the same config: it is part of the cache hash.
GENERATOR_VERSION = 1
# Rows generated per chunk (bounds memory: ~100 MB of temporaries per chunk).
CHUNK_ROWS = 262_144
# Rows of the calibration sample (teacher standardization constants and the bias bisection).
CALIBRATION_ROWS = 200_000
# teacher_auc is measured on at most this many validation rows (bounded memory).
MAX_AUC_ROWS = 4_000_000

SPARSE_FEATURE_NAMES: List[str] = [f"cat_{i}" for i in range(NUM_SPARSE)]
DENSE_FEATURE_NAMES: List[str] = [f"int_{i}" for i in range(NUM_DENSE)]

# Shapes of the 13 dense count features (fixed, Criteo-like: very different scales, many zeros):
# x = floor(exp(mu + sigma * g)) - shift, zeroed with probability zero_prob, clamped at 0.
_DENSE_MU = np.array([0.5, 2.0, 1.5, 1.5, 7.0, 3.5, 1.5, 2.5, 4.0, 0.3, 1.0, 0.2, 1.5])
_DENSE_SIGMA = np.array([1.0, 1.5, 1.2, 1.0, 1.8, 1.5, 1.3, 1.0, 1.2, 0.6, 0.9, 0.8, 1.1])
_DENSE_SHIFT = np.array([0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0], dtype=np.float64)
_DENSE_ZERO_PROB = np.array([0.45, 0.05, 0.2, 0.1, 0.02, 0.2, 0.05, 0.02, 0.03, 0.5, 0.3, 0.75, 0.2])
# Correlation of each dense feature's latent normal with the teacher's standardized sparse logit.
_DENSE_RHO = np.array([0.4, 0.0, 0.3, 0.0, 0.0, 0.25, 0.4, 0.0, 0.0, 0.3, 0.0, 0.0, 0.0])

# Random streams: np.random.default_rng([seed, stream, ...]).
_STREAM_TEACHER, _STREAM_PERM, _STREAM_CALIB, _STREAM_SPLIT = 1, 2, 3, 4


# -- config handling ---------------------------------------------------------------------------


def normalize_synthetic_config(cfg: Any, key: str = "data.synthetic") -> SyntheticConfig:
    """Validate a SyntheticConfig (dataclass, DictConfig or mapping) and return a clean copy.

    Raises ValueError naming the offending key (``data.synthetic.<field>``) and the fix.
    """
    c = coerce_dataclass(cfg, SyntheticConfig, key)
    k = lambda name: f"{key}.{name}"  # noqa: E731
    out = SyntheticConfig(
        num_train=checked_number(c.num_train, k("num_train"), int, lo=1),
        num_val=checked_number(c.num_val, k("num_val"), int, lo=1),
        num_test=checked_number(c.num_test, k("num_test"), int, lo=1),
        cardinality_scale=checked_number(c.cardinality_scale, k("cardinality_scale"), float, lo=0, lo_open=True),
        min_cardinality=checked_number(c.min_cardinality, k("min_cardinality"), int, lo=2,
                                       fix="Fix: small features need at least 2 rows to carry any signal."),
        max_cardinality=checked_number(c.max_cardinality, k("max_cardinality"), int, lo=2),
        zipf_exponent=checked_number(c.zipf_exponent, k("zipf_exponent"), float, lo=0,
                                     fix="Fix: use 0 for uniform ids, ~1.1 for Criteo-like skew."),
        zipf_exponents=None,
        permute_ids=c.permute_ids,
        base_ctr=checked_number(c.base_ctr, k("base_ctr"), float, lo=0, lo_open=True, hi=1, hi_open=True,
                                fix="Fix: a click-through rate strictly between 0 and 1, e.g. 0.25."),
        teacher_rank=checked_number(c.teacher_rank, k("teacher_rank"), int, lo=0,
                                    fix="Fix: 0 disables the interaction term."),
        teacher_id_scale=checked_number(c.teacher_id_scale, k("teacher_id_scale"), float, lo=0),
        teacher_interaction_scale=checked_number(c.teacher_interaction_scale, k("teacher_interaction_scale"),
                                                 float, lo=0),
        teacher_dense_scale=checked_number(c.teacher_dense_scale, k("teacher_dense_scale"), float, lo=0),
        seed=checked_number(c.seed, k("seed"), int, lo=0),
    )
    if not isinstance(c.permute_ids, bool):
        raise ValueError(f"{k('permute_ids')} must be true or false, got {c.permute_ids!r}")
    if out.max_cardinality < out.min_cardinality:
        raise ValueError(
            f"{k('max_cardinality')}={out.max_cardinality} is below {k('min_cardinality')}="
            f"{out.min_cardinality}. Fix: raise max_cardinality or lower min_cardinality."
        )
    if c.zipf_exponents is not None:
        exps = list(c.zipf_exponents)
        if len(exps) != NUM_SPARSE:
            raise ValueError(
                f"{k('zipf_exponents')} has {len(exps)} values, expected {NUM_SPARSE} (one per "
                f"categorical feature). Fix: give {NUM_SPARSE} exponents, or null to use "
                f"{k('zipf_exponent')} for every feature."
            )
        out.zipf_exponents = [
            checked_number(e, f"{k('zipf_exponents')}[{i}]", float, lo=0, fix="Fix: exponents are >= 0.")
            for i, e in enumerate(exps)
        ]
    return out


def feature_cardinalities(cfg: SyntheticConfig) -> List[int]:
    """Per-feature table sizes: round(criteo * scale) clamped to [min, max], never above criteo."""
    out = []
    for c in CRITEO_KAGGLE_CARDINALITIES:
        n = int(round(c * cfg.cardinality_scale))
        n = min(max(n, cfg.min_cardinality), cfg.max_cardinality)
        out.append(max(1, min(n, c)))
    return out


def feature_exponents(cfg: SyntheticConfig) -> List[float]:
    if cfg.zipf_exponents is not None:
        return [float(e) for e in cfg.zipf_exponents]
    return [float(cfg.zipf_exponent)] * NUM_SPARSE


def config_hash(cfg: SyntheticConfig) -> str:
    """Short stable hash of the (normalized) generator config and the generator version."""
    cfg = normalize_synthetic_config(cfg)
    blob = json.dumps(
        {"generator_version": GENERATOR_VERSION, "config": dataclasses.asdict(cfg)},
        sort_keys=True,
    )
    return hashlib.sha256(blob.encode()).hexdigest()[:12]


# -- the teacher -------------------------------------------------------------------------------


class Teacher:
    """The hidden model that draws ids, dense features and labels. Deterministic by config."""

    def __init__(self, cfg: SyntheticConfig) -> None:
        self.cfg = cfg
        self.cardinalities = feature_cardinalities(cfg)
        self.exponents = feature_exponents(cfg)
        seed = cfg.seed
        rng = np.random.default_rng([seed, _STREAM_TEACHER])
        prng = np.random.default_rng([seed, _STREAM_PERM])

        self.cdfs: List[np.ndarray] = []
        self.perms: List[Optional[np.ndarray]] = []
        for card, s in zip(self.cardinalities, self.exponents):
            w = np.arange(1, card + 1, dtype=np.float64) ** -s
            cdf = np.cumsum(w)
            cdf /= cdf[-1]
            self.cdfs.append(cdf)
            self.perms.append(prng.permutation(card) if cfg.permute_ids else None)

        # Feature importances (lognormal, sum of squares 1): some features matter much more.
        imp = rng.lognormal(0.0, 0.75, NUM_SPARSE)
        imp /= np.sqrt((imp**2).sum())
        self.importance = imp
        r = cfg.teacher_rank
        # Interaction latent std b_f = c0 * sqrt(imp_f); var(sum_{f<g} <u_f,u_g>) = r c0^4 P.
        pair = ((imp.sum()) ** 2 - (imp**2).sum()) / 2.0
        c0 = (cfg.teacher_interaction_scale**2 / (r * pair)) ** 0.25 if r > 0 else 0.0
        self.w: List[np.ndarray] = []
        self.u: List[np.ndarray] = []
        self.u_sq: List[np.ndarray] = []
        for f, card in enumerate(self.cardinalities):
            self.w.append((rng.standard_normal(card) * (cfg.teacher_id_scale * imp[f])).astype(np.float32))
            if r > 0:
                u = (rng.standard_normal((card, r)) * (c0 * math.sqrt(imp[f]))).astype(np.float32)
                self.u.append(u)
                self.u_sq.append((u.astype(np.float64) ** 2).sum(axis=1))
        # Dense term weights: a random half of the dense features, unit norm.
        c = rng.standard_normal(NUM_DENSE) * (rng.random(NUM_DENSE) < 0.5)
        if not c.any():
            c[0] = 1.0
        self.dense_coef = c / np.sqrt((c**2).sum())

        # Calibration: standardize the sparse term and the dense features, then fit the bias.
        self.sparse_mean, self.sparse_std = 0.0, 1.0
        self.dense_mean = np.zeros(NUM_DENSE)
        self.dense_std = np.ones(NUM_DENSE)
        self.bias = 0.0
        crng = np.random.default_rng([seed, _STREAM_CALIB])
        ids = self.sample_ids(crng, CALIBRATION_ROWS)
        sparse_logit = self.sparse_logit(ids)
        self.sparse_mean = float(sparse_logit.mean())
        self.sparse_std = float(sparse_logit.std()) or 1.0
        dense = self.sample_dense(crng, sparse_logit)
        self.dense_mean = dense.mean(axis=0, dtype=np.float64)
        std = dense.std(axis=0, dtype=np.float64)
        self.dense_std = np.where(std > 1e-6, std, 1.0)
        z = sparse_logit + self.dense_logit(dense)
        self.bias = fit_bias(z, cfg.base_ctr)
        self.logit_std = float(z.std())

    def sample_ids(self, rng: np.random.Generator, n: int) -> np.ndarray:
        """(n, 26) int64 ids, Zipf-like per feature (inverse-CDF sampling, then permutation)."""
        u = rng.random((NUM_SPARSE, n))
        ids = np.empty((n, NUM_SPARSE), dtype=np.int64)
        for f in range(NUM_SPARSE):
            k = np.searchsorted(self.cdfs[f], u[f], side="right")
            np.minimum(k, self.cardinalities[f] - 1, out=k)  # guard cdf[-1] rounding
            perm = self.perms[f]
            ids[:, f] = perm[k] if perm is not None else k
        return ids

    def sparse_logit(self, ids: np.ndarray) -> np.ndarray:
        """Per-id effects + low-rank pairwise interactions, float64 (n,)."""
        n = ids.shape[0]
        out = np.zeros(n, dtype=np.float64)
        r = self.cfg.teacher_rank
        if r > 0:
            total = np.zeros((n, r), dtype=np.float64)
            sq = np.zeros(n, dtype=np.float64)
        for f in range(NUM_SPARSE):
            col = ids[:, f]
            out += self.w[f][col]
            if r > 0:
                total += self.u[f][col]
                sq += self.u_sq[f][col]
        if r > 0:
            # sum_{f<g} <u_f, u_g> = (||sum_f u_f||^2 - sum_f ||u_f||^2) / 2
            out += 0.5 * (np.einsum("ij,ij->i", total, total) - sq)
        return out

    def sample_dense(self, rng: np.random.Generator, sparse_logit: np.ndarray) -> np.ndarray:
        """(n, 13) float32 log(max(x, 0) + 1) of zero-inflated log-normal counts."""
        n = sparse_logit.shape[0]
        t = (sparse_logit - self.sparse_mean) / self.sparse_std
        g = rng.standard_normal((n, NUM_DENSE))
        g *= np.sqrt(1.0 - _DENSE_RHO**2)
        g += t[:, None] * _DENSE_RHO
        x = np.floor(np.exp(_DENSE_MU + _DENSE_SIGMA * g)) - _DENSE_SHIFT
        x[rng.random((n, NUM_DENSE)) < _DENSE_ZERO_PROB] = 0.0
        np.maximum(x, 0.0, out=x)
        return np.log1p(x).astype(np.float32)

    def dense_logit(self, dense: np.ndarray) -> np.ndarray:
        z = (dense - self.dense_mean) / self.dense_std
        return self.cfg.teacher_dense_scale * (z @ self.dense_coef)

    def sample(self, rng: np.random.Generator, n: int) -> Tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """One chunk: dense (n,13) float32, sparse (n,26) int32, p (n,) float64, labels (n,1) int32."""
        ids = self.sample_ids(rng, n)
        sl = self.sparse_logit(ids)
        dense = self.sample_dense(rng, sl)
        p = sigmoid(self.bias + sl + self.dense_logit(dense))
        labels = (rng.random(n) < p).astype(np.int32).reshape(n, 1)
        return dense, ids.astype(np.int32), p, labels


# -- writing -----------------------------------------------------------------------------------


def _write_chunk(arrays: Dict[str, np.ndarray], start: int, chunk: Dict[str, np.ndarray]) -> None:
    """Copy one generated chunk into the split's open .npy memmaps (a seam for crash tests)."""
    for kind, arr in chunk.items():
        arrays[kind][start : start + arr.shape[0]] = arr


def generate_dataset(cfg: Any, out_dir: Union[str, Path]) -> Dict[str, Any]:
    """Generate all splits of ``cfg`` into ``out_dir`` (must exist) and write meta.json last.

    Returns the meta dict. Not atomic by itself: ``datasets.ensure_dataset`` is the cached,
    atomic version.
    """
    cfg = normalize_synthetic_config(cfg)
    out_dir = Path(out_dir)
    t0 = time.perf_counter()
    teacher = Teacher(cfg)
    logger.info(
        "synthetic data: teacher ready in %.1fs (bias %.3f, logit std %.3f, cardinalities %s)",
        time.perf_counter() - t0, teacher.bias, teacher.logit_std, teacher.cardinalities,
    )
    rows = {"train": cfg.num_train, "val": cfg.num_val, "test": cfg.num_test}
    ctr: Dict[str, float] = {}
    teacher_auc = float("nan")
    for split_idx, split in enumerate(SPLITS):
        n = rows[split]
        t_split = time.perf_counter()
        arrays = {
            "dense": np.lib.format.open_memmap(
                split_file(out_dir, split, "dense"), mode="w+", dtype=np.float32, shape=(n, NUM_DENSE)
            ),
            "sparse": np.lib.format.open_memmap(
                split_file(out_dir, split, "sparse"), mode="w+", dtype=np.int32, shape=(n, NUM_SPARSE)
            ),
            "labels": np.lib.format.open_memmap(
                split_file(out_dir, split, "labels"), mode="w+", dtype=np.int32, shape=(n, 1)
            ),
        }
        positives = 0
        auc_p: List[np.ndarray] = []
        auc_y: List[np.ndarray] = []
        auc_rows = 0
        for chunk_idx, start in enumerate(range(0, n, CHUNK_ROWS)):
            m = min(CHUNK_ROWS, n - start)
            rng = np.random.default_rng([cfg.seed, _STREAM_SPLIT, split_idx, chunk_idx])
            dense, sparse, p, labels = teacher.sample(rng, m)
            _write_chunk(arrays, start, {"dense": dense, "sparse": sparse, "labels": labels})
            positives += int(labels.sum())
            if split == "val" and auc_rows < MAX_AUC_ROWS:
                take = min(m, MAX_AUC_ROWS - auc_rows)
                auc_p.append(p[:take])
                auc_y.append(labels[:take, 0])
                auc_rows += take
            logger.debug("synthetic data: %s rows %d..%d written", split, start, start + m)
        for arr in arrays.values():
            arr.flush()
        del arrays
        ctr[split] = positives / n
        if split == "val":
            teacher_auc = auc(torch.from_numpy(np.concatenate(auc_p)), torch.from_numpy(np.concatenate(auc_y)))
        logger.info(
            "synthetic data: %s split, %d rows, ctr %.4f, %.1fs",
            split, n, ctr[split], time.perf_counter() - t_split,
        )
    meta = {
        "format_version": FORMAT_VERSION,
        "num_dense": NUM_DENSE,
        "num_sparse": NUM_SPARSE,
        "sparse_feature_names": SPARSE_FEATURE_NAMES,
        "dense_feature_names": DENSE_FEATURE_NAMES,
        "num_embeddings_per_feature": teacher.cardinalities,
        "rows": rows,
        "ctr": ctr,
        "teacher_auc": None if math.isnan(teacher_auc) else teacher_auc,  # nan: one class only
        "teacher_auc_rows": min(cfg.num_val, MAX_AUC_ROWS),
        "generator": {
            "name": "synthetic",
            "version": GENERATOR_VERSION,
            "hash": config_hash(cfg),
            "config": dataclasses.asdict(cfg),
            "zipf_exponents": teacher.exponents,
            "teacher_bias": teacher.bias,
            "teacher_logit_std": teacher.logit_std,
        },
    }
    (out_dir / META_FILE).write_text(json.dumps(meta, indent=2) + "\n")
    logger.info(
        "synthetic data: generated %d rows in %.1fs into %s (teacher_auc %.4f on val)",
        sum(rows.values()), time.perf_counter() - t0, out_dir, teacher_auc,
    )
    return meta
