"""Sharding plan and DistributedModelParallel wrapping."""

from __future__ import annotations

import json
import logging
from dataclasses import replace
from pathlib import Path
from typing import Dict, List, Optional

import torch
import torch.distributed as dist
from torch import nn
from torchrec.distributed.embedding_types import EmbeddingComputeKernel
from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
from torchrec.distributed.model_parallel import DistributedModelParallel
from torchrec.distributed.planner import EmbeddingShardingPlanner
from torchrec.distributed.planner.storage_reservations import FixedPercentageStorageReservation
from torchrec.distributed.planner.types import ParameterConstraints, TopologyFactory
from torchrec.distributed.planner.types import TrainerConfig as PlannerTrainerConfig
from torchrec.distributed.planner.types import KernelConfig
from torchrec.distributed.sharding_plan import _calculate_cw_shard_sizes_and_offsets
from torchrec.distributed.types import CacheParams, ModuleSharder, ShardingPlan
from torchrec.modules.embedding_configs import DataType, EmbeddingBagConfig

from slipstream_rec.sharding.config import (
    AutoTypes,
    ComputeKernel,
    QCommsConfig,
    QCommsPlanning,
    ShardingConfig,
    ShardingKind,
)
from slipstream_rec.sharding.qcomms import check_qcomms, codecs_registry
from slipstream_rec.sharding.qcomms_switch import CommsSwitch, switch_registry
from slipstream_rec.sharding.sharder import (
    SlipstreamEmbeddingBagCollectionSharder,
)

logger = logging.getLogger(__name__)


# What auto allows on CUDA: TorchRec's planner weighs these by memory and cost. Key-value and
# virtual-table kernels are left out: their weights are not tensors Slipstream can snapshot.
_AUTO_CUDA_KERNELS = [EmbeddingComputeKernel.FUSED.value, EmbeddingComputeKernel.FUSED_UVM_CACHING.value]
_CUDA_ONLY = (ComputeKernel.fused_uvm_caching, ComputeKernel.fused_uvm)


def _kernels(kind: ShardingKind, cfg: ShardingConfig, device_type: str) -> Optional[List[str]]:
    """Compute kernels allowed for a table of sharding ``kind``; None: the planner's defaults."""
    # Data-parallel tables are plain nn.EmbeddingBag weights updated by the dense optimizer path.
    if kind is ShardingKind.data_parallel:
        return [EmbeddingComputeKernel.DENSE.value]
    kernel = cfg.compute_kernel
    if kernel is ComputeKernel.dense:
        raise ValueError(
            "sharding.compute_kernel=dense is only for data_parallel tables; use fused (or auto)"
        )
    if kernel in _CUDA_ONLY and device_type != "cuda":
        raise ValueError(
            f"sharding.compute_kernel={kernel.value} keeps rows in host memory behind a GPU: CUDA "
            f"only, and this run is on {device_type}. Use sharding.compute_kernel=fused (or auto)"
        )
    if kernel is ComputeKernel.auto:
        return list(_AUTO_CUDA_KERNELS) if device_type == "cuda" else [EmbeddingComputeKernel.FUSED.value]
    return [kernel.value]


def hot_rows_from_summary(path: str) -> Dict[str, int]:
    """Hot rows per table measured by an earlier run (its summary.json), keyed by table name."""
    try:
        summary = json.loads(Path(path).read_text())
        per_feature = summary["slipstream"]["hot_rows_per_table"] or {}
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ValueError(
            f"sharding.cache_from_summary={path!r}: not a readable summary.json with "
            f"slipstream.hot_rows_per_table ({e}); give the summary of a run with a tracking "
            "policy (track_only, paper, paper_plus), or null"
        ) from None
    # hot_rows_per_table is keyed by feature; one table t_<feature> per feature.
    return {f"t_{feature}": int(n) for feature, n in per_feature.items()}


def cache_load_factors(cfg: ShardingConfig, tables: List[EmbeddingBagConfig]) -> Dict[str, float]:
    """The GPU cache size of each table, as a fraction of its rows (fused_uvm_caching)."""
    if not 0.0 < cfg.cache_load_factor <= 1.0:
        raise ValueError(f"sharding.cache_load_factor={cfg.cache_load_factor} must be in (0, 1]")
    factors = {t.name: float(cfg.cache_load_factor) for t in tables}
    if cfg.cache_from_summary:
        if not cfg.cache_hot_margin >= 1.0:
            raise ValueError(f"sharding.cache_hot_margin={cfg.cache_hot_margin} must be >= 1")
        hot = hot_rows_from_summary(cfg.cache_from_summary)
        for t in tables:
            if t.name in hot:
                rows = hot[t.name] * cfg.cache_hot_margin
                # at least one cache set's worth of rows (FBGEMM's LRU/LFU caches are 32-way)
                factors[t.name] = min(1.0, max(rows, 32.0) / t.num_embeddings)
    return factors


