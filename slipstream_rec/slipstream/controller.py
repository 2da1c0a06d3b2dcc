"""Runs a Slipstream policy alongside the training loop.

The trainer hands the controller its raw batch stream (``wrap``) and tells it when a step is
done (``after_step``). The controller:
1. switches per-shard lookup counting on for the sampled early steps, then picks hot rows under
   the global budget (collective);
2. snapshots the hot rows every ``snapshot_interval`` steps and publishes every row's change to
   all ranks (collective), re-deciding staleness each time;
3. chooses the threshold T from a sample of upcoming inputs in the look-ahead buffer
   (collective), so that the target fraction D of hot inputs would be skipped, capped; with the
   quality check (``quality.py``), D itself is first moved by how well the model already predicts
   the inputs it would skip (one no-grad forward of that sample, collective);
4. classifies each raw batch when the pipeline pulls it, before its input all-to-all, drops the
   skippable samples (with the safeguards) and refills batches to a constant size;
5. keeps all ranks in lock-step: all ranks agree whether each has a batch, every step or, with
   ``trainer.lockstep_every_steps`` = k, every k steps from the k batches each rank built ahead;
6. with ``serve_when=auto``, times windows of steps with and without serving and stands the
   whole method down where serving does not pay (``serve/lever.py``): no serving, no counting,
   no snapshots, until it looks again.

With policy ``off`` none of the tracking happens and every sample is kept; with ``random`` (the
control) nothing is tracked either and the decider skips a uniform random fraction. The stream,
the lock-step agreement and the counters are the same code for every policy.
"""

from __future__ import annotations

import logging
import math
import time
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple

import torch
import torch.distributed as dist
from torch import nn

from slipstream_rec.data.types import Batch
from slipstream_rec.data.batch_ops import slice_rows
from slipstream_rec.slipstream.classify import (
    per_sample_max_change,
    skippable_by_threshold,
    threshold_for_target,
)
from slipstream_rec.slipstream.config import Policy, ServeWhen, SlipstreamConfig
from slipstream_rec.training.downsampling import NegativeDownsampler
from slipstream_rec.slipstream.serve.lever import SETTLE_STEPS, LeverState, ServeLever, window_steps
from slipstream_rec.slipstream.serve.server import StaleServer
from slipstream_rec.slipstream.serve.split import ServePlan
from slipstream_rec.slipstream.lockstep import lockstep
from slipstream_rec.slipstream.quality import QualityGovernor, QualityStats, group_stats
from slipstream_rec.slipstream.rows import RowIndex, RowState
from slipstream_rec.slipstream.decide import SkipDecider
from slipstream_rec.sharding.sharded import SlipstreamShardedEBC
from slipstream_rec.slipstream.stream import SkippingStream
from slipstream_rec.slipstream.tracker import StalenessTracker, hot_budget_bytes
from slipstream_rec.distributed import all_reduce_, gather_varlen

logger = logging.getLogger(__name__)


