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

Each split is written in TorchRec's binary criteo npy layout (see slipstream_rec/data/loader.py)
plus ``meta.json``; ``ensure_dataset`` caches it under ``{root}/{name}-{config hash}`` and only
renames a complete directory into place.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import hashlib
import json
import logging
import math
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, Mapping, Optional, Tuple, Union

import numpy as np
import torch

from slipstream_rec.data.config import (
    CRITEO_KAGGLE_CARDINALITIES,
    NUM_DENSE,
    NUM_SPARSE,
    ClicklogConfig,
    DataConfig,
    SyntheticConfig,
)
from slipstream_rec.data.labels import fit_bias, sigmoid
from slipstream_rec.data.loader import FORMAT_VERSION, META_FILE, SPLITS, load_meta, split_file
from slipstream_rec.training.metrics import auc

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

# data.source values generated into the cache by ensure_dataset (clicklog: data/clicklog.py).
GENERATED_SOURCES = ("synthetic", "clicklog")

# Random streams: np.random.default_rng([seed, stream, ...]).
_STREAM_TEACHER, _STREAM_PERM, _STREAM_CALIB, _STREAM_SPLIT = 1, 2, 3, 4


# -- config handling ---------------------------------------------------------------------------


def _to_mapping(cfg: Any) -> Any:
    """DictConfig -> dict (resolved); anything else unchanged."""
    try:
        from omegaconf import DictConfig, OmegaConf
    except ImportError:  # pragma: no cover - omegaconf ships with hydra
        return cfg
    if isinstance(cfg, DictConfig):
        return OmegaConf.to_container(cfg, resolve=True)
    return cfg


def _coerce(cfg: Any, cls: type, key: str) -> Any:
    cfg = _to_mapping(cfg)
    if isinstance(cfg, cls):
        return cfg
    if isinstance(cfg, Mapping):
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(cfg) - names)
        if unknown:
            raise ValueError(f"{key} has unknown key(s) {unknown}. Fix: use only {sorted(names)}.")
        kwargs = dict(cfg)
        if cls is DataConfig and "synthetic" in kwargs:
            kwargs["synthetic"] = _coerce(kwargs["synthetic"], SyntheticConfig, f"{key}.synthetic")
        if cls is DataConfig and "clicklog" in kwargs:
            kwargs["clicklog"] = _coerce(kwargs["clicklog"], ClicklogConfig, f"{key}.clicklog")
        if cls is DataConfig:  # the converters' nested settings: typed through OmegaConf
            from omegaconf import OmegaConf

            for name in ("criteo", "tabular", "movielens"):
                if isinstance(kwargs.get(name), Mapping):
                    kind = type(getattr(DataConfig(), name))
                    kwargs[name] = OmegaConf.to_object(
                        OmegaConf.merge(OmegaConf.structured(kind), kwargs[name])
                    )
        return cls(**kwargs)
    raise ValueError(f"{key} must be a {cls.__name__} or a mapping, got {type(cfg).__name__}")


def _num(value: Any, key: str, kind: type, *, lo: Optional[float] = None, lo_open: bool = False,
         hi: Optional[float] = None, hi_open: bool = False, fix: str = "") -> Any:
    """Validate ``value`` as int / float with an optional range; error names the config key."""
    ok_type = (kind is int and isinstance(value, (int, np.integer)) and not isinstance(value, bool)) or (
        kind is float and isinstance(value, (int, float, np.integer, np.floating))
        and not isinstance(value, bool)
    )
    if not ok_type or (kind is float and not math.isfinite(float(value))):
        raise ValueError(f"{key} must be a finite {kind.__name__}, got {value!r}. {fix}".rstrip())
    v = kind(value)
    if lo is not None and (v <= lo if lo_open else v < lo):
        raise ValueError(f"{key} must be {'>' if lo_open else '>='} {lo}, got {v!r}. {fix}".rstrip())
    if hi is not None and (v >= hi if hi_open else v > hi):
        raise ValueError(f"{key} must be {'<' if hi_open else '<='} {hi}, got {v!r}. {fix}".rstrip())
    return v


