"""Sharding configuration: one plan type for all tables, or the planner's choice."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Dict


class ShardingKind(Enum):
    """How embedding tables are placed. Names are the override values (``sharding.type=row_wise``)."""

    auto = "auto"  # TorchRec's planner picks per table, by its cost model
    table_wise = "table_wise"  # each table whole on one rank
    row_wise = "row_wise"  # each table's rows split evenly over all ranks
    column_wise = "column_wise"  # each table's columns split into shards placed on ranks
    table_row_wise = "table_row_wise"  # row-wise within a node (== row_wise on one node)
    data_parallel = "data_parallel"  # every table replicated; gradients all-reduced


@dataclass
class ShardingConfig:
    """Sharding plan for the embedding tables (the dense arch is always data parallel, DDP)."""

    # Sharding type for every table: auto, table_wise, row_wise, column_wise, table_row_wise,
    # data_parallel.
    type: ShardingKind = ShardingKind.auto
    # Per-table exceptions, table name -> sharding type, e.g. {t_cat_2: row_wise}. Tables are
    # named t_<feature> (t_cat_0 ... t_cat_25 on Criteo-like data).
    table_overrides: Dict[str, ShardingKind] = field(default_factory=dict)
    # column_wise only: width of each column shard (must divide model.embedding_dim); 0 lets
    # the planner choose (it may keep a table whole).
    column_shard_dim: int = 0
    # Fraction of each device's memory the planner keeps free for activations and buffers.
    storage_reservation: float = 0.15
