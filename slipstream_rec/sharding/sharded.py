"""The metered sharded EmbeddingBagCollection: its local shards, its byte meter, its rows updated.

Each rank sees, after the input all-to-all, exactly the lookups that hit the table shards it
holds. ``SlipstreamShardedEBC`` exposes them as ``ShardUnit``s (one local shard of one table,
tied to its position in the post-all-to-all KJT and to a view of its live weights), meters the
bytes it gives to every embedding collective, measures the rows a step updates, and lays out
serving's variable-batch outputs. Slipstream's tracker (``slipstream/tracker.py``) counts the
shards' lookups through TorchRec's post-lookup hook and snapshots their hot rows; everything
here is local to the rank.

What a shard sees after the input all-to-all (TorchRec 1.8, measured):
- table_wise / column_wise: global ids of the local tables' features, all ranks' samples;
- row_wise / table_row_wise: ids already *local* to this row shard (global id - row offset);
- data_parallel: the local batch only (no communication), so counts are summed over ranks later.
In every case the id in the KJT is the row index into the local shard's weights.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple

import torch
from torchrec.distributed.embedding_sharding import _set_sharding_context_post_a2a
from torchrec.distributed.embedding_types import KJTList
from torchrec.distributed.embeddingbag import (
    EmbeddingBagCollectionContext,
    ShardedEmbeddingBagCollection,
    VariableBatchEmbeddingBagCollectionAwaitable,
)
from torchrec.distributed.dist_data import KJTAllToAll
from torchrec.distributed.sharding.dp_sharding import DpPooledEmbeddingDist
from torchrec.distributed.types import Awaitable, LazyAwaitable, NoWait, ShardingType
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor, KeyedTensor

from slipstream_rec.sharding import vbe_cpu
from slipstream_rec.sharding.qcomms_switch import PLAIN, registry_switch
from slipstream_rec.sharding.vbe_output import GatheredVariableBatchOutput


@dataclass
class ShardUnit:
    """One local shard of one table, as one feature of one sharding group's post-a2a KJT."""

    table: str  # table name, e.g. t_cat_3
    feature: str  # the feature whose ids index this table
    sharding_type: str  # table_wise, row_wise, ...
    group: int  # index of the sharding group (lookup) in the sharded module
    position: int  # index of the feature in that group's post-a2a KJT keys
    row_offset: int  # first global row of this shard
    col_offset: int  # first column of this shard
    rows: int  # rows of this shard
    cols: int  # columns of this shard
    replicated: bool  # data_parallel: every rank holds all rows and counts only its own batch
    weights: torch.Tensor = field(repr=False, default=None)  # (rows, cols) view of the live weights
    # The FBGEMM TBE holding the weights (None: plain weights). Under fused_uvm_caching the
    # weights view is the host (UVM) copy and the newest values of cached rows sit in the GPU
    # cache until the TBE is flushed: the tracker flushes before every snapshot.
    kernel: Any = field(repr=False, default=None)
    # Lookups counted during the counting phase, sparse: the rows looked up (local, sorted) and
    # how often (int64, exact at any count). O(distinct rows counted), not O(rows). A counted
    # step only appends its ids (``_pending``, on their device): the sort into rows and counts
    # (``torch.unique``, whose output size the host must read) runs when the counts are read,
    # or every MERGE_EVERY counted steps to bound the memory, not in every counted step.
    _counted_rows: Optional[torch.Tensor] = field(repr=False, default=None)
    _counted: Optional[torch.Tensor] = field(repr=False, default=None)
    _pending: List[Tuple[torch.Tensor, Optional[torch.Tensor]]] = field(repr=False, default_factory=list)
    hot_rows: Optional[torch.Tensor] = field(repr=False, default=None)  # local row ids, sorted
    snapshot: Optional[torch.Tensor] = field(repr=False, default=None)  # (n_hot, cols) copy

    MERGE_EVERY = 16  # pending counted steps before they are merged (a host read each time)

    @property
    def row_bytes(self) -> int:
        return self.cols * self.weights.element_size()

    @property
    def counted_rows(self) -> Optional[torch.Tensor]:
        self._merge()
        return self._counted_rows

    @counted_rows.setter
    def counted_rows(self, rows: Optional[torch.Tensor]) -> None:
        self._pending, self._counted_rows = [], rows

    @property
    def counted(self) -> Optional[torch.Tensor]:
        self._merge()
        return self._counted

    @counted.setter
    def counted(self, counts: Optional[torch.Tensor]) -> None:
        self._pending, self._counted = [], counts

    def add_counts(self, rows: torch.Tensor, counts: Optional[torch.Tensor] = None) -> None:
        """Count lookups of local ``rows`` (each once, or ``counts`` times). No host read: the
        ids stay on their device until the counts are read (``MERGE_EVERY``)."""
        rows = rows.to(torch.int64).reshape(-1)
        self._pending.append((rows, None if counts is None else counts.to(torch.int64).reshape(-1)))
        if len(self._pending) >= self.MERGE_EVERY:
            self._merge()

    def _merge(self) -> None:
        if not self._pending:
            return
        parts, self._pending = self._pending, []
        rows = [r for r, _ in parts]
        counts = [c if c is not None else torch.ones_like(r) for r, c in parts]
        if self._counted_rows is not None and self._counted_rows.numel():
            rows.insert(0, self._counted_rows)
            counts.insert(0, self._counted)  # type: ignore[arg-type]
        unique, inverse = torch.unique(torch.cat(rows), return_inverse=True)
        self._counted_rows = unique
        self._counted = torch.zeros(unique.numel(), dtype=torch.int64, device=unique.device).index_add_(
            0, inverse, torch.cat(counts)
        )

    def clear_counts(self) -> None:
        self._counted_rows, self._counted, self._pending = None, None, []

    def sparse_counts(self) -> Tuple[torch.Tensor, torch.Tensor]:
        """(rows, counts): the counted local rows, ascending, and their int64 counts."""
        if self.counted_rows is None:
            return torch.zeros(0, dtype=torch.int64), torch.zeros(0, dtype=torch.int64)
        return self.counted_rows, self.counted  # type: ignore[return-value]

    def count_table(self) -> torch.Tensor:
        """Counts of every row of the shard as one int64 (rows,) tensor. O(rows): tests only."""
        rows, counts = self.sparse_counts()
        return torch.zeros(self.rows, dtype=torch.int64).index_put_((rows.cpu(),), counts.cpu())

    def state_bytes(self) -> int:
        """Bytes of this shard's Slipstream state (counts, the pending counted ids, hot rows,
        snapshot)."""
        held = [self._counted_rows, self._counted, self.hot_rows, self.snapshot]
        held += [t for part in self._pending for t in part]
        return sum(t.numel() * t.element_size() for t in held if t is not None)


