"""The gradients that served samples owe to their rows: summed locally, pushed to their shards.

A served sample (``serving.py``) reads its rows from the replica and sends nothing through the
shards, so its gradient for those rows does not reach them in its step. Dropping it would be
skipping again (measured: on ``clicklog_quick`` serving 32% of the samples without the push cost
0.0045 test AUC; with the tables frozen it cost nothing, so all of the loss was these gradients).
Instead each rank sums, per row, the gradient its served samples' pooled embeddings received
(SUM pooling: a row gets its bag's gradient once per occurrence), and every
``replica_sync_steps`` the ranks exchange the sums (one all-gather of (row, gradient) pairs) and
every rank applies, to the shards it holds, the sum over ranks divided by the world size: what
TorchRec's output all-to-all backward and gradient division make of a step's gradient. A shard
applies it by a forward and backward of its own embedding kernel on one lookup per row (no
communication: the kernel's fused optimizer updates the rows in backward; for data-parallel
tables the gradient lands on the replicated weights, identical on every rank, and the optimizer
step that follows applies it). A stale row's update is thus delayed by at most
``replica_sync_steps`` steps and applied as one step of the summed gradient, instead of lost.
"""

from __future__ import annotations

from typing import Any, Dict, List

import torch
import torch.distributed as dist
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from slipstream_rec.distributed import gather_varlen
from slipstream_rec.slipstream.rows import RowIndex
from slipstream_rec.slipstream.sharded import ShardUnit

__all__ = ["ServedGradients"]


class ServedGradients:
    """Per-row sums of the served samples' embedding gradients on this rank (sorted flat keys)."""

    def __init__(self, index: RowIndex, dim: int) -> None:
        self.index = index
        self.dim = int(dim)
        self._keys = torch.zeros(0, dtype=torch.int64)
        self._grads = torch.zeros(0, self.dim)
        self._parts: List[Any] = []  # (keys, sums) of the steps since the last merge
        self.pushes = 0  # pushes that moved at least one row (same count on every rank)
        self.rows_pushed = 0  # rows this rank pushed, all pushes

    @torch.no_grad()
    def add(self, kjt: KeyedJaggedTensor, bag_grads: torch.Tensor) -> None:
        """Add the gradient ``bag_grads`` (n, F, D) of the pooled embeddings of the served samples
        ``kjt`` (n samples, F features in the KJT's key order) to their rows. Local."""
        kjt = kjt.to(torch.device("cpu"))
        lengths = kjt.lengths().to(torch.int64)
        if not int(lengths.sum()):
            return
        device = bag_grads.device
        flat = self.index.flat_keys(kjt).to(device)
        per_bag = bag_grads.detach().float().transpose(0, 1).reshape(-1, self.dim)  # feature-major
        # one id per bag (the usual case): the bags are the lookups
        per_lookup = per_bag if bool((lengths == 1).all()) else per_bag.repeat_interleave(lengths.to(device), dim=0)
        # this step's rows summed now (few distinct rows, many lookups); the steps' sums are
        # merged only when they are read (the push, a checkpoint): O(step) work per step
        step_keys, inverse = torch.unique(flat, return_inverse=True)
        step_grads = torch.zeros(step_keys.numel(), self.dim, device=device).index_add_(0, inverse, per_lookup)
        self._parts.append((step_keys, step_grads))

    def _merge(self) -> None:
        if not self._parts:
            return
        keys = torch.cat([self._keys.to(self._parts[0][0].device)] + [k for k, _ in self._parts])
        grads = torch.cat([self._grads.to(self._parts[0][1].device)] + [g for _, g in self._parts])
        self._parts = []
        unique, inverse = torch.unique(keys, return_inverse=True)
        self._keys = unique
        self._grads = torch.zeros(unique.numel(), self.dim, device=grads.device).index_add_(0, inverse, grads)

    @property
    def keys(self) -> torch.Tensor:
        """The summed rows, sorted flat keys."""
        self._merge()
        return self._keys

    @property
    def grads(self) -> torch.Tensor:
        """Their gradient sums, (rows, D)."""
        self._merge()
        return self._grads

    def push(self, units: List[ShardUnit], feature_idx: Dict[str, int]) -> int:
        """Exchange the sums and apply them to this rank's shards ``units``; returns the bytes
        this rank gave to the exchange. Collective: ALL ranks enter two all-gathers, with or
        without rows of their own."""
        keys, grads = self.keys.cpu(), self.grads.cpu()
        sent = keys.numel() * 8 + grads.numel() * 4
        all_keys = gather_varlen(keys)  # all ranks
        all_grads = gather_varlen(grads.reshape(-1)).view(-1, self.dim)  # all ranks
        world = dist.get_world_size() if dist.is_initialized() else 1
        unique, inverse = torch.unique(all_keys, return_inverse=True)
        total = torch.zeros(unique.numel(), self.dim).index_add_(0, inverse, all_grads) / world
        by_kernel: Dict[int, List[Any]] = {}
        for unit in units:  # discovery order: a kernel's features in its own order
            first = int(self.index.offsets[feature_idx[unit.feature]]) + unit.row_offset
            lo, hi = torch.searchsorted(unique, torch.tensor([first, first + unit.rows])).tolist()
            rows = unique[lo:hi] - first
            grad = total[lo:hi, unit.col_offset : unit.col_offset + unit.cols]
            by_kernel.setdefault(id(unit.kernel), [unit.kernel, unit.weights.device, []])[2].append((rows, grad))
        for kernel, device, parts in by_kernel.values():
            if sum(r.numel() for r, _ in parts):
                _apply(kernel, device, parts)
        self.pushes += 1
        self.rows_pushed += int(keys.numel())
        self._keys, self._grads = torch.zeros(0, dtype=torch.int64), torch.zeros(0, self.dim, device=self._grads.device)
        return int(sent)

    def state_dict(self) -> Dict[str, Any]:
        return {
            "keys": self.keys.cpu().clone(), "grads": self.grads.detach().cpu().clone(),
            "pushes": self.pushes, "rows_pushed": self.rows_pushed,
        }  # fmt: skip

    def load_state_dict(self, state: Dict[str, Any], device: torch.device) -> None:
        self._keys = state["keys"].clone()
        self._grads = state["grads"].to(device)
        self._parts = []
        self.pushes, self.rows_pushed = int(state["pushes"]), int(state["rows_pushed"])


def _apply(kernel: Any, device: torch.device, parts: List[Any]) -> None:
    """One lookup per row of every feature of ``kernel`` (its features in order, a pseudo-sample
    per row of the longest), backward with each row's gradient: the kernel's own update rule."""
    size = max(r.numel() for r, _ in parts)
    lengths = torch.zeros(len(parts), size, dtype=torch.int32)
    for slot, (rows, _) in enumerate(parts):
        lengths[slot, : rows.numel()] = 1
    kjt = KeyedJaggedTensor(
        keys=[f"f{slot}" for slot in range(len(parts))],  # names do not matter to a kernel: order does
        values=torch.cat([r for r, _ in parts]),
        lengths=lengths.view(-1),
        stride=size,
    ).to(device)
    out = kernel(kjt)  # (size, sum of the features' dims), features in order
    grad = torch.zeros_like(out)
    col = 0
    for rows, g in parts:
        grad[: rows.numel(), col : col + g.shape[1]] = g.to(out.device, out.dtype)
        col += g.shape[1]
    assert col == out.shape[1], "a kernel's output columns are its features' dims"
    torch.autograd.backward(out, grad)
