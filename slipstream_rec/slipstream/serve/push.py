"""The gradients that served lookups owe to their rows: summed locally, pushed to their shards.

A served lookup (``split.py``) reads its row from the replica and sends nothing through the
shards, so its gradient for that row does not reach it in its step. Dropping it would be
skipping again (measured: on ``clicklog_quick`` serving 32% of the samples without the push cost
0.0045 test AUC; with the tables frozen it cost nothing, so all of the loss was these gradients).
Instead each rank sums, per row, the gradient its served lookups' bags received (SUM pooling: a
row gets its bag's gradient once per occurrence), and every ``replica_sync_steps`` each rank
sends its sums to the ranks that hold their rows (one all-to-all of (row, gradient) pairs; a
data-parallel table's rows to every rank) and every rank applies, to the shards it holds, the
sum over ranks divided by the world size: what
TorchRec's output all-to-all backward and gradient division make of a step's gradient. A shard
applies it by a forward and backward of its own embedding kernel on one lookup per row (no
communication: the kernel's fused optimizer updates the rows in backward; for data-parallel
tables the gradient lands on the replicated weights, identical on every rank, and the optimizer
step that follows applies it). A stale row's update is thus delayed by at most
``replica_sync_steps`` steps and applied as one step of the summed gradient, instead of lost.
The sums travel at ``slipstream.sync_precision`` (``wire_rows.py``); under int8 what a sum's
rounding left is added to the row's next push (error feedback), so small elements are delayed,
not dropped.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional

import torch
import torch.distributed as dist
import torch.nn.functional as F

from slipstream_rec.data.types import ServedRows, host_kjt
from slipstream_rec.distributed import all_gather_objects, exchange_varlen
from slipstream_rec.slipstream.rows import RowIndex
from slipstream_rec.slipstream.serve.wire_rows import decode_rows, encode_rows, row_width
from slipstream_rec.sharding.sharded import ShardUnit

__all__ = ["RowOwners", "ServedGradients", "served_rows", "unit_cuts"]


def served_rows(pos: torch.Tensor, bags: torch.Tensor, keys: torch.Tensor) -> ServedRows:
    """The rows of the served lookups, keyed on the host: ``pos`` is each lookup's row in the
    replica's sorted flat ``keys``, ``bags`` its bag (feature-major: the layout of the pooled
    embeddings' gradient). Counted into the replica's rows (a bincount), and the lookups grouped
    by row with a stable sort (batch order kept within a row), here on the host at split time so
    that the step's sum is one kernel. Local."""
    counts = torch.bincount(pos, minlength=keys.numel())
    present = (counts > 0).nonzero().view(-1)
    counts = counts.index_select(0, present)
    # (int32 positions sort in a third of the time; the replica's rows fit)
    order = torch.sort(pos.to(torch.int32), stable=True).indices
    offsets = torch.cumsum(counts, 0) - counts
    return ServedRows(keys.index_select(0, present), counts, bags.index_select(0, order), offsets)


class RowOwners:
    """Which ranks hold a slice of which rows: every rank's shard units as spans of flat keys.
    Collective (construction): ALL ranks enter one all-gather of the spans."""

    def __init__(self, units: List[ShardUnit], index: RowIndex, feature_idx: Dict[str, int]) -> None:
        firsts = [index.offset_list[feature_idx[u.feature]] + u.row_offset for u in units]
        mine = [[f, f + u.rows] for f, u in zip(firsts, units)]
        spans = all_gather_objects(mine) if dist.is_initialized() else [mine]
        self.spans = [torch.tensor(s, dtype=torch.int64).view(-1, 2) for s in spans]

    def masks(self, keys: torch.Tensor) -> List[torch.Tensor]:
        """For every rank, which of the sorted host ``keys`` it holds a slice of (column shards
        and data-parallel copies included). Local."""
        out = []
        for spans in self.spans:
            cuts = torch.searchsorted(keys, spans.view(-1)).view(-1, 2).tolist()
            mask = torch.zeros(keys.numel(), dtype=torch.bool)
            for lo, hi in cuts:
                mask[lo:hi] = True
            out.append(mask)
        return out


