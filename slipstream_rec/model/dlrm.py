"""Builds the DLRM training module: embedding tables on the meta device, dense arch on CPU."""

from __future__ import annotations

from typing import Any, Optional, Sequence, Tuple

import torch
from torch import nn
from torchrec.models.dlrm import DLRM, DLRM_DCN
from torchrec.modules.embedding_configs import DataType, EmbeddingBagConfig, PoolingType
from torchrec.modules.embedding_modules import EmbeddingBagCollection

from slipstream_rec.data.types import Batch
from slipstream_rec.model.config import Arch, ModelConfig
from slipstream_rec.model.feature_norm import add_feature_norm


def table_name(feature: str) -> str:
    """One table per feature; the table name is what sharding plans and constraints refer to."""
    return f"t_{feature}"


def embedding_bag_configs(
    cfg: ModelConfig, feature_names: Sequence[str], num_embeddings: Sequence[int]
) -> list[EmbeddingBagConfig]:
    if len(feature_names) != len(num_embeddings):
        raise ValueError(
            f"{len(feature_names)} sparse features but {len(num_embeddings)} table sizes; "
            "the dataset's meta.json must list one num_embeddings per sparse feature"
        )
    return [
        EmbeddingBagConfig(
            name=table_name(feature),
            embedding_dim=cfg.embedding_dim,
            num_embeddings=int(rows),
            feature_names=[feature],
            pooling=PoolingType.SUM,
            data_type=DataType.FP16 if cfg.embedding_dtype.value == "fp16" else DataType.FP32,
        )
        for feature, rows in zip(feature_names, num_embeddings)
    ]


class DLRMTask(nn.Module):
    """DLRM plus its loss: ``forward(batch) -> (loss, (loss, logits, labels, weights))``.

    The loss is the weighted mean of per-sample BCE over the local batch. With all weights 1 this
    is TorchRec's ``DLRMTrain``; Slipstream sets weights of 1/p on sampled-back skippable inputs.
    The (loss, output) return shape is what TorchRec's train pipelines expect.
    """

    def __init__(self, dlrm: nn.Module) -> None:
        super().__init__()
        self.model = dlrm
        # (served rows, leaf of their pooled embeddings) of the last training forward; the
        # Slipstream controller takes it after backward (``take_served``).
        self.served: Optional[Tuple[Any, torch.Tensor]] = None

    def take_served(self) -> Optional[Tuple[Any, torch.Tensor]]:
        served, self.served = self.served, None
        # TorchRec's pipeline traces forward once with proxies: only a real forward counts.
        return served if served is not None and isinstance(served[1], torch.Tensor) else None

    def forward(
        self, batch: Batch
    ) -> Tuple[torch.Tensor, Tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]]:
        dlrm = self.model
        # TorchRec's DLRM.forward, with the lookups Slipstream serves from its local replica
        # added back to their bags.
        embedded_dense = dlrm.dense_arch(batch.dense_features)
        embedded_sparse = dlrm.sparse_arch(batch.sparse_features)  # (B, F, D)
        if batch.served is not None:
            # Per lookup serving (slipstream/serve/split.py): each bag is the sum of its sharded part,
            # put back in its sample's row by the variable-batch KJT's inverse indices (zeros
            # where the bag has no sharded lookup), and its part from the local replica of stale
            # rows. The replica part is a leaf of its own, so that the gradient its rows owe can
            # be read after backward and pushed to their shards later (slipstream/serve/push.py).
            local = batch.served.pooled.detach().to(embedded_sparse.dtype).requires_grad_(self.training)
            if self.training:
                self.served = (batch.served.rows, local)
            embedded_sparse = embedded_sparse + local.transpose(0, 1)
        concatenated = dlrm.inter_arch(dense_features=embedded_dense, sparse_features=embedded_sparse)
        logits = dlrm.over_arch(concatenated).squeeze(-1)
        per_sample = nn.functional.binary_cross_entropy_with_logits(
            logits, batch.labels, reduction="none"
        )
        loss = (per_sample * batch.weights).sum() / batch.weights.sum()
        return loss, (loss.detach(), logits.detach(), batch.labels.detach(), batch.weights.detach())


def build_model(
    cfg: ModelConfig,
    num_dense: int,
    feature_names: Sequence[str],
    num_embeddings: Sequence[int],
    dense_device: torch.device,
    embedding_device: torch.device = torch.device("meta"),
) -> DLRMTask:
    """The unsharded model. Tables live on ``meta`` so that DMP materialises only local shards."""
    cfg.validate()
    ebc = EmbeddingBagCollection(
        tables=embedding_bag_configs(cfg, feature_names, num_embeddings), device=embedding_device
    )
    common = dict(
        embedding_bag_collection=ebc,
        dense_in_features=num_dense,
        dense_arch_layer_sizes=list(cfg.dense_arch_layer_sizes),
        over_arch_layer_sizes=list(cfg.over_arch_layer_sizes),
        dense_device=dense_device,
    )
    if cfg.arch is Arch.dlrm_dcn:
        dlrm = DLRM_DCN(
            **common, dcn_num_layers=cfg.dcn_num_layers, dcn_low_rank_dim=cfg.dcn_low_rank_dim
        )
    else:
        dlrm = DLRM(**common)
    # model.feature_norm: none leaves TorchRec's module as is; layer/batch wrap its interaction.
    add_feature_norm(dlrm, cfg.feature_norm, cfg.embedding_dim, dense_device)
    return DLRMTask(dlrm)
