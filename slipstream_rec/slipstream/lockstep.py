"""Keeping all ranks on the same step while Slipstream skips different numbers of samples on each.

Every rank's stream emits constant-size batches, but a rank that skips more runs out of data
first; the others would then wait in the next all-to-all until the timeout. ``lockstep`` makes
all ranks stop together, agreeing every step or, from batches built ahead, every k steps.
"""

from __future__ import annotations

from typing import Any, Callable, Iterator, List, Optional

import torch
import torch.distributed as dist

from slipstream_rec.data.types import Batch
from slipstream_rec.distributed import all_reduce_
from slipstream_rec.slipstream.serve.split import ServePlan

__all__ = ["lockstep"]


def lockstep(
    batches: Iterator[Batch],
    on_drop: Any = None,
    every: int = 1,
    plan: Optional[ServePlan] = None,
    on_agree: Optional[Callable[[int], None]] = None,
) -> Iterator[Batch]:
    """Yield while EVERY rank still has a batch; stop on all ranks together; split each batch
    between the shards and the local replica the same way on every rank.

    Collective: all ranks enter one MIN all-reduce per agreement. Without it, a rank whose stream
    ran dry first would leave the others waiting in the next all-to-all until the timeout. Under
    serving the same all-reduce carries, negated, the slots each feature needs through the shards
    on each rank (``ServePlan.annotate``), so every rank learns each feature's sharded size S_f
    of each batch (the MAX) with no extra collective; while nothing can be served (no replica,
    serving paused or stood down, an empty replica: ``ServePlan.width``) it carries only the
    flag and every S_f is the batch size.

    ``every`` = 1: one agreement per batch. ``every`` = k > 1 (``batches`` must be a
    ``SkippingStream``): each rank builds its next k batches ahead (``prepare``), the ranks agree
    on the fewest any of them holds, n, and all hand out n batches with no further collective.
    A rank that runs out holds fewer than k, so it says so k steps ahead; n < k means the last
    agreement: every rank stops after those n and drops what it built beyond them. The
    agreement falls on the same steps in an interrupted and resumed run (``agreed_ahead`` and
    ``agreed_shard`` are part of the stream's checkpoint). ``on_agree`` is told the bytes this
    rank gave to each agreement's all-reduce (the byte meter's ``control``).
    """
    count = on_agree if on_agree is not None else (lambda _n: None)
    plan = plan if plan is not None else ServePlan()
    world = dist.get_world_size() if dist.is_initialized() else 1
    if every < 1:
        raise ValueError(f"trainer.lockstep_every_steps={every} must be >= 1 (1: agree every step)")
    if every > 1 and world > 1:
        yield from _lockstep_ahead(batches, on_drop, every, plan, count)
        return
    while True:
        batch = next(batches, None)
        width = plan.width  # sizes agreed for this batch: one per feature while serving can, else none
        needed = [0] * width if batch is None else plan.annotate(batch)[:width]
        if world > 1:
            flag = torch.tensor([0 if batch is None else 1] + [-x for x in needed], dtype=torch.int64)
            all_reduce_(flag, dist.ReduceOp.MIN)  # all ranks, every step
            count(flag.numel() * flag.element_size())
            everyone, sharded = bool(flag[0].item()), [-int(x) for x in flag[1:].tolist()]
        else:
            everyone, sharded = batch is not None, needed
        if not everyone:
            if batch is not None and on_drop is not None:
                on_drop(batch.batch_size)
            return
        assert batch is not None
        yield plan.split(batch, sharded or _whole(batch))


def _whole(batch: Batch) -> List[int]:
    """Every feature's slots when nothing is agreed (no replica): the whole batch."""
    return [batch.batch_size] * len(batch.sparse_features.keys())


def _lockstep_ahead(
    stream: Any, on_drop: Any, every: int, plan: ServePlan, count: Callable[[int], None]
) -> Iterator[Batch]:
    """``lockstep`` with one agreement every ``every`` batches (see there)."""
    assert hasattr(stream, "prepare"), "lockstep every k > 1 steps needs a SkippingStream"
    while True:
        if stream.agreed_ahead == 0:
            if stream.agreed_last:  # the previous agreement was the last: every rank stops
                stream.drop_ready()  # counted by the stream as dropped at the end
                return
            ready = stream.prepare(every)
            width = plan.width  # for these batches (annotated now, with the agreement)
            needed = [plan.annotate(b)[:width] for b in stream.ready_batches()[:every]]
            needed += [[0] * width] * (every - len(needed))
            n = torch.tensor([ready] + [-x for need in needed for x in need], dtype=torch.int64)
            all_reduce_(n, dist.ReduceOp.MIN)  # all ranks, once every `every` batches
            count(n.numel() * n.element_size())
            agreed = int(n[0].item())
            if agreed == 0:
                stream.drop_ready()
                return
            sizes = [-int(x) for x in n[1:].tolist()]
            stream.agreed_ahead = agreed
            stream.agreed_shard = [sizes[i * width : (i + 1) * width] for i in range(agreed)]
            stream.agreed_last = int(agreed < every)  # some rank holds no more after these
        batch = next(stream)
        sharded = stream.agreed_shard.pop(0)
        stream.agreed_ahead -= 1  # before the yield: a checkpoint in between sees it handed out
        yield plan.split(batch, sharded or _whole(batch))
