"""The lock-step agreement under serving, on 2 gloo ranks: what it carries and what it agrees.

While the replica can serve, each agreement carries the flag and one sharded size per feature,
and every rank splits with the largest size any rank needs (the expectation: each rank's needs
counted in plain loops over its samples). While nothing can be served (the replica empty,
serving paused) it carries the flag alone and every batch goes whole. Both paths, the per-step
one and the one that agrees every k steps.
"""

from __future__ import annotations

import pytest
import torch

from tests.dist_harness import run_workers
from tests.slipstream._serving_case import FEATURES, REPLICA, SAMPLES, _replica_keys

WORLD = 2
FLAG = 8  # bytes: the one int64 every agreement carries
# Rank 1's batch: a different need per feature than rank 0's SAMPLES.
RANK1 = [
    ([0], [5], [1]),  # servable
    ([4], [0], [3]),  # a=4 is not in the replica
    ([1], [2], [1]),  # b=2 is not
    ([2], [0], [0]),  # c=0 is not
    ([5], [5], [3]),  # a=5 is not
    ([1], [0], [1]),  # servable
]


def _needed(samples):
    """Per feature, the slots a rank needs through the shards: its bags that keep a lookup
    outside the replica, one more for an empty bag if some sample has none there, at most B."""
    out = []
    for f, name in enumerate(FEATURES):
        kept = sum(any(row not in REPLICA[name] for row in s[f]) for s in samples)
        out.append(min(len(samples), kept + (kept < len(samples))))
    return out


AGREED = [max(a, b) for a, b in zip(_needed(SAMPLES), _needed(RANK1))]


def _filled(plan, units, features, index):
    """The replica rebuilt to the case's rows (all ranks: a rebuild is collective)."""
    plan.replica.rebuild(units, _replica_keys(index), features)


def agreement_worker(env, every: int):
    from slipstream_rec.slipstream.lockstep import lockstep
    from slipstream_rec.slipstream.rows import RowIndex
    from slipstream_rec.slipstream.serve.replica import StaleReplica
    from slipstream_rec.slipstream.serve.split import ServePlan
    from slipstream_rec.slipstream.stream import SkippingStream
    from tests.slipstream._serving_case import DIM, ROWS, _batch, _tables, _units

    index = RowIndex(FEATURES, ROWS)
    # table-wise: each rank holds every other table (a rebuild assembles each row from its holder)
    units = [u for i, u in enumerate(_units(_tables())) if i % WORLD == env.rank]
    features = {n: i for i, n in enumerate(FEATURES)}
    plan = ServePlan(StaleReplica(index, DIM, torch.device("cpu")))  # empty: nothing served yet
    batches = [_batch(SAMPLES if env.rank == 0 else RANK1) for _ in range(4)]
    sent = []
    if every == 1:
        agreed = lockstep(iter(batches), every=1, plan=plan, on_agree=sent.append)
    else:
        keep_all = lambda b: (torch.ones(b.batch_size, dtype=torch.bool), torch.ones(b.batch_size))  # noqa: E731
        agreed = lockstep(SkippingStream(iter(batches), len(SAMPLES), keep_all), every=every, plan=plan, on_agree=sent.append)
    seen = []
    for step in range(4):
        if every == 1 and step == 1 or every == 2 and step == 2:
            _filled(plan, units, features, index)  # the stale set's rows, the same on every rank
        if every == 1 and step == 2:
            plan.paused = True  # the lever times a window without serving
        if every == 1 and step == 3:
            plan.paused = False
        out = next(agreed)
        # whole: nothing served and every feature sends all B bags (the stream rebuilds its
        # batches, so the object itself is not compared)
        whole = out.served is None and out.sharded_sizes == [len(SAMPLES)] * len(FEATURES)
        seen.append((whole, None if whole else out.sharded_sizes))
    assert next(agreed, None) is None  # both ranks end together
    return seen, sent


def test_per_step_agreement_carries_sizes_only_while_the_replica_can_serve():
    for seen, sent in run_workers(agreement_worker, WORLD, every=1):
        # empty replica, serving, paused, serving again; then the last agreement (no batch left)
        assert seen == [(True, None), (False, AGREED), (True, None), (False, AGREED)]
        width = FLAG * (1 + len(FEATURES))
        assert sent == [FLAG, width, FLAG, width, width]


def test_agreement_every_k_steps_carries_sizes_only_while_the_replica_can_serve():
    for seen, sent in run_workers(agreement_worker, WORLD, every=2):
        # batches 0-1 agreed with the replica empty, batches 2-3 with it full, then the end
        assert seen == [(True, None), (True, None), (False, AGREED), (False, AGREED)]
        assert sent == [FLAG, FLAG * (1 + 2 * len(FEATURES)), FLAG * (1 + 2 * len(FEATURES))]


@pytest.mark.parametrize("samples", [SAMPLES, RANK1])
def test_the_reference_needs_match_one_rank_on_its_own(samples):
    from slipstream_rec.slipstream.serve.split import ServePlan
    from tests.slipstream._serving_case import _batch, _replica

    replica, _, _ = _replica()
    assert ServePlan(replica).annotate(_batch(samples)) == _needed(samples)
