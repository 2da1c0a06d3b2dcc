"""Sharding plan and DistributedModelParallel wrapping."""

from __future__ import annotations

import logging
from typing import Dict, List, Optional

import torch
import torch.distributed as dist
from torch import nn
from torchrec.distributed.embedding_types import EmbeddingComputeKernel
from torchrec.distributed.model_parallel import DistributedModelParallel
from torchrec.distributed.planner import EmbeddingShardingPlanner
from torchrec.distributed.planner.storage_reservations import FixedPercentageStorageReservation
from torchrec.distributed.planner.types import ParameterConstraints, TopologyFactory
from torchrec.distributed.planner.types import TrainerConfig as PlannerTrainerConfig
from torchrec.distributed.planner.types import KernelConfig
from torchrec.distributed.types import ModuleSharder, ShardingPlan
from torchrec.modules.embedding_configs import EmbeddingBagConfig

from slipstream_rec.sharding.config import ShardingConfig, ShardingKind
from slipstream_rec.sharding.sharder import SlipstreamEmbeddingBagCollectionSharder

logger = logging.getLogger(__name__)


def _kernels(kind: ShardingKind) -> List[str]:
    # Data-parallel tables are plain nn.EmbeddingBag weights updated by the dense optimizer path;
    # every other type uses FBGEMM's fused TBE with the optimizer applied in backward.
    if kind is ShardingKind.data_parallel:
        return [EmbeddingComputeKernel.DENSE.value]
    return [EmbeddingComputeKernel.FUSED.value]


def parameter_constraints(
    cfg: ShardingConfig, tables: List[EmbeddingBagConfig]
) -> Dict[str, ParameterConstraints]:
    """Per-table planner constraints that realise ``cfg``; empty for a pure ``auto`` plan."""
    names = {t.name for t in tables}
    unknown = sorted(set(cfg.table_overrides) - names)
    if unknown:
        raise ValueError(
            f"sharding.table_overrides names unknown tables {unknown}; tables are "
            f"{sorted(names)[:6]}{' ...' if len(names) > 6 else ''}"
        )
    constraints: Dict[str, ParameterConstraints] = {}
    for table in tables:
        kind = cfg.table_overrides.get(table.name, cfg.type)
        if kind is ShardingKind.auto:
            continue
        min_partition: Optional[int] = None
        if kind is ShardingKind.column_wise and cfg.column_shard_dim:
            if table.embedding_dim % cfg.column_shard_dim:
                raise ValueError(
                    f"sharding.column_shard_dim={cfg.column_shard_dim} does not divide the "
                    f"embedding dim {table.embedding_dim} of {table.name}; pick a divisor"
                )
            min_partition = cfg.column_shard_dim
        constraints[table.name] = ParameterConstraints(
            sharding_types=[kind.value],
            compute_kernels=_kernels(kind),
            min_partition=min_partition,
        )
    return constraints


def build_plan(
    model: nn.Module,
    cfg: ShardingConfig,
    tables: List[EmbeddingBagConfig],
    sharders: List[ModuleSharder[nn.Module]],
    world_size: int,
    local_world_size: int,
    device: torch.device,
    batch_size: int,
    pg: Optional[dist.ProcessGroup] = None,
) -> ShardingPlan:
    """Plan on rank 0 and broadcast (all ranks enter: ``collective_plan`` is a collective)."""
    if not 0.0 <= cfg.storage_reservation < 1.0:
        raise ValueError(
            f"sharding.storage_reservation={cfg.storage_reservation} must be in [0, 1)"
        )
    topology = TopologyFactory.create_topology(
        trainer_config=PlannerTrainerConfig(
            world_size=world_size, local_world_size=local_world_size
        ),
        kernel_config=KernelConfig(compute_device=device.type),
    )
    planner = EmbeddingShardingPlanner(
        topology=topology,
        batch_size=batch_size,
        storage_reservation=FixedPercentageStorageReservation(cfg.storage_reservation),
        constraints=parameter_constraints(cfg, tables),
        debug=False,
    )
    return planner.collective_plan(model, sharders, pg)


def make_sharders() -> List[ModuleSharder[nn.Module]]:
    """The one sharder list given to both the planner and DMP (they must agree)."""
    return [SlipstreamEmbeddingBagCollectionSharder()]


def shard_model(
    model: nn.Module,
    cfg: ShardingConfig,
    tables: List[EmbeddingBagConfig],
    device: torch.device,
    batch_size: int,
    pg: Optional[dist.ProcessGroup] = None,
) -> DistributedModelParallel:
    """Plan and wrap ``model`` in DMP. Collective: every rank of ``pg`` must call it."""
    pg = pg or dist.GroupMember.WORLD
    assert pg is not None, "init the default process group before sharding"
    world_size = dist.get_world_size(pg)
    local_world_size = int(__import__("os").environ.get("LOCAL_WORLD_SIZE", world_size))
    sharders = make_sharders()
    plan = build_plan(
        model, cfg, tables, sharders, world_size, local_world_size, device, batch_size, pg
    )
    return DistributedModelParallel(
        module=model, device=device, plan=plan, sharders=sharders
    )


def describe_plan(dmp: DistributedModelParallel) -> Dict[str, str]:
    """table name -> sharding type actually used; what summary.json reports."""
    out: Dict[str, str] = {}
    for module_plan in dmp.plan.plan.values():
        for table, param_sharding in module_plan.items():  # type: ignore[union-attr]
            out[table] = param_sharding.sharding_type
    return out
