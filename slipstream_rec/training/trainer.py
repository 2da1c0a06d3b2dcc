"""The training loop: TorchRec train pipeline steps, periodic exact evaluation, summary."""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import logging
import time
from collections import deque
from pathlib import Path
from dataclasses import dataclass, field
from typing import Any, Callable, Deque, Dict, Iterable, Iterator, List, Optional

import torch
import torch.distributed as dist
from torch import nn
from torchrec.distributed.train_pipeline import TrainPipelineBase, TrainPipelineSparseDist

from slipstream_rec.checkpoint.manager import Checkpointer
from slipstream_rec.checkpoint.rng import capture_rng, restore_rng
from slipstream_rec.distributed import DistEnv, all_reduce_
from slipstream_rec.data.batch_ops import batch_from_state, batch_to_state
from slipstream_rec.slipstream.controller import SlipstreamController
from slipstream_rec.training.faults import FaultInjector
from slipstream_rec.training.config import PipelineKind, Precision, TrainerConfig
from slipstream_rec.training.precision import PROBE_START, PrecisionProbe, resolve_precision
from slipstream_rec.training.embedding_cache import embedding_cache_summary
from slipstream_rec.training.embedding_traffic import (
    embedding_traffic_summary,
    load_traffic_state,
    local_a2a_bytes,
    per_sample,
    traffic_state,
)
from slipstream_rec.training.metric_log import MetricLog
from slipstream_rec.training.metrics import evaluate_predictions
from slipstream_rec.training.profiling import StepProfiler
from slipstream_rec.training.sync_audit import SyncAudit
from slipstream_rec.training.wire_meter import WireMeter

logger = logging.getLogger(__name__)


@dataclass
class TrainState:
    """Counters of one run, global over ranks (every rank holds the same values)."""

    step: int = 0
    epoch: int = 0
    samples_seen: int = 0  # samples read from the training stream
    samples_trained: int = 0  # samples that went through forward/backward/optimizer
    train_seconds: float = 0.0  # wall time inside training steps (evaluation excluded)
    data_seconds: float = 0.0  # inside the batch stream's next(): loading, classifying, refilling
    eval_seconds: float = 0.0
    checkpoint_seconds: float = 0.0  # saving checkpoints (excluded from train_seconds too)
    history: List[Dict[str, Any]] = field(default_factory=list)  # evaluation results


def planned_steps(cfg: TrainerConfig, batches_per_epoch: int) -> int:
    """Steps the run will take: all epochs, capped by ``max_steps``."""
    steps = batches_per_epoch * cfg.epochs
    return min(steps, cfg.max_steps) if cfg.max_steps else steps


PIPELINE_STAGES = ("input_all_to_all", "forward", "backward", "optimizer")


