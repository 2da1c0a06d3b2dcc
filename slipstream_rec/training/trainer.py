"""The training loop: TorchRec train pipeline steps, periodic exact evaluation, checkpoints.

Each component owns its cadence and the loop only asks it after every step: the Slipstream
controller (``on_step_end``), negative downsampling's guard (``maybe_guard``), the metric log
(``maybe_log``), the checkpointer (``maybe_save``), the profiler and the fault injector.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import time
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional, Tuple

import torch
from torch import nn
from torchrec.distributed.train_pipeline import TrainPipelineBase

from slipstream_rec.checkpoint.manager import Checkpointer
from slipstream_rec.data.batch_ops import batch_from_state
from slipstream_rec.distributed import DistEnv
from slipstream_rec.sharding.qcomms_guard import CommsGuard
from slipstream_rec.sharding.qcomms_switch import CommsProbe
from slipstream_rec.slipstream import stats
from slipstream_rec.slipstream.controller import SlipstreamController
from slipstream_rec.step_probe import StepProbe, start_after
from slipstream_rec.training.config import Precision, TrainerConfig
from slipstream_rec.training.downsampling import NegativeDownsampler
from slipstream_rec.training import run_state
from slipstream_rec.training.run_state import TrainState, planned_steps
from slipstream_rec.training.embedding_traffic import local_a2a_bytes, per_sample
from slipstream_rec.training.clock import TrainClock
from slipstream_rec.training.evaluation import evaluate
from slipstream_rec.training.faults import FaultInjector
from slipstream_rec.training.metric_log import MetricLog
from slipstream_rec.training.pipeline import InFlight, TimedTrainPipelineSparseDist, make_pipeline, timed_batches
from slipstream_rec.training.precision import PrecisionProbe, resolve_precision
from slipstream_rec.training.profiling import StepProfiler
from slipstream_rec.training.summary import run_summary, time_breakdown
from slipstream_rec.training.sync_audit import SyncAudit
from slipstream_rec.training.wire_meter import WireMeter

logger = logging.getLogger(__name__)


class Trainer:
    """Drives a DMP-wrapped ``DLRMTask`` through a TorchRec train pipeline.

    The batches come through the Slipstream controller's stream, which agrees every step that
    all ranks still have a batch (Slipstream skips different numbers of samples on each rank),
    so every rank runs the same steps and the pipeline's and evaluation's collectives line up.
    """

    def __init__(
        self, cfg: TrainerConfig, env: DistEnv, model: nn.Module, optimizer: torch.optim.Optimizer,
        scheduler: torch.optim.lr_scheduler.LRScheduler, train_loader: Any, val_loader: Any,
        test_loader: Optional[Any], log: MetricLog, slipstream: SlipstreamController,
        downsampling: NegativeDownsampler, checkpointer: Optional[Checkpointer] = None,
        run_dir: Optional[Path] = None, comms_probe: Optional[CommsProbe] = None,
        comms_guard: Optional[CommsGuard] = None,
    ) -> None:  # fmt: skip
        self.cfg, self.env, self.model, self.optimizer, self.scheduler = cfg, env, model, optimizer, scheduler
        self.train_loader, self.val_loader, self.test_loader = train_loader, val_loader, test_loader
        self.log, self.slipstream, self.downsampling, self.checkpointer = log, slipstream, downsampling, checkpointer
        self.state = TrainState()
        self.clock = TrainClock(self.state, env.device)
        # all ranks: one agreement on the precision (auto reads each rank's machine)
        self.precision, self.precision_reason = resolve_precision(cfg.precision, env.device, cfg.pipeline)
        self.pipeline = make_pipeline(cfg.pipeline, model, optimizer, env.device, self.precision)
        # auto with fast bf16 everywhere: timed on this run's first steps before it is kept
        probing = cfg.precision is Precision.auto and self.precision is Precision.bf16 and cfg.precision_probe_steps
        self.precision_probe = PrecisionProbe(cfg.precision_probe_steps, cfg.precision_min_gain) if probing else None
        # sharding.qcomms.when=auto: quantized against fp32 comms, timed after the precision's turns
        self.comms_probe = comms_probe
        if comms_probe is not None:
            comms_probe.start = start_after(self.precision_probe)
        self.comms_guard = comms_guard  # their error measured after the probe, fp32 where it is too large
        self.in_flight: Optional[InFlight] = None  # the running epoch's iterator
        self.resume_position: Optional[Dict[str, Any]] = None  # set by load_state_dict
        self.resumed_from: Optional[Dict[str, Any]] = None
        self._reattach_step = -1  # the step after an evaluation or a quality check's scoring
        self.faults = FaultInjector.from_env(env.rank)
        # the node's interface counter over the training steps (summary.json's wire)
        self.wire = WireMeter.from_config(cfg.wire_interface, env.local_rank)
        slipstream.bind(
            scorer=self.score, clock=self.clock.drained, timed_from=self.lever_timed_from, last_step=self.total_steps()
        )
        # trainer.sync_audit: count the ops of each step that would wait for a GPU (sync_audit.py)
        self.audit = SyncAudit.for_run(model, self.pipeline, env.device) if cfg.sync_audit else None
        # trainer.profile_steps: a torch.profiler trace of steps from the middle of the run
        self.profiler = StepProfiler(
            cfg.profile_steps, self.total_steps() // 2, Path(run_dir or ".") / "profile", env.rank,
            env.device.type == "cuda",
        )  # fmt: skip
        if isinstance(self.pipeline, TimedTrainPipelineSparseDist):  # the base pipeline has no hook
            task = getattr(model, "module", model)
            self.pipeline.on_backward = lambda: slipstream.on_backward(task)

    def lever_timed_from(self) -> int:
        """The first step the serve lever may time: none of the probes' (fp32 and bf16, then
        fp32 and quantized comms, in turns), up to the step the last one decided at. Read after
        every step: an early decision frees the steps after it."""
        probes = [p for p in (self.precision_probe, self.comms_probe) if p is not None]
        return max(p.last_probed for p in probes) + 1 if probes else 1

    @torch.no_grad()
    def score(self, batch: Any) -> torch.Tensor:
        """Logits of ``batch`` under the current parameters, in eval mode, without training on
        it (Slipstream's quality check). Collective (the sharded forward): all ranks call it at
        the same step. The pipeline is paused like for an evaluation and resumes on its next step."""
        model = self._paused_model()
        was_training = model.training
        model.eval()
        try:
            _, (_, logits, _, _) = model(batch.to(self.env.device, non_blocking=True))
        finally:
            model.train(was_training)
        return logits

    def _paused_model(self) -> nn.Module:
        """The model with the pipeline paused (its in-flight batches kept); it re-attaches on
        its next step."""
        self._reattach_step = self.state.step + 1
        return self.pipeline.detach() if hasattr(self.pipeline, "detach") else self.model

    def eval_logit_offset(self) -> float:
        """What evaluation adds to every logit: negative downsampling's calibration and the
        policy's own (the random control on non-clicks)."""
        return self.downsampling.logit_offset() + self.slipstream.eval_logit_offset()

    @contextlib.contextmanager
    def _not_a_step(self) -> Iterator[None]:
        """Evaluations and checkpoints are left out of the sync audit's step counts, the wire
        meter's bytes and the metric log's throughput."""
        with self.audit.paused() if self.audit is not None else contextlib.nullcontext(), self.wire.paused():
            yield
        self.log.pause_window()

    def _step_kinds(self, step: int) -> List[str]:
        """What ran in ``step`` besides training (the sync audit's classes of steps)."""
        ck = self.cfg.checkpoint
        kinds = self.slipstream.step_kinds(step)
        kinds += ["guard"] if self.downsampling.is_guard_step(step) else []
        kinds += ["qcomms_guard"] if self.comms_guard is not None and self.comms_guard.checked_at == step else []
        kinds += ["reattach"] if step == self._reattach_step else []  # TorchRec re-attaches after a detach
        # the probes' steps (precision, then the comms) end with a host wait on a GPU
        probes = (self.precision_probe, self.comms_probe)
        kinds += ["probe"] if any(p is not None and p.probed(step) for p in probes) else []
        kinds += ["log"] if self.log.due(step) else []
        checks = ck.enabled and ck.every_minutes and step % ck.check_every_steps == 0
        return kinds + (["checkpoint_check"] if checks else [])

    def total_steps(self) -> int:
        """Steps planned; an upper bound when Slipstream skips samples."""
        return planned_steps(self.cfg, len(self.train_loader))

    def _epoch_batches(self, epoch: int, budget: int) -> InFlight:
        """Raw batches -> Slipstream's classify/skip/refill stream (lock-step over ranks) -> at
        most ``budget`` training steps. A resumed epoch first replays the batches the pipeline
        had prefetched, then continues the saved stream where its source stopped."""
        self.train_loader.set_epoch(epoch)
        pos, self.resume_position = self.resume_position, None
        every = self.cfg.lockstep_every_steps
        if pos is not None and pos["epoch"] == epoch:
            replay = [batch_from_state(b) for b in pos["in_flight"]]
            stream = self.slipstream.wrap(self.train_loader.iter_from(pos["source_batches"]), pos["stream"], every)
            batches: Iterator[Any] = itertools.chain(replay, stream)
        else:
            batches = self.slipstream.wrap(iter(self.train_loader), lockstep_every=every)
        batches = itertools.islice(batches, budget)
        if self.audit is not None:
            batches = self.audit.data_side(batches)
        self.in_flight = InFlight(timed_batches(batches, self.state, pin=self.env.device.type == "cuda"))
        return self.in_flight

    def fit(self) -> TrainState:
        try:
            with self.audit if self.audit is not None else contextlib.nullcontext():
                self._fit_epochs(self.total_steps())
        finally:
            self.profiler.close()
        return self.state

    def _fit_epochs(self, total: int) -> None:
        st = self.state
        global_batch = self.cfg.batch_size * self.env.world_size
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
            self.clock.start_epoch()
            self.log.start_window(st.step)
            self.wire.resume()
            while True:
                self.profiler.before_step(st.step + 1)
                probe = self.precision_probe
                if probe is not None:
                    self.pipeline.autocast_dtype = probe.dtype(st.step + 1)
                if self.comms_probe is not None:
                    self.comms_probe.before_step(st.step + 1)
                if self.comms_guard is not None:
                    self.comms_guard.before_step(st.step + 1)
                step_start = time.perf_counter()
                try:
                    loss, logits, labels, _weights = self.pipeline.progress(batches)
                except StopIteration:
                    break
                if probe is not None and probe.chosen is None:  # all ranks, the probe's steps
                    decided = self._time_probe(probe, "precision", st.step + 1, step_start)
                    if decided is not None:
                        self.precision, self.precision_reason = decided
                if self.comms_probe is not None and self.comms_probe.picked is None:  # all ranks
                    self._time_probe(self.comms_probe, "qcomms", st.step + 1, step_start)
                batches.trained_one()
                self.scheduler.step()
                st.step += 1
                st.samples_trained += global_batch
                self.wire.steps += 1
                self.log.advance()
                self._after_step(st.step, loss, logits, labels)
            self.clock.end_epoch()  # the device's queued kernels counted too
            self.wire.pause()

    def _after_step(self, step: int, loss: torch.Tensor, logits: torch.Tensor, labels: torch.Tensor) -> None:
        """Every component's turn after a step, in the same order on every rank (all ranks enter
        the collectives of the controller, the guard and the checkpoint's decision)."""
        self.downsampling.observe(logits, labels)  # held out: scored before their update
        for kind, record in self.slipstream.on_step_end(step):
            self.log.log(kind, step, record)
        guard = self.downsampling.maybe_guard(step)
        if guard is not None:
            self.log.log("downsampling", step, guard)
        checked = self.comms_guard.after_step(step, self.env.device) if self.comms_guard is not None else None
        if checked is not None:  # all ranks measured this step
            self.log.log("qcomms_guard", step, checked)
            if checked["tripped"] and self.env.is_rank0:
                logger.info("trainer: qcomms %s", self.comms_guard.reason)  # type: ignore[union-attr]
        self.log.maybe_log(step, loss, lambda: self._train_record(step))
        if self.cfg.eval_every_steps and step % self.cfg.eval_every_steps == 0:
            with self._not_a_step():
                self._evaluate("val", self.val_loader)
        if self.checkpointer is not None and self.checkpointer.due(step, self.clock.live):
            with self._not_a_step():
                self.save_checkpoint()
        if self.audit is not None:
            self.audit.end_step(step, self._step_kinds(step))
        self.profiler.after_step(step)
        self.faults.after_step(step)

    def _time_probe(self, probe: StepProbe, kind: str, step: int, start: float) -> Optional[Tuple[Any, str]]:
        """Time ``step`` for ``probe`` (the precision's or the comms'); where it decides, log the
        decision as ``kind`` and return it. Collective at the probe's checks and end."""
        decided = probe.time_step(step, start, self.env.device)
        if decided is not None:
            if self.env.is_rank0:
                logger.info("trainer: %s %s", kind, probe.reason)
            self.log.log(kind, step, {"chosen": probe.picked, **probe.record})
        return decided

    def comms_summary(self) -> Dict[str, Any]:
        """summary.json's ``qcomms`` additions under ``sharding.qcomms.when=auto``: what the
        probe chose and why, its timings, the guard's checks (and fp32 where it tripped); empty
        where neither runs."""
        probe, guard = self.comms_probe, self.comms_guard
        out: Dict[str, Any] = {}
        if probe is not None:
            reason = probe.reason or "auto: quantized (as configured) until the probe decides"
            out = {"chosen": probe.picked or "quantized", "reason": reason + probe.unfinished(self.state.step),
                   "probe": dict(probe.record)}  # fmt: skip
        if guard is not None:
            out["guard"] = guard.summary()
            if guard.tripped_at is not None:  # the run ended in fp32, whatever the probe chose
                out["chosen"], out["reason"] = "fp32", "; ".join(r for r in (out.get("reason"), guard.reason) if r)
        return out

    def _train_record(self, step: int) -> Dict[str, Any]:
        return {
            "samples_trained": self.state.samples_trained,
            "lr": self.scheduler.get_last_lr()[0],
            **stats.record(self.slipstream),
            # this rank's embedding collectives so far, per sample it trained
            "a2a_bytes_per_sample": per_sample(local_a2a_bytes(self.model), step * self.cfg.batch_size),
            **{f"time_{k}": v for k, v in time_breakdown(self).items()},
        }

    # ---- checkpoints ----------------------------------------------------------------------
    def save_checkpoint(self) -> None:
        """Save the whole run state now, unless this step is saved already. Collective."""
        step = self.state.step
        if self.checkpointer is None or self.checkpointer.last_step == step:
            return
        before = self.state.checkpoint_seconds
        with self.clock.paused("checkpoint_seconds"):
            path = self.checkpointer.save(step, self.state_dict())
        self.checkpointer.mark_saved(step, self.clock.live())
        seconds = round(self.state.checkpoint_seconds - before, 3)
        self.log.log("checkpoint", step, {"path": str(path), "seconds": seconds})

    def state_dict(self) -> Dict[str, Any]:
        """This rank's part of a checkpoint, besides model and optimizers (which go through DCP)."""
        return run_state.state_dict(self)

    def load_state_dict(self, state: Dict[str, Any]) -> Dict[str, Any]:
        """Continue from a checkpoint's local state; returns what was restored exactly."""
        return run_state.load_state_dict(self, state)

    def _evaluate(self, split: str, loader: Any) -> Dict[str, float]:
        """Pause the pipeline (its in-flight batches are kept), evaluate, resume on next step."""
        with self.clock.paused("eval_seconds"):
            result = evaluate(self._paused_model(), loader, self.env.device, self.eval_logit_offset())
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
        if self.precision_probe is not None:
            self.precision_reason += self.precision_probe.unfinished(self.state.step)
        return run_summary(self, val, test)  # all ranks
