"""How each training batch's lookups are split between the sharded embeddings and the local replica.

Under ``slipstream.action=serve`` every lookup of a row in the replica of stale rows
(``replica.py``) is answered locally, whatever the sample's other lookups are; only the other
lookups go through the shards. SUM pooling makes this exact: a bag's pooled embedding is the sum
of its replica part and its sharded part (the model adds them, ``model/dlrm.py``), and the
gradient of the bag reaches both (the replica part's is pushed to the rows' shards later,
``push.py``).

The sharded part is compacted per feature, so that the pooled-embedding and gradient
all-to-alls shrink with each feature's own lookups: feature f's bags that keep a sharded lookup
fill its first n_f slots, in sample order, one empty bag follows for the samples whose lookups of
f were all served, and the batch's KJT is variable-batch (TorchRec's VBE: a stride per feature,
``stride_per_key_per_rank``, and ``inverse_indices`` that give every sample its bag back), so
the sharded EBC's output has one row per sample again, each bag's sharded part in its place
(zeros for the served-only samples). Feature f sends S_f slots (lengths in, pooled embeddings
out, gradients back) instead of B, and only the ids outside the replica. Where every S_f is B
the batch keeps TorchRec's plain layout, each bag in its place with its sharded lookups: the
variable-batch collectives cost more for the same bytes (``sharding/sharded.py``'s ``TwoLayoutDist``).

Row-wise sharding needs every rank to send the same S_f (its backward all-gathers equal slices:
``ProcessGroupGloo::allgather: invalid tensor size`` otherwise, measured), so the ranks agree on
each S_f in the collective that already runs before the input all-to-all (``lockstep.py``): S_f
= the largest n_f (+1 for the empty bag) of any rank. Data-parallel features keep all B bags in
place (their lookups are local: slots there save no bytes, and TorchRec's data-parallel lookup
takes one stride for all its features, measured). The dense features, labels and weights keep
their order: nothing is dropped or reordered.

``annotate`` and ``split`` are local (no collective). Policies that do not serve use the same
plan with no replica: every lookup needs the shards, S_f = B, and the split is the identity.
"""

from __future__ import annotations

import time
from typing import Any, Dict, List, Optional

import torch

