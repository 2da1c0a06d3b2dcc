"""How each training batch is split between the sharded embeddings and the local replica.

Every rank's batch has ``trainer.batch_size`` samples; under ``slipstream.action=serve`` some of
them can be answered from the replica of stale rows (``replica.py``). TorchRec's all-to-alls need
the same number of samples from every rank (the backward of row-wise sharding fails on gloo
otherwise, measured), so the ranks agree on S, the size of the sharded part, in the collective
that already runs before the input all-to-all (``lockstep.py``): S = the largest number of
samples any rank *needs* to send (those with a lookup outside the replica), at least 1. Each rank
then sends its S - needed first servable samples through the shards too, and serves the rest.

The split reorders the batch: the S sharded samples first, then the served ones; the dense
features, labels and weights follow the same order, and the model concatenates the pooled
embeddings the same way (``model/dlrm.py``). Nothing is dropped: the dense batch stays B.

``annotate`` and ``split`` are local (no collective). Policies that do not serve use the same
plan with no replica: every sample needs the shards, S = B, and the split is the identity.
"""

from __future__ import annotations

import time
from typing import Any, Dict, Optional

import torch

from slipstream_rec.data.types import Batch
from slipstream_rec.slipstream.batch_ops import select_kjt
from slipstream_rec.slipstream.push import served_rows
from slipstream_rec.slipstream.replica import StaleReplica

__all__ = ["ServePlan"]


class ServePlan:
    """``annotate`` a batch (servable samples and their pooled embeddings), then ``split`` it."""

    def __init__(self, replica: Optional[StaleReplica] = None) -> None:
        self.replica = replica  # None: nothing is ever served
        self.seconds = 0.0  # host time in annotate + split (the "local serving" share of a step)
        self.samples_served = 0  # this rank's samples answered from the replica
        self.lookups_served = 0  # their lookups
        self.samples_split = 0  # this rank's samples handed to training through split()

    def annotate(self, batch: Batch) -> int:
        """Mark the servable samples of ``batch`` (in place) with their pooled embeddings from the
        replica as it is now; returns how many samples need the shards. Overwrites an earlier
        annotation (a batch left over from the previous agreement is re-annotated)."""
        t0 = time.perf_counter()
        batch.servable, batch.served_pooled = None, None
        needed = batch.batch_size
        if self.replica is not None and self.replica.rows:
            mask = self.replica.servable(batch.sparse_features)
            n = int(mask.sum())
            if n:
                idx = mask.nonzero().view(-1)
                batch.servable = mask
                batch.served_pooled = self.replica.pooled(select_kjt(batch.sparse_features, idx))
                needed -= n
        self.seconds += time.perf_counter() - t0
        return needed

    def split(self, batch: Batch, sharded: int) -> Batch:
        """The batch as training sees it: ``sharded`` samples through the shards (the agreed S),
        the rest served. ``sharded`` is at least this rank's needed count (the agreement's MAX)."""
        b = batch.batch_size
        self.samples_split += b
        if batch.servable is None:
            assert sharded >= b, "a rank that serves nothing sends its whole batch"
            return batch
        t0 = time.perf_counter()
        mask = batch.servable
        servable = mask.nonzero().view(-1)
        needed = b - servable.numel()
        assert needed <= sharded <= b, (needed, sharded, b)
        extra = sharded - needed  # servable samples sent through the shards anyway
        order = torch.cat([(~mask).nonzero().view(-1), servable])  # needed first, then servable
        served = batch.served_pooled[extra:]  # type: ignore[index]
        out = Batch(
            dense_features=batch.dense_features.index_select(0, order),
            sparse_features=select_kjt(batch.sparse_features, order[:sharded]),
            labels=batch.labels.index_select(0, order),
            weights=batch.weights.index_select(0, order),
            served_pooled=served,
            served_features=select_kjt(batch.sparse_features, order[sharded:]),
        )
        out.served_rows = served_rows(out.served_features, self.replica.index)
        self.samples_served += int(served.shape[0])
        self.lookups_served += int(out.served_rows.inverse.numel())
        self.seconds += time.perf_counter() - t0
        return out

    def counters(self) -> Dict[str, int]:
        return {
            "samples_served": self.samples_served,
            "lookups_served": self.lookups_served,
            "samples_split": self.samples_split,
        }

    def state_dict(self) -> Dict[str, Any]:
        return {"counters": self.counters(), "replica": self.replica.state_dict() if self.replica else None}

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        for k, v in state["counters"].items():
            setattr(self, k, int(v))
        if self.replica is not None and state.get("replica") is not None:
            self.replica.load_state_dict(state["replica"])
