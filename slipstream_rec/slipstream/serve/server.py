"""Slipstream's serve action on one rank: the replica, the batch split, and what serving owes.

The controller owns one ``StaleServer`` under ``slipstream.action=serve`` and calls it at three
points of every step, all on step numbers every rank shares:
- the data side splits each batch between the shards and the replica (``plan``, via lockstep);
- after backward (``after_backward``): the served samples' row gradients are summed and, on a
  sync step (every ``replica_sync_steps``, and every snapshot), sent to the shards that hold
  their rows (``push.py``); on a counted step their lookups are counted, since no shard sees
  them and the hot set must still see their rows looked up;
- after the snapshot (``rebuild``): the replica follows the new stale set; after the other sync
  steps the rows the push moved are copied again (``slipstream.replica_sync_bound``).
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Tuple

import torch
import torch.distributed as dist

from slipstream_rec.distributed import all_reduce_
from slipstream_rec.timing import timed
from slipstream_rec.slipstream.config import SlipstreamConfig, SyncPrecision
from slipstream_rec.slipstream.serve.push import ServedGradients
from slipstream_rec.slipstream.serve.replica import StaleReplica
from slipstream_rec.slipstream.rows import RowIndex
from slipstream_rec.slipstream.serve.split import ServePlan
from slipstream_rec.slipstream.tracker import StalenessTracker

__all__ = ["NoServe", "StaleServer", "WIRE_DTYPES"]

Counts = Tuple[torch.Tensor, torch.Tensor]  # (sorted flat keys, int64 counts)
# slipstream.sync_precision: what the push and the replica sync send a row's values as
# (wire_rows.py; int8: a row's values at one bf16 scale)
WIRE_DTYPES = {SyncPrecision.fp32: torch.float32, SyncPrecision.bf16: torch.bfloat16, SyncPrecision.int8: torch.int8}


class StaleServer:
    """Replica, split plan, served gradients and served lookup counts of one rank."""

    def __init__(
        self,
        tracker: StalenessTracker,
        index: RowIndex,
        sync_bound: float = 0.0,
        sync_precision: SyncPrecision = SyncPrecision.fp32,
    ) -> None:
        # Collective (all ranks): the embedding dim is agreed by a MAX all-reduce, as a rank may
        # hold no shard at all.
        units = tracker.units
        dims = {u.table: u.col_offset + u.cols for u in units}
        local = max(dims.values()) if dims else 0
        dim = int(all_reduce_(torch.tensor([local], dtype=torch.int64), dist.ReduceOp.MAX).item())
        if any(d != dim for d in dims.values()):
            raise ValueError(
                "slipstream.action=serve needs one embedding dim for every table (model.embedding_dim); "
                f"the tables here have {sorted(set(dims.values()))}"
            )
        device = units[0].weights.device if units else torch.device("cpu")  # the training device
        self.tracker = tracker
        self.index = index
        self.sync_bound = float(sync_bound)  # slipstream.replica_sync_bound
        self.wire_dtype = WIRE_DTYPES[sync_precision]
        # The replica lives on the host, where the data side reads it (replica.py); the served
        # gradients are summed where they are computed.
        self.replica = StaleReplica(index, dim, torch.device("cpu"), self.wire_dtype)
        # Data-parallel tables are on every rank, so every rank knows which features they are.
        replicated = {u.feature for u in units if u.replicated}
        self.plan = ServePlan(self.replica, [f in replicated for f in index.feature_names])
        for module in tracker.modules:  # before the first batch: per-feature sizes from the start
            module.use_variable_batch()
        self.grads = ServedGradients(index, dim, device, self.wire_dtype)
        self.push_seconds = 0.0
        # host seconds summing the served gradients per row every step (a kernel launch on a GPU)
        self.sum_seconds = 0.0
        self._counts: List[Counts] = []  # served lookups of counted steps, merged lazily
        # Which rows a sync compares. Once every batch in training was split with the replica's
        # current rows, a replica row moves only by the pushes (its every lookup is served), so a
        # sync reads only the rows pushed since the last one. A batch split before the last
        # rebuild still looks its rows that joined (and, split while serving paused, any row) up
        # through the shards: until a comparison of those has followed the rebuild by the
        # batches split ahead of training (``batches_ahead``, set by the controller), syncs and
        # rebuilds read them too.
        self.batches_ahead = 1 << 30  # until told: every sync reads them
        self._rebuilt_at = 0  # the step of the last rebuild
        self._compared_at = 0  # the step of the last comparison of the rows it left unsettled
        self._joined = torch.zeros(0, dtype=torch.int64)  # the rows that joined at it (sorted keys)
        self._all_unsettled = False  # serving resumed at it: every row unsettled
        self._pushed: List[torch.Tensor] = []  # the rows each push since the last sync applied here

    @classmethod
    def from_config(cls, cfg: SlipstreamConfig, tracker: StalenessTracker, index: RowIndex) -> "StaleServer":
        """serve's server (slipstream.replica_sync_bound, slipstream.sync_precision). Collective."""
        return cls(tracker, index, cfg.replica_sync_bound, cfg.sync_precision)

    # ---- after backward (collective on sync steps) --------------------------------------------
    def after_backward(self, task: Any, sync_step: bool) -> None:
        """Take the gradient the served samples' pooled embeddings received (``DLRMTask``) and add
        it to their rows' sums; count their lookups on a counted step; on a sync step push the
        sums (all ranks: ``sync_step`` is the same on every rank)."""
        served = task.take_served()
        if served is not None and served[1].grad is not None:
            rows = served[0]  # ServedRows, keyed on the host when the batch was split
            with timed(self, "sum_seconds"):
                self.grads.add(rows, served[1].grad)
            if self.tracker.counting:
                self._counts.append((rows.keys, rows.counts))  # host tensors: no read back
        if sync_step:
            with timed(self, "push_seconds"):
                sent = self.grads.push(self.tracker.units, self.tracker.feature_index)  # all ranks
                self._pushed.append(self.grads.applied)
                meter = self.tracker.modules[0].a2a_bytes
                meter["push"] = meter.get("push", 0) + sent

    def take_counts(self) -> Optional[Counts]:
        """The served lookups counted since the last call, merged; None if there were none."""
        merged = self._merged()
        self._counts = []
        return merged

    def _merged(self) -> Optional[Counts]:
        if not self._counts:
            return None
        keys = torch.cat([k for k, _ in self._counts])
        counts = torch.cat([c for _, c in self._counts])
        unique, inverse = torch.unique(keys, return_inverse=True)
        merged = (unique, torch.zeros(unique.numel(), dtype=torch.int64).index_add_(0, inverse, counts))
        self._counts = [merged]
        return merged

    # ---- after the snapshot and the syncs (collective) ----------------------------------------
    def rebuild(self, stale_keys: torch.Tensor, step: int, resumed: bool = False) -> None:
        """The replica becomes the rows ``stale_keys`` (identical on every rank) after ``step``,
        sending the rows that joined and the rows that moved past
        ``slipstream.replica_sync_bound`` (``_suspects``: the pushed rows, and more where
        batches trained through the shards). ``resumed``: serving resumes after a pause, whose
        batches looked every row up through the shards: every row is compared, now and until
        the batches split in the pause have trained. Collective."""
        suspects = None if resumed else self._suspects()
        self.replica.rebuild(self.tracker.units, stale_keys, self.tracker.feature_index, self.sync_bound, suspects)
        self._rebuilt_at = self._compared_at = int(step)
        self._joined, self._all_unsettled = self.replica.joined_keys, bool(resumed)
        self._pushed = []

    def resync(self, step: int) -> None:
        """The replica's rows brought up to date after a push moved them, after ``step``: the
        rows pushed since the last sync, and while a batch split before the last rebuild may
        have trained since, the rows it looked up through the shards. Collective (the same
        choice on every rank: step numbers)."""
        suspects = self._suspects()
        if self._unsettled():
            self._compared_at = int(step)
        keys = self.replica.keys
        self.replica.rebuild(self.tracker.units, keys, self.tracker.feature_index, self.sync_bound, suspects)
        self._pushed = []

    def _unsettled(self) -> bool:
        """Whether a batch split before the last rebuild may have trained since the last
        comparison of the rows it left unsettled. Step numbers only: the same on every rank."""
        return self._compared_at - self._rebuilt_at < self.batches_ahead

    def _suspects(self) -> Optional[torch.Tensor]:
        """The held rows that may have moved on their shards since they were last compared
        (sorted flat keys; None: every row): the rows pushed since the last sync, and while the
        last rebuild is unsettled the rows that joined at it (every row after a pause)."""
        pushed = self._pushed_rows()
        if not self._unsettled():
            return pushed
        if self._all_unsettled:
            return None
        return torch.unique(torch.cat([pushed, self._joined]))

    def _pushed_rows(self) -> torch.Tensor:
        """The rows the pushes since the last sync applied to this rank's shards, sorted."""
        return torch.unique(torch.cat(self._pushed)) if self._pushed else torch.zeros(0, dtype=torch.int64)

    @property
    def rows(self) -> int:
        """Rows in the replica (the same on every rank)."""
        return self.replica.rows

    # ---- reporting and checkpointing (local) --------------------------------------------------
    def record(self) -> Dict[str, Any]:
        plan = self.plan
        return {
            "replica_rows": self.replica.rows,
            "replica_bytes": self.replica.nbytes(),
            "replica_joined": self.replica.joined,
            "replica_left": self.replica.left,
            "served_fraction": plan.lookups_served / max(1, plan.lookups_split),  # lookups, this rank
            "slots_fraction": plan.slots_sent / max(1, plan.bags_split),
            # this rank's running counts, so that any interval's shares are a difference
            **{k: v for k, v in plan.counters().items() if k != "samples_split"},
            "lookups_by_feature": list(plan.feature_lookups),
            "served_by_feature": list(plan.feature_served),
            "replica_rows_sent": self.replica.rows_sent,
            "served_sums_unpushed": self.grads.pending,  # this rank's, since the last push
        }

    def nbytes(self) -> int:
        return self.replica.nbytes() + int(self.grads.keys.numel() * 8 + self.grads.grads.numel() * 4)

    @property
    def sync_bytes(self) -> int:
        """Bytes this rank gave to the replica's syncs so far (the byte meter's ``replica``)."""
        return int(self.replica.sync_bytes)

    def summary(self) -> Dict[str, Any]:
        """The replica and the pushes, for summary.json (this rank's)."""
        return {
            "rows": self.replica.rows,
            "bytes_per_rank": self.replica.nbytes(),
            "rebuilds": self.replica.rebuilds,
            "pushes": self.grads.pushes,
            "rows_pushed_per_rank": self.grads.rows_pushed,
        }

    def state_dict(self) -> Dict[str, Any]:
        return {
            "plan": self.plan.state_dict(),
            "grads": self.grads.state_dict(),
            "counts": self._merged(),
            "push_seconds": self.push_seconds,
            "sum_seconds": self.sum_seconds,
            "compared": [self._rebuilt_at, self._compared_at],
            "joined": self._joined.clone(),
            "all_unsettled": self._all_unsettled,
            "pushed": self._pushed_rows(),
        }

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        self.plan.load_state_dict(state["plan"])
        self.grads.load_state_dict(state["grads"])
        self._counts = [state["counts"]] if state["counts"] is not None else []
        self.push_seconds = float(state["push_seconds"])
        self.sum_seconds = float(state["sum_seconds"])
        # a checkpoint from before these were kept: the next sync compares every row
        self._rebuilt_at, self._compared_at = state.get("compared", [0, -(1 << 30)])
        self._joined = state.get("joined", torch.zeros(0, dtype=torch.int64)).clone()
        self._all_unsettled = bool(state.get("all_unsettled", "joined" not in state))
        self._pushed = [state["pushed"]] if state.get("pushed") is not None else []  # (None: older checkpoints)


class NoServe:
    """No serving: the split is the identity (every lookup through the shards), nothing is owed
    and there is no replica to keep."""

    push_seconds = 0.0
    sum_seconds = 0.0
    rows = 0
    sync_bytes = 0

    def __init__(self) -> None:
        self.plan = ServePlan()

    def after_backward(self, task: Any, sync_step: bool) -> None:
        pass

    def take_counts(self) -> None:
        return None

    def rebuild(self, stale_keys: torch.Tensor, step: int, resumed: bool = False) -> None:
        pass

    def resync(self, step: int) -> None:
        pass

    def record(self) -> Dict[str, Any]:
        return {}

    def nbytes(self) -> int:
        return 0

    def summary(self) -> None:
        return None

    def state_dict(self) -> None:
        return None

    def load_state_dict(self, state: Optional[Dict[str, Any]]) -> None:
        pass