def normalize_synthetic_config(cfg: Any, key: str = "data.synthetic") -> SyntheticConfig:
    """Validate a SyntheticConfig (dataclass, DictConfig or mapping) and return a clean copy.

    Raises ValueError naming the offending key (``data.synthetic.<field>``) and the fix.
    """
    c = _coerce(cfg, SyntheticConfig, key)
    k = lambda name: f"{key}.{name}"  # noqa: E731
    out = SyntheticConfig(
        num_train=_num(c.num_train, k("num_train"), int, lo=1),
        num_val=_num(c.num_val, k("num_val"), int, lo=1),
        num_test=_num(c.num_test, k("num_test"), int, lo=1),
        cardinality_scale=_num(c.cardinality_scale, k("cardinality_scale"), float, lo=0, lo_open=True),
        min_cardinality=_num(c.min_cardinality, k("min_cardinality"), int, lo=2,
                             fix="Fix: small features need at least 2 rows to carry any signal."),
        max_cardinality=_num(c.max_cardinality, k("max_cardinality"), int, lo=2),
        zipf_exponent=_num(c.zipf_exponent, k("zipf_exponent"), float, lo=0,
                           fix="Fix: use 0 for uniform ids, ~1.1 for Criteo-like skew."),
        zipf_exponents=None,
        permute_ids=c.permute_ids,
        base_ctr=_num(c.base_ctr, k("base_ctr"), float, lo=0, lo_open=True, hi=1, hi_open=True,
                      fix="Fix: a click-through rate strictly between 0 and 1, e.g. 0.25."),
        teacher_rank=_num(c.teacher_rank, k("teacher_rank"), int, lo=0,
                          fix="Fix: 0 disables the interaction term."),
        teacher_id_scale=_num(c.teacher_id_scale, k("teacher_id_scale"), float, lo=0),
        teacher_interaction_scale=_num(c.teacher_interaction_scale, k("teacher_interaction_scale"),
                                       float, lo=0),
        teacher_dense_scale=_num(c.teacher_dense_scale, k("teacher_dense_scale"), float, lo=0),
        seed=_num(c.seed, k("seed"), int, lo=0),
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
            _num(e, f"{k('zipf_exponents')}[{i}]", float, lo=0, fix="Fix: exponents are >= 0.")
            for i, e in enumerate(exps)
        ]
    return out


def normalize_data_config(cfg: Any, key: str = "data") -> DataConfig:
    """Validate a DataConfig (dataclass, DictConfig or mapping) and return a clean copy."""
    from slipstream_rec.data.sources import RAW_SOURCES

    c = _coerce(cfg, DataConfig, key)
    if c.source not in (*GENERATED_SOURCES, "npy", *RAW_SOURCES):
        raise ValueError(
            f"{key}.source={c.source!r} is unknown. Fix: use one of "
            f"{[*GENERATED_SOURCES, 'npy', *RAW_SOURCES]}."
        )
    if c.bad_rows not in ("error", "skip"):
        raise ValueError(f"{key}.bad_rows={c.bad_rows!r} is unknown. Fix: 'error' or 'skip'.")
    if not isinstance(c.name, str) or not c.name or "/" in c.name or c.name.startswith("."):
        raise ValueError(
            f"{key}.name={c.name!r} is not a valid directory-name prefix. Fix: a non-empty name "
            f"without '/' that does not start with '.'."
        )
    if c.source == "npy" and not c.path:
        raise ValueError(
            f"{key}.path must be set when {key}.source=npy. Fix: {key}.path=/dir/with/meta.json "
            f"(or {key}.source=synthetic to generate the default dataset)."
        )
    if c.path and c.source != "npy":
        # Ignoring it would train on the data.source dataset instead (the default click log is
        # generated, 730 MB, and trained for 2000 steps) while the user thinks it reads data.path.
        raise ValueError(
            f"{key}.path={c.path} is only read with {key}.source=npy, and {key}.source={c.source}. "
            f"Fix: add {key}.source=npy to train on {c.path}, or drop {key}.path."
        )
    if c.source == "clicklog":
        from slipstream_rec.data.clicklog import normalize_clicklog_config

        return dataclasses.replace(c, clicklog=normalize_clicklog_config(c.clicklog, f"{key}.clicklog"))
    if c.source != "synthetic":
        return c  # data.synthetic is unused (and not validated) when reading other data
    return dataclasses.replace(
        c, synthetic=normalize_synthetic_config(c.synthetic, f"{key}.synthetic")
    )


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


def dataset_dir(cfg: Any) -> Path:
    """``{root}/{name}-{hash}`` for source=synthetic / clicklog, ``path`` for source=npy."""
    c = normalize_data_config(cfg)
    if c.source == "npy":
        return Path(c.path)  # type: ignore[arg-type]
    if c.source in GENERATED_SOURCES:
        return Path(c.root) / f"{c.name}-{_generator(c)[0]}"
    if c.source != "synthetic":
        from slipstream_rec.data.convert import source_digest
        from slipstream_rec.data.sources import make_source

        return Path(c.root) / f"{c.name}-{source_digest(make_source(c), c.bad_rows)}"
    return Path(c.root) / f"{c.name}-{config_hash(c.synthetic)}"


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

    Returns the meta dict. Not atomic by itself: use ``ensure_dataset`` for the cached, atomic
    version.
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


