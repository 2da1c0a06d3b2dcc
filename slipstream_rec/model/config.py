"""Model configuration: which DLRM variant and how large."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import List


class Arch(Enum):
    """Interaction architecture. Lower-case names so that overrides read ``model.arch=dlrm_dcn``."""

    dlrm = "dlrm"  # pairwise dot products (torchrec.models.dlrm.DLRM)
    dlrm_dcn = "dlrm_dcn"  # DCN-v2 low-rank cross network (torchrec.models.dlrm.DLRM_DCN)


class FeatureNorm(Enum):
    """Normalization of the interaction's inputs (Slipstream's accuracy recovery, arXiv 2404.04270).

    Applied to every pooled embedding (B, F, D) and to the bottom-MLP output (B, D) just before
    the interaction; see slipstream_rec/model/feature_norm.py for which reading of the paper
    each option is. Lower-case names so that overrides read ``model.feature_norm=batch``.
    """

    none = "none"  # no normalization: TorchRec's DLRM unchanged
    layer = "layer"  # LayerNorm over D of each embedding vector, per-feature affine
    batch = "batch"  # BatchNorm per feature and dimension, statistics over the global batch


class EmbeddingDtype(Enum):
    """Storage type of the embedding rows (TorchRec's EmbeddingBagConfig.data_type)."""

    fp32 = "fp32"
    fp16 = "fp16"  # half the memory and lookup bytes; FBGEMM's TBE updates the fp16 rows in place


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
    # Normalize the interaction's inputs: none (the plain DLRM), layer (LayerNorm over each
    # embedding's D values) or batch (BatchNorm per feature and dimension, with running
    # statistics; its training forward is a small all-reduce over all ranks).
    feature_norm: FeatureNorm = FeatureNorm.none
    # Storage type of the embedding rows: fp32 or fp16 (the TBE's weights_precision; pooled
    # embeddings are returned in fp32). Slipstream's snapshots compare the rows in fp32.
    embedding_dtype: EmbeddingDtype = EmbeddingDtype.fp32

    def validate(self) -> None:
        """The layer-size rules of TorchRec's DLRM, checked before any process group or run
        directory exists and again where the model is built."""
        if not self.dense_arch_layer_sizes or self.dense_arch_layer_sizes[-1] != self.embedding_dim:
            raise ValueError(
                f"model.dense_arch_layer_sizes={list(self.dense_arch_layer_sizes)} must end with "
                f"model.embedding_dim={self.embedding_dim}: DLRM interacts the bottom MLP output with "
                "the embeddings, so set the last layer to the embedding dim"
            )
        if len(self.over_arch_layer_sizes) < 2 or self.over_arch_layer_sizes[-1] != 1:
            raise ValueError(
                f"model.over_arch_layer_sizes={list(self.over_arch_layer_sizes)} must have at least "
                "two layers (TorchRec's OverArch) and end with 1 (one click logit per sample), "
                "e.g. [512, 256, 1]"
            )