class TimedTrainPipelineSparseDist(TrainPipelineSparseDist):
    """TorchRec's TrainPipelineSparseDist with host timers around its stages.

    ``input_all_to_all``: starting and waiting for the input distribution (the KJT all-to-all of
    the next batch); ``forward`` / ``backward`` include the embedding lookups and the output
    all-to-all (and its backward, with the fused embedding update), which the pipeline runs
    inside the model call; ``optimizer``: the dense optimizer step. On CUDA these are launch
    times on the host, not kernel times.
    """

    def __init__(self, *args: Any, autocast_dtype: Optional[torch.dtype] = None, **kwargs: Any) -> None:
        # autocast_dtype: run the training forward under torch.autocast to this dtype (None: off).
        super().__init__(*args, **kwargs)
        # Called after each training step's backward, before its optimizer step (Slipstream's
        # serve pushes the served samples' gradients there: SlipstreamController.after_backward).
        self.after_backward: Optional[Callable[[], None]] = None
        self.seconds: Dict[str, float] = {stage: 0.0 for stage in PIPELINE_STAGES}
        # Read at every training forward: trainer.precision=auto's probe switches it (precision.py).
        self.autocast_dtype = autocast_dtype
        model_fwd = self._model_fwd
        device_type = self._device.type

        def timed_forward(batch: Any) -> Any:
            start = time.perf_counter()
            if self.autocast_dtype is None:
                out = model_fwd(batch)
            else:
                with torch.autocast(device_type, dtype=self.autocast_dtype):
                    out = model_fwd(batch)
            self.seconds["forward"] += time.perf_counter() - start
            return out

        self._model_fwd = timed_forward

    def start_sparse_data_dist(self, batch: Any, context: Any) -> None:
        start = time.perf_counter()
        super().start_sparse_data_dist(batch, context)
        self.seconds["input_all_to_all"] += time.perf_counter() - start

    def wait_sparse_data_dist(self, context: Any) -> None:
        start = time.perf_counter()
        super().wait_sparse_data_dist(context)
        self.seconds["input_all_to_all"] += time.perf_counter() - start

    def _backward(self, losses: torch.Tensor) -> None:
        start = time.perf_counter()
        super()._backward(losses)
        self.seconds["backward"] += time.perf_counter() - start

    def _optimizer_step(self) -> None:
        if self.after_backward is not None:
            self.after_backward()
        start = time.perf_counter()
        super()._optimizer_step()
        self.seconds["optimizer"] += time.perf_counter() - start


def make_pipeline(
    kind: PipelineKind,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    device: torch.device,
    precision: Precision = Precision.fp32,
) -> Any:
    if kind is PipelineKind.base:
        assert precision is Precision.fp32, "TrainerConfig.validate refuses bf16 with the base pipeline"
        return TrainPipelineBase(model, optimizer, device)
    dtype = torch.bfloat16 if precision is Precision.bf16 else None
    # enqueue_batch_after_forward: the data side (loading, Slipstream's classify / annotate /
    # split, the lock-step flag) runs after the current batch's forward is launched, so on a GPU
    # it overlaps the forward's kernels instead of delaying their launch. The order of every
    # collective is the same on every rank either way.
    return TimedTrainPipelineSparseDist(
        model, optimizer, device, execute_all_batches=True, autocast_dtype=dtype,
        enqueue_batch_after_forward=True,
    )  # fmt: skip


class InFlight:
    """The training iterator as the pipeline sees it, remembering the batches it handed out that
    are not trained yet. TorchRec's pipelines prefetch (TrainPipelineSparseDist holds the next
    two batches, their input all-to-all already started); a checkpoint saves those batches so a
    resumed run trains exactly them next, without pulling or classifying them again."""

    def __init__(self, batches: Iterator[Any]) -> None:
        self._batches = batches
        self.pending: Deque[Any] = deque()

    def __iter__(self) -> "InFlight":
        return self

    def __next__(self) -> Any:
        batch = next(self._batches)
        self.pending.append(batch)
        return batch

    def trained_one(self) -> None:
        """A pipeline step finished: the oldest batch handed out was the one trained."""
        self.pending.popleft()


@torch.no_grad()
def evaluate(
    model: nn.Module, batches: Iterable[Any], device: torch.device, logit_offset: float = 0.0
) -> Dict[str, float]:
    """Exact AUC / log loss over every batch of a split on all ranks. Collective: all ranks enter,
    each with the same number of batches (the loaders guarantee it). ``logit_offset`` is added to
    every logit (a calibration correction: AUC is unchanged, log loss is not)."""
    was_training = model.training
    model.eval()
    logits: List[torch.Tensor] = []
    labels: List[torch.Tensor] = []
    for batch in batches:
        batch = batch.to(device, non_blocking=True)
        _, (_, batch_logits, batch_labels, _) = model(batch)
        logits.append(batch_logits)
        labels.append(batch_labels)
    model.train(was_training)
    return evaluate_predictions(torch.cat(logits) + logit_offset, torch.cat(labels))


