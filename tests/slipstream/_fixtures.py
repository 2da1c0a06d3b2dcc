"""What the 2-rank slipstream tests share: the sharded model, the batch stream and one serve step.

``serve_step_worker`` (a spawn target, so at module level) trains one global batch with ``off``
and with ``serve`` and checks them against each other; tests/slipstream/serve/test_serve_dist.py says
what it expects and why, and tests/slipstream/serve/test_routing_dist.py runs it to record which
process group each collective takes.
"""

from __future__ import annotations

import torch

from tests._fixtures import FEATURES, LOCAL_BATCH, ROWS, WORLD, _slice_batch


def _sharded(kind: str):
    """The 2-rank DLRM with fused SGD tables, sharded as ``kind``: (the DMP, its slipstream EBCs)."""
    from slipstream_rec.model.config import ModelConfig
    from slipstream_rec.model.dlrm import build_model, embedding_bag_configs
    from slipstream_rec.optim import EmbeddingOptimConfig, EmbeddingOptimizerKind, fuse_embedding_optimizer
    from slipstream_rec.sharding.config import ShardingConfig, ShardingKind
    from slipstream_rec.sharding.plan import shard_model
    from slipstream_rec.sharding.sharded import SlipstreamShardedEBC

    cfg = ModelConfig(embedding_dim=8, dense_arch_layer_sizes=[16, 8], over_arch_layer_sizes=[16, 1])
    cpu = torch.device("cpu")
    model = build_model(cfg, 13, FEATURES, ROWS, cpu)
    fuse_embedding_optimizer(model, EmbeddingOptimConfig(type=EmbeddingOptimizerKind.sgd, lr=0.1))
    sharding = ShardingConfig(type=ShardingKind[kind], column_shard_dim=4)
    dmp = shard_model(model, sharding, embedding_bag_configs(cfg, FEATURES, ROWS), cpu, LOCAL_BATCH)
    modules = [m for m in dmp.modules() if isinstance(m, SlipstreamShardedEBC)]
    assert len(modules) == 1
    return dmp, modules


def _source(rank: int, batches: int = 40):
    # Every batch is the rank's half of the fixed global batch: the look-ahead holds the same
    # samples that were counted, so every sampled input is hot.
    for _ in range(batches):
        yield _slice_batch(rank * LOCAL_BATCH, (rank + 1) * LOCAL_BATCH)


# sharding.type "mixed" of test_serve_dist.py: table-wise with these features' tables data-parallel
DATA_PARALLEL_IN_MIXED = ("f1", "f2")
DIM = 8


def _models(kind: str, lr: float):
    from torchrec.optim.apply_optimizer_in_backward import apply_optimizer_in_backward

    from slipstream_rec.model.config import ModelConfig
    from slipstream_rec.model.dlrm import build_model, embedding_bag_configs
    from slipstream_rec.optim import (
        DenseOptimConfig, DenseOptimizerKind, EmbeddingOptimConfig, EmbeddingOptimizerKind, OptimConfig,
        build_optimizer,
    )  # fmt: skip
    from slipstream_rec.sharding.config import ShardingConfig, ShardingKind
    from slipstream_rec.sharding.plan import describe_plan, shard_model
    from slipstream_rec.sharding.state import load_full_state_dict
    from slipstream_rec.sharding.sharded import SlipstreamShardedEBC

    cfg = ModelConfig(embedding_dim=DIM, dense_arch_layer_sizes=[16, DIM], over_arch_layer_sizes=[16, 1])
    cpu = torch.device("cpu")
    torch.manual_seed(0)  # the same reference on every rank
    ref = build_model(cfg, 13, FEATURES, ROWS, cpu, embedding_device=cpu)
    full = {k: v.detach().clone() for k, v in ref.state_dict().items()}
    # SGD everywhere; data-parallel tables step in optimizer.step() with optim.embedding's lr.
    optim_cfg = OptimConfig(
        embedding=EmbeddingOptimConfig(type=EmbeddingOptimizerKind.sgd, lr=lr),
        dense=DenseOptimConfig(type=DenseOptimizerKind.sgd, lr=0.1),
    )
    out = []
    for _ in ("off", "serve"):
        model = build_model(cfg, 13, FEATURES, ROWS, cpu)
        tables = [p for n, p in model.named_parameters() if "embedding_bags" in n]
        apply_optimizer_in_backward(torch.optim.SGD, tables, {"lr": lr})  # lr 0 allowed here
        if kind == "mixed":
            overrides = {f"t_{f}": ShardingKind.data_parallel for f in DATA_PARALLEL_IN_MIXED}
            sharding = ShardingConfig(type=ShardingKind.table_wise, table_overrides=overrides)
        else:
            sharding = ShardingConfig(type=ShardingKind[kind], column_shard_dim=4)
        dmp = shard_model(model, sharding, embedding_bag_configs(cfg, FEATURES, ROWS), cpu, LOCAL_BATCH)
        expected = {"table_wise", "data_parallel"} if kind == "mixed" else {kind}
        assert set(describe_plan(dmp).values()) == expected
        load_full_state_dict(dmp, full)
        optimizer, _ = build_optimizer(dmp, optim_cfg)
        ebc = [m for m in dmp.modules() if isinstance(m, SlipstreamShardedEBC)]
        out.append((dmp, optimizer, ebc[0] if ebc else None))
    return full, out


