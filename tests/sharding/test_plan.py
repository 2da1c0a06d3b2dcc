"""Planner constraints and the sharder's sharding types."""

from __future__ import annotations

import pytest
from torchrec.modules.embedding_configs import EmbeddingBagConfig

from slipstream_rec.sharding.config import ShardingConfig, ShardingKind
from slipstream_rec.sharding.plan import parameter_constraints
from slipstream_rec.sharding.sharder import SlipstreamEmbeddingBagCollectionSharder

TABLES = [
    EmbeddingBagConfig(name=f"t_{i}", embedding_dim=16, num_embeddings=100, feature_names=[f"f{i}"])
    for i in range(3)
]


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_sharder_offers_every_type_on_every_device(device):
    types = SlipstreamEmbeddingBagCollectionSharder().sharding_types(device)
    for kind in ShardingKind:
        if kind is not ShardingKind.auto:
            assert kind.value in types, (kind, device)


def test_auto_leaves_the_planner_free():
    assert parameter_constraints(ShardingConfig(), TABLES) == {}


def test_one_type_for_all_tables_with_the_right_kernel():
    c = parameter_constraints(ShardingConfig(type=ShardingKind.row_wise), TABLES)
    assert set(c) == {"t_0", "t_1", "t_2"}
    assert all(v.sharding_types == ["row_wise"] and v.compute_kernels == ["fused"] for v in c.values())
    dp = parameter_constraints(ShardingConfig(type=ShardingKind.data_parallel), TABLES)
    assert all(v.compute_kernels == ["dense"] for v in dp.values())


def test_mixed_plan_by_table_overrides():
    cfg = ShardingConfig(type=ShardingKind.table_wise, table_overrides={"t_1": ShardingKind.row_wise})
    c = parameter_constraints(cfg, TABLES)
    assert [c[t].sharding_types for t in ("t_0", "t_1", "t_2")] == [["table_wise"], ["row_wise"], ["table_wise"]]


def test_unknown_table_override_names_the_key():
    with pytest.raises(ValueError, match="sharding.table_overrides"):
        parameter_constraints(ShardingConfig(table_overrides={"t_9": ShardingKind.row_wise}), TABLES)


def test_column_shard_dim_must_divide_the_embedding_dim():
    cfg = ShardingConfig(type=ShardingKind.column_wise, column_shard_dim=5)
    with pytest.raises(ValueError, match="sharding.column_shard_dim"):
        parameter_constraints(cfg, TABLES)
    ok = parameter_constraints(ShardingConfig(type=ShardingKind.column_wise, column_shard_dim=8), TABLES)
    assert all(v.min_partition == 8 for v in ok.values())
