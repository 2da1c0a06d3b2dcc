"""Serving on 2 gloo ranks: one training step of ``serve`` equals one of ``off``, on every sharding type.

Two copies of the same DLRM are sharded the same way and loaded with the same weights: ``off``
trains one global batch through the shards; ``serve`` first copies a set of rows into the local
replica (a collective: the values must come from every rank's shards), splits each rank's half of
the batch's lookups between the shards and the replica (every lookup of a replica row is served;
the ranks agree on the sharded slots per feature in ``lockstep``), trains it, pushes the served
lookups' row gradients through the shards and steps.

The expectations come from ``off`` on the unsplit batch, and from the reference weights:
- the replica holds exactly the reference rows it was given;
- every rank's sharded size of each feature is the largest number of its bags with a lookup
  outside the replica on any rank, plus one empty bag (counted here in plain loops), and the
  whole batch for a data-parallel feature;
- logits equal ``off``'s sample by sample (nothing is reordered), and the dense gradients equal
  ``off``'s (the loss is a mean over the same samples);
- with SGD (linear, stateless), one step of the shard gradient in backward plus the pushed sum of
  the served gradient moves every row exactly as ``off``'s single step does; with the tables'
  learning rate 0 nothing moves at all (the issue's "rows that do not change").
"""

from __future__ import annotations

import pytest
import torch

from tests.dist_harness import run_workers
from tests.sharding.test_equivalence import FEATURES, LOCAL_BATCH, ROWS, WORLD, _slice_batch

# sharding.type; "mixed": table-wise with f1's and f2's tables data-parallel, so that a compacted
# batch's variable-batch KJT also carries data-parallel features (their whole batch, laid out
# feature-major: two of them, since one feature's layout is the same either way)
KINDS = ["table_wise", "row_wise", "column_wise", "table_row_wise", "data_parallel", "mixed"]
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
    from slipstream_rec.distributed import gather_varlen
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
    sent = grads.push(ebc.units, {f: i for i, f in enumerate(FEATURES)})  # all ranks
    serve_opt.step()
    # what the push sent to other ranks: each row's key and its values at the wire's width
    off_rank = sum(int(m.sum()) for r, m in enumerate(grads.owners.masks(pushed)) if r != env.rank)
    assert sent == off_rank * (8 + DIM * (4 if wire == "fp32" else 2)), (sent, off_rank)

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
            else:  # SGD: the pushed part of each row's step rounded to bf16 (2^-8 of it at most)
                torch.testing.assert_close(mine - start, theirs - start, rtol=2**-7, atol=1e-6)
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


@pytest.mark.parametrize("kind", KINDS)
def test_a_serve_step_equals_an_off_step(kind):
    results = run_workers(serve_step_worker, world_size=WORLD, kind=kind, lr=0.5)
    assert len({r["sharded"] for r in results}) == 1, results  # one agreed size on every rank
    assert sum(r["served"] for r in results) > 0, "the batch must serve something to test serving"
    if kind != "data_parallel":
        assert min(results[0]["sharded"]) < LOCAL_BATCH, "the sharded part must be compacted to test packing"
        assert len(set(results[0]["sharded"])) > 1, "features of their own sizes, to test the layout"
    # compacted: TorchRec's variable-batch layout on every rank (data-parallel: whole batches)
    assert all(r["variable"] == (kind != "data_parallel") for r in results), results


@pytest.mark.parametrize("kind", ["row_wise", "mixed"])
def test_a_serve_step_with_a_bf16_push_sends_half_the_values_and_equals_an_off_step_within_its_rounding(kind):
    results = run_workers(serve_step_worker, world_size=WORLD, kind=kind, lr=0.5, wire="bf16")
    assert sum(r["moved"] for r in results) > 0 and sum(r["sent"] for r in results) > 0, results


@pytest.mark.parametrize("kind", KINDS)
def test_a_serve_step_of_whole_batches_keeps_the_plain_layout_and_equals_an_off_step(kind):
    results = run_workers(serve_step_worker, world_size=WORLD, kind=kind, lr=0.5, every=WORLD * LOCAL_BATCH)
    assert all(r["sharded"] == (LOCAL_BATCH,) * len(FEATURES) for r in results), results
    assert results[0]["served"] > 0, "rank 0 must serve something to test serving in the plain layout"
    assert not any(r["variable"] for r in results), results