def _unwrap(lookup: Any) -> Any:
    # data-parallel lookups are wrapped in DistributedDataParallel
    return getattr(lookup, "module", lookup)


def _tbe(module: Any) -> Any:
    """The FBGEMM TBE behind a TorchRec embedding kernel module (the module itself if none)."""
    return getattr(module, "emb_module", module)


def has_cache(kernel: Any) -> bool:
    """Whether a TBE keeps rows in a GPU cache in front of host memory (fused_uvm_caching)."""
    cache = getattr(_tbe(kernel), "lxu_cache_weights", None)
    return cache is not None and cache.numel() > 0


def flush_caches(units: List[ShardUnit]) -> int:
    """Write every cached row back to the weights the units read (each TBE once); returns how
    many TBEs had a cache. Local, no collective."""
    seen, flushed = set(), 0
    for unit in units:
        kernel = unit.kernel
        if kernel is None or id(kernel) in seen:
            continue
        seen.add(id(kernel))
        if has_cache(kernel):
            _tbe(kernel).flush()
            flushed += 1
    return flushed


# fbgemm's UVM cache statistics (SplitTableBatchedEmbeddingBagsCodegen.get_uvm_cache_stats order)
_CACHE_STATS = ("calls", "requested_indices", "unique_indices", "unique_misses", "conflict_unique_misses", "conflict_misses")


