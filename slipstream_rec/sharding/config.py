"""Sharding configuration: one plan type for all tables, or the planner's choice."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Dict, Optional

from slipstream_rec.validation import check_fields


class ShardingKind(Enum):
    """How embedding tables are placed. Names are the override values (``sharding.type=row_wise``)."""

    auto = "auto"  # TorchRec's planner picks per table, by its cost model
    table_wise = "table_wise"  # each table whole on one rank
    row_wise = "row_wise"  # each table's rows split evenly over all ranks
    column_wise = "column_wise"  # each table's columns split into shards placed on ranks
    table_row_wise = "table_row_wise"  # row-wise within a node (== row_wise on one node)
    data_parallel = "data_parallel"  # every table replicated; gradients all-reduced


class CommPrecision(Enum):
    """Precision of the pooled embeddings (forward) or their gradients (backward) on the wire."""

    fp32 = "fp32"  # off: full precision, 4 bytes a value
    fp16 = "fp16"  # 2 bytes a value (clamped to fp16's range)
    # 2 bytes a value; on gloo (CPU) TorchRec sends fp16 instead (it says so in a warning, and
    # summary.json's qcomms records both what was asked and what went on the wire)
    bf16 = "bf16"
    # row-wise int8: every 32 values as 32 bytes plus an fp32 scale and bias (40 bytes for
    # 128 of fp32); needs per-rank embedding widths times batch sizes divisible by 32
    int8 = "int8"


class QCommsPlanning(Enum):
    """What the planner is told the quantized comms cost (``sharding.qcomms.plan_as``)."""

    # The comms at fp32: the plan is the one the run has without qcomms, and only the precision
    # on the wire changes. Told they cost half, TorchRec's planner spends the saving on another
    # plan: on clicklog it moved tables off data_parallel (and, offered the row-wise kinds, every
    # table to table_row_wise), sending more bytes and training to a lower test AUC than the
    # same comms on the plan without them (docs/performance.md, quantized comms).
    fp32 = "fp32"
    # The codecs' own sizes (TorchRec's behaviour): the planner may choose another plan.
    quantized = "quantized"


class QCommsWhen(Enum):
    """When the quantized comms (and ``trainer.ddp_comm_hook``) run (``sharding.qcomms.when``)."""

    # Every step, as configured.
    always = "always"
    # Timed on the run's own steps, quantized against fp32 in turns, after the precision probe:
    # kept only where quantized steps are ``min_gain`` faster (across nodes, where the link is
    # the cost); else fp32 comms and the plain all-reduce for the rest of the run (on one node
    # they save no time and cost precision). sharding/qcomms_switch.py.
    auto = "auto"


class AutoTypes(Enum):
    """The sharding kinds ``type: auto`` lets TorchRec's planner choose from (of those
    ShardingKind names)."""

    # Those TorchRec's own EmbeddingBagCollectionSharder offers on the run's device (CPU:
    # data_parallel, table_wise, column_wise; CUDA: every kind).
    torchrec = "torchrec"
    # Every kind, row_wise and table_row_wise on CPU too.
    all = "all"


@dataclass
class QCommsConfig:
    """TorchRec's quantized comms (``torchrec.distributed.fbgemm_qcomm_codec``): the pooled
    embeddings' all-to-all / reduce-scatter and their gradients are encoded before they are sent
    and decoded on arrival. The ids (the input all-to-all) are never quantized. Built into one
    codec registry handed to the sharder DMP builds the output dists with; the planner gets it
    too only with ``plan_as=quantized`` (it reads the codec's element size into its
    communication cost)."""

    # Precision of the pooled embeddings sent in the forward: fp32 (off), fp16, bf16, int8.
    forward: CommPrecision = CommPrecision.fp32
    # Precision of their gradients sent back in the backward: fp32 (off), fp16, bf16, int8.
    backward: CommPrecision = CommPrecision.fp32
    # The gradients multiplied by this before the backward's fp16 / bf16 encoding and divided
    # after decoding (TorchRec's QCommsConfig.backward_loss_scale): a mean loss over a batch of
    # thousands makes them small enough that fp16 holds many only as subnormals (below 6.1e-5),
    # with few bits, or as zero (bf16 has fp32's range: it needs none). null: none. fp16 / bf16 only.
    backward_loss_scale: Optional[float] = None
    # What the planner costs the comms at: fp32 (the plan without qcomms; only the wire's
    # precision changes) or quantized (the codecs' sizes, TorchRec's behaviour: it may choose
    # another plan). Only the planner reads it; the sharded model always sends through the codecs.
    plan_as: QCommsPlanning = QCommsPlanning.fp32
    # always (every step as configured) or auto (kept only where the run's own steps time them
    # faster; they and trainer.ddp_comm_hook switch together). Nothing quantized: no effect.
    when: QCommsWhen = QCommsWhen.always
    # auto: steps timed with each (quantized and fp32 comms, in turns of 4); 0: no timing, on.
    probe_steps: int = 16
    # auto: how much faster the quantized steps' median must be to keep them (0.05: 5%).
    min_gain: float = 0.05
    # auto: the quantized comms' error measured every this many steps after the probe, on the
    # run's own tensors (sharding/qcomms_guard.py); 0: never.
    guard_every_steps: int = 100
    # auto: the relative error (root mean square over all ranks, of the pooled embeddings, their
    # gradients or the DDP all-reduce's gradients) past which the comms go back to fp32 for the
    # rest of the run. fp16 of normal values loses about 3e-4, bf16 2e-3; values under fp16's
    # normal range lose more (the scales above are for them), zeros or infinities all.
    max_error: float = 0.05
    # auto: the share of the values sent (non-zero) that may arrive as zero (under fp16's
    # smallest subnormal, 6e-8) or not finite before the comms go back to fp32 for the rest of
    # the run. clicklog's gradients unscaled: 0.3-0.9% lost; scaled by 1024: under 0.004%.
    max_lost: float = 0.001

    @property
    def enabled(self) -> bool:
        return self.forward is not CommPrecision.fp32 or self.backward is not CommPrecision.fp32

    def validate(self) -> None:
        check_fields("sharding.qcomms", self, [
            ("probe_steps", self.probe_steps >= 0, "0 (no timing: the comms stay on) or a number of steps"),
            ("min_gain", -1 < self.min_gain < 1, "a fraction in (-1, 1) (0.05: 5% faster)"),
            ("guard_every_steps", self.guard_every_steps >= 0, "0 (no guard) or a number of steps (100)"),
            ("max_error", self.max_error > 0, "a positive relative error (0.05: 5%)"),
            ("max_lost", 0 <= self.max_lost <= 1, "a share in [0, 1] (0.001: 0.1% of the values)"),
        ])  # fmt: skip


class ComputeKernel(Enum):
    """Where a table's rows live and how they are looked up (TorchRec's compute kernels)."""

    auto = "auto"  # the planner's choice: fused where the tables fit in GPU memory, else caching
    fused = "fused"  # FBGEMM TBE with the optimizer in backward, rows in GPU (or CPU) memory
    # Rows in host memory (UVM), a GPU cache of cache_load_factor of them in front (CUDA only):
    # the hot rows in GPU memory, the cold rows in host memory.
    fused_uvm_caching = "fused_uvm_caching"
    fused_uvm = "fused_uvm"  # rows in host memory (UVM), no cache (CUDA only)
    dense = "dense"  # plain nn.EmbeddingBag weights (data_parallel only)


@dataclass
class ShardingConfig:
    """Sharding plan for the embedding tables (the dense arch is always data parallel, DDP)."""

    # Sharding type for every table: auto, table_wise, row_wise, column_wise, table_row_wise,
    # data_parallel.
    type: ShardingKind = ShardingKind.auto
    # Per-table exceptions, table name -> sharding type, e.g. {t_cat_2: row_wise}. Tables are
    # named t_<feature> (t_cat_0 ... t_cat_25 on Criteo-like data).
    table_overrides: Dict[str, ShardingKind] = field(default_factory=dict)
    # The kinds auto chooses from: torchrec (those TorchRec's own sharder offers on this device)
    # or all (the row-wise kinds on CPU too). On gloo the planner rates row-wise plans cheaper
    # than they run (docs/performance.md, "The planner's choices on CPU"); a named type or a
    # table override may still be any kind.
    auto_types: AutoTypes = AutoTypes.torchrec
    # column_wise only: width of each column shard (must divide model.embedding_dim); 0 lets
    # the planner choose (it may keep a table whole).
    column_shard_dim: int = 0
    # Fraction of each device's memory the planner keeps free for activations and buffers.
    storage_reservation: float = 0.15
    # Compute kernel of every sharded table: auto (the planner picks by memory: fused where the
    # tables fit in GPU memory, fused_uvm_caching where they do not), fused, fused_uvm_caching,
    # fused_uvm (the last two on CUDA only). data_parallel tables always use dense.
    compute_kernel: ComputeKernel = ComputeKernel.auto
    # fused_uvm_caching: fraction of each table's rows held in the GPU cache (TorchRec's default
    # is 0.2). Also what the planner assumes when it weighs the caching kernel under auto.
    cache_load_factor: float = 0.2
    # A summary.json of an earlier Slipstream run of the same tables: size each table's GPU
    # cache from the hot rows Slipstream's counting measured there (slipstream.hot_rows_per_table),
    # times cache_hot_margin, instead of cache_load_factor (which stays the floor). null: off.
    cache_from_summary: Optional[str] = None
    # Cache rows per hot row measured, when sizing the cache from a summary (headroom for the
    # rows that become hot later and for the cache's set associativity).
    cache_hot_margin: float = 1.5
    # Planner's GPU memory per device in GiB (0: the memory of this machine's GPUs, or TorchRec's
    # default of 32 GB when planning a CUDA topology without one). Lower it to plan a GPU with
    # less room, e.g. to force the caching kernel in a check.
    hbm_cap_gb: float = 0.0
    # CUDA: have FBGEMM gather its GPU-cache statistics (fused_uvm_caching tables), reported in
    # summary.json as embedding_cache (hit rate, host-to-device bytes). Costs a little per step.
    cache_stats: bool = False
    # Quantized comms of the pooled embeddings and their gradients (sharding.qcomms.forward,
    # sharding.qcomms.backward); fp32 on both (the default) is off.
    qcomms: QCommsConfig = field(default_factory=QCommsConfig)
