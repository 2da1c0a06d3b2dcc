"""Global hot and stale sets, agreed by all ranks from what each shard tracked locally.

Every public method here that is a collective is entered by ALL ranks at the same training step
(the controller calls them from ``on_step_end`` on step numbers every rank shares); none sits in a
rank-dependent branch. After each of them every rank holds the same ``RowState``: the same hot
rows with the same change values, hence the same stale set for any threshold.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Tuple

import torch
import torch.distributed as dist

from slipstream_rec.slipstream.config import SlipstreamConfig
from slipstream_rec.slipstream.counting import LookupCounter
from slipstream_rec.slipstream.peer_rows import PeerUnits
from slipstream_rec.slipstream.rows import RowIndex, RowState
from slipstream_rec.sharding.sharded import ShardUnit, SlipstreamShardedEBC, flush_caches
from slipstream_rec.distributed import all_reduce_, gather_varlen

logger = logging.getLogger(__name__)

Counts = Tuple[torch.Tensor, torch.Tensor]  # (sorted flat keys, int64 counts)


@dataclass
class HotSelection:
    """What ``select_hot`` decided (identical on every rank)."""

    min_count_used: int  # the fewest counted lookups of a hot row (min_count with no hot row)
    hot_rows: int  # distinct hot rows over all tables
    hot_bytes: int  # bytes of hot rows summed over all shards (replicas counted per rank)
    budget_bytes: int  # the configured global budget
    candidates: int  # distinct rows offered (met the minimum count) before the budget cut


class StalenessTracker:
    """Hot-row selection, snapshots and change measurement over all Slipstream shards.

    ``modules`` are the model's ``SlipstreamShardedEBC`` instances; their local units are
    ordered identically on every rank for the replicated (data-parallel) ones, whose counts are
    summed across ranks because each rank counts only its own batch.
    """

    def __init__(
        self,
        modules: List[SlipstreamShardedEBC],
        index: RowIndex,
        row_state: RowState,
        change_metric: str = "linf",
    ) -> None:
        if change_metric not in ("linf", "rel_l2"):
            raise ValueError(
                f"slipstream.change_metric={change_metric!r}: use linf (the paper's max absolute "
                "change per element) or rel_l2 (L2 norm of the change / L2 norm of the row)"
            )
        self.modules = modules
        self.index = index
        self.row_state = row_state
        self.change_metric = change_metric
        self.units: List[ShardUnit] = [u for m in modules for u in m.units]
        self.counter = LookupCounter(modules)  # the shards' lookups, on the sampled steps
        names = list(index.feature_names)
        self._feature_idx: Dict[str, int] = {name: i for i, name in enumerate(names)}
        unknown = sorted({u.feature for u in self.units} - set(names))
        assert not unknown, f"sharded features {unknown} missing from the row index"
        self.snapshots_taken = 0
        self.hot_keys = torch.zeros(0, dtype=torch.int64)  # global flat keys of the hot rows, sorted
        self.peak_bytes = 0  # largest state_bytes() seen, transient copies and gathers included
        self.selection: Optional[Dict[str, Any]] = None  # the latest choice of the hot set
        self.turnover: List[Dict[str, int]] = []  # one entry per later choice of the hot set
        # The gathers below carry flat keys as int32 where every table's rows fit (half int64's
        # bytes), and give what this rank sent to ``meter`` (the controller's byte meter, kind
        # ``tracking``: 8.4 bytes per trained sample on clicklog at dim 16, snapshots every 20 steps).
        self.key_dtype = torch.int32 if index.num_rows <= torch.iinfo(torch.int32).max else torch.int64
        self.meter: Callable[[int], None] = lambda nbytes: None
        self.peers: Optional[PeerUnits] = None  # every rank's units, gathered at the first measure

    @classmethod
    def from_config(
        cls, cfg: SlipstreamConfig, modules: List[SlipstreamShardedEBC], index: RowIndex, row_state: RowState
    ) -> "StalenessTracker":
        """The tracker of a tracking policy, over the model's Slipstream shards."""
        if not modules:
            raise ValueError(
                f"slipstream.policy={cfg.policy.value} needs the project's sharder "
                "(SlipstreamEmbeddingBagCollectionSharder); the model has no Slipstream shards"
            )
        return cls(modules, index, row_state, cfg.change_metric.value)

    @property
    def feature_index(self) -> Dict[str, int]:
        """Feature name -> its position in the row index (the flat key layout)."""
        return self._feature_idx

    # ---- counting (local: counting.py) ----------------------------------------------------
    @property
    def counting(self) -> bool:
        return self.counter.counting

    @property
    def count_seconds(self) -> float:
        return self.counter.seconds

    def set_counting(self, on: bool) -> None:
        self.counter.counting = on

    # ---- the hot set (collective) -----------------------------------------------------------
    def choose(self, step: int, budget_bytes: int, min_count: int, extra: Optional[Counts], again: bool) -> None:
        """The hot set chosen (``select_hot``), or chosen again right after a snapshot from the
        lookups counted since the last choice (``reselect_hot``); recorded in ``selection`` (and
        ``turnover``). Collective."""
        if again:
            sel, joined, left = self.reselect_hot(budget_bytes, min_count, extra)
            self.turnover.append({"step": step, "hot_rows": sel.hot_rows, "joined": joined, "left": left})
            what = f"hot set chosen again at step {step}: {sel.hot_rows} rows ({joined} joined, {left} left)"
        else:
            sel = self.select_hot(budget_bytes, min_count, extra)
            what = (f"{sel.hot_rows} hot rows ({sel.hot_bytes / 2**20:.1f} MiB of {sel.budget_bytes / 2**20:.1f} "
                    f"MiB budget, min count {sel.min_count_used}) at step {step}")  # fmt: skip
        self.selection = sel.__dict__
        if _is_rank0():
            logger.info("slipstream: %s", what)

    def _gather(self, t: torch.Tensor, lengths: Optional[List[int]] = None) -> torch.Tensor:
        """All ranks: ``t`` gathered from every rank (``gather_varlen``; ``lengths``: every rank's
        numel where known), its bytes metered."""
        return gather_varlen(t, lengths=lengths, meter=self.meter)

    def _gather_keys(self, keys: torch.Tensor) -> torch.Tensor:
        """All ranks: flat keys gathered as ``key_dtype``, returned as int64."""
        return self._gather(keys.to(self.key_dtype)).to(torch.int64)

    def _gather_counts(self, counts: torch.Tensor) -> torch.Tensor:
        """All ranks: lookup counts gathered as int32 (a row counted over 2^31 times in one window
        saturates there: it ties with any other such row, and ties are broken by key)."""
        return self._gather(counts.clamp_max(torch.iinfo(torch.int32).max).to(torch.int32)).to(torch.int64)

    def _global_keys(self, unit: ShardUnit, local_rows: torch.Tensor) -> torch.Tensor:
        rows = local_rows.to(torch.int64).cpu() + unit.row_offset
        return self.index.to_flat(self._feature_idx[unit.feature], rows)

    # ---- hot selection (collective) ---------------------------------------------------------
    @torch.no_grad()
    def select_hot(
        self, budget_bytes: int, min_count: int, extra: Optional[Tuple[torch.Tensor, torch.Tensor]] = None
    ) -> HotSelection:
        """Pick the most-counted rows that fit ``budget_bytes`` over all shards. Collective.

        The order is exact and the same on every rank: count descending (int64), then flat key
        ascending, so ties at the boundary are broken by key and the budget is never exceeded.
        A row's bytes are summed over all its shards (column shards, data-parallel replicas).
        ``extra``: this rank's lookups that no shard saw, as (flat keys, counts): the samples
        served from the replica (``serve``); summed over ranks and added to every shard's counts.
        """
        empty = torch.zeros(0, dtype=torch.int64)
        extra_keys, extra_counts = (t.cpu().to(torch.int64) for t in extra) if extra is not None else (empty, empty)
        replicated = sorted((u for u in self.units if u.replicated), key=lambda u: (u.table, u.col_offset))
        if dist.is_initialized() and dist.get_world_size() > 1:
            # All ranks: data-parallel tables are counted from local batches only, and so are the
            # extra lookups; sum both over ranks. Every rank holds the same replicated units
            # (possibly none), and enters the two gathers (keys, counts) either way.
            rows = [u.sparse_counts() for u in replicated]
            keys = self._gather_keys(torch.cat([*(self._global_keys(u, r) for u, (r, _) in zip(replicated, rows)), extra_keys]))
            counts = self._gather_counts(torch.cat([*(c.cpu() for _, c in rows), extra_counts]))
            for unit in replicated:
                unit.clear_counts()  # replaced by the sums over ranks
        else:
            keys, counts = extra_keys, extra_counts
        # A table is either data-parallel or sharded, so a key's sum is its data-parallel count
        # over ranks plus its extra lookups, or its extra lookups alone.
        unique, inverse = torch.unique(keys, return_inverse=True)
        summed = torch.zeros(unique.numel(), dtype=torch.int64).index_add_(0, inverse, counts)
        for unit in self.units if unique.numel() else []:
            first = self._first_key(unit)
            lo, hi = torch.searchsorted(unique, torch.tensor([first, first + unit.rows])).tolist()
            if hi > lo:
                unit.add_counts((unique[lo:hi] - first).to(unit.weights.device), summed[lo:hi].to(unit.weights.device))

        # Each unit offers its rows with at least min_count lookups, in the global order, at most
        # floor(budget / row_bytes) + 1 of them: those alone exceed the budget, so a row a unit
        # does not offer comes after the cut and the decision over the offers is exact.
        keys, counts, spans = [], [], []
        for unit in self.units:
            counted_rows, counted = (t.cpu() for t in unit.sparse_counts())
            enough = counted >= int(min_count)
            rows, c = counted_rows[enough], counted[enough]  # ascending rows = key order
            cap = budget_bytes // unit.row_bytes + 1
            if rows.numel() > cap:
                # stable sort: equal counts keep ascending rows, i.e. ascending keys
                order = torch.sort(c, descending=True, stable=True).indices[:cap]
                rows, c = rows[order], c[order]
            keys.append(self._global_keys(unit, rows))
            counts.append(c)
            spans.append(torch.tensor([rows.numel(), unit.row_bytes], dtype=torch.int64))
        empty = torch.zeros(0, dtype=torch.int64)
        # All ranks: three gathers of the offers (keys, counts, the same lengths) and of each
        # unit's (offers, row bytes), which every rank expands to a row's bytes in the same order.
        all_keys = self._gather_keys(torch.cat(keys) if keys else empty)
        all_counts = self._gather_counts(torch.cat(counts) if counts else empty)
        all_spans = self._gather(torch.cat(spans) if spans else empty).view(-1, 2)
        all_bytes = torch.repeat_interleave(all_spans[:, 1], all_spans[:, 0])
        assert all_bytes.numel() == all_keys.numel(), "every offered row has its unit's row bytes"

        self._note_peak(sum(t.numel() * t.element_size() for t in (all_keys, all_counts, all_bytes)))
        # From here on every rank computes the same thing from the same gathered offers.
        unique, inverse = torch.unique(all_keys, return_inverse=True)  # sorted keys
        row_bytes = torch.zeros(unique.numel(), dtype=torch.int64).index_add_(0, inverse, all_bytes)
        row_count = torch.zeros(unique.numel(), dtype=torch.int64).scatter_reduce_(
            0, inverse, all_counts, "amax", include_self=False
        )
        order = torch.sort(row_count, descending=True, stable=True).indices  # ties: key order
        cumulative = torch.cumsum(row_bytes[order], 0)
        fits = int((cumulative <= int(budget_bytes)).sum())  # a prefix: bytes are positive
        chosen = order[:fits]
        self.hot_keys = torch.sort(unique[chosen]).values
        for unit in self.units:
            unit.hot_rows = self.local_rows(unit, self.hot_keys).to(unit.weights.device)
            unit.snapshot = None
            unit.clear_counts()  # this window's counting is over; free the memory
        self.row_state.reset()
        return HotSelection(
            min_count_used=int(row_count[chosen[-1]]) if fits else int(min_count),
            hot_rows=int(fits),
            hot_bytes=int(row_bytes[chosen].sum()),
            budget_bytes=int(budget_bytes),
            candidates=int(unique.numel()),
        )

    @torch.no_grad()
    def reselect_hot(
        self, budget_bytes: int, min_count: int, extra: Optional[Tuple[torch.Tensor, torch.Tensor]] = None
    ) -> Tuple[HotSelection, int, int]:
        """Choose the hot set again from the lookups counted since the last choice, right after a
        snapshot (the hot set follows the data). Collective, like ``select_hot``.

        Rows that stay hot keep the change the snapshot just measured; rows that leave lose
        theirs (so they are stale no more); rows that join are snapshotted now and have no change
        (never stale) until the next snapshot measures one. Returns (selection, joined, left).
        """
        old_keys, old_changes = self.row_state.keys.clone(), self.row_state.values.clone()
        before = self.hot_keys
        selection = self.select_hot(budget_bytes, min_count, extra)  # resets snapshots and changes
        kept = torch.isin(old_keys, self.hot_keys)
        self.row_state.replace(old_keys[kept], old_changes[kept])
        for unit in self.units:  # weights unchanged since the snapshot: one copy serves all rows
            if unit.hot_rows is not None and unit.hot_rows.numel():
                unit.snapshot = unit.weights.index_select(0, unit.hot_rows).float()
        joined = int((~torch.isin(self.hot_keys, before)).sum())
        left = int((~torch.isin(before, self.hot_keys)).sum())
        return selection, joined, left

    def _first_key(self, unit: ShardUnit) -> int:
        """Flat key of the unit's first local row."""
        return self.index.offset_list[self._feature_idx[unit.feature]] + unit.row_offset

    def local_rows(self, unit: ShardUnit, sorted_keys: torch.Tensor) -> torch.Tensor:
        """The unit's local rows among ``sorted_keys`` (flat keys, ascending), ascending."""
        first = self._first_key(unit)
        lo, hi = torch.searchsorted(sorted_keys, torch.tensor([first, first + unit.rows])).tolist()
        return sorted_keys[lo:hi] - first

    # ---- snapshots (collective) -------------------------------------------------------------
    @torch.no_grad()
    def snapshot(self) -> bool:
        """Copy each shard's hot rows and, from the second snapshot on, measure how much each
        hot row changed since the previous one; publish the changes into ``row_state`` on every
        rank. Returns whether changes were measured. Collective.

        Memory: one stored copy per hot row, plus the new copy while comparing (2x at most).
        """
        part_a, part_b, measured_rows = [], [], []  # where the shards are
        measured = False
        # fused_uvm_caching: the weights views are the host copy; write the GPU cache back first.
        flush_caches(self.units)
        for unit in self.units:
            if unit.hot_rows is None or unit.hot_rows.numel() == 0:
                measured_rows.append(0)
                continue
            current = unit.weights.index_select(0, unit.hot_rows).float()
            # Peak: the previous snapshot and the new copy are both held here.
            self._note_peak(current.numel() * current.element_size())
            if unit.snapshot is not None:
                diff = current - unit.snapshot
                if self.change_metric == "linf":
                    part_a.append(diff.abs().amax(dim=1))
                else:  # rel_l2: sums of squares, added over column shards before the ratio
                    part_a.append(diff.pow(2).sum(dim=1))
                    part_b.append(unit.snapshot.pow(2).sum(dim=1))
                measured_rows.append(unit.hot_rows.numel())
                measured = True
            else:
                measured_rows.append(0)
            unit.snapshot = current  # index_select made a copy
        self.snapshots_taken += 1

        # To the host once for all units (the copy waits for the device).
        if measured:
            part_a, part_b = [torch.cat(part_a).cpu()], [torch.cat(part_b).cpu()] if part_b else []
        # All ranks: even a rank without hot rows joins the gathers (empty tensors).
        any_measured = all_reduce_(torch.tensor([1.0 if measured else 0.0]), dist.ReduceOp.MAX)
        self.meter(any_measured.element_size())
        if any_measured.item() == 0:
            return False
        if self.peers is None:  # every rank's units, once (peer_rows.py)
            spans = [[self._first_key(u), u.rows] for u in self.units]
            self.peers = PeerUnits.gather(torch.tensor(spans, dtype=torch.int64).view(-1, 2), self.meter)
        # the keys are not sent: every rank works them out from the units' measured row counts
        assert len(measured_rows) == len(self.units), "a count for every unit"
        units = self.peers.units_per_rank  # every rank's, so no size is exchanged
        all_rows = self._gather(torch.tensor(measured_rows, dtype=torch.int32), lengths=units)
        all_keys = self.peers.keys(self.hot_keys, all_rows)
        lengths = [int(part.sum()) for part in all_rows.split(units)]  # every rank's changes
        all_a = self._gather(torch.cat(part_a) if part_a else torch.zeros(0), lengths=lengths)
        # linf has no second part (every rank takes the same branch: the config's)
        all_b = (
            self._gather(torch.cat(part_b) if part_b else torch.zeros(0), lengths=lengths)
            if self.change_metric != "linf" else None
        )  # fmt: skip
        self._note_peak(sum(t.numel() * t.element_size() for t in (all_keys, all_a, all_b) if t is not None))
        unique, inverse = torch.unique(all_keys, return_inverse=True)
        if self.change_metric == "linf":
            # A row's change is its largest element change over all its column shards (replicas
            # of data-parallel rows report the same value).
            change = torch.zeros(unique.numel()).scatter_reduce_(0, inverse, all_a, "amax", include_self=False)
        else:
            assert all_b is not None, "rel_l2 gathers both parts"
            a = torch.zeros(unique.numel(), dtype=torch.float64).index_add_(0, inverse, all_a.double())
            b = torch.zeros(unique.numel(), dtype=torch.float64).index_add_(0, inverse, all_b.double())
            change = (a.sqrt() / b.sqrt().clamp_min(1e-12)).float()
        self.row_state.replace(unique, change.clamp_min(0.0))  # unique: sorted keys
        return True

    def hot_rows_per_table(self) -> Dict[str, int]:
        """Distinct hot rows per table (same on every rank)."""
        return self.rows_per_table(self.hot_keys)

    def rows_per_table(self, keys: torch.Tensor) -> Dict[str, int]:
        """How many of the flat ``keys`` (unique) fall in each feature's table; zeros left out."""
        if not keys.numel():
            return {}
        feature, _ = self.index.from_flat(keys)
        counts = torch.bincount(feature, minlength=self.index.num_features).tolist()
        return {name: int(n) for name, n in zip(self.index.feature_names, counts) if n}

    def _note_peak(self, transient: int = 0) -> None:
        held = self.state_bytes() + self.row_state.nbytes() + int(transient)
        self.peak_bytes = max(self.peak_bytes, held)

    def state_bytes(self) -> int:
        """Bytes of this rank's tracking state: the global hot keys and every local shard's counts,
        hot rows and snapshot (the controller adds the published changes)."""
        return int(self.hot_keys.numel() * 8 + sum(u.state_bytes() for u in self.units))


class NoTracking:
    """A policy that tracks nothing (off, random): no shard counts, no hot set, no snapshot. The
    controller's schedule has no tracking step for it, so none of the collectives is called."""

    count_seconds = 0.0
    counting = False
    peak_bytes = 0

    def __init__(self) -> None:
        self.modules: List[SlipstreamShardedEBC] = []
        self.units: List[ShardUnit] = []
        self.hot_keys = torch.zeros(0, dtype=torch.int64)
        self.selection: Optional[Dict[str, Any]] = None
        self.turnover: List[Dict[str, int]] = []
        self.meter: Callable[[int], None] = lambda nbytes: None

    def set_counting(self, on: bool) -> None:
        pass

    def state_bytes(self) -> int:
        return 0



def _is_rank0() -> bool:
    return not dist.is_initialized() or dist.get_rank() == 0


def hot_budget_bytes(megabytes: float) -> int:
    if not (megabytes > 0 and math.isfinite(megabytes)):
        raise ValueError(f"slipstream.hot_budget_mb={megabytes} must be a positive number of MiB")
    return int(megabytes * 1024 * 1024)