def _is_valid_cache(path: Path, expected_hash: str) -> bool:
    try:
        meta = load_meta(path)
    except (OSError, ValueError):
        return False
    return bool(meta.generator) and meta.generator.get("hash") == expected_hash


def ensure_dataset(cfg: Any) -> Path:
    """Return the dataset directory of ``cfg`` (a DataConfig), generating it first if needed.

    source=synthetic / clicklog: ``{root}/{name}-{hash of cfg.synthetic / cfg.clicklog}``
    (generated by this module / data/clicklog.py); reused if it holds a valid
    meta.json for that hash, else generated into a temporary sibling directory and renamed into
    place only when complete (a crash leaves only a ``.{name}-{hash}.tmp-*`` directory; a
    concurrent generator that loses the rename race discards its copy).
    source=npy: validates ``cfg.path`` (meta.json and file headers) and returns it.
    source=criteo / tabular / movielens_1m: the directory slipstream-data converts into
    (``slipstream_rec.data.sources``; tabular and movielens_1m are converted on first use).
    """
    c = normalize_data_config(cfg)
    if c.source not in (*GENERATED_SOURCES, "npy"):
        from slipstream_rec.data.sources import ensure_converted

        return ensure_converted(c)
    if c.source == "npy":
        path = Path(c.path)  # type: ignore[arg-type]
        load_meta(path)
        logger.info("dataset: using npy directory %s", path)
        return path

    h, generate = _generator(c)
    root = Path(c.root)
    final = root / f"{c.name}-{h}"
    if _cached(final, h):
        return final
    root.mkdir(parents=True, exist_ok=True)
    # Ranks on one host serialize on a lock file, so only one of them generates and the others
    # then find the cache; across hosts (or where flock is unsupported) the rename race decides.
    with _lock(root / f".{final.name}.lock"):
        if _cached(final, h):
            return final
        tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.tmp-", dir=root))
        logger.info("dataset: generating %s (via %s)", final, tmp.name)
        try:
            generate(tmp)
            os.chmod(tmp, 0o755)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        try:
            os.rename(tmp, final)
        except OSError:
            # Lost the race to a concurrent generator (final now exists and is non-empty).
            shutil.rmtree(tmp, ignore_errors=True)
            if not _is_valid_cache(final, h):
                raise
            logger.info("dataset: another process finished %s first; discarded our copy", final)
    return final


def _generator(c: DataConfig) -> Tuple[str, Callable[[Path], Any]]:
    """(config hash, generate into a directory) of a normalized generated-data config."""
    if c.source == "clicklog":
        from slipstream_rec.data import clicklog

        return clicklog.config_hash(c.clicklog), lambda out: clicklog.generate_dataset(c.clicklog, out)
    return config_hash(c.synthetic), lambda out: generate_dataset(c.synthetic, out)


def _cached(final: Path, h: str) -> bool:
    """True if ``final`` is a finished dataset for hash ``h``; error if it exists but is not."""
    if not final.exists():
        return False
    if _is_valid_cache(final, h):
        logger.info("dataset: reusing cached %s", final)
        return True
    raise ValueError(
        f"{final} exists but is not a complete dataset for this config (bad or missing "
        f"{META_FILE}, missing/mismatched .npy files, or a different hash). Fix: delete "
        f"{final}; the next run regenerates it."
    )


@contextlib.contextmanager
def _lock(path: Path) -> Iterator[None]:
    """Exclusive flock on ``path`` while generating; a no-op where flock is unavailable.

    The holder removes the lock file when done, so data/ keeps no ``.X.lock`` files. That is
    safe because a process that got the lock on a file already unlinked (it opened it before the
    removal) sees that the path no longer names its file and takes the lock again on the new one.
    """
    try:
        import fcntl
    except ImportError:
        yield
        return
    while True:
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError:
            yield
            return
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
        except OSError:  # e.g. some network filesystems: fall back to the rename race
            os.close(fd)
            yield
            return
        try:
            same = os.stat(path).st_ino == os.fstat(fd).st_ino
        except FileNotFoundError:
            same = False
        if same:
            break
        os.close(fd)  # the holder before us removed it: lock the current file instead
    try:
        yield
    finally:
        with contextlib.suppress(OSError):
            os.unlink(path)  # while still holding the lock (see above)
        os.close(fd)  # closing releases the lock


def main(argv: Optional[List[str]] = None) -> None:
    """``python -m slipstream_rec.data.synthetic [--root data]``: build the default dataset."""
    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("--root", default=DataConfig.root)
    parser.add_argument("--name", default=DataConfig.name)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s", force=True)
    path = ensure_dataset(DataConfig(root=args.root, name=args.name))
    meta = load_meta(path)
    print(json.dumps({"path": str(path), "rows": meta.rows, "teacher_auc": meta.teacher_auc, "ctr": meta.ctr}))


if __name__ == "__main__":
    main()
