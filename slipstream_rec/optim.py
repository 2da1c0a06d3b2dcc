"""Optimizers: the embedding optimizer fused into the TBE backward, and the dense optimizer."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Dict, Tuple, Type

import torch
from torch import nn
from torchrec.distributed.model_parallel import DistributedModelParallel
from torchrec.optim.apply_optimizer_in_backward import apply_optimizer_in_backward
from torchrec.optim.keyed import CombinedOptimizer, KeyedOptimizerWrapper
from torchrec.optim.optimizers import in_backward_optimizer_filter
from torchrec.optim.rowwise_adagrad import RowWiseAdagrad

from slipstream_rec.validation import check_fields


class EmbeddingOptimizerKind(Enum):
    """Optimizers FBGEMM fuses into the embedding backward on CPU and GPU."""

    sgd = "sgd"  # EXACT_SGD
    adagrad = "adagrad"  # EXACT_ADAGRAD
    rowwise_adagrad = "rowwise_adagrad"  # EXACT_ROWWISE_ADAGRAD: one accumulator per row


class DenseOptimizerKind(Enum):
    sgd = "sgd"
    adagrad = "adagrad"
    adam = "adam"


@dataclass
class EmbeddingOptimConfig:
    """Embedding-table optimizer, applied inside the backward pass (no gradient is materialised)."""

    # sgd, adagrad or rowwise_adagrad.
    type: EmbeddingOptimizerKind = EmbeddingOptimizerKind.rowwise_adagrad
    # Learning rate of the embedding rows.
    lr: float = 0.05
    # Adagrad epsilon (ignored by sgd).
    eps: float = 1.0e-8

    def validate(self) -> None:
        check_fields("optim.embedding", self, [("lr", self.lr > 0, "a positive learning rate, e.g. 0.05")])


@dataclass
class DenseOptimConfig:
    """Optimizer of the bottom/top MLPs."""

    # sgd, adagrad or adam.
    type: DenseOptimizerKind = DenseOptimizerKind.adagrad
    # Learning rate after warm-up.
    lr: float = 0.01
    # sgd only: momentum.
    momentum: float = 0.0
    # L2 weight decay.
    weight_decay: float = 0.0
    # Linear learning-rate warm-up from 0 over this many steps (0: none).
    warmup_steps: int = 0

    def validate(self) -> None:
        checks = [
            ("lr", self.lr > 0, "a positive learning rate, e.g. 0.01"),
            ("momentum", self.momentum >= 0, "0 or more"),
            ("weight_decay", self.weight_decay >= 0, "0 or more"),
            ("warmup_steps", self.warmup_steps >= 0, "0 (none) or a positive step count"),
        ]
        check_fields("optim.dense", self, checks)


@dataclass
class OptimConfig:
    # Embedding-table optimizer (fused in backward).
    embedding: EmbeddingOptimConfig = field(default_factory=EmbeddingOptimConfig)
    # Dense-parameter optimizer.
    dense: DenseOptimConfig = field(default_factory=DenseOptimConfig)

    def validate(self) -> None:
        """Checked when the config is loaded, before any process group or file exists."""
        self.embedding.validate()
        self.dense.validate()


def _embedding_optimizer(cfg: EmbeddingOptimConfig) -> Tuple[Type[torch.optim.Optimizer], Dict[str, Any]]:
    cfg.validate()
    if cfg.type is EmbeddingOptimizerKind.sgd:
        return torch.optim.SGD, {"lr": cfg.lr}
    if cfg.type is EmbeddingOptimizerKind.adagrad:
        return torch.optim.Adagrad, {"lr": cfg.lr, "eps": cfg.eps}
    return RowWiseAdagrad, {"lr": cfg.lr, "eps": cfg.eps}


def fuse_embedding_optimizer(model: nn.Module, cfg: EmbeddingOptimConfig) -> None:
    """Attach the embedding optimizer to every table before DMP.

    The planner picks the FBGEMM fused kernel only for parameters that carry an in-backward
    optimizer; DMP then translates it into the TBE's fused update.
    """
    optimizer_class, kwargs = _embedding_optimizer(cfg)
    tables = [
        param
        for name, param in model.named_parameters()
        if "embedding_bags" in name
    ]
    assert tables, "model has no embedding tables"
    apply_optimizer_in_backward(optimizer_class, tables, kwargs)


def build_optimizer(
    dmp: DistributedModelParallel, cfg: OptimConfig
) -> Tuple[CombinedOptimizer, torch.optim.lr_scheduler.LRScheduler]:
    """One optimizer for the whole model: ``zero_grad/step/state_dict`` cover every parameter.

    Three parts: the fused TBE optimizer (its step is a no-op: updates happen in backward), the
    embedding optimizer for data-parallel tables (DDP parameters with averaged gradients, which
    TorchRec does not fuse) so that every table follows ``optim.embedding`` whatever its
    sharding, and the dense optimizer for the MLPs. The warm-up schedule drives the dense part.
    """
    dense_cfg = cfg.dense
    dense_cfg.validate()

    def make_dense(params: Any) -> torch.optim.Optimizer:
        if dense_cfg.type is DenseOptimizerKind.sgd:
            return torch.optim.SGD(
                params, lr=dense_cfg.lr, momentum=dense_cfg.momentum, weight_decay=dense_cfg.weight_decay
            )
        if dense_cfg.type is DenseOptimizerKind.adam:
            return torch.optim.Adam(params, lr=dense_cfg.lr, weight_decay=dense_cfg.weight_decay)
        return torch.optim.Adagrad(params, lr=dense_cfg.lr, weight_decay=dense_cfg.weight_decay)

    unfused = dict(in_backward_optimizer_filter(dmp.named_parameters()))
    dp_tables = {k: v for k, v in unfused.items() if "embedding_bags" in k}
    dense_params = {k: v for k, v in unfused.items() if k not in dp_tables}
    dense = KeyedOptimizerWrapper(dense_params, make_dense)
    parts: list = [dmp.fused_optimizer, dense]
    if dp_tables:
        table_class, table_kwargs = _embedding_optimizer(cfg.embedding)
        parts.append(KeyedOptimizerWrapper(dp_tables, lambda p: table_class(p, **table_kwargs)))
    optimizer = CombinedOptimizer(parts)
    warmup = dense_cfg.warmup_steps
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        dense, lambda step: min(1.0, (step + 1) / warmup) if warmup else 1.0
    )
    return optimizer, scheduler
