"""How each training batch's lookups are split between the sharded embeddings and the local replica.

Under ``slipstream.action=serve`` every lookup of a row in the replica of stale rows
(``replica.py``) is answered locally, whatever the sample's other lookups are; only the other
lookups go through the shards. SUM pooling makes this exact: a bag's pooled embedding is the sum
of its replica part and its sharded part (the model adds them, ``model/dlrm.py``), and the
gradient of the bag reaches both (the replica part's is pushed to the rows' shards later,
``push.py``).

The sharded part is compacted per feature, so that the pooled-embedding and gradient
all-to-alls shrink with the lookups, not only the ids: feature f's bags that keep a sharded
lookup fill its first n_f slots, in sample order, and the sharded KJT has S slots per feature.
TorchRec's all-to-alls need one S on every rank (the backward of row-wise sharding fails on gloo
otherwise, measured; its variable-batch KJTs, which would give each feature its own size, fail
the same way for row-wise and are not taken by data-parallel tables), so the ranks agree on S in
the collective that already runs before the input all-to-all (``lockstep.py``): S = the largest
n_f of any feature on any rank, at least 1. The slots past a feature's n_f are empty bags. The
dense features, labels and weights keep their order: nothing is dropped or reordered.

What each split sends, per rank and feature: S slots (lengths in, pooled embeddings out,
gradients back) instead of B, and only the ids outside the replica. The gain on the output side
is bounded by the feature whose lookups are least served (``lookups_per_feature`` measures it).

``annotate`` and ``split`` are local (no collective). Policies that do not serve use the same
plan with no replica: every lookup needs the shards, S = B, and the split is the identity.
"""

from __future__ import annotations

import time
from typing import Any, Dict, List, Optional

import torch

from slipstream_rec.data.types import Batch, Served, host_kjt
from slipstream_rec.slipstream.push import served_rows
from slipstream_rec.slipstream.replica import StaleReplica

__all__ = ["ServePlan"]


def _lookups_per_bag(lengths: torch.Tensor, marked: torch.Tensor) -> torch.Tensor:
    """How many of each bag's lookups are ``marked`` (a per-lookup bool, KJT value order): a
    difference of running sums at the bags' ends, int64 (no scatter)."""
    ends = torch.cumsum(lengths, 0)
    running = torch.zeros(marked.numel() + 1, dtype=torch.int64)
    torch.cumsum(marked, 0, out=running[1:])
    return running.index_select(0, ends) - running.index_select(0, ends - lengths)


def _bag_of_lookups(lengths: torch.Tensor, total: int) -> torch.Tensor:
    """Each lookup's bag (its position in the feature-major lengths), int64."""
    if total == lengths.numel() and bool((lengths == 1).all()):  # one id per bag: the usual case
        return torch.arange(total)
    return torch.repeat_interleave(torch.arange(lengths.numel()), lengths, output_size=total)