from slipstream_rec.data.types import Batch, Served, host_kjt, host_vbe_kjt
from slipstream_rec.slipstream.serve.push import served_rows
from slipstream_rec.slipstream.serve.replica import StaleReplica

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
    """``annotate`` a batch (its lookups in the replica, their pooled sums), then ``split`` it.

    ``data_parallel``: per feature (KJT key order), whether its table is data-parallel (its bags
    stay in place and count no slots); None: no feature is."""

    def __init__(
        self, replica: Optional[StaleReplica] = None, data_parallel: Optional[List[bool]] = None
    ) -> None:
        self.replica = replica  # None: nothing is ever served
        # per feature: its table is data-parallel (None: none is); a tensor once, read per batch
        self._data_parallel = None if data_parallel is None else torch.tensor(data_parallel, dtype=torch.bool)
        # Nothing is served while set (the serve lever times a window without serving, or has
        # stood serving down; serve_lever.py): the split is then the identity, as without a replica.
        self.paused = False
        self.seconds = 0.0  # host time in annotate + split (the "local serving" share of a step)
        self.samples_served = 0  # samples all of whose lookups (at least one) were served
        self.lookups_served = 0  # lookups answered from the replica
        self.lookups_split = 0  # lookups of the samples handed to training through split()
        self.samples_split = 0  # samples handed to training through split()
        # bags sent through the sharded collectives (sum of S_f over the features that are not
        # data-parallel, empty bags included) and the bags of those features (B each) per split
        self.slots_sent = 0
        self.bags_split = 0
        # per feature (KJT key order): lookups seen and served, for the servable share by table
        self.feature_lookups: List[int] = []
        self.feature_served: List[int] = []

    @property
    def width(self) -> int:
        """Sizes the ranks agree on per batch (``lockstep.py``): one per feature while the
        replica can serve, none while nothing can be served (no replica, serving paused, or an
        empty replica: every feature then sends the whole batch). The same on every rank at
        every agreement: ``paused`` and the replica's rows change only on steps all ranks share.
        With none, the agreement is its one-element flag, which gloo all-reduces far faster
        (medians of 6 x 500 on 2 processes of these 2 cores: one int64 0.19 ms, three or more
        1.1-1.5 ms), every step of a run that stood serving down."""
        if self.replica is None or self.paused or not self.replica.rows:
            return 0
        return self.replica.index.num_features

    def _replicated(self, num_keys: int) -> torch.Tensor:
        if self._data_parallel is None:
            return torch.zeros(num_keys, dtype=torch.bool)
        assert self._data_parallel.numel() == num_keys, "one data-parallel flag per KJT key"
        return self._data_parallel

    def annotate(self, batch: Batch) -> List[int]:
        """Mark the lookups of ``batch`` that the replica answers (in place), with their bags'
        pooled sums from the replica as it is now; returns the slots each feature needs through
        the shards on this rank (its bags that keep a sharded lookup, one more for an empty bag
        if some sample has none, at most B; B for a data-parallel feature). Overwrites an earlier
        annotation (a batch left over from the previous agreement is re-annotated)."""
        t0 = time.perf_counter()
        batch.served = None
        kjt = batch.sparse_features
        num_keys, b = len(kjt.keys()), batch.batch_size
        needed = [b] * num_keys
        if self.width and kjt.values().numel():
            flat = self.replica.index.flat_keys(kjt)
            pos, local = self.replica.locate(flat)
            if bool(local.any()):
                lengths = kjt.lengths().to(torch.int64)
                served_per_bag = _lookups_per_bag(lengths, local)
                kept = (lengths > served_per_bag).view(num_keys, b).sum(1)
                slots = torch.clamp(kept + (kept < b).to(torch.int64), max=b)
                needed = torch.where(self._replicated(num_keys), b, slots).tolist()
                bag = _bag_of_lookups(lengths, flat.numel())
                at = pos[local]
                batch.served = Served(
                    pooled=self.replica.pooled_at(at, served_per_bag).view(num_keys, b, -1),
                    rows=served_rows(at, bag[local], self.replica.keys),
                    local=local,
                )
        self.seconds += time.perf_counter() - t0
        return needed

    def split(self, batch: Batch, sharded: List[int]) -> Batch:
        """The batch as training sees it: ``sharded[f]`` slots of feature f through the shards
        (the agreed S_f), the replica's lookups served. ``sharded[f]`` is at least this rank's
        needed count (the agreement's MAX)."""
        b = batch.batch_size
        kjt = batch.sparse_features
        num_keys = len(kjt.keys())
        assert len(sharded) == num_keys, f"{len(sharded)} agreed sizes for {num_keys} features"
        lookups = int(kjt.values().numel())
        replicated = self._replicated(num_keys)
        communicating = int(num_keys - replicated.sum())
        self.samples_split += b
        self.lookups_split += lookups
        self.bags_split += b * communicating
        self._count_features(kjt, batch.served)
        if batch.served is None:
            assert min(sharded, default=b) >= b, "a rank that serves nothing sends its whole batch"
            self.slots_sent += b * communicating
            return batch
        t0 = time.perf_counter()
        served = batch.served
        assert served.local is not None, "split() of a batch that was not annotated"
        local = served.local
        lengths = kjt.lengths().to(torch.int64)
        sharded_lengths = lengths - _lookups_per_bag(lengths, local)
        unserved = (sharded_lengths > 0).view(num_keys, b)  # bags that keep a sharded lookup
        values = kjt.values()[~local]
        weights = kjt.weights_or_none()
        weights = None if weights is None else weights[~local]
        if all(int(s) == b for s in sharded):
            # Every feature sends its whole batch (the sizes are agreed, so on every rank): each
            # bag keeps its place with its sharded lookups, in TorchRec's plain layout, whose
            # collectives cost less than the variable-batch ones for the same bytes
            # (sharding/sharded.py, TwoLayoutDist).
            compact = host_kjt(list(kjt.keys()), values, sharded_lengths.to(kjt.lengths().dtype), b, weights)
        else:
            compact = self._compacted(kjt, sharded, sharded_lengths, unserved, replicated, values, weights)
        out = Batch(
            dense_features=batch.dense_features,
            sparse_features=compact,
            labels=batch.labels,
            weights=batch.weights,
            served=Served(pooled=served.pooled, rows=served.rows),
        )
        n_local = int(local.sum())
        self.lookups_served += n_local
        # samples with lookups and none of them sharded
        has = lengths.view(num_keys, b).sum(0) > 0
        self.samples_served += int((has & ~unserved.any(0)).sum())
        self.slots_sent += sum(int(s) for s, r in zip(sharded, replicated.tolist()) if not r)
        self.seconds += time.perf_counter() - t0
        return out

    def _compacted(
        self, kjt: Any, sharded: List[int], sharded_lengths: torch.Tensor, unserved: torch.Tensor,
        replicated: torch.Tensor, values: torch.Tensor, weights: Optional[torch.Tensor],
    ) -> Any:  # fmt: skip
        """The variable-batch KJT of ``split``: feature f's kept bags in its first slots, in sample
        order, then one empty bag for the samples none of whose lookups of f are sharded."""
        num_keys, b = unserved.shape
        # a data-parallel feature keeps every bag in its place (emptied where all was served)
        keep = unserved | replicated.view(-1, 1)
        kept = keep.sum(1)
        strides = torch.tensor(sharded, dtype=torch.int64)
        assert bool((kept <= strides).all()) and bool((strides <= b).all()), (sharded, b)
        assert bool(((kept == b) | (kept < strides)).all()), "room for the empty bag"
        slot = torch.cumsum(keep, 1) - 1  # each kept bag's slot in its feature, sample order
        # every sample's bag: its slot, or the empty bag after the kept ones
        inverse = torch.where(keep, slot, kept.view(-1, 1))
        first = torch.cumsum(strides, 0) - strides  # each feature's first slot in the lengths
        slot_lengths = torch.zeros(int(strides.sum()), dtype=torch.int64)
        slot_lengths[(first.view(-1, 1) + slot)[keep]] = sharded_lengths.view(num_keys, b)[keep]
        # The sharded lookups keep their order: kept bags keep their order within each feature
        # and the features stay feature-major, so the packed values are the unserved ones as is.
        return host_vbe_kjt(
            list(kjt.keys()), values, slot_lengths.to(kjt.lengths().dtype), [int(x) for x in sharded],
            inverse, weights,
        )  # fmt: skip

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
