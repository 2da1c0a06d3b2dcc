"""A copy of the stale hot rows on every rank, so that inputs touching only them are served locally.

Slipstream's ``serve`` action (``slipstream.action=serve``) answers an input whose lookups all hit
stale rows from this replica instead of the sharded tables: no input all-to-all, no shard lookup,
no pooled-embedding all-to-all and no gradient all-to-all for it, while the dense network still
trains on it.

Consistency (bounded staleness, no write-back): the replica is rebuilt from the shards at every
snapshot, when the tracker has just agreed on the stale set on every rank. Between two snapshots
the shards keep training those rows from the inputs that do go through them; the replica does not
follow, so a served lookup reads a row at most ``snapshot_interval`` steps old, whose change over
the last interval was below the threshold T (linf: no element moved by T or more). Served inputs
produce no gradient for the stale rows (the paper's "skips their updates"): the rows are not
parameters here, nothing is all-reduced for them. A row that starts to move again (its change at
a snapshot reaches T) is not stale at that snapshot and so leaves the replica at the rebuild.

Rows are full rows (every column): column-wise shards of a row are assembled from every rank that
holds one; data-parallel tables are copied locally (every rank holds the same weights). Pooling is
SUM, as every table of the model (``model/dlrm.py``); other poolings are refused where the model
is built.
"""

from __future__ import annotations

from typing import Any, Dict, List

import torch
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from slipstream_rec.distributed import gather_varlen
from slipstream_rec.slipstream.classify import per_sample_max_change
from slipstream_rec.slipstream.rows import RowIndex, RowState
from slipstream_rec.slipstream.sharded import ShardUnit, flush_caches

__all__ = ["StaleReplica"]