def auto_types(
    cfg: ShardingConfig, device_type: str, table: EmbeddingBagConfig, single_node: bool = False
) -> List[str]:
    """The sharding types ``type: auto`` lets the planner choose from for ``table`` on
    ``device_type``: the kinds this project names (and tests Slipstream's shards on), under
    ``auto_types=torchrec`` only those TorchRec's own sharder offers there. A kind that is
    another one under a second name here is left out (the planner would pick either by the
    process's hash seed, so the plan would change from run to run)."""
    named = {k.value for k in ShardingKind if k is not ShardingKind.auto}
    # TorchRec's sharder leaves the row-wise kinds out on CPU; its planner, offered them there,
    # picks them for the big tables, and the run is slower (docs/performance.md). The sharder's
    # order is kept: the planner breaks ties between equally rated types by it.
    if cfg.auto_types is AutoTypes.all:
        offered = SlipstreamEmbeddingBagCollectionSharder().sharding_types(device_type)
    else:
        offered = EmbeddingBagCollectionSharder().sharding_types(device_type)
    # A table too narrow to split into column shards (TorchRec's default block: MIN_CW_DIM) is
    # table-wise; on one node table_row_wise is row_wise.
    sizes, _ = _calculate_cw_shard_sizes_and_offsets(table.embedding_dim, table.num_embeddings)
    if len(sizes) == 1:
        named.discard(ShardingKind.column_wise.value)
    if single_node:
        named.discard(ShardingKind.table_row_wise.value)
    return [t for t in offered if t in named]