def _replica_keys(index, every: int):
    # Every row that every ``every``-th sample of the global batch looks up. Every 4th: each
    # rank's half then has two servable samples (at least; others may be servable by chance), and
    # the rest need the shards. Only sample 0 (every = the global batch): its rank needs every
    # feature's whole batch still (one sample served, and one empty bag for it), so every rank
    # sends whole batches and some of rank 0's lookups are served all the same.
    from slipstream_rec.data.batch_ops import select_kjt

    whole = _slice_batch(0, WORLD * LOCAL_BATCH).sparse_features
    return torch.unique(index.flat_keys(select_kjt(whole, torch.arange(0, WORLD * LOCAL_BATCH, every))))


def serve_step_worker(env, kind: str, lr: float, every: int = 4, wire: str = "fp32"):
    from slipstream_rec.distributed import all_reduce_, gather_varlen
    from slipstream_rec.slipstream.lockstep import lockstep
    from slipstream_rec.slipstream.serve.push import ServedGradients
    from slipstream_rec.slipstream.serve.replica import StaleReplica
    from slipstream_rec.slipstream.rows import RowIndex
    from slipstream_rec.slipstream.serve.split import ServePlan
    from slipstream_rec.slipstream.config import SyncPrecision
    from slipstream_rec.slipstream.serve.server import WIRE_DTYPES

    full, ((off, off_opt, _), (serve, serve_opt, ebc)) = _models(kind, lr)
    index = RowIndex(FEATURES, ROWS)
    replica = StaleReplica(index, DIM, torch.device("cpu"))
    keys = _replica_keys(index, every)
    replica.rebuild(ebc.units, keys, {f: i for i, f in enumerate(FEATURES)})  # all ranks
    assert torch.equal(replica.keys, keys)
    feature, rows = index.from_flat(keys)
    for f, name in enumerate(FEATURES):
        expected = full[f"model.sparse_arch.embedding_bag_collection.embedding_bags.t_{name}.weight"]
        torch.testing.assert_close(replica.values[feature == f], expected[rows[feature == f]], rtol=0, atol=0)

    lo, hi = env.rank * LOCAL_BATCH, (env.rank + 1) * LOCAL_BATCH
    batch = _slice_batch(lo, hi)
    in_replica = set(keys.tolist())
    kjt = batch.sparse_features
    flat = index.flat_keys(kjt).tolist()
    lengths = kjt.lengths().tolist()
    needed, served_lookups, at = [], 0, 0
    replicated = [kind == "data_parallel" or (kind == "mixed" and f in DATA_PARALLEL_IN_MIXED) for f in FEATURES]
    for f in range(len(FEATURES)):  # plain loops: bags of f with a lookup outside the replica
        sent = 0
        for i in range(LOCAL_BATCH):
            bag = flat[at : at + lengths[f * LOCAL_BATCH + i]]
            at += len(bag)
            sent += any(k not in in_replica for k in bag)
            served_lookups += sum(k in in_replica for k in bag)
        needed.append(LOCAL_BATCH if replicated[f] else min(LOCAL_BATCH, sent + 1))
    if served_lookups == 0:  # a rank that serves nothing sends its whole batch (no empty bag)
        needed = [LOCAL_BATCH] * len(FEATURES)
    plan = ServePlan(replica, replicated)
    ebc.use_variable_batch()  # what the server does before the first batch
    # a whole batch first, as in the warm-up: the plain layout's dists, then the other one's
    plain_logits = serve(batch)[1][1].detach()
    split = next(lockstep(iter([_slice_batch(lo, hi)]), plan=plan))  # all ranks: the agreement
    sizes = gather_varlen(torch.tensor(split.sharded_sizes + needed)).view(WORLD, 2, -1)
    assert split.sharded_sizes == sizes[:, 1].max(0).values.tolist(), sizes  # every rank: the MAX
    assert split.batch_size == LOCAL_BATCH and plan.lookups_served == served_lookups

    # off on the unsplit batch
    off_opt.zero_grad()
    loss, (_, off_logits, _, _) = off(batch)
    loss.backward()
    off_opt.step()
    # serve on the split batch, then the push, then the step
    serve_opt.zero_grad()
    loss, (_, logits, labels, _) = serve(split)
    loss.backward()
    grads = ServedGradients(index, DIM, wire_dtype=WIRE_DTYPES[SyncPrecision(wire)])
    served = serve.module.take_served()
    assert (served is not None) == (served_lookups > 0)
    if served is not None:
        assert served[1].grad is not None
        grads.add(*[served[0], served[1].grad])
    pushed = grads.keys.clone()
    # the largest pushed value on any rank: an int8 row is within 1/254 of its largest element
    mine = torch.cat([grads.grads.abs().reshape(-1), torch.zeros(1)]).max().view(1)  # a rank may serve nothing
    largest = all_reduce_(mine, torch.distributed.ReduceOp.MAX).item()
    sent = grads.push(ebc.units, {f: i for i, f in enumerate(FEATURES)})  # all ranks
    serve_opt.step()
    # what the push sent to other ranks: each row's key and its values at the wire's width
    off_rank = sum(int(m.sum()) for r, m in enumerate(grads.owners.masks(pushed)) if r != env.rank)
    row_bytes = {"fp32": DIM * 4, "bf16": DIM * 2, "int8": DIM + 2}[wire]  # int8: a byte a value, a bf16 scale
    assert sent == off_rank * (4 + row_bytes), (sent, off_rank)  # int32 keys

    torch.testing.assert_close(logits, off_logits, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(plain_logits, off_logits.detach(), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(labels, batch.labels)
    off_params = dict(off.named_parameters())
    dense = 0
    for name, param in serve.named_parameters():
        if "embedding_bags" not in name:
            torch.testing.assert_close(param.grad, off_params[name].grad, rtol=1e-4, atol=1e-6)
            dense += 1
    assert dense > 0
    # Every table, shard by shard: serve's rows equal off's; count the rows that moved at all.
    off_state, moved, checked = off.state_dict(), 0, 0
    for key, value in serve.state_dict().items():
        if "embedding_bags" not in key:
            continue
        for mine, theirs, start in _shards(value, off_state[key], full[key]):
            if wire == "fp32":
                torch.testing.assert_close(mine, theirs, rtol=1e-5, atol=1e-6)
            elif wire == "bf16":  # SGD: the pushed part of each row's step rounded to bf16 (2^-8 of it at most)
                torch.testing.assert_close(mine - start, theirs - start, rtol=2**-7, atol=1e-6)
            else:  # SGD: each rank's pushed sums within 1/254 (x 1 + 2^-7, the bf16 scale) of their largest, averaged
                torch.testing.assert_close(mine - start, theirs - start, rtol=0, atol=lr * largest / 254 * (1 + 2**-7) + 1e-6)
            moved += int((mine != start).any(dim=1).sum())
            checked += mine.shape[0]
    assert checked > 0
    return {
        "sharded": tuple(split.sharded_sizes), "served": served_lookups, "moved": moved,
        "variable": split.sparse_features.variable_stride_per_key(), "sent": sent,
    }  # fmt: skip


def _shards(serve_value, off_value, full_value):
    """(serve's local tensor, off's, the reference slice) for each local shard of one table."""
    if not hasattr(serve_value, "local_shards"):  # data-parallel: a plain replicated tensor
        return [(serve_value, off_value, full_value)]
    out = []
    for mine, theirs in zip(serve_value.local_shards(), off_value.local_shards()):
        meta = mine.metadata
        sl = tuple(slice(o, o + n) for o, n in zip(meta.shard_offsets, meta.shard_sizes))
        out.append((mine.tensor, theirs.tensor, full_value[sl]))
    return out
