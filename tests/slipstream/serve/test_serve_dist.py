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

from tests._fixtures import FEATURES, LOCAL_BATCH, ROWS, WORLD
from tests.dist_harness import run_workers
from tests.slipstream._fixtures import _sharded, _source, serve_step_worker

# sharding.type; "mixed": table-wise with f1's and f2's tables data-parallel, so that a compacted
# batch's variable-batch KJT also carries data-parallel features (their whole batch, laid out
# feature-major: two of them, since one feature's layout is the same either way)
KINDS = ["table_wise", "row_wise", "column_wise", "table_row_wise", "data_parallel", "mixed"]


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


@pytest.mark.parametrize("kind", ["row_wise", "mixed"])
def test_a_serve_step_with_an_int8_push_sends_a_byte_a_value_and_equals_an_off_step_within_its_rounding(kind):
    results = run_workers(serve_step_worker, world_size=WORLD, kind=kind, lr=0.5, wire="int8")
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


def reactivation_worker(env, precision: str = "fp32"):
    from slipstream_rec.distributed import gather_varlen
    from slipstream_rec.slipstream.config import Action, Policy, SlipstreamConfig, SyncPrecision
    from slipstream_rec.slipstream.controller import SlipstreamController

    dmp, modules = _sharded("row_wise")
    cfg = SlipstreamConfig(
        policy=Policy.paper_plus, action=Action.serve, count_steps=2, count_fraction=0.5, min_count=1,
        snapshot_interval=2, target_skip_fraction=0.5, max_threshold=0.1, threshold_sample_size=1000,
        lookahead_batches=2, sync_precision=SyncPrecision(precision),
    )  # fmt: skip
    ctl = SlipstreamController(cfg, dmp, FEATURES, ROWS, LOCAL_BATCH, seed=0, rank=env.rank)
    # independent of the server's table: bf16 asked, bf16 on both of serve's collectives
    wire = {"fp32": torch.float32, "bf16": torch.bfloat16, "int8": torch.int8}[precision]
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
        elif precision == "bf16":  # rows that joined arrive rounded to bf16
            assert torch.equal(mine, unit.weights[local].bfloat16().float())
        else:  # int8: each within 1/254 of its row's largest magnitude (row-wise: whole rows)
            theirs = unit.weights[local]
            assert bool(((mine - theirs).abs() <= theirs.abs().amax(1, keepdim=True) / 254 * (1 + 2**-7) * 1.0001).all())
            assert not torch.equal(mine, theirs)  # rounded, not copied

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


@pytest.mark.parametrize("precision", ["fp32", "bf16", "int8"])
def test_the_replica_follows_the_stale_set_and_a_row_that_moves_again_leaves_it(precision):
    results = run_workers(reactivation_worker, world_size=WORLD, precision=precision)
    assert len({r["replica"] for r in results}) == 1