def parameter_constraints(
    cfg: ShardingConfig,
    tables: List[EmbeddingBagConfig],
    device_type: str = "cpu",
    single_node: bool = False,
) -> Dict[str, ParameterConstraints]:
    """Per-table planner constraints that realise ``cfg``: a named type, or auto's types."""
    names = {t.name for t in tables}
    unknown = sorted(set(cfg.table_overrides) - names)
    if unknown:
        raise ValueError(
            f"sharding.table_overrides names unknown tables {unknown}; tables are "
            f"{sorted(names)[:6]}{' ...' if len(names) > 6 else ''}"
        )
    caching = device_type == "cuda" and cfg.compute_kernel in (ComputeKernel.auto, ComputeKernel.fused_uvm_caching)
    factors = cache_load_factors(cfg, tables)
    constraints: Dict[str, ParameterConstraints] = {}
    for table in tables:
        kind = cfg.table_overrides.get(table.name, cfg.type)
        fp16 = table.data_type == DataType.FP16
        if fp16 and kind is ShardingKind.data_parallel:
            raise ValueError(
                f"model.embedding_dtype=fp16 with data_parallel table {table.name}: data-parallel "
                "rows are updated by the dense optimizer in fp16 (NaN measured on CPU). Use "
                "another sharding type for it (sharding.table_overrides) or model.embedding_dtype=fp32"
            )
        min_partition: Optional[int] = None
        if kind is ShardingKind.column_wise and cfg.column_shard_dim:
            if table.embedding_dim % cfg.column_shard_dim:
                raise ValueError(
                    f"sharding.column_shard_dim={cfg.column_shard_dim} does not divide the "
                    f"embedding dim {table.embedding_dim} of {table.name}; pick a divisor"
                )
            min_partition = cfg.column_shard_dim
        if kind is ShardingKind.auto:
            # auto's types with the configured kernel; under auto also data_parallel (dense
            # kernel). fp16 rows update only through FBGEMM's fused kernels, and a forced kernel
            # is every table's: neither goes data_parallel.
            types = auto_types(cfg, device_type, table, single_node)
            kernels = _kernels(kind, cfg, device_type)
            if fp16 or cfg.compute_kernel is not ComputeKernel.auto:
                types = [t for t in types if t != ShardingKind.data_parallel.value]
            else:
                kernels = kernels + [EmbeddingComputeKernel.DENSE.value]
        else:
            types = [kind.value]
            kernels = _kernels(kind, cfg, device_type)
        constraints[table.name] = ParameterConstraints(
            sharding_types=types,
            compute_kernels=kernels,
            min_partition=min_partition,
            cache_params=CacheParams(load_factor=factors[table.name]) if caching else None,
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
    planner = make_planner(cfg, tables, world_size, local_world_size, device.type, batch_size)
    return planner.collective_plan(model, sharders, pg)


def device_hbm_bytes(device_type: str) -> Optional[int]:
    """The GPU memory of this machine's devices (the smallest), for the planner's topology; None
    elsewhere (TorchRec's default). TorchRec assumes 32 GB per GPU: an 80 GB H100 or a 141 GB
    H200 would be planned as if most of its memory were not there."""
    if device_type != "cuda" or not torch.cuda.is_available():
        return None
    return min(torch.cuda.get_device_properties(i).total_memory for i in range(torch.cuda.device_count()))


def make_planner(
    cfg: ShardingConfig,
    tables: List[EmbeddingBagConfig],
    world_size: int,
    local_world_size: int,
    device_type: str,
    batch_size: int,
) -> EmbeddingShardingPlanner:
    """TorchRec's planner for ``cfg`` on a topology of ``device_type`` (no device needed: a CUDA
    topology plans on a CPU-only machine too)."""
    if cfg.hbm_cap_gb < 0:
        raise ValueError(f"sharding.hbm_cap_gb={cfg.hbm_cap_gb} must be >= 0 (0: the default)")
    hbm = int(cfg.hbm_cap_gb * 1024**3) if cfg.hbm_cap_gb else device_hbm_bytes(device_type)
    topology = TopologyFactory.create_topology(
        trainer_config=PlannerTrainerConfig(
            world_size=world_size, local_world_size=local_world_size, hbm_cap_bytes=hbm
        ),
        kernel_config=KernelConfig(compute_device=device_type),
    )
    return EmbeddingShardingPlanner(
        topology=topology,
        batch_size=batch_size,
        storage_reservation=FixedPercentageStorageReservation(cfg.storage_reservation),
        constraints=parameter_constraints(cfg, tables, device_type, local_world_size >= world_size),
        debug=False,
    )


def make_sharders(
    cfg: Optional[ShardingConfig] = None, device_type: str = "cpu", switch: Optional[CommsSwitch] = None
) -> List[ModuleSharder[nn.Module]]:
    """The sharder list DMP builds the sharded modules with (the output dists with the quantized
    comms' codecs, each behind ``switch`` where given: ``sharding.qcomms.when=auto``); the
    planner's is ``planner_sharders``."""
    fused_params = None
    if cfg is not None and cfg.cache_stats and device_type == "cuda":
        # FBGEMM's TBE then counts its GPU cache's lookups and misses (get_uvm_cache_stats).
        fused_params = {"gather_uvm_cache_stats": True}
    registry = codecs_registry(cfg.qcomms) if cfg is not None else None
    if registry is not None and switch is not None:
        registry = switch_registry(registry, switch)
    return [SlipstreamEmbeddingBagCollectionSharder(fused_params=fused_params, qcomm_codecs_registry=registry)]


def planner_sharders(
    cfg: ShardingConfig, sharders: List[ModuleSharder[nn.Module]], device_type: str = "cpu"
) -> List[ModuleSharder[nn.Module]]:
    """The sharders the planner plans with: DMP's ``sharders`` where ``sharding.qcomms.plan_as``
    is quantized (the planner costs the codecs' sizes), else the same sharders without the
    codecs, so that the planner costs fp32 comms and the plan is the one without qcomms. The
    plan names no codec: DMP's sharders then send that plan's collectives through theirs."""
    if cfg.qcomms.plan_as is QCommsPlanning.quantized or not cfg.qcomms.enabled:
        return sharders
    return make_sharders(replace(cfg, qcomms=QCommsConfig()), device_type)


def shard_model(
    model: nn.Module,
    cfg: ShardingConfig,
    tables: List[EmbeddingBagConfig],
    device: torch.device,
    batch_size: int,
    pg: Optional[dist.ProcessGroup] = None,
    switch: Optional[CommsSwitch] = None,
) -> DistributedModelParallel:
    """Plan and wrap ``model`` in DMP, its codecs behind ``switch`` where given. Collective:
    every rank of ``pg`` must call it."""
    pg = pg or dist.GroupMember.WORLD
    assert pg is not None, "init the default process group before sharding"
    world_size = dist.get_world_size(pg)
    local_world_size = int(__import__("os").environ.get("LOCAL_WORLD_SIZE", world_size))
    sharders = make_sharders(cfg, device.type, switch)
    plan = build_plan(
        model, cfg, tables, planner_sharders(cfg, sharders, device.type), world_size,
        local_world_size, device, batch_size, pg,
    )
    check_qcomms(cfg, plan, batch_size)  # the same plan and config on every rank: all or none raise
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