def change_histogram(change: torch.Tensor, lo: float = 1e-6, hi: float = 10.0, bins: int = 28) -> Dict[str, Any]:
    """Histogram of the hot rows' changes on log-spaced bins (values below ``lo`` land in the
    first bin, above ``hi`` in the last): how the threshold sits in the distribution."""
    values = change[torch.isfinite(change)].clamp(lo, hi)
    edges = torch.logspace(torch.log10(torch.tensor(lo)), torch.log10(torch.tensor(hi)), bins + 1)
    counts = torch.histogram(values.float(), bins=edges.float()).hist if values.numel() else torch.zeros(bins)
    return {"edges": [round(e, 8) for e in edges.tolist()], "counts": [int(c) for c in counts.tolist()]}


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
    ) -> None:
        cfg.validate()
        self.cfg = cfg
        self.batch_size = batch_size
        self.is_rank0 = rank == 0
        self.index = RowIndex(feature_names, num_embeddings)
        self.row_state = RowState(self.index.num_rows, self.index)
        self.threshold: Optional[float] = None  # None: nothing is stale
        self.threshold_info: Dict[str, Any] = {}
        # reactivate=false: the sorted flat keys of the rows found stale once (stale for good).
        self._frozen_keys = torch.zeros(0, dtype=torch.int64)
        modules = [m for m in model.modules() if isinstance(m, SlipstreamShardedEBC)]
        self._modules = modules
        if cfg.policy.tracks and not modules:
            raise ValueError(
                f"slipstream.policy={cfg.policy.value} needs the project's sharder "
                "(SlipstreamEmbeddingBagCollectionSharder); the model has no Slipstream shards"
            )
        self.tracker = (
            StalenessTracker(modules, self.index, self.row_state, cfg.change_metric.value)
            if cfg.policy.tracks
            else None
        )
        self.budget = hot_budget_bytes(cfg.hot_budget_mb)
        world = dist.get_world_size() if dist.is_initialized() else 1
        if cfg.serves:
            # The hot rows' snapshots (one copy over all shards) and the replica of the stale
            # ones (a copy on every rank, stale rows being hot rows) share the budget: hot rows
            # chosen within budget / (1 + world) keep both within it.
            self.budget //= 1 + world
        # serve: the replica of the stale rows and what serving owes (collective: all ranks).
        self.server = (
            StaleServer(self.tracker, self.index, cfg.replica_sync_bound, cfg.sync_precision) if cfg.serves else None
        )
        self.plan = self.server.plan if self.server is not None else ServePlan()
        # serve_when=auto: whether serving pays, from timed windows (serve/lever.py); the clock
        # (training seconds so far, the device's queue drained) is set by the trainer.
        self.lever = ServeLever(
            auto=cfg.serves and cfg.serve_when is ServeWhen.auto, min_gain=cfg.serve_min_gain,
            recheck_windows=cfg.serve_recheck_windows,
            window=window_steps(cfg.serve_window_steps, cfg.snapshot_interval),
        )  # fmt: skip
        self.clock: Optional[Callable[[], float]] = None
        self._mark: Optional[Tuple[int, float, float]] = None  # (step, clock, tracking seconds)
        # steps of a lever window not timed: the batches split ahead under the previous state
        # (the pipeline's two, and the lock-step's k - 1 more; set by wrap)
        self._settle = SETTLE_STEPS
        self._count_every = max(1, round(1.0 / cfg.count_fraction))
        self.decider = SkipDecider(
            self.index,
            self.row_state,
            threshold=self._active_threshold,
            active=self._past_warmup,
            alpha=cfg.alpha,
            keep_probability=cfg.keep_probability,
            max_skip_fraction=cfg.max_skip_fraction,
            window_samples=cfg.window_samples,
            seed=seed * 1000 + rank,  # independent draws per rank, reproducible per run
            enabled=cfg.skips,
            negatives_only=cfg.negatives_only,
            random_fraction=cfg.random_skip_fraction,
        )
        # Uniform negative downsampling beside the policy, fixed or chosen and guarded (auto).
        self.downsampler = NegativeDownsampler(
            cfg.negative_downsampling, seed * 1000 + rank, cfg.negatives_per_click,
            cfg.downsampling_guard_steps, cfg.downsampling_max_noise,
        )  # fmt: skip
        self.stream: Optional[SkippingStream] = None
        self._streams_done: Dict[str, int] = {"seen": 0, "skipped": 0, "dropped": 0}
        self.step = 0
        # The controller's step when this rank first skipped a sample (None: not yet). The random
        # control of a run starts skipping at that run's step (slipstream.warmup_steps).
        self.first_skip_step: Optional[int] = None
        self.hot_selection: Optional[Dict[str, Any]] = None
        self.hot_turnover: List[Dict[str, int]] = []  # one entry per later choice of the hot set
        self.seconds = {
            "count": 0.0, "classify": 0.0, "snapshot": 0.0, "sync": 0.0, "quality": 0.0, "lever": 0.0,
        }  # fmt: skip
        self.quality = (
            QualityGovernor(
                cfg.target_skip_fraction, cfg.quality_step, cfg.quality_min_gain, cfg.quality_z,
                cfg.quality_min_samples,
            )
            if cfg.quality_check
            else None
        )
        # Per-sample logits of a batch under the current parameters, no grad; a collective (the
        # sharded forward), so every rank calls it at the same step. Set by the trainer.
        self.scorer: Optional[Callable[[Batch], torch.Tensor]] = None
        if self.tracker is not None:
            self.tracker.set_counting(self._counts_step(1))

    # ---- data side --------------------------------------------------------------------------
    def _past_warmup(self) -> bool:
        return self.step >= self.cfg.warmup_steps

    def _active_threshold(self) -> Optional[float]:
        return self.threshold if self._past_warmup() else None

    def target_skip_fraction(self) -> Optional[float]:
        """The current D: the configured one, or where the quality check has moved it; None for
        the policies that choose no threshold (off, random)."""
        if not self.cfg.policy.tracks:
            return None
        return self.quality.target if self.quality is not None else self.cfg.target_skip_fraction

    def _decide(self, batch: Batch) -> Any:
        t0 = time.perf_counter()
        dropped = self.downsampler.drop_mask(batch.labels)  # None at rate 0
        if self.cfg.policy is Policy.off or self.cfg.serves:  # keep all, classify nothing here
            out = torch.ones(batch.batch_size, dtype=torch.bool), torch.ones(batch.batch_size)
        else:
            out = self.decider(batch, dropped)
            if self.first_skip_step is None and self.cfg.skips and not bool(out[0].all()):
                self.first_skip_step = self.step
        if dropped is not None:  # also for off, serve and track_only, which keep the rest
            out = out[0] & ~dropped, out[1]
        self.seconds["classify"] += time.perf_counter() - t0
        return out

    def wrap(
        self,
        raw_batches: Iterator[Batch],
        stream_state: Optional[Dict[str, Any]] = None,
        lockstep_every: int = 1,
    ) -> Iterator[Batch]:
        """The training stream of one epoch: classified, refilled, in lock-step over ranks.

        ``stream_state`` (from a checkpoint) continues an interrupted epoch: ``raw_batches`` must
        then start right after the saved stream's ``source_batches_pulled`` batches.
        ``lockstep_every``: batches between two agreements of the ranks (``lockstep``).
        """
        self._close_stream()
        self._settle = min(SETTLE_STEPS + max(0, lockstep_every - 1), self.lever.window - 1)
        self.stream = SkippingStream(
            raw_batches, self.batch_size, decide=self._decide, lookahead_batches=self.cfg.lookahead_batches
        )
        if stream_state is not None:
            self.stream.load_state_dict(stream_state)
        if not self.downsampler.decided:  # the same on every rank (config, then checkpoints)
            # All ranks, once: the rule's rate from the labels of the look-ahead, before the
            # first batch is classified.
            upcoming = self.stream.peek_upcoming(self.cfg.lookahead_batches * self.batch_size)
            record = self.downsampler.choose_from_labels(None if upcoming is None else upcoming.labels, self.step)
            if record is not None and self.is_rank0:
                logger.info("slipstream: negative downsampling at step %d: %s", self.step, record["reason"])
        return lockstep(
            self.stream, on_drop=self._dropped, every=lockstep_every, plan=self.plan, on_agree=self._agreed
        )

    def _agreed(self, nbytes: int) -> None:
        """The byte meter's ``control``: kept beside the shards' own meters (the first sharded
        module's ``a2a_bytes``), which checkpoints carry (training/embedding_traffic.py)."""
        meter = self._modules[0].a2a_bytes if self._modules else {}
        meter["control"] = meter.get("control", 0) + nbytes

    def _dropped(self, n: int) -> None:
        self._streams_done["dropped"] += n

    def _close_stream(self) -> None:
        if self.stream is not None:
            s = self.stream
            self._streams_done["seen"] += s.samples_seen
            self._streams_done["skipped"] += s.samples_skipped
            self._streams_done["dropped"] += s.samples_dropped_at_end
            self.stream = None

    # ---- step side (collectives on shared step numbers) -------------------------------------
    def _every(self, step: int, every: int, from_count_steps: bool = True) -> bool:
        """Whether ``step`` is one of every ``every`` steps counted from ``count_steps`` (which
        itself counts only with ``from_count_steps``); the same answer on every rank."""
        since = step - self.cfg.count_steps
        return every > 0 and (since >= 0 if from_count_steps else since > 0) and since % every == 0

    def _snapshot_step(self, step: int) -> bool:
        return self._every(step, self.cfg.snapshot_interval)

    def _sync_step(self, step: int) -> bool:
        """serve: a step after which the served gradients are pushed and the replica re-copied
        (every snapshot, and every ``replica_sync_steps`` in between)."""
        return self._every(step, self.cfg.replica_sync_steps or self.cfg.snapshot_interval)

    def after_backward(self, task: Any) -> None:
        """Called by every rank after the backward of each training step, before its optimizer
        step; only ``serve`` acts there (``StaleServer.after_backward``: on a sync step, a
        collective that pushes the served samples' row gradients before ``after_step``
        snapshots or copies the rows)."""
        if self.server is not None:
            self.server.after_backward(task, self._push_step(self.step + 1))  # the step trained

    def _push_step(self, step: int) -> bool:
        """serve: a sync step whose served gradients are pushed. Stood down, only in the first
        window after standing down, which trains the last batches split while serving (the
        pipeline's and the lock-step's batches ahead); nothing is served after them."""
        lever = self.lever
        if not self._sync_step(step):
            return False
        return lever.tracks or step <= lever.entered + lever.window

    def _counts_step(self, step: int) -> bool:
        window = step <= self.cfg.count_steps or self.cfg.hot_refresh_steps > 0
        return window and step % self._count_every == 0

    def _served_counts(self) -> Any:
        return self.server.take_counts() if self.server is not None else None

    def _refresh_step(self, step: int) -> bool:
        return self._every(step, self.cfg.hot_refresh_steps, from_count_steps=False)

    def step_kinds(self, step: int) -> List[str]:
        """What step ``step`` runs besides training: counting, a snapshot, a serve sync, the
        downsampling guard (the sync audit's classes of steps, training/sync_audit.py)."""
        kinds = []
        if self.tracker is not None and self.lever.tracks:
            kinds += ["count"] if self._counts_step(step) else []
            kinds += ["snapshot"] if self._snapshot_step(step) else []
        kinds += ["sync"] if self.server is not None and self._push_step(step) else []
        kinds += ["lever"] if self._lever_boundary(step) or self._lever_mark_step(step) else []
        kinds += ["guard"] if self.downsampler.is_guard_step(step) else []
        return kinds

    def observe(self, logits: torch.Tensor, labels: torch.Tensor) -> None:
        """The logits and labels of the batch just trained (the downsampling guard's held-out
        samples: each was scored before any update from it). Local."""
        if self.downsampler.guard_steps > 0:
            self.downsampler.observe(logits, labels)

    def downsampling_check(self, step: int) -> Optional[Dict[str, Any]]:
        """The downsampling guard on its steps (collective: every rank, the same steps)."""
        if not self.downsampler.is_guard_step(step):
            return None
        record = self.downsampler.guard(step)
        if self.is_rank0 and record["rate_after"] != record["rate_before"]:
            logger.warning("slipstream: negative downsampling at step %d: %s", step, record["reason"])
        return record

    def after_step(self, step: int) -> Optional[Dict[str, Any]]:
        """Called by every rank after each step; returns a record to log, or None."""
        self.step = step
        if self.tracker is None:
            return None
        record = self._track(step) if self.lever.tracks else None
        self._lever_step(step)  # all ranks: the same steps
        return record

    def _track(self, step: int) -> Optional[Dict[str, Any]]:
        """Counting, snapshots, the threshold and the replica on their steps (collectives)."""
        cfg = self.cfg
        self.tracker.set_counting(self._counts_step(step + 1))
        since = step - cfg.count_steps
        snapshot = self._snapshot_step(step)
        if self.server is not None and self._sync_step(step) and not snapshot and self.lever.serves:
            # All ranks: the rows the push just moved, copied again from the shards.
            t0 = time.perf_counter()
            self.server.rebuild(self.server.replica.keys)
            self.seconds["sync"] += time.perf_counter() - t0
        if not snapshot:
            return None
        t0 = time.perf_counter()
        if since == 0:
            sel = self.tracker.select_hot(self.budget, int(cfg.min_count), self._served_counts())
            self.hot_selection = sel.__dict__
            if self.is_rank0:
                logger.info(
                    "slipstream: %d hot rows (%.1f MiB of %.1f MiB budget, min count %d) at step %d",
                    sel.hot_rows, sel.hot_bytes / 2**20, sel.budget_bytes / 2**20, sel.min_count_used, step,
                )
        t1 = time.perf_counter()
        measured = self.tracker.snapshot()
        if self._refresh_step(step):  # all ranks: the same step numbers
            sel, joined, left = self.tracker.reselect_hot(self.budget, int(cfg.min_count), self._served_counts())
            self.hot_selection = sel.__dict__
            self.hot_turnover.append({"step": step, "hot_rows": sel.hot_rows, "joined": joined, "left": left})
            if self.is_rank0:
                logger.info(
                    "slipstream: hot set chosen again at step %d: %d rows (%d joined, %d left)",
                    step, sel.hot_rows, joined, left,
                )
        t2 = time.perf_counter()
        decision = None
        if measured:
            if not cfg.reactivate:
                # The paper: once stale, stale for the rest of training.
                self.row_state.set_changes(self._frozen_keys, torch.zeros(self._frozen_keys.numel()))
            if self.threshold is None or cfg.refresh_threshold:
                decision = self._choose_threshold()
            if not cfg.reactivate and self.threshold is not None:
                stale = self.row_state.stale_keys(self.threshold)
                self._frozen_keys = torch.unique(torch.cat([self._frozen_keys, stale]))
        if self.server is not None and self.lever.serves:
            # All ranks (the stale set is the same on every rank): the replica follows it, so a
            # row that moved again (change >= T) leaves it here. Before the first threshold, or
            # in the warm-up, nothing is stale and the replica stays empty. Not while the lever
            # times a window without serving: nothing is served from the replica then.
            self.server.rebuild(self._stale_now())
        t3 = time.perf_counter()
        quality_s = decision["seconds"] if decision else 0.0
        self.seconds["sync"] += (t1 - t0) + (t3 - t2) - quality_s
        self.seconds["snapshot"] += t2 - t1
        record = self.state_record(with_tables=True)
        record["state_bytes"] = self.state_bytes()
        record["peak_state_bytes"] = self.peak_state_bytes()
        if decision is not None:
            record["quality"] = decision
        if self.hot_turnover and self.hot_turnover[-1]["step"] == step:
            record["hot_turnover"] = self.hot_turnover[-1]
        return record

    def _stale_now(self) -> torch.Tensor:
        """The flat keys stale under the active threshold (none before it)."""
        active = self._active_threshold()
        return self.row_state.stale_keys(active) if active is not None else torch.zeros(0, dtype=torch.int64)

    # ---- does serving pay? (serve_when=auto; collectives on shared step numbers) -------------
    def _lever_boundary(self, step: int) -> bool:
        return self.lever.auto and self._every(step, self.lever.window)

    def _lever_mark_step(self, step: int) -> bool:
        since = step - self.cfg.count_steps
        return self.lever.auto and since >= 0 and since % self.lever.window == self._settle

    def _tracking_seconds(self) -> float:
        """This rank's seconds of Slipstream's own work so far (what standing down removes)."""
        return self.overhead_seconds() - self.seconds["classify"]

    def _lever_step(self, step: int) -> None:
        """Time the lever's window and, at its end, let the lever decide and apply its state.
        Collective at window ends of a timed window (one MAX all-reduce: all ranks, the same
        steps) and wherever the state changes (the replica's rebuild, a re-basing snapshot)."""
        lever = self.lever
        if self._lever_mark_step(step) and lever.timed:
            assert self.clock is not None, "serve_when=auto needs the trainer's clock"
            self._mark = (step, self.clock(), self._tracking_seconds())
        if not self._lever_boundary(step):
            return
        t0 = time.perf_counter()
        self._lever_window_end(step)
        self.seconds["lever"] += time.perf_counter() - t0

    def _lever_window_end(self, step: int) -> None:
        lever = self.lever
        measured = None
        if lever.timed:
            per_step = -1.0  # not measured here (a run resumed inside the window)
            if self._mark is not None:
                s0, c0, k0 = self._mark
                elapsed = self.clock() - c0
                if not lever.serves:  # the step Slipstream would leave: less its own work
                    elapsed -= self._tracking_seconds() - k0
                per_step = elapsed / max(1, step - s0)
            t = all_reduce_(torch.tensor([per_step], dtype=torch.float64), dist.ReduceOp.MAX)  # all ranks
            self._agreed(t.numel() * t.element_size())
            agreed = float(t.item())
            measured = agreed if agreed >= 0 else None
        self._mark = None
        before = lever.state
        after = lever.window_end(step, measured, ready=self.server.replica.rows > 0)
        if after is None:
            return
        # All ranks take the same transition at the same step.
        self.plan.paused = not after.serves
        if after is LeverState.down:
            self.server.rebuild(torch.zeros(0, dtype=torch.int64))  # the replica emptied
        elif before is LeverState.down:
            # Looking again: the snapshots left off when standing down, so this one re-bases
            # the hot rows' changes and the next snapshot measures them over one interval.
            self.tracker.snapshot()
        elif after.serves and not before.serves:
            self.server.rebuild(self._stale_now())  # the rows that moved while not serving
        self.tracker.set_counting(lever.tracks and self._counts_step(step + 1))
        if self.is_rank0 and lever.decisions and lever.decisions[-1]["step"] == step:
            logger.info("slipstream: serving at step %d: %s", step, lever.decisions[-1]["reason"])

    def _choose_threshold(self) -> Optional[Dict[str, Any]]:
        """T from upcoming inputs of every rank (collective: one gather of per-sample values);
        with the quality check, D is moved first (collectives, see ``_check_quality``). Returns
        the quality decision's record, if one was taken."""
        assert self.stream is not None, "after_step before wrap"
        cfg = self.cfg
        peek = max(cfg.threshold_sample_size, cfg.quality_sample_size if self.quality else 0)
        sample = self.stream.peek_upcoming(peek)
        if sample is None:
            values = torch.zeros(0)
        else:
            values = per_sample_max_change(
                slice_rows(sample, 0, min(sample.batch_size, cfg.threshold_sample_size)).sparse_features,
                self.index, self.row_state,
            )
        values = gather_varlen(values.float())  # all ranks
        decision = None
        if self.quality is not None:  # config: the same on every rank
            t_max, _ = threshold_for_target(values, cfg.target_skip_fraction, cfg.max_threshold)
            decision = self._check_quality(sample, t_max)
        threshold, info = threshold_for_target(values, self.target_skip_fraction(), cfg.max_threshold)
        if info["n_sampled"] == 0 and self.threshold is not None:
            # The look-ahead is empty only at the end of the data: keep the last threshold.
            return decision
        self.threshold, self.threshold_info = float(threshold), info
        if info.get("reason") and self.is_rank0:
            logger.warning("slipstream: threshold %.3g at step %d: %s", threshold, self.step, info["reason"])
        return decision

    def _check_quality(self, sample: Optional[Batch], t_max: float) -> Optional[Dict[str, Any]]:
        """Score the upcoming sample and move D (``quality.py``). Collectives, all ranks: one MIN
        all-reduce of the sample size, the sharded forward (``scorer``), one SUM all-reduce of
        the loss statistics."""
        assert self.quality is not None and self.scorer is not None, "quality check without a scorer"
        t0 = time.perf_counter()
        cfg = self.cfg
        local = 0 if sample is None else min(sample.batch_size, cfg.quality_sample_size)
        n = int(all_reduce_(torch.tensor([local], dtype=torch.int64), dist.ReduceOp.MIN).item())
        if n == 0:  # end of the data on some rank: no decision, D stays
            return None
        assert sample is not None
        batch = slice_rows(sample, 0, n)  # the same size on every rank
        candidate = skippable_by_threshold(
            batch.sparse_features, self.index, self.row_state, t_max, cfg.alpha
        )
        if cfg.negatives_only:
            candidate &= batch.labels.view(-1) == 0
        logits = self.scorer(batch).detach().float().cpu().view(-1)
        losses = nn.functional.binary_cross_entropy_with_logits(
            logits, batch.labels.view(-1).float(), reduction="none"
        )
        totals = all_reduce_(group_stats(losses, candidate).to_tensor())  # all ranks
        record = self.quality.update(QualityStats.from_tensor(totals), self.step)
        record["threshold_at_max_target"] = float(t_max)
        if self.is_rank0:
            logger.info(
                "slipstream: quality check at step %d: %s; target %.3f -> %.3f",
                self.step, record["reason"], record["target_before"], record["target_after"],
            )
        record["seconds"] = time.perf_counter() - t0
        self.seconds["quality"] += record["seconds"]
        return record

    # ---- checkpointing (local, no collective) -----------------------------------------------
    def state_dict(self) -> Dict[str, Any]:
        """Everything but the running epoch's stream (the trainer saves that with the data
        position). The global part is identical on every rank; the tracker's is per shard."""
        return {
            "step": self.step,
            "first_skip_step": self.first_skip_step,
            "threshold": self.threshold,
            "threshold_info": self.threshold_info,
            "row_state": self.row_state.state_dict(),
            "frozen_keys": self._frozen_keys.clone(),
            "hot_selection": self.hot_selection,
            "hot_turnover": list(self.hot_turnover),
            "seconds": dict(self.seconds),
            "count_seconds": [m.count_seconds for m in self.tracker.modules] if self.tracker else [],
            "streams_done": dict(self._streams_done),
            "decider": self.decider.state_dict(),
            "downsampler": self.downsampler.state_dict(),
            "quality": self.quality.state_dict() if self.quality is not None else None,
            "tracker": self.tracker.state_dict() if self.tracker is not None else None,
            "server": self.server.state_dict() if self.server is not None else None,
            "lever": self.lever.state_dict(),
        }

    def load_state_dict(self, state: Dict[str, Any]) -> bool:
        """Restore; returns whether the per-shard tracking state was restored exactly (see
        ``StalenessTracker.load_state_dict`` for what happens when the shard layout changed)."""
        if (state["tracker"] is None) != (self.tracker is None):
            raise ValueError(
                f"the checkpoint was written with a slipstream policy that "
                f"{'does not track' if state['tracker'] is None else 'tracks'} rows, this run's "
                f"slipstream.policy={self.cfg.policy.value} "
                f"{'does' if self.tracker is not None else 'does not'}. Fix: resume with the "
                "policy the run started with, or start a new run directory"
            )
        saved_rows = (
            int(state["row_state"]["num_rows"]) if "row_state" in state else state["change"].numel()
        )
        if saved_rows != self.row_state.num_rows:
            raise ValueError(
                f"the checkpoint tracks {saved_rows} embedding rows, this model has "
                f"{self.row_state.num_rows}. Fix: resume with the dataset and model the run started with"
            )
        self.step = int(state["step"])
        self.first_skip_step = state.get("first_skip_step")
        self.threshold = state["threshold"]
        self.threshold_info = state["threshold_info"]
        if "row_state" in state:
            self.row_state.load_state_dict(state["row_state"])
            self._frozen_keys = state["frozen_keys"].clone()
        else:  # older checkpoints: dense per-row change and frozen mask
            change = state["change"]
            hot = torch.isfinite(change).nonzero().flatten()
            self.row_state.replace(hot, change[hot])
            self._frozen_keys = state["frozen_stale"].nonzero().flatten()
        self.hot_selection = state["hot_selection"]
        self.hot_turnover = list(state.get("hot_turnover", []))
        self.seconds.update(state["seconds"])
        self._streams_done.update(state["streams_done"])
        self.decider.load_state_dict(state["decider"])
        if "downsampler" in state:  # older checkpoints have none: the stream restarts from its seed
            self.downsampler.load_state_dict(state["downsampler"])
        if self.quality is not None:
            if state.get("quality") is None:
                raise ValueError(
                    "the checkpoint was written without slipstream.quality_check, this run has it "
                    "on. Fix: resume with slipstream.quality_check=false, or start a new run directory"
                )
            self.quality.load_state_dict(state["quality"])
        if (state.get("server") is None) != (self.server is None):
            raise ValueError(
                "the checkpoint was written with another slipstream.action than this run's "
                f"({self.cfg.action.value}). Fix: resume with the action the run started with, or "
                "start a new run directory"
            )
        if self.server is not None:
            self.server.load_state_dict(state["server"])
        if "lever" in state:  # older checkpoints: the lever starts waiting
            self.lever.load_state_dict(state["lever"])
            self.plan.paused = not self.lever.serves
        exact = True
        if self.tracker is not None:
            exact = self.tracker.load_state_dict(state["tracker"])
            if len(state["count_seconds"]) == len(self.tracker.modules):
                for m, v in zip(self.tracker.modules, state["count_seconds"]):
                    m.count_seconds = float(v)
            self.tracker.set_counting(self.lever.tracks and self._counts_step(self.step + 1))
        return exact

    def eval_logit_offset(self) -> float:
        """What evaluation adds to every logit so that predicted click rates stay calibrated.

        Uniform negative downsampling (policy random with negatives_only, pure skipping) trains
        on the non-clicks kept at rate q = 1 - random_skip_fraction, so the model's odds come out
        1/q too high; log(q) undoes exactly that (He et al., "Practical Lessons from Predicting
        Clicks on Ads at Facebook", 2014). A monotone shift of every logit leaves AUC unchanged.
        ``negative_downsampling`` beside any policy is the same uniform correction, at its
        current rate. Every other case is 0: with p > 0 the 1/p weights already keep the loss
        unbiased, and a skip that depends on the lookups shifts some inputs' odds and not
        others', which no single offset corrects (the staleness policies with negatives_only are
        not calibrated). With a ceiling (max_skip_fraction < 1) that binds, fewer non-clicks are
        skipped than q assumes and the correction overshoots; conf/slipstream/random.yaml has no
        ceiling.
        """
        c = self.cfg
        offset = self.downsampler.logit_offset()
        if c.policy is Policy.random and c.negatives_only and c.keep_probability == 0:
            offset += math.log(1.0 - c.random_skip_fraction)
        return offset

    # ---- reporting --------------------------------------------------------------------------
    def downsampling_summary(self) -> Dict[str, Any]:
        """The downsampling's setting, rate and decisions, and the non-clicks it dropped summed
        over ranks. Collective: all ranks enter (one SUM all-reduce)."""
        out = self.downsampler.summary()
        dropped = torch.tensor([self.downsampler.dropped], dtype=torch.int64)
        out["negatives_dropped"] = int(all_reduce_(dropped).item())  # all ranks
        return out

    def counters(self) -> Dict[str, int]:
        """This rank's stream counters over all epochs so far."""
        seen, skipped, dropped = (self._streams_done[k] for k in ("seen", "skipped", "dropped"))
        if self.stream is not None:
            seen += self.stream.samples_seen
            skipped += self.stream.samples_skipped
            dropped += self.stream.samples_dropped_at_end
        return {
            "samples_seen": seen,
            "samples_skipped": skipped,
            "samples_dropped": dropped,
            # what the classifier and safeguards decided, whether or not the policy skips
            # (track_only: what paper_plus would have skipped on the same stream)
            "samples_would_skip": int(self.decider.totals.skipped),  # 0 under off: never asked
            # serve: lookups answered from the replica, samples all of whose lookups were, the
            # bags sent through the shards (padding slots included) of all bags; for every
            # other action nothing is served and every bag is sent
            "samples_served": self.plan.samples_served,
            "lookups_served": self.plan.lookups_served,
            "lookups_split": self.plan.lookups_split,
            "slots_sent": self.plan.slots_sent,
            "bags_split": self.plan.bags_split,
        }

    def global_counters(self) -> Dict[str, int]:
        """Counters summed over ranks. Collective: all ranks enter."""
        local = self.counters()
        t = all_reduce_(torch.tensor([float(v) for v in local.values()], dtype=torch.float64))
        out = {k: int(v) for k, v in zip(local, t.tolist())}
        never = torch.tensor([float("inf") if self.first_skip_step is None else float(self.first_skip_step)])
        first = float(all_reduce_(never, dist.ReduceOp.MIN).item())  # all ranks
        out["first_skip_step"] = None if math.isinf(first) else int(first)
        return out

    def state_record(self, with_tables: bool = False) -> Dict[str, Any]:
        """Per-interval observability (this rank's classification counters; the rest is global)."""
        c = self.counters()
        record: Dict[str, Any] = {
            "threshold": self.threshold,
            "skip_fraction": c["samples_skipped"] / c["samples_seen"] if c["samples_seen"] else 0.0,
            "hot_rows": int(self.tracker.hot_keys.numel()) if self.tracker is not None else 0,
            "target_skip_fraction": self.target_skip_fraction(),
            "count_seconds": self.count_seconds(),
            **{f"{k}_seconds": v for k, v in self.seconds.items() if k != "count"},
            "serve_seconds": self.plan.seconds,
            "push_seconds": self.server.push_seconds if self.server is not None else 0.0,
            "served_sum_seconds": self.server.sum_seconds if self.server is not None else 0.0,
            "serve_lever": self.lever.state.value if self.lever.auto else None,
        }
        if self.server is not None:
            record.update(self.server.record())
        if self.threshold is not None:
            stale = self.row_state.stale_keys(self.threshold)  # O(hot rows)
            record["stale_rows"] = int(stale.numel())
            if with_tables and self.tracker is not None:
                record["stale_rows_per_table"] = self.tracker.rows_per_table(stale)
        else:
            record["stale_rows"] = 0
        if with_tables and self.tracker is not None:
            record["hot_rows_per_table"] = self.tracker.hot_rows_per_table()
            record["threshold_info"] = self.threshold_info
            record["change_histogram"] = change_histogram(self.row_state.values)
        return record

    def state_bytes(self) -> int:
        """Bytes of this rank's Slipstream per-row state now: the tracker's (hot keys, counts, hot
        rows, snapshots), the published changes with their lookup view, the frozen keys, the
        replica (serve)."""
        held = self.row_state.nbytes() + self._frozen_keys.numel() * 8
        if self.server is not None:
            held += self.server.nbytes()
        if self.tracker is not None:
            held += self.tracker.state_bytes()
        return int(held)

    def peak_state_bytes(self) -> int:
        """The largest ``state_bytes`` so far on this rank, snapshot copies and gathers included."""
        peak = self.tracker.peak_bytes + self._frozen_keys.numel() * 8 if self.tracker is not None else 0
        return int(max(peak, self.state_bytes()))

    def count_seconds(self) -> float:
        if self.tracker is None:
            return 0.0
        return sum(m.count_seconds for m in self.tracker.modules)

    def overhead_seconds(self) -> float:
        push = self.server.push_seconds + self.server.sum_seconds if self.server is not None else 0.0
        return self.count_seconds() + push + sum(v for k, v in self.seconds.items() if k != "count")