def cache_stats(units: List[ShardUnit]) -> Optional[Dict[str, float]]:
    """This rank's GPU-cache statistics summed over its caching TBEs, where fbgemm gathers them
    (TBEs built with gather_uvm_cache_stats, see sharding.cache_stats); None when none does.
    ``h2d_bytes``: rows fetched from host memory into the cache (unique misses x row bytes)."""
    totals = {k: 0.0 for k in _CACHE_STATS}
    totals["h2d_bytes"] = 0.0
    seen, found = set(), False
    for unit in units:
        tbe = _tbe(unit.kernel) if unit.kernel is not None else None
        if tbe is None or id(tbe) in seen or not has_cache(tbe) or not getattr(tbe, "gather_uvm_cache_stats", False):
            continue
        seen.add(id(tbe))
        found = True
        values = tbe.get_uvm_cache_stats().detach().cpu().tolist()
        for k, v in zip(_CACHE_STATS, values):
            totals[k] += float(v)
        totals["h2d_bytes"] += float(values[3]) * unit.row_bytes
    if not found:
        return None
    return totals


def discover_units(ebc: ShardedEmbeddingBagCollection) -> List[ShardUnit]:
    """The local shards of ``ebc``, each tied to its KJT position and its weight view."""
    units: List[ShardUnit] = []
    for group, lookup in enumerate(ebc._lookups):
        lookup = _unwrap(lookup)
        sharding_type = ebc._sharding_types[group]
        position = 0
        for config, module in zip(lookup.grouped_configs, lookup._emb_modules):
            weights = module.split_embedding_weights()
            # Key-value (SSD) and virtual-table kernels return a tuple (weights, ids, ...) of
            # objects that are not weight tensors: nothing a snapshot can index.
            if isinstance(weights, tuple) or not all(torch.is_tensor(w) for w in weights):
                kernel = getattr(config, "compute_kernel", None)
                raise ValueError(
                    f"slipstream: tables {[t.name for t in config.embedding_tables]} use the "
                    f"{getattr(kernel, 'value', kernel)} compute kernel, whose weights are not "
                    "tensors (key-value / SSD kernels): Slipstream cannot snapshot them. Set "
                    "sharding.compute_kernel=fused or fused_uvm_caching, or slipstream=off"
                )
            assert len(weights) == len(config.embedding_tables), "one weight view per table"
            for table, weight in zip(config.embedding_tables, weights):
                offsets = (
                    table.local_metadata.shard_offsets if table.local_metadata is not None else [0, 0]
                )
                for feature in table.feature_names:
                    units.append(
                        ShardUnit(
                            table=table.name,
                            feature=feature,
                            sharding_type=sharding_type,
                            group=group,
                            position=position,
                            row_offset=int(offsets[0]),
                            col_offset=int(offsets[1]),
                            rows=int(table.local_rows),
                            cols=int(table.local_cols),
                            replicated=sharding_type == ShardingType.DATA_PARALLEL.value,
                            weights=weight,
                            kernel=module,
                        )
                    )
                    position += 1
    return units


# The shardings whose pooled output is reduce-scattered (row-wise over all ranks; table-row-wise
# within a node, then an all-to-all across nodes) and whose gradient is all-gathered back: their
# bytes are also counted under "output/<type>" and "gradient/<type>" (SPLIT_COUNTS), since they
# leave a rank at other rates than an all-to-all's (training/embedding_traffic.py).
REDUCE_SCATTER_SHARDINGS = (ShardingType.ROW_WISE.value, ShardingType.TABLE_ROW_WISE.value)
SPLIT_COUNTS = tuple(f"{k}/{t}" for k in ("output", "gradient") for t in REDUCE_SCATTER_SHARDINGS)

