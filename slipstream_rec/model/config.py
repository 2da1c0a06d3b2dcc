"""Model configuration: which DLRM variant and how large."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import List


class Arch(Enum):
    """Interaction architecture. Lower-case names so that overrides read ``model.arch=dlrm_dcn``."""

    dlrm = "dlrm"  # pairwise dot products (torchrec.models.dlrm.DLRM)
    dlrm_dcn = "dlrm_dcn"  # DCN-v2 low-rank cross network (torchrec.models.dlrm.DLRM_DCN)


@dataclass
class ModelConfig:
    """A DLRM from torchrec.models.dlrm, one embedding table per categorical feature."""

    # Interaction architecture: dlrm (dot products) or dlrm_dcn (DCN-v2 cross layers).
    arch: Arch = Arch.dlrm
    # Width of every embedding row; must equal the last bottom-MLP layer.
    embedding_dim: int = 16
    # Bottom (dense) MLP layer sizes after the dense input; the last equals embedding_dim.
    dense_arch_layer_sizes: List[int] = field(default_factory=lambda: [512, 256, 64, 16])
    # Top (over) MLP layer sizes; the last must be 1 (one logit per sample).
    over_arch_layer_sizes: List[int] = field(default_factory=lambda: [512, 256, 1])
    # DCN-v2 only: number of cross layers.
    dcn_num_layers: int = 3
    # DCN-v2 only: rank of the low-rank cross weight matrices.
    dcn_low_rank_dim: int = 512