class ServePlan:
    """``annotate`` a batch (its lookups in the replica, their pooled sums), then ``split`` it."""

    def __init__(self, replica: Optional[StaleReplica] = None) -> None:
        self.replica = replica  # None: nothing is ever served
        # Nothing is served while set (the serve lever times a window without serving, or has
        # stood serving down; serve_lever.py): the split is then the identity, as without a replica.
        self.paused = False
        self.seconds = 0.0  # host time in annotate + split (the "local serving" share of a step)
        self.samples_served = 0  # samples all of whose lookups (at least one) were served
        self.lookups_served = 0  # lookups answered from the replica
        self.lookups_split = 0  # lookups of the samples handed to training through split()
        self.samples_split = 0  # samples handed to training through split()
        self.slots_sent = 0  # bags sent through the shards, padding slots included (S x F per split)
        self.bags_split = 0  # bags of the samples split (B x F per split)
        # per feature (KJT key order): lookups seen and served, for the servable share by table
        self.feature_lookups: List[int] = []
        self.feature_served: List[int] = []

    def annotate(self, batch: Batch) -> int:
        """Mark the lookups of ``batch`` that the replica answers (in place), with their bags'
        pooled sums from the replica as it is now; returns the slots per feature this rank needs
        through the shards (the largest number of a feature's bags that keep a sharded lookup).
        Overwrites an earlier annotation (a batch left over from the previous agreement is
        re-annotated)."""
        t0 = time.perf_counter()
        batch.served = None
        needed = batch.batch_size
        kjt = batch.sparse_features
        if self.replica is not None and not self.paused and self.replica.rows and kjt.values().numel():
            flat = self.replica.index.flat_keys(kjt)
            pos, local = self.replica.locate(flat)
            if bool(local.any()):
                num_keys, b = len(kjt.keys()), kjt.stride()
                lengths = kjt.lengths().to(torch.int64)
                served_per_bag = _lookups_per_bag(lengths, local)
                needed = int((lengths > served_per_bag).view(num_keys, b).sum(1).max())
                bag = _bag_of_lookups(lengths, flat.numel())
                at = pos[local]
                batch.served = Served(
                    pooled=self.replica.pooled_at(at, served_per_bag).view(num_keys, b, -1),
                    rows=served_rows(at, bag[local], self.replica.keys),
                    local=local,
                )
        self.seconds += time.perf_counter() - t0
        return needed

    def split(self, batch: Batch, sharded: int) -> Batch:
        """The batch as training sees it: ``sharded`` slots per feature through the shards (the
        agreed S), the replica's lookups served. ``sharded`` is at least this rank's needed
        count (the agreement's MAX)."""
        b = batch.batch_size
        kjt = batch.sparse_features
        num_keys = len(kjt.keys())
        lookups = int(kjt.values().numel())
        self.samples_split += b
        self.lookups_split += lookups
        self.bags_split += b * num_keys
        self._count_features(kjt, batch.served)
        if batch.served is None:
            assert sharded >= b, "a rank that serves nothing sends its whole batch"
            self.slots_sent += b * num_keys
            return batch
        t0 = time.perf_counter()
        served = batch.served
        assert served.local is not None, "split() of a batch that was not annotated"
        local = served.local
        lengths = kjt.lengths().to(torch.int64)
        sharded_lengths = lengths - _lookups_per_bag(lengths, local)
        keep = (sharded_lengths > 0).view(num_keys, b)
        slot = torch.cumsum(keep, 1) - 1  # each kept bag's slot in its feature, sample order
        assert 1 <= sharded and int(keep.sum(1).max()) <= sharded <= max(b, 1), (sharded, b)
        feature = torch.arange(num_keys).view(-1, 1).expand(num_keys, b)
        slot_lengths = torch.zeros(num_keys, sharded, dtype=torch.int64)
        slot_lengths[feature[keep], slot[keep]] = sharded_lengths.view(num_keys, b)[keep]
        # The sharded lookups keep their order: kept bags keep their order within each feature
        # and the features stay feature-major, so the packed values are the unserved ones as is.
        values = kjt.values()[~local]
        weights = kjt.weights_or_none()
        compact = host_kjt(
            list(kjt.keys()), values, slot_lengths.view(-1).to(kjt.lengths().dtype), sharded,
            None if weights is None else weights[~local],
        )  # fmt: skip
        # sample-major (b, f): the slot's row slot * F + f of the (S * F, D) sharded output, or
        # the row of zeros S * F
        gather = torch.full((num_keys, b), sharded * num_keys, dtype=torch.int64)
        gather[keep] = slot[keep] * num_keys + feature[keep]
        out = Batch(
            dense_features=batch.dense_features,
            sparse_features=compact,
            labels=batch.labels,
            weights=batch.weights,
            served=Served(pooled=served.pooled, rows=served.rows, gather=gather.t().reshape(-1)),
        )
        n_local = int(local.sum())
        self.lookups_served += n_local
        # samples with lookups and none of them sharded
        has = lengths.view(num_keys, b).sum(0) > 0
        self.samples_served += int((has & ~keep.any(0)).sum())
        self.slots_sent += sharded * num_keys
        self.seconds += time.perf_counter() - t0
        return out

    def _count_features(self, kjt: Any, served: Optional[Served]) -> None:
        per_key = kjt.length_per_key()  # host lists: the KJTs of the data side carry them
        if not self.feature_lookups:
            self.feature_lookups = [0] * len(per_key)
            self.feature_served = [0] * len(per_key)
        self.feature_lookups = [a + int(n) for a, n in zip(self.feature_lookups, per_key)]
        if served is not None and served.local is not None:
            bounds = torch.tensor(kjt.offset_per_key(), dtype=torch.int64)
            running = torch.zeros(served.local.numel() + 1, dtype=torch.int64)
            torch.cumsum(served.local, 0, out=running[1:])
            hits = (running.index_select(0, bounds[1:]) - running.index_select(0, bounds[:-1])).tolist()
            self.feature_served = [a + n for a, n in zip(self.feature_served, hits)]

    def counters(self) -> Dict[str, int]:
        return {
            "samples_served": self.samples_served,
            "lookups_served": self.lookups_served,
            "lookups_split": self.lookups_split,
            "samples_split": self.samples_split,
            "slots_sent": self.slots_sent,
            "bags_split": self.bags_split,
        }

    def state_dict(self) -> Dict[str, Any]:
        return {
            "counters": self.counters(),
            "features": [list(self.feature_lookups), list(self.feature_served)],
            "replica": self.replica.state_dict() if self.replica else None,
        }

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        for k, v in state["counters"].items():
            setattr(self, k, int(v))
        self.feature_lookups, self.feature_served = (list(x) for x in state["features"])
        if self.replica is not None and state.get("replica") is not None:
            self.replica.load_state_dict(state["replica"])