ROWS_UPDATED_EVERY = 10  # training calls between two measurements of the rows a step updates


class TwoLayoutDist(torch.nn.Module):
    """A sharding's output dist for both KJT layouts, each to its own TorchRec dist: ``plain``
    for the batches whose features all send the whole batch, ``variable`` for serving's
    compacted ones (VBE). TorchRec's row-wise dists build their collective for the layout of
    their first call and refuse the other, and its table-wise ones build the variable-batch
    collective only when the first call has that layout. A plain batch through the
    variable-batch collective costs as much as its compaction saves nothing: on 2 emulated
    nodes over 1gbit, with nothing served, 50.5 s against 43.5 s plain and 43.2-44.0 s for
    ``off`` (docs/slipstream.md)."""

    def __init__(self, plain: torch.nn.Module, variable: torch.nn.Module) -> None:
        super().__init__()
        self.plain = plain
        self.variable = variable

    def forward(self, local_embs: torch.Tensor, sharding_ctx: Any = None) -> Any:
        if sharding_ctx is not None and sharding_ctx.variable_batch_per_feature:
            return self.variable(local_embs, sharding_ctx)
        return self.plain(local_embs, sharding_ctx)


class VariableBatchDpDist(DpPooledEmbeddingDist):
    """The data-parallel output dist, which has nothing to send, laying its (B, sum of dims)
    output feature-major for a variable-batch input, as TorchRec's variable-batch EBC output
    expects of every sharding (its table-wise and row-wise dists return that layout; TorchRec's
    data-parallel one returns its lookup's as is, measured). Every data-parallel feature has the
    whole batch (slipstream/serve/split.py), the one stride the data-parallel lookup takes."""

    def __init__(self, dims: List[int]) -> None:
        super().__init__()
        self.dims = list(dims)

    def forward(self, local_embs: torch.Tensor, sharding_ctx: Any = None) -> Awaitable[torch.Tensor]:
        if sharding_ctx is None or not sharding_ctx.variable_batch_per_feature:
            return NoWait(local_embs)
        return NoWait(torch.cat([part.reshape(-1) for part in local_embs.split(self.dims, dim=1)]))