class StaleReplica:
    """The stale rows as one local (rows, D) table: sorted flat ``keys`` and their ``values``."""

    def __init__(self, index: RowIndex, dim: int, device: torch.device) -> None:
        # index: the flat key space of all tables; dim: the embedding dim (every table's);
        # device: where the served pooled embeddings are computed (the training device).
        self.index = index
        self.dim = int(dim)
        self.device = device
        self.keys = torch.zeros(0, dtype=torch.int64)  # sorted flat keys, on the host
        self.values = torch.zeros(0, self.dim, dtype=torch.float32, device=device)
        # Membership as a RowState (change 0 for a replica row, +inf otherwise): its per-table
        # lookup view answers "is every lookup of this sample in the replica" in one pass.
        self._member = RowState(index.num_rows, index)
        self.rebuilds = 0
        self.sync_bytes = 0  # bytes this rank gave to the rebuild gathers, all rebuilds
        self.joined = 0  # rows that entered at the last rebuild
        self.left = 0  # rows that left at the last rebuild (re-activated or no longer hot)

    @property
    def rows(self) -> int:
        return int(self.keys.numel())

    def nbytes(self) -> int:
        """Bytes this rank holds for the replica: keys, row values, membership view."""
        return int(self.keys.numel() * 8 + self.values.numel() * self.values.element_size() + self._member.nbytes())

    # ---- rebuild (collective) -------------------------------------------------------------
    @torch.no_grad()
    def rebuild(self, units: List[ShardUnit], keys: torch.Tensor, feature_idx: Dict[str, int]) -> None:
        """Copy the rows ``keys`` (sorted flat keys, identical on every rank) from the shards.

        Collective: ALL ranks enter (four gathers, empty tensors where a rank holds none of the
        rows). Each rank sends the slices it holds of non-replicated shards (rows x its columns);
        data-parallel rows are copied locally. Every rank ends with the same full rows.
        """
        keys = torch.as_tensor(keys, dtype=torch.int64).reshape(-1).cpu()
        n, dim = keys.numel(), self.dim
        values = torch.zeros(n, dim, dtype=torch.float32)
        filled = torch.zeros(n, dtype=torch.int64)  # columns received per row
        flush_caches(units)  # fused_uvm_caching: the newest values may sit in the GPU cache
        send_keys, send_cols, send_widths, send_values = [], [], [], []
        for unit in units:
            first = int(self.index.offsets[feature_idx[unit.feature]]) + unit.row_offset
            lo, hi = torch.searchsorted(keys, torch.tensor([first, first + unit.rows])).tolist()
            if hi == lo:
                continue
            local = (keys[lo:hi] - first).to(unit.weights.device)
            rows = unit.weights.index_select(0, local).float().cpu()
            if unit.replicated:
                values[lo:hi, unit.col_offset : unit.col_offset + unit.cols] = rows
                filled[lo:hi] += unit.cols
                continue
            send_keys.append(keys[lo:hi])
            send_cols.append(torch.full((hi - lo,), unit.col_offset, dtype=torch.int64))
            send_widths.append(torch.full((hi - lo,), unit.cols, dtype=torch.int64))
            send_values.append(rows.reshape(-1))

        def cat(parts: List[torch.Tensor], dtype: torch.dtype) -> torch.Tensor:
            return torch.cat(parts) if parts else torch.zeros(0, dtype=dtype)

        mine = [cat(send_keys, torch.int64), cat(send_cols, torch.int64), cat(send_widths, torch.int64)]
        mine.append(cat(send_values, torch.float32))
        self.sync_bytes += sum(t.numel() * t.element_size() for t in mine)
        # All ranks: the same four gathers, in this order.
        all_keys, all_cols, all_widths, all_values = (gather_varlen(t) for t in mine)
        if all_keys.numel():
            pos = torch.searchsorted(keys, all_keys)
            starts = torch.cumsum(all_widths, 0) - all_widths
            pairs = torch.unique(torch.stack([all_cols, all_widths], 1), dim=0).tolist()
            for col, width in pairs:  # one pass per distinct column slice (a few at most)
                sel = ((all_cols == col) & (all_widths == width)).nonzero().view(-1)
                at = (starts[sel].view(-1, 1) + torch.arange(width).view(1, -1)).view(-1)
                values[pos[sel], col : col + width] = all_values[at].view(-1, width)
                filled.index_add_(0, pos[sel], all_widths[sel])
        assert bool((filled == dim).all()), "every replica row assembled from all of its columns"
        before = self.keys
        self.joined = int((~torch.isin(keys, before)).sum()) if n else 0
        self.left = int((~torch.isin(before, keys)).sum()) if before.numel() else 0
        self.keys = keys.clone()
        self.values = values.to(self.device)
        self._member.replace(self.keys, torch.zeros(n))
        self.rebuilds += 1

    # ---- serving (local) --------------------------------------------------------------------
    def servable(self, kjt: KeyedJaggedTensor) -> torch.Tensor:
        """(B,) bool: the samples whose every lookup is a replica row (and that have a lookup)."""
        if not self.rows:
            return torch.zeros(kjt.stride(), dtype=torch.bool)
        return per_sample_max_change(kjt, self.index, self._member) < 1.0  # 0 in, +inf out

    def pooled(self, kjt: KeyedJaggedTensor) -> torch.Tensor:
        """(B, F, D) SUM-pooled embeddings of ``kjt`` from the replica, F in the KJT's key order.
        Every lookup must be a replica row (``servable``)."""
        num_keys, stride = len(kjt.keys()), kjt.stride()
        flat = self.index.flat_keys(kjt)
        pos = torch.searchsorted(self.keys, flat)
        assert flat.numel() == 0 or bool((self.keys[pos.clamp(max=self.rows - 1)] == flat).all()), (
            "pooled() of a sample that is not servable"
        )
        lengths = kjt.lengths().to(torch.int64)
        offsets = torch.cumsum(lengths, 0) - lengths
        bags = torch.nn.functional.embedding_bag(
            pos.to(self.device), self.values, offsets.to(self.device), mode="sum"
        )  # (F * B, D), feature-major like the KJT
        return bags.view(num_keys, stride, self.dim).transpose(0, 1).contiguous()

    # ---- checkpointing (local) ----------------------------------------------------------------
    def state_dict(self) -> Dict[str, Any]:
        return {
            "keys": self.keys.clone(),
            "values": self.values.detach().cpu().clone(),
            "rebuilds": self.rebuilds,
            "sync_bytes": self.sync_bytes,
            "joined": self.joined,
            "left": self.left,
        }

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        self.keys = state["keys"].clone()
        self.values = state["values"].to(self.device)
        self._member.replace(self.keys, torch.zeros(self.keys.numel()))
        for k in ("rebuilds", "sync_bytes", "joined", "left"):
            setattr(self, k, int(state[k]))