class ServedGradients:
    """Per-row sums of the served samples' embedding gradients on this rank: the rows' sorted
    flat keys on the host, their sums on the training device."""

    def __init__(
        self, index: RowIndex, dim: int, device: torch.device = torch.device("cpu"),
        wire_dtype: torch.dtype = torch.float32,
    ) -> None:  # fmt: skip
        self.index = index
        self.dim = int(dim)
        self.device = device
        self.wire_dtype = wire_dtype  # slipstream.sync_precision: what a pushed sum travels as (wire_rows.py)
        # what a pushed row's flat key travels as: int32 where every table's rows fit (half the
        # key's bytes: at dim 16 in bf16 a row's 4 + 32 bytes instead of 8 + 32)
        self.key_dtype = torch.int32 if index.num_rows <= torch.iinfo(torch.int32).max else torch.int64
        self._keys = torch.zeros(0, dtype=torch.int64)
        self._grads = torch.zeros(0, self.dim, device=device)
        self._parts: List[Any] = []  # (host keys, device sums) of the steps since the last merge
        self.owners: Optional[RowOwners] = None  # who holds which rows, learnt at the first push
        self.pushes = 0  # pushes that moved at least one row (same count on every rank)
        self.rows_pushed = 0  # rows this rank pushed, all pushes
        # the rows the last push applied to this rank's shards (sorted flat keys, every rank's
        # pushes): the only replica rows a push moves (replica.py, ``rebuild``'s ``moved``)
        self.applied = torch.zeros(0, dtype=torch.int64)
        # int8 only: what the last push's rounding left of each row's sum (its rows' sorted keys
        # on the host, the remainders where the sums are), added to the row's next push (``_on_wire``)
        self._carry_keys = torch.zeros(0, dtype=torch.int64)
        self._carry = torch.zeros(0, self.dim, device=device)

    @property
    def pending(self) -> int:
        """Row sums held and not pushed yet (a row may count once per step it was served in); 0:
        every served gradient so far has reached its shard. Host sizes only."""
        return int(self._keys.numel()) + sum(int(k.numel()) for k, _ in self._parts)

    @torch.no_grad()
    def add(self, rows: ServedRows, bag_grads: torch.Tensor) -> None:
        """Add the gradient ``bag_grads`` (F, B, D) of the replica parts of a batch's pooled
        embeddings to the rows of its served lookups ``rows`` (``served_rows``): a bag per row
        whose indices are its lookups' bags. Local; no host read: the step's sums are a buffer of
        ``rows.keys`` rows, which the host knows."""
        if rows.bags.numel() == 0:
            return
        per_bag = bag_grads.detach().float().reshape(-1, self.dim)  # feature-major, as the bags
        step_grads = F.embedding_bag(rows.bags, per_bag, rows.offsets, mode="sum")  # (K, D)
        self._parts.append((rows.keys, step_grads))

    def _merge(self) -> None:
        """The steps' sums merged (few distinct rows per step, many lookups): keys on the host,
        sums where they are."""
        if not self._parts:
            return
        keys = torch.cat([self._keys] + [k for k, _ in self._parts])
        grads = torch.cat([self._grads.to(self._parts[0][1].device)] + [g for _, g in self._parts])
        self._parts = []
        unique, inverse = torch.unique(keys, return_inverse=True)  # host tensors
        self._keys = unique
        self._grads = torch.zeros(unique.numel(), self.dim, device=grads.device).index_add_(
            0, inverse.to(grads.device, non_blocking=True), grads
        )

    @property
    def keys(self) -> torch.Tensor:
        """The summed rows, sorted flat keys (host)."""
        self._merge()
        return self._keys

    @property
    def grads(self) -> torch.Tensor:
        """Their gradient sums, (rows, D), on the training device."""
        self._merge()
        return self._grads

    def push(self, units: List[ShardUnit], feature_idx: Dict[str, int]) -> int:
        """Send the sums to the ranks that hold their rows and apply them there; returns the
        bytes this rank sent to other ranks. Collective: ALL ranks enter, with or without rows
        of their own: the first push learns every rank's shards (``RowOwners``, one all-gather
        of their spans), then each push is one all-to-all of the keys (int32 where the rows
        fit) through the host group (its sizes tell every rank what it receives) and one of the sums through the main backend
        (device tensors under nccl), sized by those counts, so no rank reads a size back from
        its device. A row goes only to the ranks that hold a slice of it (all of them for a
        data-parallel table, whose copies must stay equal)."""
        keys, grads = self.keys, self.grads
        if self.owners is None:
            self.owners = RowOwners(units, self.index, feature_idx)  # all ranks, once
        rank = dist.get_rank() if dist.is_initialized() else 0
        picks = [m.nonzero().view(-1) for m in self.owners.masks(keys)]
        key_parts = [keys.index_select(0, p).to(self.key_dtype) for p in picks]
        wire = self.wire_dtype
        rows = self._on_wire(keys, grads)  # (n, row width): every row encoded once
        grad_parts = [rows.index_select(0, p.to(rows.device, non_blocking=True)).reshape(-1) for p in picks]
        sent = sum(
            k.numel() * k.element_size() + g.numel() * g.element_size()
            for r, (k, g) in enumerate(zip(key_parts, grad_parts)) if r != rank
        )  # fmt: skip
        all_keys, lengths = exchange_varlen(key_parts, with_lengths=True)  # all ranks
        all_keys = all_keys.to(torch.int64)
        width = row_width(wire, self.dim)
        all_grads = exchange_varlen(grad_parts, lengths=[n * width for n in lengths], bulk=True)
        all_grads = decode_rows(all_grads, self.dim, wire)
        world = dist.get_world_size() if dist.is_initialized() else 1
        unique, inverse = torch.unique(all_keys, return_inverse=True)  # host
        total = torch.zeros(unique.numel(), self.dim, device=all_grads.device)
        total = total.index_add_(0, inverse.to(all_grads.device, non_blocking=True), all_grads) / world
        by_kernel: Dict[int, List[Any]] = {}
        firsts, cuts = unit_cuts(units, unique, self.index, feature_idx)
        for unit, first, (lo, hi) in zip(units, firsts, cuts):  # a kernel's features in its order
            rows = unique[lo:hi] - first
            grad = total[lo:hi, unit.col_offset : unit.col_offset + unit.cols]
            by_kernel.setdefault(id(unit.kernel), [unit.kernel, unit.weights.device, []])[2].append((rows, grad))
        for kernel, device, parts in by_kernel.values():
            if sum(r.numel() for r, _ in parts):
                _apply(kernel, device, parts)
        self.applied = unique
        self.pushes += 1
        self.rows_pushed += int(keys.numel())
        self._keys = torch.zeros(0, dtype=torch.int64)
        self._grads = torch.zeros(0, self.dim, device=self._grads.device)
        return int(sent)

    def _on_wire(self, keys: torch.Tensor, grads: torch.Tensor) -> torch.Tensor:
        """The sums of ``keys`` as the push sends them, (n, row width) of the wire's elements.
        Under int8 a sum is rounded to a 254th of its row's largest element, which would drop a
        row's small elements step after step; so what the rounding left (error feedback) is
        added to the row's sum the next time it is pushed, and what this push's rounding leaves
        is kept for then. A row not pushed at the next push loses its remainder (at most a
        254th of its largest element, once). Local; it reads host keys only, no device value."""
        if self.wire_dtype is not torch.int8:
            return encode_rows(grads, self.wire_dtype).view(keys.numel(), row_width(self.wire_dtype, self.dim))
        if self._carry_keys.numel() and keys.numel():
            hit = torch.isin(self._carry_keys, keys).nonzero().view(-1)  # host
            at = torch.searchsorted(keys, self._carry_keys.index_select(0, hit))
            carried = self._carry.index_select(0, hit.to(self._carry.device, non_blocking=True))
            grads = grads.index_add(0, at.to(grads.device, non_blocking=True), carried.to(grads.device))
        rows = encode_rows(grads, torch.int8)
        self._carry_keys = keys.clone()
        self._carry = grads - decode_rows(rows, self.dim, torch.int8)
        return rows.view(keys.numel(), row_width(torch.int8, self.dim))

    def state_dict(self) -> Dict[str, Any]:
        return {
            "keys": self.keys.clone(), "grads": self.grads.detach().cpu().clone(),
            "pushes": self.pushes, "rows_pushed": self.rows_pushed,
            "carry_keys": self._carry_keys.clone(), "carry": self._carry.detach().cpu().clone(),
        }  # fmt: skip

    def load_state_dict(self, state: Dict[str, Any], device: Optional[torch.device] = None) -> None:
        self._keys = state["keys"].cpu().clone()
        self._grads = state["grads"].to(device or self.device)
        self._parts = []
        self.pushes, self.rows_pushed = int(state["pushes"]), int(state["rows_pushed"])
        # (a checkpoint from before the int8 push's remainders carries none)
        self._carry_keys = state.get("carry_keys", torch.zeros(0, dtype=torch.int64)).cpu().clone()
        self._carry = state.get("carry", torch.zeros(0, self.dim)).to(device or self.device)


