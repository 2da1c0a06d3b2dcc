"""The trainer's state (``TrainState``) and its part of a checkpoint: its counters, the LR
schedule, RNG, the data position with the batches in flight, Slipstream's and negative
downsampling's state, the byte meters and the precision's decision (model and optimizers go
through DCP, ``checkpoint/manager.py``)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Dict, List

from slipstream_rec.checkpoint.rng import capture_rng, restore_rng
from slipstream_rec.data.batch_ops import batch_to_state
from slipstream_rec.training.config import Precision, TrainerConfig
from slipstream_rec.training.embedding_traffic import load_traffic_state, traffic_state

if TYPE_CHECKING:  # the trainer imports this module
    from slipstream_rec.training.trainer import Trainer

__all__ = ["TrainState", "load_state_dict", "planned_steps", "state_dict"]


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
    # this rank's process CPU time (all its threads) inside training epochs, evaluations and
    # checkpoints excluded: the work done, without the time the rank waited
    train_cpu_seconds: float = 0.0
    paused_cpu_seconds: float = 0.0  # CPU time in evaluations and checkpoints (taken out of it)
    history: List[Dict[str, Any]] = field(default_factory=list)  # evaluation results


def planned_steps(cfg: TrainerConfig, batches_per_epoch: int) -> int:
    """Steps the run will take: all epochs, capped by ``max_steps``."""
    steps = batches_per_epoch * cfg.epochs
    return min(steps, cfg.max_steps) if cfg.max_steps else steps


def state_dict(trainer: "Trainer") -> Dict[str, Any]:
    """This rank's part of a checkpoint, besides model and optimizers (which go through DCP)."""
    st = dataclasses.asdict(trainer.state)
    st["train_seconds"] = trainer.clock.live()
    st["train_cpu_seconds"] = trainer.clock.live_cpu()
    stream = trainer.slipstream.stream
    pending = list(trainer.in_flight.pending) if trainer.in_flight is not None else []
    position = {
        "epoch": trainer.state.epoch,
        "batches_per_epoch": len(trainer.train_loader),
        "batch_size": trainer.cfg.batch_size,
        "stream": stream.state_dict() if stream is not None else None,
        "source_batches": stream.source_batches_pulled if stream is not None else 0,
        "in_flight": [batch_to_state(b) for b in pending],
        "buffered_rows": (stream.buffered_rows() if stream is not None else 0) + sum(b.batch_size for b in pending),
    }
    probe = trainer.precision_probe
    return {
        "world_size": trainer.env.world_size, "trainer": st, "scheduler": trainer.scheduler.state_dict(),
        "rng": capture_rng(), "slipstream": trainer.slipstream.state_dict(),
        "downsampling": trainer.downsampling.state_dict(), "position": position,
        "traffic": traffic_state(trainer.model),
        "precision_probe": probe.state_dict() if probe else None,
        "precision": [trainer.precision.value, trainer.precision_reason],
        "comms_probe": trainer.comms_probe.state_dict() if trainer.comms_probe else None,
        "comms_guard": trainer.comms_guard.state_dict() if trainer.comms_guard else None,
    }  # fmt: skip

def load_state_dict(trainer: "Trainer", state: Dict[str, Any]) -> Dict[str, Any]:
    """Continue from a checkpoint's local state; returns what was restored exactly.

    Same world size, batch size and data: the exact data position (the rest of the epoch's
    stream and the prefetched batches). Otherwise the position is carried over as the
    fraction of the epoch's rows already pulled, at batch granularity: the rank partitions
    differ, so in the interrupted epoch some rows are seen twice or not at all.
    """
    trainer.state = trainer.clock.state = TrainState(**state["trainer"])
    if trainer.checkpointer is not None:
        trainer.checkpointer.mark_saved(trainer.state.step, trainer.state.train_seconds)
    trainer.scheduler.load_state_dict(state["scheduler"])
    restore_rng(state["rng"])
    tracking_exact = trainer.slipstream.load_state_dict(state["slipstream"])
    trainer.downsampling.load_state_dict(state["downsampling"])
    probe = trainer.precision_probe
    if probe is not None and state["precision_probe"] is not None:
        probe.load_state_dict(state["precision_probe"])
        if probe.chosen is not None:  # decided before the interruption
            trainer.precision, trainer.precision_reason = Precision(state["precision"][0]), state["precision"][1]
    comms = trainer.comms_probe
    if comms is not None and state.get("comms_probe") is not None:  # absent: an older checkpoint
        comms.load_state_dict(state["comms_probe"])  # its decision sets the switch from the next step
    guard = trainer.comms_guard
    if guard is not None and state.get("comms_guard") is not None:  # absent: an older checkpoint
        guard.load_state_dict(state["comms_guard"])  # a trip holds the switch off from the next step
    load_traffic_state(trainer.model, state["traffic"])
    pos = state["position"]
    same_data = (
        state.get("same_world_size", False)
        and pos["batch_size"] == trainer.cfg.batch_size
        and pos["batches_per_epoch"] == len(trainer.train_loader)
    )
    if same_data:
        trainer.resume_position = pos
    else:
        rows = pos["batches_per_epoch"] * pos["batch_size"]
        done = max(0, pos["source_batches"] * pos["batch_size"] - pos["buffered_rows"])
        start = min(len(trainer.train_loader), int(len(trainer.train_loader) * done / max(1, rows)))
        trainer.resume_position = {"epoch": pos["epoch"], "source_batches": start, "stream": None, "in_flight": []}
    return {"data_position_exact": same_data, "slipstream_tracking_exact": tracking_exact}
