"""Runs a Slipstream policy beside the training loop: the method's order of events, in one place.

Three hooks, named for where they run in TorchRec's ``TrainPipelineSparseDist``; every rank
calls each of them on the same steps:

- ``on_host_batch`` (the data side, when the pipeline pulls a batch, before its input
  all-to-all): negative downsampling's drop, then the policy's decision on the rest (skip, or
  keep). ``wrap`` builds the stream around it: constant-size batches refilled from the kept
  samples, all ranks agreeing in lock-step that each still has one, and under serving each batch
  split between the shards and the local replica (``lockstep.py``, ``serve/split.py``);
- ``on_backward`` (after a step's backward, before its optimizer step): serve sums the served
  lookups' row gradients and, on a sync step, pushes them to the rows' shards (collective);
- ``on_step_end`` (after the optimizer step), on the schedule's steps (``schedule.py``) and in
  this order: counting switched on or off for the next step; between snapshots, a sync's replica
  update (the rows the push just moved); at a snapshot: the hot set chosen (the first time), the
  snapshot itself, the hot set chosen again (a refresh), the quality check and then the
  threshold T (``threshold.py``), and the replica rebuilt to the new stale set; last, the serve
  lever's window (``serve/lever_clock.py``, the rule in ``serve/lever.py``): timed and, at its
  end, serving kept or stood down.
  The collectives there are entered by all ranks.

Every policy runs this same code. A policy that does not use a component gets its null version
(``NoTracking``, ``NoServe``, ``NoQuality``, ``KeepAll``) and a schedule with no step of it: under
``off`` nothing is ever due.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple

import torch
import torch.distributed as dist
from torch import nn

from slipstream_rec.data.types import Batch
from slipstream_rec.sharding.sharded import SlipstreamShardedEBC
from slipstream_rec.timing import timed
from slipstream_rec.slipstream import resume, stats
from slipstream_rec.slipstream.config import SlipstreamConfig
from slipstream_rec.slipstream.decide import KeepAll, SkipDecider
from slipstream_rec.slipstream.lockstep import lockstep
from slipstream_rec.slipstream.quality import NoQuality, QualityCheck
from slipstream_rec.slipstream.rows import RowIndex, RowState
from slipstream_rec.slipstream.schedule import Schedule
from slipstream_rec.slipstream.serve import NoServe, StaleServer
from slipstream_rec.slipstream.serve.lever import SETTLE_STEPS, ServeLever
from slipstream_rec.slipstream.serve.lever_clock import WindowClock, lever_window_step
from slipstream_rec.slipstream.stream import SkippingStream, StreamTotals
from slipstream_rec.slipstream.threshold import StaleThreshold
from slipstream_rec.slipstream.tracker import NoTracking, StalenessTracker, hot_budget_bytes
from slipstream_rec.slipstream.types import NO_DOWNSAMPLING, Downsampling

logger = logging.getLogger(__name__)

Records = List[Tuple[str, Dict[str, Any]]]  # (kind, record) pairs for the metric log


class SlipstreamController:
    """One per run, on every rank. See the module docstring for what it does when."""

    def __init__(
        self,
        cfg: SlipstreamConfig,
        model: nn.Module,
        feature_names: List[str],
        num_embeddings: List[int],
        batch_size: int,
        seed: int,
        rank: int,
        downsampling: Downsampling = NO_DOWNSAMPLING,
    ) -> None:
        cfg.validate()
        self.cfg, self.batch_size, self.is_rank0 = cfg, batch_size, rank == 0
        self.index = index = RowIndex(feature_names, num_embeddings)
        self.row_state = rows = RowState(index.num_rows, index)
        # the model's sharded EBCs, under every policy (their byte meters count for every policy)
        self.modules = [m for m in model.modules() if isinstance(m, SlipstreamShardedEBC)]
        tracks = cfg.policy.tracks
        self.tracker = StalenessTracker.from_config(cfg, self.modules, index, rows) if tracks else NoTracking()
        # serve: the hot rows' snapshots (one copy over all shards) and the replica of the stale
        # ones (a copy on every rank, stale rows being hot rows) share the budget: hot rows
        # chosen within budget / (1 + world) keep both within it.
        world = dist.get_world_size() if dist.is_initialized() else 1
        self.budget = hot_budget_bytes(cfg.hot_budget_mb) // (1 + world if cfg.serves else 1)
        # serve: the replica, the split and what serving owes (its constructor is a collective)
        self.server = StaleServer.from_config(cfg, self.tracker, index) if cfg.serves else NoServe()
        self.plan = self.server.plan
        self.lever = ServeLever.from_config(cfg)
        self.window_clock = WindowClock()  # its clock is the trainer's (``bind``)
        self._timed_from: Callable[[], int] = lambda: 0  # the first step the lever may time (``bind``)
        self.schedule = Schedule.from_config(cfg, self.lever.window if self.lever.auto else 0, SETTLE_STEPS)
        self.threshold = StaleThreshold(cfg, index, rows, self.is_rank0)
        self.tracker.meter = self.threshold.meter = self.count_tracking  # their gathers' bytes
        self.quality = QualityCheck(cfg, index, rows, self.is_rank0) if cfg.quality_check else NoQuality(cfg)
        self.decider = (
            SkipDecider.from_config(
                cfg, index, rows, seed * 1000 + rank,  # independent draws per rank, reproducible per run
                threshold=lambda: self.threshold.active(self.step), active=lambda: self.step >= cfg.warmup_steps,
            )
            if cfg.classifies
            else KeepAll()
        )
        self.downsampling = downsampling  # negative downsampling's drop on the data side
        self.stream: Optional[SkippingStream] = None
        self.streams_done = StreamTotals()  # the epochs' streams before the running one
        self.step = 0
        # The step when this rank first skipped a sample (None: not yet). The random control of
        # a run starts skipping at that run's step (slipstream.warmup_steps).
        self.first_skip_step: Optional[int] = None
        self.seconds = {"classify": 0.0, "snapshot": 0.0, "sync": 0.0, "lever": 0.0}
        self.tracker.set_counting(self.schedule.counts(1))

    def bind(
        self, scorer: Callable[[Batch], torch.Tensor], clock: Callable[[], float],
        timed_from: Callable[[], int] = lambda: 0, last_step: Optional[int] = None,
    ) -> None:  # fmt: skip
        """The trainer's scoring forward (the quality check's: a collective, no grad), clock
        (training seconds with the device's queue drained: the lever's windows), the first
        step whose time the lever may use (the steps before it time something of the trainer's:
        the precision probe; read after every step, since the probe may end early) and the
        run's planned last step (the lever's looks need steps after them; None: unknown)."""
        self.quality.scorer = scorer
        self.window_clock.clock = clock
        self._timed_from = timed_from
        self.lever.last_step = last_step

    @property
    def timed_from(self) -> int:
        """The first step whose time the lever may use (``bind``), as the trainer knows it now."""
        return int(self._timed_from())

    def target_skip_fraction(self) -> Optional[float]:
        """The current D, where the quality check has moved it; None for the policies that
        choose no threshold (off, random)."""
        return self.quality.target if self.cfg.policy.tracks else None

    # ---- on_host_batch: the data side (local, but for the lock-step's agreement) ------------
    def on_host_batch(self, batch: Batch) -> Tuple[torch.Tensor, torch.Tensor]:
        """(keep, weights) of a raw batch: the non-clicks downsampling drops, then the policy's
        decision on what remains (``SkippingStream`` calls it as it classifies)."""
        with timed(self.seconds, "classify"):
            dropped = self.downsampling.drop_mask(batch.labels)  # None at rate 0
            keep, weights = self.decider(batch, dropped)
            if self.first_skip_step is None and self.cfg.skips and not bool(keep.all()):
                self.first_skip_step = self.step
            if dropped is not None:  # a decider that keeps everything keeps no dropped sample either
                keep = keep & ~dropped
        return keep, weights

    def wrap(
        self, raw_batches: Iterator[Batch], stream_state: Optional[Dict[str, Any]] = None, lockstep_every: int = 1
    ) -> Iterator[Batch]:
        """The training stream of one epoch: classified (``on_host_batch``), refilled, in
        lock-step over ranks, split for serving. ``stream_state`` (from a checkpoint) continues
        an interrupted epoch: ``raw_batches`` must then start right after the saved stream's
        ``source_batches_pulled`` batches. ``lockstep_every``: batches between two agreements."""
        self.streams_done.close(self.stream)
        # the lever's timing waits out the batches split ahead (the pipeline's and the lock-step's)
        ahead = SETTLE_STEPS + max(0, lockstep_every - 1)
        settle = min(ahead, self.lever.window - 1)
        self.server.batches_ahead = ahead + 1  # one more than the pipeline's and the lock-step's
        self.schedule = dataclasses.replace(self.schedule, settle=settle)
        self.stream = SkippingStream(
            raw_batches, self.batch_size, decide=self.on_host_batch, lookahead_batches=self.cfg.lookahead_batches
        )
        if stream_state is not None:
            self.stream.load_state_dict(stream_state)
        if not self.downsampling.decided:  # the same on every rank (config, then checkpoints)
            # All ranks, once: the rule's rate from the look-ahead's labels, before any is classified.
            upcoming = self.stream.peek_upcoming(self.cfg.lookahead_batches * self.batch_size)
            decision = self.downsampling.choose_from_labels(None if upcoming is None else upcoming.labels, self.step)
            if decision is not None and self.is_rank0:
                logger.info("downsampling: negative downsampling at step %d: %s", self.step, decision["reason"])
        done = self.streams_done.dropped_at_end
        return lockstep(self.stream, on_drop=done, every=lockstep_every, plan=self.plan, on_agree=self.count_control)

    def count_control(self, nbytes: int, kind: str = "control") -> None:
        """``nbytes`` more on the byte meter's ``kind``: ``control`` (the lock-step's and the
        lever's agreements) or ``tracking`` (``count_tracking``); kept beside the shards' own
        meters (the first sharded module's ``a2a_bytes``), which checkpoints carry
        (training/embedding_traffic.py)."""
        for meter in [m.a2a_bytes for m in self.modules[:1]]:
            meter[kind] = meter.get(kind, 0) + nbytes

    def count_tracking(self, nbytes: int) -> None:
        """``nbytes`` more on ``tracking``: the gathers that choose the hot set, agree on the
        snapshots' changes and choose T."""
        self.count_control(nbytes, "tracking")

    # ---- on_backward: before the optimizer step (collective on sync steps) -------------------
    def on_backward(self, task: Any) -> None:
        """serve: the served lookups' row gradients summed, and pushed on a sync step."""
        step = self.step + 1  # the step being trained
        self.server.after_backward(task, self.schedule.sync(step) and self.lever.pushes(step))

    # ---- on_step_end: after the optimizer step (collectives on shared step numbers) ----------
    def on_step_end(self, step: int) -> Records:
        """Tracking, the threshold and the replica on their steps, then the lever; returns what
        to log. All ranks, every step."""
        self.step = step
        out: Records = []
        if self.lever.tracks:
            record = self._track(step)
            if record is not None:
                out.append(("slipstream", record))
        lever_window_step(self, step)  # serve_when=auto's windows
        out += [("lever_window", figure) for figure in self.window_clock.take_new()]
        return out + [("lever", decision) for decision in self.lever.take_new()]

    def _track(self, step: int) -> Optional[Dict[str, Any]]:
        sched, cfg = self.schedule, self.cfg
        self.tracker.set_counting(sched.counts(step + 1))
        snapshot = sched.snapshot(step)
        if sched.sync(step) and not snapshot and self.lever.serves:
            with timed(self.seconds, "sync"):
                self.server.resync(step)  # all ranks: the rows the push just moved
        if not snapshot:
            return None
        t0 = time.perf_counter()
        if sched.first_choice(step):
            self.tracker.choose(step, self.budget, int(cfg.min_count), self.server.take_counts(), again=False)
        t1 = time.perf_counter()
        measured = self.tracker.snapshot()
        if sched.refresh(step):
            self.tracker.choose(step, self.budget, int(cfg.min_count), self.server.take_counts(), again=True)
        t2 = time.perf_counter()
        # the quality check, then T: what the changes just measured make stale
        decision = self.threshold.after_snapshot(self.stream, self.quality, step) if measured else None
        if self.lever.serves:
            # The replica follows the stale set (the same on every rank), so a row that moved
            # again leaves it here; not while the lever times a window without serving.
            self.server.rebuild(self.threshold.stale_now(step), step)
        t3 = time.perf_counter()
        self.seconds["sync"] += (t1 - t0) + (t3 - t2) - (decision["seconds"] if decision else 0.0)
        self.seconds["snapshot"] += t2 - t1
        record = stats.record(self, with_tables=True)
        record["state_bytes"] = stats.state_bytes(self)
        record["peak_state_bytes"] = stats.peak_state_bytes(self)
        if decision is not None:
            record["quality"] = decision
        if self.tracker.turnover and self.tracker.turnover[-1]["step"] == step:
            record["hot_turnover"] = self.tracker.turnover[-1]
        return record

    # ---- what the trainer reads ----------------------------------------------------------
    def step_kinds(self, step: int) -> List[str]:
        """What ``step`` runs besides training (the sync audit's classes of steps)."""
        sched, lever = self.schedule, self.lever
        kinds = ["count"] if lever.tracks and sched.counts(step) else []
        kinds += ["snapshot"] if lever.tracks and sched.snapshot(step) else []
        kinds += ["sync"] if sched.sync(step) and lever.pushes(step) else []
        lever_step = sched.window_end(step) or sched.window_mark(step) or step == self.window_clock.checked
        return kinds + (["lever"] if lever_step else [])

    def eval_logit_offset(self) -> float:
        """What evaluation adds to every logit for the policy's own skips (``SkipDecider``);
        negative downsampling adds its own (training/downsampling.py)."""
        return self.decider.logit_offset()

    # ---- checkpointing (local, no collective: resume.py) ---------------------------------
    def state_dict(self) -> Dict[str, Any]:
        return resume.state_dict(self)

    def load_state_dict(self, state: Dict[str, Any]) -> bool:
        """Restore; returns whether the per-shard tracking state was restored exactly."""
        return resume.load_state_dict(self, state)
