"""The project's model on the meta device for the planner, and the clicklog tables planned on 2
ranks: shared by the plan tests and the subprocesses they start under other hash seeds."""

from __future__ import annotations

from typing import List

from slipstream_rec.sharding.config import AutoTypes, ShardingConfig

# The rows of data=clicklog's 26 tables: big and small tables, where TorchRec's planner, offered
# the row-wise kinds on CPU, picks them for the big ones.
CLICKLOG_ROWS = [100000, 200, 60, 3000, 6, 14, 26, 8, 40, 51200, 35806, 8000, 2000, 120, 6, 18,
                 25000, 10000, 40, 54943, 2, 24, 7, 10, 6, 500]  # fmt: skip


def meta_model(rows: List[int], device: str = "meta"):
    """The project's DLRM (dim 16, one table per feature of ``rows`` rows) on the meta device
    (or ``device``), its optimizer fused as in training, and its table configs: what the planner
    plans."""
    import torch
    from slipstream_rec.model.config import ModelConfig
    from slipstream_rec.model.dlrm import build_model, embedding_bag_configs
    from slipstream_rec.optim import EmbeddingOptimConfig, fuse_embedding_optimizer

    feats = [f"f{i}" for i in range(len(rows))]
    model_cfg = ModelConfig(embedding_dim=16)
    model = build_model(model_cfg, 13, feats, rows, torch.device(device))
    fuse_embedding_optimizer(model, EmbeddingOptimConfig())
    return model, embedding_bag_configs(model_cfg, feats, rows)


def clicklog_plan(auto_types: str = "torchrec", local_world_size: int = 1) -> dict:
    """Our planner's plan of the clicklog tables on 2 ranks: table -> (type, ranks)."""
    from slipstream_rec.sharding.plan import make_planner, make_sharders

    model, tables = meta_model(CLICKLOG_ROWS)
    cfg = ShardingConfig(auto_types=AutoTypes(auto_types))
    plan = make_planner(cfg, tables, 2, local_world_size, "cpu", 2048).plan(model, make_sharders(cfg))
    return {t: (ps.sharding_type, ps.ranks) for mp in plan.plan.values() for t, ps in mp.items()}
