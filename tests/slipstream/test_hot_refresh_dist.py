"""The hot set follows the data (``slipstream.hot_refresh_steps``), on 2 gloo ranks.

The data drifts: the first 3 steps train batch A, every later step batch B (A's ids shifted by
20). Lookups are counted every 2nd step; the hot set is chosen at step 2 (from step 2: A) and
again at step 6 from the window since (steps 4 and 6: B). The expected sets are computed from the
batches themselves: after the refresh the hot set is exactly B's rows, the rows only A looked up
left it, the rows only B looks up joined it; rows in both keep the change the step-6 snapshot
measured, and the new ones have none until a snapshot measures them.
"""

from __future__ import annotations

import torch

from tests._fixtures import FEATURES, LOCAL_BATCH, ROWS, WORLD, _slice_batch
from tests.dist_harness import run_workers

SHIFT = 20


def _shifted(batch):
    from slipstream_rec.data.types import Batch
    from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

    kjt = batch.sparse_features
    parts = torch.split(kjt.values(), kjt.length_per_key())
    values = torch.cat([(p + SHIFT) % rows for p, rows in zip(parts, ROWS)])
    return Batch(batch.dense_features, KeyedJaggedTensor(keys=kjt.keys(), values=values, lengths=kjt.lengths(), stride=kjt.stride()), batch.labels)


def _source(rank):
    for i in range(40):
        half = _slice_batch(rank * LOCAL_BATCH, (rank + 1) * LOCAL_BATCH)
        yield half if i < 3 else _shifted(half)


def refresh_worker(env):
    from slipstream_rec.slipstream.config import Policy, SlipstreamConfig
    from slipstream_rec.slipstream.controller import SlipstreamController
    from slipstream_rec.slipstream.rows import RowIndex
    from tests.slipstream._fixtures import _sharded

    dmp, _ = _sharded("row_wise")
    cfg = SlipstreamConfig(
        policy=Policy.track_only, count_steps=2, count_fraction=0.5, min_count=1, snapshot_interval=2,
        hot_refresh_steps=4, threshold_sample_size=1000, lookahead_batches=2,
    )  # fmt: skip
    ctl = SlipstreamController(cfg, dmp, FEATURES, ROWS, LOCAL_BATCH, seed=0, rank=env.rank)
    stream = ctl.wrap(_source(env.rank))
    index = RowIndex(FEATURES, ROWS)
    whole = _slice_batch(0, WORLD * LOCAL_BATCH)
    a = set(index.flat_keys(whole.sparse_features).tolist())
    b = set(index.flat_keys(_shifted(whole).sparse_features).tolist())
    records = {}
    for n in range(1, 9):
        loss, _ = dmp(next(stream))
        loss.backward()
        records[n] = dict(ctl.on_step_end(n)).get("slipstream")
        if n == 6:  # right after the refresh
            kept = torch.isfinite(ctl.row_state.changes_of(torch.tensor(sorted(a & b))))
            new = torch.isfinite(ctl.row_state.changes_of(torch.tensor(sorted(b - a))))
            assert bool(kept.all()) and not bool(new.any())
            assert ctl.row_state.num_hot == len(a & b)
    assert records[2]["hot_rows"] == len(a)
    turnover = records[6]["hot_turnover"]
    assert turnover == {"step": 6, "hot_rows": len(b), "joined": len(b - a), "left": len(a - b)}, turnover
    assert set(ctl.tracker.hot_keys.tolist()) == b
    assert records[10 - 2] is not None and "hot_turnover" not in records[8]  # next refresh: step 10
    return {"turnover": turnover, "kept": sorted(a & b), "new": sorted(b - a)}


def test_the_hot_set_is_chosen_again_from_the_last_window():
    results = run_workers(refresh_worker, world_size=WORLD)
    assert results[0] == results[1]  # the same decision on every rank
    assert results[0]["turnover"]["joined"] > 0 and results[0]["turnover"]["left"] > 0