def test_with_frozen_tables_serving_changes_no_row():
    results = run_workers(serve_step_worker, world_size=WORLD, kind="table_wise", lr=0.0)
    assert all(r["moved"] == 0 for r in results)
    assert sum(r["served"] for r in results) > 0


def _source(rank: int, batches: int = 40):
    for _ in range(batches):
        yield _slice_batch(rank * LOCAL_BATCH, (rank + 1) * LOCAL_BATCH)


def reactivation_worker(env, precision: str = "fp32"):
    from slipstream_rec.distributed import gather_varlen
    from slipstream_rec.slipstream.config import Action, Policy, SlipstreamConfig, SyncPrecision
    from slipstream_rec.slipstream.controller import SlipstreamController
    from tests.slipstream.test_tracking_dist import _sharded

    dmp, modules = _sharded("row_wise")
    cfg = SlipstreamConfig(
        policy=Policy.paper_plus, action=Action.serve, count_steps=2, count_fraction=0.5, min_count=1,
        snapshot_interval=2, target_skip_fraction=0.5, max_threshold=0.1, threshold_sample_size=1000,
        lookahead_batches=2, sync_precision=SyncPrecision(precision),
    )  # fmt: skip
    ctl = SlipstreamController(cfg, dmp, FEATURES, ROWS, LOCAL_BATCH, seed=0, rank=env.rank)
    # independent of the server's table: bf16 asked, bf16 on both of serve's collectives
    wire = torch.bfloat16 if precision == "bf16" else torch.float32
    assert ctl.server.replica.wire_dtype is wire and ctl.server.grads.wire_dtype is wire
    stream = ctl.wrap(_source(env.rank))

    def step(n):
        batch = next(stream)
        loss, _ = dmp(batch)
        loss.backward()
        ctl.on_backward(dmp.module)
        return dict(ctl.on_step_end(n)).get("slipstream"), batch

    for n in (1, 2, 3):
        step(n)
    assert ctl.server.replica.rows == 0  # one snapshot: no change measured, nothing stale yet
    record, _ = step(4)
    stale = ctl.row_state.stale_keys(ctl.threshold.value)
    assert stale.numel() > 0 and torch.equal(ctl.server.replica.keys, stale)  # the replica is the stale set
    assert record["replica_rows"] == stale.numel()
    # every rank holds the same values, and they are the rows of this rank's shards
    values = ctl.server.replica.values
    assert torch.equal(gather_varlen(values.view(-1)), values.view(-1).repeat(WORLD))
    for unit in modules[0].units:
        first = int(ctl.index.offsets[FEATURES.index(unit.feature)]) + unit.row_offset
        pos = ((ctl.server.replica.keys >= first) & (ctl.server.replica.keys < first + unit.rows)).nonzero().view(-1)
        local = ctl.server.replica.keys[pos] - first
        mine = values[pos][:, unit.col_offset : unit.col_offset + unit.cols]
        if precision == "fp32":
            torch.testing.assert_close(mine, unit.weights[local])
        else:  # rows that joined arrive rounded to bf16
            assert torch.equal(mine, unit.weights[local].bfloat16().float())

    _, batch5 = step(5)
    assert batch5.served is not None and ctl.server.plan.lookups_served > 0
    # f0's hot rows move a lot before the next snapshot: they leave the replica (re-activation)
    f0 = ctl.index.to_flat(0, torch.arange(ROWS[0]))
    in_replica = torch.isin(ctl.server.replica.keys, f0)
    assert bool(in_replica.any()), "some of f0's rows are served before they move"
    with torch.no_grad():
        for unit in modules[0].units:
            if unit.feature == "f0" and unit.hot_rows is not None and unit.hot_rows.numel():
                unit.weights[unit.hot_rows, 0] += 0.5
    record, _ = step(6)
    assert not bool(torch.isin(ctl.server.replica.keys, f0).any())
    assert record["replica_left"] >= int(in_replica.sum())
    return {"served": ctl.server.plan.lookups_served, "replica": ctl.server.replica.rows}


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_the_replica_follows_the_stale_set_and_a_row_that_moves_again_leaves_it(precision):
    results = run_workers(reactivation_worker, world_size=WORLD, precision=precision)
    assert len({r["replica"] for r in results}) == 1