def unit_cuts(
    units: List[ShardUnit], keys: torch.Tensor, index: RowIndex, feature_idx: Dict[str, int]
) -> Any:
    """Each unit's first flat key, and the [lo, hi) range of the sorted host ``keys`` that falls
    in its rows: one search and one read for all units."""
    firsts = [index.offset_list[feature_idx[u.feature]] + u.row_offset for u in units]
    bounds = torch.tensor([[f, f + u.rows] for f, u in zip(firsts, units)], dtype=torch.int64).view(-1)
    cuts = torch.searchsorted(keys, bounds).view(-1, 2).tolist() if units else []
    return firsts, cuts


def _apply(kernel: Any, device: torch.device, parts: List[Any]) -> None:
    """One lookup per row of every feature of ``kernel`` (its features in order, a pseudo-sample
    per row of the longest), backward with each row's gradient: the kernel's own update rule."""
    size = max(r.numel() for r, _ in parts)
    lengths = torch.zeros(len(parts), size, dtype=torch.int32)
    for slot, (rows, _) in enumerate(parts):
        lengths[slot, : rows.numel()] = 1
    kjt = host_kjt(
        [f"f{slot}" for slot in range(len(parts))],  # names do not matter to a kernel: order does
        torch.cat([r for r, _ in parts]),
        lengths.view(-1),
        size,
    ).to(device, non_blocking=True)
    out = kernel(kjt)  # (size, sum of the features' dims), features in order
    grad = torch.zeros_like(out)
    col = 0
    for rows, g in parts:
        grad[: rows.numel(), col : col + g.shape[1]] = g.to(out.device, out.dtype)
        col += g.shape[1]
    assert col == out.shape[1], "a kernel's output columns are its features' dims"
    torch.autograd.backward(out, grad)
