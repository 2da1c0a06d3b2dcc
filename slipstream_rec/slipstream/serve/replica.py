"""A copy of the stale hot rows on every rank, so that lookups of them are served locally.

Slipstream's ``serve`` action (``slipstream.action=serve``) answers every lookup of a stale row
from this replica instead of the sharded tables (``split.py``): the lookup sends no id through
the input all-to-all, and a bag all of whose lookups are served sends no pooled embedding and
receives no gradient through the output all-to-all, while the dense network still trains on it.

Consistency (bounded staleness): the replica is rebuilt from the shards at every snapshot, when
the tracker has just agreed on the stale set on every rank, and brought up to date every
``replica_sync_steps``. Every lookup of a replica row is served on every rank, so in between its
shard changes only through the pushes of the served lookups' gradients (``push.py``), which
run right before each sync; a sync then sends only the rows that moved past
``replica_sync_bound`` (``rebuild``). A served lookup reads a row at most ``replica_sync_steps``
steps old, which differs from its shard by at most the bound plus the pushes since the last
sync, and whose change over the last snapshot interval was below the threshold T. A row that
starts to move again (its change at a snapshot reaches T) is not stale at that snapshot and so
leaves the replica at the rebuild.

Where it lives: on the host. The data side reads it (membership, and each bag's replica part,
computed when a batch is annotated), so a batch leaves the data side with host
tensors only and the pipeline pins and copies it with the rest of the batch. A rebuild copies
the shards' rows of the replica to the host to compare them with the copy (a host wait), sends
the rows that moved through the main backend (device tensors under nccl) and copies what it
received to the host (a second host wait): the two host waits of a sync step.

Rows are full rows (every column): column-wise shards of a row are assembled from every rank that
holds one; data-parallel tables are copied locally (every rank holds the same weights). Pooling is
SUM, as every table of the model (``model/dlrm.py``); other poolings are refused where the model
is built.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional

import torch

from slipstream_rec.distributed import gather_varlen
from slipstream_rec.slipstream.serve.push import unit_cuts
from slipstream_rec.slipstream.serve.wire_rows import decode_rows, encode_rows, row_width
from slipstream_rec.slipstream.rows import RowIndex
from slipstream_rec.sharding.sharded import ShardUnit, flush_caches

__all__ = ["StaleReplica"]

# Up to this many rows in all tables, a replica keeps a dense map from every flat key to its row
# in the replica (int32, -1 outside: 4 bytes a row, 32 MiB at this size), so that locating a
# batch's lookups is one gather; above it, a binary search in the sorted keys (measured on
# clicklog, 106k lookups against 68k replica rows: the search 1.8 ms a batch, the gather 0.1).
DENSE_MAP_ROWS = 1 << 23


def _positions(keys: torch.Tensor, wanted: torch.Tensor) -> Any:
    """(positions, found): where each of the keys ``wanted`` (any shape) is in the sorted
    ``keys`` (meaningful where found), and whether it is there. A binary search."""
    if not keys.numel():
        return torch.zeros(wanted.shape, dtype=torch.int64), torch.zeros(wanted.shape, dtype=torch.bool)
    at = torch.searchsorted(keys, wanted).clamp_(max=keys.numel() - 1)
    return at, keys.index_select(0, at.view(-1)).view(wanted.shape) == wanted


def _columns(values: torch.Tensor, col: int, width: int) -> torch.Tensor:
    """The columns [col, col + width) of ``values``, a view written through in place."""
    return values if (col, width) == (0, values.shape[1]) else values[:, col : col + width]


class StaleReplica:
    """The stale rows as one local (rows, D) table: sorted flat ``keys`` and their ``values``."""

    def __init__(
        self, index: RowIndex, dim: int, device: torch.device, wire_dtype: torch.dtype = torch.float32
    ) -> None:
        # index: the flat key space of all tables; dim: the embedding dim (every table's);
        # device: where the values live and the served pooled embeddings are computed: the host
        # under serve (see the module docstring); wire_dtype: what a sync sends of a row
        # (slipstream.sync_precision, wire_rows.py): float32 sends the rows, bfloat16 and int8
        # their difference from the copy every rank holds (``rebuild``).
        self.index = index
        self.dim = int(dim)
        self.device = device
        self.wire_dtype = wire_dtype
        # Below this share of a value, a row's difference from its shard is the wire's own
        # rounding, not a move: a bf16 difference leaves up to 2^-8 of itself behind. An int8
        # one leaves up to 1/254 of the difference's largest element, which for a row that
        # moved little is far below its values; where it is not (a value near zero) the row is
        # sent again at the next comparison, each time leaving 1/254 of what was left.
        self.resolution = 0.0 if wire_dtype is torch.float32 else torch.finfo(torch.bfloat16).eps / 2
        self.keys = torch.zeros(0, dtype=torch.int64)  # sorted flat keys, on the host
        self.values = torch.zeros(0, self.dim, dtype=torch.float32, device=device)
        # each flat key's row in the replica, -1 outside (DENSE_MAP_ROWS; None: searched instead)
        dense = index.num_rows <= DENSE_MAP_ROWS
        self._where = torch.full((index.num_rows,), -1, dtype=torch.int32) if dense else None
        self.rebuilds = 0
        self.sync_bytes = 0  # bytes this rank gave to the rebuild gathers, all rebuilds
        self.rows_sent = 0  # row slices this rank sent to them
        self.joined = 0  # rows that entered at the last rebuild
        self.joined_keys = torch.zeros(0, dtype=torch.int64)  # their sorted flat keys
        self.left = 0  # rows that left at the last rebuild (re-activated or no longer hot)

    @property
    def rows(self) -> int:
        return int(self.keys.numel())

    def nbytes(self) -> int:
        """Bytes this rank holds for the replica: keys, row values and the key map."""
        held = self.keys.numel() * 8 + self.values.numel() * self.values.element_size()
        return int(held + (self._where.numel() * 4 if self._where is not None else 0))

    def _set_keys(self, keys: torch.Tensor) -> None:
        if self._where is not None:
            self._where.index_fill_(0, self.keys, -1)
            self._where.index_copy_(0, keys, torch.arange(keys.numel(), dtype=torch.int32))
        self.keys = keys

    # ---- rebuild (collective) -------------------------------------------------------------
    @torch.no_grad()
    def rebuild(
        self, units: List[ShardUnit], keys: torch.Tensor, feature_idx: Dict[str, int], bound: float = -1.0,
        suspects: Optional[torch.Tensor] = None,
    ) -> None:
        """Make the replica the rows ``keys`` (sorted flat keys, identical on every rank), from
        the shards, sending only what changed: a row that joins is sent whole; a row the replica
        already holds is sent again only where the shard's values differ from the held copy by
        more than ``bound`` (the largest absolute difference over the columns a shard holds;
        under bf16 and int8 by more than ``bound`` plus 2^-8 of the shard's value, in any
        element). ``bound`` < 0 sends every row. Under fp32 a sent row's values replace the
        copy; under bf16 and int8 what is sent is the shard minus the copy (``wire_rows``), which
        every rank adds to its copy (a joining row's copy is zeros), so the copy stays within the
        wire's rounding of its last difference from the shard.

        ``suspects`` (sorted flat keys; None: every held row) are the held rows that may have
        moved on their shards since the last comparison: the caller knows them (``StaleServer``).
        Under per-lookup serving a replica row changes on its shard only through the pushes
        (every lookup of it is served), so between two syncs only the rows pushed move, and a
        comparison of those alone, with ``bound`` 0, sends exactly the rows that moved: the
        replica equals the shards after it (fp32). Held rows outside ``suspects`` are neither
        read nor compared; data-parallel rows are always compared whole (local, and a dense
        optimizer may move a row with no gradient). What this leaves out is the rounding a bf16
        or int8 difference left behind, which a comparison of every row would send again where
        it exceeds the resolution; it stays in the copy until the row moves again (and the next
        difference, taken from the copy, carries it).

        Collective: ALL ranks enter (per shard slice sent, a (column, width, rows) descriptor
        and the rows' positions in ``keys`` (int32) through the host group, then their values
        through the main backend, sized by the descriptors; empty where a rank sends nothing).
        Each rank compares and sends the slices it holds of non-replicated shards; data-parallel
        rows are copied locally. Every rank ends with the same rows.
        """
        keys = torch.as_tensor(keys, dtype=torch.int64).reshape(-1).cpu()
        n, dim = keys.numel(), self.dim
        flush_caches(units)  # fused_uvm_caching: the newest values may sit in the GPU cache
        pos, held = self.locate(keys)
        same = torch.equal(keys, self.keys)
        if same:  # the same rows: the copy is updated in place
            values = self.values.cpu()
        else:  # the rows held now, at their new positions (held[i]: keys[i] was in the replica)
            values = torch.zeros(n, dim, dtype=torch.float32)
            values[held] = self.values.cpu().index_select(0, pos[held])
        # the positions read from non-replicated shards: every row, or the rows that joined and
        # the suspects held
        read: Optional[torch.Tensor] = None
        if suspects is not None:
            mask = ~held
            at, found = _positions(keys, suspects)
            mask[at[found]] = True
            read = mask.nonzero().view(-1)
        filled = torch.zeros(n, dtype=torch.int64)  # columns received per row that joined
        firsts, cuts = unit_cuts(units, keys, self.index, feature_idx)
        # each unit's positions read: one search and one read for all units
        edges = torch.searchsorted(read, torch.tensor(cuts, dtype=torch.int64).view(-1)).view(-1, 2).tolist() \
            if read is not None and cuts else [None] * len(cuts)  # fmt: skip
        current: List[torch.Tensor] = []  # the shards' rows read, to the host in one copy
        spans: List[Any] = []  # (positions read, column, width, replicated)
        for unit, first, (lo, hi), edge in zip(units, firsts, cuts, edges):
            if hi <= lo:
                continue
            at = torch.arange(lo, hi) if read is None or unit.replicated else read[edge[0] : edge[1]]
            if not at.numel():
                continue
            local = (keys.index_select(0, at) - first).to(unit.weights.device)
            current.append(unit.weights.index_select(0, local).float().reshape(-1))
            spans.append((at, unit.col_offset, unit.cols, unit.replicated))
        home = units[0].weights.device if units else torch.device("cpu")  # where the shards are
        flat_rows = torch.cat(current).cpu() if current else torch.zeros(0)  # to the host, in one copy
        descriptors: List[int] = []  # (column, width, rows) per slice this rank sends
        positions: List[torch.Tensor] = []
        send: List[torch.Tensor] = []
        offset = 0
        for at, col, width, replicated in spans:
            count = at.numel()
            rows = flat_rows[offset : offset + count * width].view(count, width)
            offset += count * width
            columns = _columns(values, col, width)
            diff = rows - columns.index_select(0, at)  # a joining row's copy is zeros: its values
            if bound >= 0:
                resolution = 0.0 if replicated else self.resolution  # copied here: exact
                moved_rows = ~held.index_select(0, at)
                moved_rows |= (diff.abs() > bound + resolution * rows.abs()).any(1)
                idx = moved_rows.nonzero().view(-1)
            else:
                idx = torch.arange(count)
            hit = at.index_select(0, idx)
            if replicated:  # every rank holds these weights: copied here, never sent
                columns.index_copy_(0, hit, rows.index_select(0, idx))
                filled.index_add_(0, hit, torch.full_like(hit, width))
                continue
            if idx.numel():
                descriptors += [col, width, int(idx.numel())]
                positions.append(hit)
                out = rows if self.resolution == 0 else diff
                send.append(encode_rows(out.index_select(0, idx), self.wire_dtype))
        mine = torch.tensor(descriptors, dtype=torch.int64)
        # positions in ``keys`` travel as int32 (a replica holds fewer than 2^31 rows): half
        # their bytes (at dim 16 in bf16 a row's 4 + 32 bytes instead of 8 + 32)
        assert n <= torch.iinfo(torch.int32).max, "replica positions fit int32"
        where = torch.cat(positions).to(torch.int32) if positions else torch.zeros(0, dtype=torch.int32)
        wire = self.wire_dtype
        sent = torch.cat(send).to(home) if send else torch.zeros(0, dtype=wire, device=home)
        self.sync_bytes += mine.numel() * 8 + where.numel() * 4 + sent.numel() * sent.element_size()
        self.rows_sent += int(where.numel())
        # All ranks: the descriptors and positions (host), then the values (main backend).
        all_desc, counts = gather_varlen(mine, with_lengths=True)
        desc = all_desc.view(-1, 3).tolist()  # (column, width, rows) per slice, rank by rank: one read
        ends = [sum(counts[: r + 1]) // 3 for r in range(len(counts))]
        per_rank = [desc[end - c // 3 : end] for c, end in zip(counts, ends)]
        all_where = gather_varlen(where, lengths=[sum(r for _, _, r in d) for d in per_rank])  # sized by them
        all_where = all_where.to(torch.int64)
        widths = [sum(row_width(wire, w) * r for _, w, r in d) for d in per_rank]
        received = gather_varlen(sent, lengths=widths, bulk=True).cpu()
        at_pos = at_val = 0
        for col, width, count in desc:
            idx = all_where[at_pos : at_pos + count]
            size = count * row_width(wire, width)
            got = decode_rows(received[at_val : at_val + size], width, wire)
            columns = _columns(values, col, width)
            if self.resolution == 0:
                columns.index_copy_(0, idx, got)
            else:  # differences from the copy this rank holds too
                columns.index_add_(0, idx, got)
            filled.index_add_(0, idx, torch.full_like(idx, width))
            at_pos, at_val = at_pos + count, at_val + size
        assert bool((filled[~held] == dim).all()), "every row that joined assembled from all of its columns"
        self.joined_keys = keys[~held]
        self.joined = int(self.joined_keys.numel())
        self.left = int(self.keys.numel() - held.sum())  # held before, less those that stayed
        if not same:
            self._set_keys(keys.clone())
        self.values = values.to(self.device)
        self.rebuilds += 1

    # ---- serving (local) --------------------------------------------------------------------
    def contains(self, flat: torch.Tensor) -> torch.Tensor:
        """(n,) bool: which of the flat keys ``flat`` (host) are replica rows."""
        return self.locate(flat)[1]

    def locate(self, flat: torch.Tensor) -> Any:
        """(positions, found): each flat key's row in the replica (meaningful where found) and
        whether it is a replica row. Host."""
        if self._where is None or not self.rows:
            return _positions(self.keys, flat)
        at = self._where.index_select(0, flat.reshape(-1)).view(flat.shape)
        found = at >= 0
        return at.clamp_(min=0).to(torch.int64), found

    def pooled(self, flat: torch.Tensor, per_bag: torch.Tensor) -> torch.Tensor:
        """(bags, D): each bag's SUM of its replica rows; ``flat`` holds the bags' keys back to
        back, ``per_bag`` how many each bag has (0: a row of zeros). Every key must be a replica
        row (``contains``)."""
        pos, found = self.locate(flat)
        assert bool(found.all()), "pooled() of a key that is not in the replica"
        return self.pooled_at(pos, per_bag)

    def pooled_at(self, pos: torch.Tensor, per_bag: torch.Tensor) -> torch.Tensor:
        """``pooled`` of the replica rows at positions ``pos`` (``locate``)."""
        offsets = torch.cumsum(per_bag, 0) - per_bag
        return torch.nn.functional.embedding_bag(
            pos.to(self.device), self.values, offsets.to(self.device), mode="sum"
        )

    # ---- checkpointing (local) ----------------------------------------------------------------
    def state_dict(self) -> Dict[str, Any]:
        return {
            "keys": self.keys.clone(),
            "values": self.values.detach().cpu().clone(),
            "rebuilds": self.rebuilds,
            "sync_bytes": self.sync_bytes,
            "joined": self.joined,
            "left": self.left,
            "rows_sent": self.rows_sent,
        }

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        self._set_keys(state["keys"].clone())
        self.values = state["values"].to(self.device)
        for k in ("rebuilds", "sync_bytes", "joined", "left"):
            setattr(self, k, int(state[k]))
        self.rows_sent = int(state.get("rows_sent", 0))
