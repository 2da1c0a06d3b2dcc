"""Sharded forward/backward on one batch equals an unsharded reference, for every sharding type.

Two gloo processes each take half of one global batch. The reference is the same DLRM, unsharded,
on the whole batch. TorchRec semantics that the expectations encode:
- logits are per sample, so each rank's logits equal the reference's rows for its half;
- dense gradients are averaged by DDP: grad = reference grad of the sum of per-rank mean losses / W;
- table gradients are averaged too: the output all-to-all's backward adds the ranks'
  contributions and TorchRec's gradient division divides by W (data-parallel tables are DDP
  parameters), so one fused SGD step moves a row by lr * (reference grad / W).
"""

from __future__ import annotations

import pytest
import torch

from tests._fixtures import FEATURES, LOCAL_BATCH, LR, ROWS, WORLD, _slice_batch, reference_and_rank_model
from tests.dist_harness import run_workers


def equivalence_worker(env, kind: str):
    from slipstream_rec.model.dlrm import embedding_bag_configs
    from slipstream_rec.optim import (
        EmbeddingOptimConfig,
        EmbeddingOptimizerKind,
        OptimConfig,
        build_optimizer,
        fuse_embedding_optimizer,
    )
    from slipstream_rec.sharding.config import ShardingConfig, ShardingKind
    from slipstream_rec.sharding.plan import describe_plan, shard_model
    from slipstream_rec.sharding.state import load_full_state_dict

    cpu = torch.device("cpu")
    cfg, ref, full, model = reference_and_rank_model(env.rank)
    optim_cfg = OptimConfig(embedding=EmbeddingOptimConfig(type=EmbeddingOptimizerKind.sgd, lr=LR))
    fuse_embedding_optimizer(model, optim_cfg.embedding)
    sharding = ShardingConfig(type=ShardingKind[kind], column_shard_dim=4)
    dmp = shard_model(model, sharding, embedding_bag_configs(cfg, FEATURES, ROWS), cpu, LOCAL_BATCH)
    plan = describe_plan(dmp)
    if kind != "auto":
        assert set(plan.values()) == {kind}, plan
    load_full_state_dict(dmp, full)
    optimizer, _ = build_optimizer(dmp, optim_cfg)

    lo, hi = env.rank * LOCAL_BATCH, (env.rank + 1) * LOCAL_BATCH
    loss, (_, logits, _, _) = dmp(_slice_batch(lo, hi))
    loss.backward()
    optimizer.step()  # fused tables were updated in backward; data-parallel tables step here

    # Reference: the sum over ranks of each rank's mean loss, on the whole batch.
    ref_logits = []
    ref_loss = torch.zeros(())
    for r in range(WORLD):
        r_loss, (_, r_logits, _, _) = ref(_slice_batch(r * LOCAL_BATCH, (r + 1) * LOCAL_BATCH))
        ref_loss = ref_loss + r_loss
        ref_logits.append(r_logits)
    ref_loss.backward()

    torch.testing.assert_close(logits, ref_logits[env.rank], rtol=1e-5, atol=1e-5)

    ref_params = dict(ref.named_parameters())
    checked_dense = 0
    for name, param in dmp.named_parameters():
        if "embedding_bags" in name:
            continue
        ref_name = next(n for n in ref_params if name.endswith(n))
        torch.testing.assert_close(param.grad, ref_params[ref_name].grad / WORLD, rtol=1e-4, atol=1e-6)
        checked_dense += 1
    assert checked_dense == len([n for n in ref_params if "embedding_bags" not in n])

    # Tables after one SGD step, fused or not: every row moved by lr * (reference grad / W).
    checked_rows = 0
    for key, value in dmp.state_dict().items():
        if "embedding_bags" not in key:
            continue
        grad = ref_params[key].grad
        expected = full[key] - LR * grad / WORLD
        if hasattr(value, "local_shards"):
            for shard in value.local_shards():
                sl = tuple(slice(o, o + s) for o, s in zip(shard.metadata.shard_offsets, shard.metadata.shard_sizes))
                torch.testing.assert_close(shard.tensor, expected[sl], rtol=1e-5, atol=1e-6)
                checked_rows += shard.tensor.shape[0]
        else:
            torch.testing.assert_close(value, expected, rtol=1e-5, atol=1e-6)
            checked_rows += value.shape[0]
    return plan, checked_rows


@pytest.mark.parametrize(
    "kind", ["table_wise", "row_wise", "column_wise", "table_row_wise", "data_parallel", "auto"]
)
def test_sharded_step_matches_unsharded_reference(kind):
    results = run_workers(equivalence_worker, WORLD, kind=kind)
    plans = [plan for plan, _ in results]
    assert plans[0] == plans[1], "ranks disagree on the plan"
    rows = sum(n for _, n in results)
    if kind in ("row_wise", "table_row_wise", "table_wise"):
        assert rows == sum(ROWS), "every row must live on exactly one rank"
    if kind == "data_parallel":
        assert rows == WORLD * sum(ROWS), "every rank holds every row"