class SlipstreamShardedEBC(ShardedEmbeddingBagCollection):
    """TorchRec's sharded EBC with its shard units, a byte meter and the rows updated per step.

    ``a2a_bytes`` counts, in training mode and for every policy, the bytes of the tensors this
    rank gives to each embedding collective (forward hooks, installed as TorchRec creates the
    modules): ``input`` (lengths, ids and per-id weights given to each ``KJTAllToAll``),
    ``output`` (the local pooled embeddings given to each sharding's output dist: its
    all-to-all, or reduce-scatter for row-wise) and ``gradient`` (the gradient of the pooled
    embeddings received from it, which its backward sends back). Sizes include the share a rank
    sends to itself; data-parallel tables have no collective and count nothing. The row-wise
    shardings' part of ``output`` and ``gradient`` is also kept under ``output/<type>`` and
    ``gradient/<type>`` (``SPLIT_COUNTS``), and what went at fp32 because
    ``sharding.qcomms.when=auto`` had the codecs switched off under ``plain:<key>``.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.a2a_bytes: Dict[str, int] = {"input": 0, "output": 0, "gradient": 0}
        super().__init__(*args, **kwargs)
        # Set under serving (slipstream/serve/server.py) before the first batch: the output dists take
        # the split batches' variable-batch layout beside the plain one (use_variable_batch).
        self.variable_batch: bool = False
        self._variable_batch_seen = False  # a variable-batch KJT went through input_dist
        self._units: Optional[List[ShardUnit]] = None
        self.calls = 0  # training calls of compute_and_output_dist
        # rows the local shards looked up (and so update) per step, summed over measured steps;
        # the sum stays where the ids are until it is read (``rows_updated``)
        self._rows_measured = 0
        self._rows_sum: Any = 0
        for sharding_type, output_dist in zip(self._sharding_types, self._output_dists):
            self._meter(sharding_type, output_dist)
        self._comms_switch = registry_switch(self.qcomm_codecs_registry)

    def _meter(self, sharding_type: str, output_dist: torch.nn.Module) -> None:
        """Count what ``output_dist`` is given and the gradient it receives back (its first
        argument is what the collective gets; TorchRec creates the collective on its first call)."""
        if sharding_type != ShardingType.DATA_PARALLEL.value:
            # row-wise shardings reduce-scatter (and all-gather back), which sends more than
            # an all-to-all of the same tensor: their share is kept apart as well (SPLIT_COUNTS)
            part = sharding_type if sharding_type in REDUCE_SCATTER_SHARDINGS else None
            output_dist.register_forward_pre_hook(functools.partial(self._count_output, part))
            output_dist.register_forward_hook(functools.partial(self._watch_gradient, part))

    def use_variable_batch(self) -> None:
        """Take serving's variable-batch KJTs (a stride per feature) beside plain ones from now
        on: every communicating sharding gets a second output dist for that layout, metered as
        the first; each batch goes through the one of its layout (the ranks agree on it: the
        sizes per feature are agreed, slipstream/serve/split.py)."""
        assert self.calls == 0, "the layouts are prepared before the first training call"
        if self.variable_batch:
            return
        self.variable_batch = True
        # FBGEMM's CPU kernel for the variable-batch lookup's metadata is ten times the lookup;
        # ours computes the same (sharding/vbe_cpu.py). GPU kernels are left as they are.
        vbe_cpu.install()
        for i, sharding_type in enumerate(self._sharding_types):
            if sharding_type == ShardingType.DATA_PARALLEL.value:  # one dist lays out both
                dims = self._embedding_shardings[i].uncombined_embedding_dims()
                self._output_dists[i] = VariableBatchDpDist(dims)
            else:
                variable = self._embedding_shardings[i].create_output_dist(device=self._device)
                self._meter(sharding_type, variable)
                self._output_dists[i] = TwoLayoutDist(self._output_dists[i], variable)

    def input_dist(self, ctx: EmbeddingBagCollectionContext, features: KeyedJaggedTensor) -> Any:
        if features.variable_stride_per_key():
            assert self.variable_batch, "a variable-batch KJT before use_variable_batch(): plain layout only"
            if not self._has_uninitialized_input_dist and not self._variable_batch_seen:
                # TorchRec prepares the variable-batch output's permutation of the inverse
                # indices on the first call only, and the first call here may have been plain
                self._create_inverse_indices_permute_indices(features.inverse_indices_or_none())
            self._variable_batch_seen = True
        return super().input_dist(ctx, features)

    # ---- the byte meter -----------------------------------------------------------------------
    def _create_input_dist(self, *args: Any, **kwargs: Any) -> None:
        super()._create_input_dist(*args, **kwargs)  # on the first input_dist call
        for input_dist in self._input_dists:
            for sub in input_dist.modules():
                if isinstance(sub, KJTAllToAll):
                    sub.register_forward_pre_hook(self._count_input)

    def _count_input(self, _module: Any, args: Tuple[Any, ...]) -> None:
        if self.training:
            self.a2a_bytes["input"] += sum(t.numel() * t.element_size() for t in args[0].dist_tensors())

    def _add(self, kind: str, part: Optional[str], nbytes: int) -> None:
        # while sharding.qcomms.when=auto has the codecs switched off, these go at fp32: kept
        # apart too (PLAIN + key), so the wire's count applies the codec's rate to the rest only
        plain = self._comms_switch is not None and not self._comms_switch.on
        for key in [kind] + ([f"{kind}/{part}"] if part is not None else []):
            for counted in [key] + ([PLAIN + key] if plain else []):
                self.a2a_bytes[counted] = self.a2a_bytes.get(counted, 0) + nbytes

    def _count_output(self, part: Optional[str], _module: Any, args: Tuple[Any, ...]) -> None:
        if self.training:
            self._add("output", part, args[0].numel() * args[0].element_size())

    def _watch_gradient(self, part: Optional[str], _module: Any, _args: Any, awaitable: Any) -> None:
        if not self.training:
            return

        def on_result(received: torch.Tensor) -> torch.Tensor:
            if received.requires_grad:
                received.register_hook(functools.partial(self._count_gradient, part))
            return received

        awaitable.callbacks.append(on_result)

    def _count_gradient(self, part: Optional[str], grad: torch.Tensor) -> None:
        self._add("gradient", part, grad.numel() * grad.element_size())

    @property
    def units(self) -> List[ShardUnit]:
        if self._units is None:  # weights exist only once DMP has materialised the shards
            self._units = discover_units(self)
        return self._units

    def compute_and_output_dist(
        self, ctx: EmbeddingBagCollectionContext, input: KJTList
    ) -> LazyAwaitable[KeyedTensor]:
        if self.training:
            if self.calls % ROWS_UPDATED_EVERY == 0:
                self._measure_rows_updated(input)
            self.calls += 1
        if ctx.variable_batch_per_feature and not all(
            getattr(sc, "batch_size_per_rank_per_feature", True) for sc in ctx.sharding_contexts
        ):
            # The variable-batch output dists size their collectives from each sharding's sizes
            # per rank and feature, which TorchRec records when its input awaitable is waited;
            # the train pipeline's re-attach after an evaluation hands this stage a fresh context
            # without them (measured: row-wise then splits its output into [0, 0]). They are
            # the post-all-to-all KJTs' own, so record them from the KJTs (host lists).
            _set_sharding_context_post_a2a(list(input), ctx)
        out = super().compute_and_output_dist(ctx, input)
        if isinstance(out, VariableBatchEmbeddingBagCollectionAwaitable):
            # FBGEMM's per-sample layout of a variable batch is the costliest part of a serving
            # step on CPU; one gather gives the same (sharding/vbe_output.py)
            return GatheredVariableBatchOutput.of(out)
        return out

    @property
    def rows_updated(self) -> Dict[str, int]:
        """Measured steps and the distinct local rows they looked up, summed (a host read)."""
        return {"steps": self._rows_measured, "rows": int(self._rows_sum)}

    def load_rows_updated(self, saved: Dict[str, int]) -> None:
        self._rows_measured, self._rows_sum = int(saved["steps"]), int(saved["rows"])

    @torch.no_grad()
    def _measure_rows_updated(self, features: KJTList) -> None:
        """Distinct rows of the local shards this step looks up: the rows its backward updates.
        Counted as distinct (feature, id) pairs of a sort, with no host read (``unique`` would
        make the host wait for the device every measured step)."""
        span = 1 + max((u.rows for u in self.units), default=0)  # every local id is below it
        for kjt in features:
            values = kjt.values()
            if values.numel() == 0:
                continue
            keys = len(kjt.keys())
            lengths = kjt.lengths()
            if kjt.variable_stride_per_key():  # serve's per-lookup batches (VBE): strides per key
                per_key = torch.stack([part.sum() for part in lengths.split(kjt.stride_per_key())])
            else:
                per_key = lengths.view(keys, -1).sum(1)
            feature = torch.repeat_interleave(
                torch.arange(keys, device=values.device), per_key, output_size=values.numel()
            )
            pairs = torch.sort(feature * span + values.to(torch.int64)).values
            self._rows_sum = self._rows_sum + (pairs[1:] != pairs[:-1]).sum() + 1
        self._rows_measured += 1