class Trainer:
    """Drives a DMP-wrapped ``DLRMTask`` through a TorchRec train pipeline.

    The batches come through the Slipstream controller's stream, which agrees every step that
    all ranks still have a batch (Slipstream skips different numbers of samples on each rank),
    so every rank runs the same steps and the pipeline's and evaluation's collectives line up.
    """

    def __init__(
        self,
        cfg: TrainerConfig,
        env: DistEnv,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        scheduler: torch.optim.lr_scheduler.LRScheduler,
        train_loader: Any,
        val_loader: Any,
        test_loader: Optional[Any],
        log: MetricLog,
        slipstream: SlipstreamController,
        checkpointer: Optional[Checkpointer] = None,
        run_dir: Optional[Path] = None,
    ) -> None:
        self.cfg = cfg
        self.env = env
        self.model = model
        self.optimizer = optimizer
        self.scheduler = scheduler
        self.train_loader = train_loader
        self.val_loader = val_loader
        self.test_loader = test_loader
        self.log = log
        self.slipstream = slipstream
        self.state = TrainState()
        self.checkpointer = checkpointer
        # all ranks: one agreement on the precision (auto reads each rank's machine)
        self.precision, self.precision_reason = resolve_precision(cfg.precision, env.device, cfg.pipeline)
        self.pipeline = make_pipeline(cfg.pipeline, model, optimizer, env.device, self.precision)
        # auto with fast bf16 everywhere: timed on this run's first steps before it is kept
        probing = cfg.precision is Precision.auto and self.precision is Precision.bf16 and cfg.precision_probe_steps
        self.precision_probe = PrecisionProbe(cfg.precision_probe_steps, cfg.precision_min_gain) if probing else None
        self._epoch_start: Optional[float] = None  # perf_counter at the start of the running epoch
        self._paused_before = 0.0  # eval + checkpoint seconds at that moment
        self._in_flight: Optional[InFlight] = None  # the running epoch's iterator
        self._resume_position: Optional[Dict[str, Any]] = None  # set by load_state_dict
        self._last_save_train_s = 0.0  # train seconds at the last checkpoint
        self._last_save_step = -1
        self.resumed_from: Optional[Dict[str, Any]] = None
        self._reattach_step = -1  # the step after an evaluation or a quality check's scoring
        self.faults = FaultInjector.from_env(env.rank)
        # the node's interface counter over the training steps (summary.json's wire)
        self.wire = WireMeter.from_config(cfg.wire_interface, env.local_rank)
        slipstream.scorer = self.score
        slipstream.clock = self._drained_train_seconds
        # trainer.sync_audit: count the ops of each step that would wait for a GPU (sync_audit.py)
        self.audit: Optional[SyncAudit] = None
        if cfg.sync_audit:
            self.audit = SyncAudit(cuda=env.device.type == "cuda")
            self.audit.taint_module(model)
            self.audit.attach(self.pipeline)
        # trainer.profile_steps: a torch.profiler trace of steps from the middle of the run
        self.profiler = StepProfiler(
            cfg.profile_steps, self.total_steps() // 2, Path(run_dir or ".") / "profile", env.rank,
            env.device.type == "cuda",
        )  # fmt: skip
        if slipstream.cfg.serves:
            # load_config refuses serve with another pipeline (slipstream_rec/config.py)
            assert isinstance(self.pipeline, TimedTrainPipelineSparseDist), "serve needs sparse_dist"
            task = getattr(model, "module", model)
            self.pipeline.after_backward = lambda: slipstream.after_backward(task)

    @torch.no_grad()
    def score(self, batch: Any) -> torch.Tensor:
        """Logits of ``batch`` under the current parameters, in eval mode, without training on
        it (Slipstream's quality check). Collective (the sharded forward): all ranks call it at
        the same step. The pipeline is paused like for an evaluation and resumes on its next step."""
        model = self.pipeline.detach() if hasattr(self.pipeline, "detach") else self.model
        self._reattach_step = self.state.step + 1
        was_training = model.training
        model.eval()
        try:
            _, (_, logits, _, _) = model(batch.to(self.env.device, non_blocking=True))
        finally:
            model.train(was_training)
        return logits

    @contextlib.contextmanager
    def _not_a_step(self) -> Iterator[None]:
        """Evaluations and checkpoints are left out of the sync audit's step counts and of the
        wire meter's bytes."""
        with self.audit.paused() if self.audit is not None else contextlib.nullcontext(), self.wire.paused():
            yield

    def _step_kinds(self, step: int) -> List[str]:
        """What ran in ``step`` besides training (the sync audit's classes of steps)."""
        c = self.cfg
        kinds = self.slipstream.step_kinds(step)
        if step == self._reattach_step:  # TorchRec's pipeline re-attaches after a detach
            kinds.append("reattach")
        if self.precision_probe is not None and self.precision_probe.candidate(step) is not None:
            kinds.append("probe")  # the precision probe's steps end with a host wait on a GPU
        if step % c.log_every_steps == 0:
            kinds.append("log")
        if c.checkpoint.enabled and c.checkpoint.every_minutes and step % c.checkpoint.check_every_steps == 0:
            kinds.append("checkpoint_check")
        return kinds

    def total_steps(self) -> int:
        """Steps planned; an upper bound when Slipstream skips samples."""
        return planned_steps(self.cfg, len(self.train_loader))

    def _epoch_batches(self, epoch: int, budget: int) -> InFlight:
        """Raw batches -> Slipstream's classify/skip/refill stream (lock-step over ranks) -> at
        most ``budget`` training steps. A resumed epoch first replays the batches the pipeline
        had prefetched, then continues the saved stream where its source stopped."""
        self.train_loader.set_epoch(epoch)
        pos, self._resume_position = self._resume_position, None
        if pos is not None and pos["epoch"] == epoch:
            replay = [batch_from_state(b) for b in pos["in_flight"]]
            start = pos["source_batches"]
            stream = self.slipstream.wrap(
                self.train_loader.iter_from(start), pos["stream"], self.cfg.lockstep_every_steps
            )
            batches: Iterator[Any] = itertools.chain(replay, stream)
        else:
            batches = self.slipstream.wrap(
                iter(self.train_loader), lockstep_every=self.cfg.lockstep_every_steps
            )
        batches = itertools.islice(batches, budget)
        if self.audit is not None:
            batches = self.audit.data_side(batches)
        self._in_flight = InFlight(self._timed(batches))
        return self._in_flight

    def _timed(self, batches: Iterator[Any]) -> Iterator[Any]:
        # CUDA: the Slipstream stream rebuilds most batches (select, concat, slice) into pageable
        # memory, whatever the loader pinned; pin them again so the pipeline's host-to-device
        # copy (non_blocking) overlaps with compute. The copy into page-locked memory is on the
        # host, counted in data_seconds.
        pin = self.env.device.type == "cuda"
        while True:
            start = time.perf_counter()
            batch = next(batches, None)
            if batch is not None and pin:
                batch = batch.pin_memory()
            self.state.data_seconds += time.perf_counter() - start
            if batch is None:
                return
            yield batch

    def _drained_train_seconds(self) -> float:
        """Training seconds so far with the device's queued work finished: the clock of the serve
        lever's windows (a host wait on a GPU, twice per window; never inside a plain step)."""
        if self.env.device.type == "cuda":
            torch.cuda.synchronize(self.env.device)
        return self._live_train_seconds()

    def _live_train_seconds(self) -> float:
        """Training seconds so far, including the running epoch (evaluations excluded)."""
        st = self.state
        if self._epoch_start is None:
            return st.train_seconds
        paused = st.eval_seconds + st.checkpoint_seconds - self._paused_before
        return st.train_seconds + time.perf_counter() - self._epoch_start - paused

    def time_breakdown(self) -> Dict[str, float]:
        """Where this rank's training time went (cumulative host seconds; they add up to
        ``total``). ``data``: loading and refilling batches; the pipeline stages (see
        ``TimedTrainPipelineSparseDist``); ``slipstream``: counting, classifying, snapshots,
        syncs, and summing and pushing the served lookups' gradients (taken out of ``data`` and
        ``forward``, where counting and classifying run);
        ``serving``: splitting batches between the shards and the replica and pooling the served
        samples' embeddings from it (taken out of ``data``, where it runs);
        ``other``: the rest (logging, scheduler, pipeline bookkeeping)."""
        st = self.state
        total = self._live_train_seconds()
        stages = getattr(self.pipeline, "seconds", {stage: 0.0 for stage in PIPELINE_STAGES})
        ctl = self.slipstream
        parts = {
            "data": max(0.0, st.data_seconds - ctl.seconds["classify"] - ctl.plan.seconds),
            "input_all_to_all": stages["input_all_to_all"],
            "forward": max(0.0, stages["forward"] - ctl.count_seconds()),
            "backward": stages["backward"],
            "optimizer": stages["optimizer"],
            "slipstream": ctl.overhead_seconds(),
            "serving": ctl.plan.seconds,
        }
        parts["other"] = max(0.0, total - sum(parts.values()))
        return {"total": total, **parts}

    def fit(self) -> TrainState:
        st = self.state
        total = self.total_steps()
        global_batch = self.cfg.batch_size * self.env.world_size
        try:
            with self.audit if self.audit is not None else contextlib.nullcontext():
                self._fit_epochs(total, global_batch)
        finally:
            self.profiler.close()
        return st

    def _fit_epochs(self, total: int, global_batch: int) -> None:
        st = self.state
        for epoch in range(st.epoch, self.cfg.epochs):
            if st.step >= total:
                break
            st.epoch = epoch
            if isinstance(self.pipeline, TrainPipelineBase):
                # TrainPipelineBase stays "connected" to the exhausted iterator of the previous
                # epoch and would stop at once (measured: epochs=2 trained one epoch).
                self.pipeline.reset()
            batches = self._epoch_batches(epoch, total - st.step)
            # Wall time of the whole loop, logging included, evaluations and checkpoints
            # excluded: what a user waits for, measured the same way as the benchmark's plain
            # TorchRec loop.
            self._epoch_start = time.perf_counter()
            self._paused_before = st.eval_seconds + st.checkpoint_seconds
            window_start, window_step = self._epoch_start, st.step
            self.wire.resume()
            while True:
                self.profiler.before_step(st.step + 1)
                probe = self.precision_probe
                if probe is not None:
                    self.pipeline.autocast_dtype = probe.dtype(st.step + 1)
                step_start = time.perf_counter()
                try:
                    loss, logits, labels, _weights = self.pipeline.progress(batches)
                except StopIteration:
                    break
                if probe is not None and probe.chosen is None:
                    self._probe_precision(probe, st.step + 1, step_start)
                batches.trained_one()
                self.scheduler.step()
                st.step += 1
                st.samples_trained += global_batch
                self.wire.steps += 1
                self.log.advance()
                self.slipstream.observe(logits, labels)  # held out: scored before their update
                record = self.slipstream.after_step(st.step)  # all ranks: may run collectives
                if record is not None:
                    self.log.log("slipstream", st.step, record)
                for decision in self.slipstream.lever.take_new():  # serve_when=auto's decisions
                    self.log.log("lever", st.step, decision)
                guard = self.slipstream.downsampling_check(st.step)  # all ranks, the same steps
                if guard is not None:
                    self.log.log("downsampling", st.step, guard)
                if st.step % self.cfg.log_every_steps == 0:
                    now = time.perf_counter()
                    rate = (st.step - window_step) * global_batch / max(now - window_start, 1e-9)
                    self.log.log(
                        "train",
                        st.step,
                        {
                            "loss": float(loss),
                            "samples_per_second": rate,
                            "samples_trained": st.samples_trained,
                            "lr": self.scheduler.get_last_lr()[0],
                            **self.slipstream.state_record(),
                            # this rank's embedding collectives so far, per sample it trained
                            "a2a_bytes_per_sample": per_sample(
                                local_a2a_bytes(self.model), st.step * self.cfg.batch_size
                            ),
                            **{f"time_{k}": v for k, v in self.time_breakdown().items()},
                        },
                    )
                    window_start, window_step = now, st.step
                if self.cfg.eval_every_steps and st.step % self.cfg.eval_every_steps == 0:
                    with self._not_a_step():
                        self._evaluate("val", self.val_loader)
                    window_start = time.perf_counter()
                if self._checkpoint_due(st.step):  # all ranks: a collective decision
                    with self._not_a_step():
                        self.save_checkpoint()
                    window_start = time.perf_counter()
                if self.audit is not None:
                    self.audit.end_step(st.step, self._step_kinds(st.step))
                self.profiler.after_step(st.step)
                self.faults.after_step(st.step)
            if self.env.device.type == "cuda":
                torch.cuda.synchronize(self.env.device)  # count the queued kernels too
            self.wire.pause()
            st.train_seconds = self._live_train_seconds()
            self._epoch_start = None

    def _probe_precision(self, probe: PrecisionProbe, step: int, start: float) -> None:
        """Time step ``step`` for the precision probe; at its last step, decide (collective:
        all ranks, the same step)."""
        if probe.candidate(step) is not None:
            if self.env.device.type == "cuda":
                torch.cuda.synchronize(self.env.device)  # probe steps only: the kernels' time too
            probe.observe(step, time.perf_counter() - start)
        if step == probe.last_step:
            self.precision, self.precision_reason = probe.agree_and_decide()  # all ranks
            if self.env.is_rank0:
                logger.info("trainer: precision %s", self.precision_reason)
            self.log.log("precision", step, {"chosen": self.precision.value, **probe.record})

    # ---- checkpoints ------------------------------------------------------------------------
    def _checkpoint_due(self, step: int) -> bool:
        """Whether to save after ``step``: every_steps, or every_minutes of training by rank 0's
        clock. Collective: all ranks enter one MAX all-reduce every check_every_steps steps."""
        c = self.cfg.checkpoint
        if self.checkpointer is None or not c.enabled:
            return False
        due = bool(c.every_steps) and step % c.every_steps == 0
        if c.every_minutes and step % c.check_every_steps == 0:
            late = self._live_train_seconds() - self._last_save_train_s >= 60.0 * c.every_minutes
            flag = torch.tensor([1.0 if (late and self.env.is_rank0) else 0.0])
            due = bool(all_reduce_(flag, dist.ReduceOp.MAX).item()) or due  # all ranks
        return due

    def save_checkpoint(self) -> None:
        """Save the whole run state now (skipped when this step is already saved). Collective."""
        if self.checkpointer is None or self._last_save_step == self.state.step:
            return
        t0 = time.perf_counter()
        path = self.checkpointer.save(self.state.step, self.state_dict())
        self.state.checkpoint_seconds += time.perf_counter() - t0
        self._last_save_train_s = self._live_train_seconds()
        self._last_save_step = self.state.step
        self.log.log(
            "checkpoint",
            self.state.step,
            {"path": str(path), "seconds": round(time.perf_counter() - t0, 3)},
        )

    def state_dict(self) -> Dict[str, Any]:
        """This rank's part of a checkpoint, besides model and optimizers (which go through DCP)."""
        st = dataclasses.asdict(self.state)
        st["train_seconds"] = self._live_train_seconds()
        stream = self.slipstream.stream
        pending = list(self._in_flight.pending) if self._in_flight is not None else []
        position = {
            "epoch": self.state.epoch,
            "batches_per_epoch": len(self.train_loader),
            "batch_size": self.cfg.batch_size,
            "stream": stream.state_dict() if stream is not None else None,
            "source_batches": stream.source_batches_pulled if stream is not None else 0,
            "in_flight": [batch_to_state(b) for b in pending],
            "buffered_rows": (stream.buffered_rows() if stream is not None else 0)
            + sum(b.batch_size for b in pending),
        }
        return {
            "world_size": self.env.world_size,
            "trainer": st,
            "scheduler": self.scheduler.state_dict(),
            "rng": capture_rng(),
            "slipstream": self.slipstream.state_dict(),
            "position": position,
            "traffic": traffic_state(self.model),
            "precision_probe": self.precision_probe.state_dict() if self.precision_probe else None,
            "precision": [self.precision.value, self.precision_reason],
        }

    def load_state_dict(self, state: Dict[str, Any]) -> Dict[str, Any]:
        """Continue from a checkpoint's local state; returns what was restored exactly.

        Same world size, batch size and data: the exact data position (the rest of the epoch's
        stream and the prefetched batches). Otherwise the position is carried over as the
        fraction of the epoch's rows already pulled, at batch granularity: the rank partitions
        differ, so in the interrupted epoch some rows are seen twice or not at all.
        """
        self.state = TrainState(**state["trainer"])
        self._last_save_train_s = self.state.train_seconds
        self._last_save_step = self.state.step
        self.scheduler.load_state_dict(state["scheduler"])
        restore_rng(state["rng"])
        tracking_exact = self.slipstream.load_state_dict(state["slipstream"])
        if self.precision_probe is not None and state.get("precision_probe") is not None:
            self.precision_probe.load_state_dict(state["precision_probe"])
            if self.precision_probe.chosen is not None:  # decided before the interruption
                self.precision, self.precision_reason = Precision(state["precision"][0]), state["precision"][1]
        load_traffic_state(self.model, state.get("traffic", []))
        pos = state["position"]
        same_data = (
            state.get("same_world_size", False)
            and pos["batch_size"] == self.cfg.batch_size
            and pos["batches_per_epoch"] == len(self.train_loader)
        )
        if same_data:
            self._resume_position = pos
        else:
            rows = pos["batches_per_epoch"] * pos["batch_size"]
            done = max(0, pos["source_batches"] * pos["batch_size"] - pos["buffered_rows"])
            start = min(len(self.train_loader), int(len(self.train_loader) * done / max(1, rows)))
            self._resume_position = {"epoch": pos["epoch"], "source_batches": start, "stream": None, "in_flight": []}
        return {"data_position_exact": same_data, "slipstream_tracking_exact": tracking_exact}

    def _evaluate(self, split: str, loader: Any) -> Dict[str, float]:
        """Pause the pipeline (its in-flight batches are kept), evaluate, resume on next step."""
        t0 = time.perf_counter()
        model = self.pipeline.detach() if hasattr(self.pipeline, "detach") else self.model
        self._reattach_step = self.state.step + 1
        result = evaluate(model, loader, self.env.device, self.slipstream.eval_logit_offset())
        self.state.eval_seconds += time.perf_counter() - t0
        record = {"split": split, "samples_trained": self.state.samples_trained, **result}
        self.state.history.append({"step": self.state.step, **record})
        self.log.log("eval", self.state.step, record)
        self.log.write(
            f"[step {self.state.step}] {split}: auc={result['auc']:.4f} "
            f"logloss={result['logloss']:.4f} ({result['num_samples']} samples)"
        )
        return result

    def finish(self) -> Dict[str, Any]:
        """Final validation (and test) evaluation; returns the metrics part of the summary."""
        last = self.state.history[-1] if self.state.history else None
        if last is not None and last["step"] == self.state.step and last["split"] == "val":
            val = last  # the periodic evaluation just ran at this very step
        else:
            val = self._evaluate("val", self.val_loader)
        test = self._evaluate("test", self.test_loader) if self.test_loader is not None else None
        st = self.state
        probe = self.precision_probe
        if probe is not None and probe.chosen is None and st.step > PROBE_START:
            self.precision_reason += (
                f" (its timing did not finish: the run ended before step {probe.last_step}, and steps "
                f"{PROBE_START + 1}-{st.step} took turns in fp32 and bf16)"
            )  # fmt: skip
        counters = self.slipstream.global_counters()  # all ranks
        st.samples_seen = counters["samples_seen"]
        overhead = all_reduce_(  # all ranks: the slowest rank's cost
            torch.tensor([self.slipstream.overhead_seconds()], dtype=torch.float64), dist.ReduceOp.MAX
        )
        # all ranks: the largest Slipstream per-row state of any rank, snapshots included
        state_bytes = all_reduce_(
            torch.tensor([self.slipstream.peak_state_bytes()], dtype=torch.int64), dist.ReduceOp.MAX
        )
        cache = embedding_cache_summary(self.model, self.env.device)  # all ranks
        traffic = embedding_traffic_summary(  # all ranks
            self.model, self.slipstream, st.samples_trained, self.env.local_world_size
        )
        slip = self.slipstream.state_record(with_tables=True)
        return {
            "steps": st.step,
            "epochs": st.epoch + 1 if st.step else 0,
            "samples_seen": st.samples_seen,
            "samples_trained": st.samples_trained,
            "train_seconds": round(st.train_seconds, 3),
            "eval_seconds": round(st.eval_seconds, 3),
            "checkpoint_seconds": round(st.checkpoint_seconds, 3),
            "checkpoints_saved_this_attempt": self.checkpointer.saved if self.checkpointer else 0,
            "last_checkpoint": str(self.checkpointer.last_path) if self.checkpointer and self.checkpointer.last_path else None,
            "resumed_from": self.resumed_from,
            "samples_per_second": st.samples_trained / st.train_seconds if st.train_seconds else 0.0,
            "val_auc": val["auc"],
            "val_logloss": val["logloss"],
            "test_auc": test["auc"] if test else None,
            "test_logloss": test["logloss"] if test else None,
            "test_ctr": test["ctr"] if test else None,
            "test_predicted_ctr": test["predicted_ctr"] if test else None,
            "samples_skipped": counters["samples_skipped"],
            "first_skip_step": counters["first_skip_step"],
            "target_skip_fraction": self.slipstream.target_skip_fraction(),
            "quality_decisions": self.slipstream.quality.decisions if self.slipstream.quality else 0,
            "samples_dropped_at_end": counters["samples_dropped"],
            "skip_fraction": counters["samples_skipped"] / max(1, counters["samples_seen"]),
            "would_skip_fraction": counters["samples_would_skip"] / max(1, counters["samples_seen"]),
            "hot_rows": slip["hot_rows"],
            "stale_rows": slip["stale_rows"],
            "threshold": slip["threshold"],
            "eval_logit_offset": self.slipstream.eval_logit_offset(),
            "precision": {
                "requested": self.cfg.precision.value, "chosen": self.precision.value, "reason": self.precision_reason,
                **({"probe": self.precision_probe.record} if self.precision_probe and self.precision_probe.record else {}),
            },  # fmt: skip
            "negative_downsampling": self.slipstream.downsampling_summary(),  # all ranks
            "serve_lever": self.slipstream.lever.summary(),
            "slipstream_overhead_seconds": round(float(overhead.item()), 3),
            "slipstream_state_bytes": int(state_bytes.item()),
            "embedding_cache": cache,
            **traffic,
            # all ranks: the bytes the nodes' interfaces sent over the training steps
            "wire": self.wire.summary(self.cfg.batch_size * self.env.world_size, traffic["off_rank_bytes_per_sample"]),
            "time_breakdown_rank0": {k: round(v, 3) for k, v in self.time_breakdown().items()},
            "slipstream": {
                "hot_selection": self.slipstream.hot_selection,
                "hot_turnover": self.slipstream.hot_turnover,
                "hot_rows_per_table": slip.get("hot_rows_per_table"),
                "stale_rows_per_table": slip.get("stale_rows_per_table"),
                "threshold_info": slip.get("threshold_info"),
                "seconds": {k: round(v, 3) for k, v in slip.items() if k.endswith("_seconds")},
            },
            "eval_history": st.history,
        }
