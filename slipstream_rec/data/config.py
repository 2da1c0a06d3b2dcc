"""Data configuration: which dataset to train on and how to generate the default synthetic one.

Plain dataclasses usable as Hydra/OmegaConf structured configs. Values are validated where they
are used (``slipstream_rec.data.synthetic`` / ``slipstream_rec.data.loader``), which raise a
``ValueError`` naming the config key (e.g. ``data.synthetic.zipf_exponents``) and the fix.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import List, Optional

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
    """A Criteo-like CTR dataset drawn from a hidden "teacher" model (see data/synthetic.py)."""

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
class DataConfig:
    """Where the dataset lives and how it is read."""

    # Dataset name; the synthetic cache directory is {root}/{name}-{hash of data.synthetic}.
    name: str = "synthetic_criteo"
    # Cache root directory for generated datasets (relative paths are relative to the cwd).
    root: str = "data"
    # "synthetic": generate into the cache (once); "npy": read the existing directory data.path.
    source: str = "synthetic"
    # Directory holding {split}_{dense,sparse,labels}.npy and meta.json; only for source=npy.
    path: Optional[str] = None
    # Open the .npy files with np.load(mmap_mode="r") instead of reading them into memory.
    mmap: bool = False
    # Reshuffle each rank's training rows every epoch (seeded by seed, epoch and rank).
    shuffle: bool = True
    # Generator settings for source=synthetic.
    synthetic: SyntheticConfig = field(default_factory=SyntheticConfig)
