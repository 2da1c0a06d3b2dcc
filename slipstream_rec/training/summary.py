"""A run's summary: where the training time went, and the metrics part of summary.json."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Dict, Optional

import torch

from slipstream_rec.distributed import all_reduce_
from slipstream_rec.slipstream import stats
from slipstream_rec.training.embedding_cache import embedding_cache_summary
from slipstream_rec.training.embedding_traffic import embedding_traffic_summary
from slipstream_rec.training.pipeline import PIPELINE_STAGES

if TYPE_CHECKING:  # the trainer imports this module
    from slipstream_rec.training.trainer import Trainer

__all__ = ["run_summary", "time_breakdown"]


def time_breakdown(trainer: "Trainer") -> Dict[str, float]:
    """Where this rank's training time went (cumulative host seconds; they add up to
    ``total``). ``data``: loading and refilling batches; the pipeline stages (see
    ``TimedTrainPipelineSparseDist``); ``slipstream``: counting, classifying, snapshots, syncs,
    and summing and pushing the served lookups' gradients (taken out of ``data`` and
    ``forward``, where counting and classifying run); ``serving``: splitting batches between
    the shards and the replica and pooling the served samples' embeddings from it (taken out of
    ``data``, where it runs); ``other``: the rest (logging, scheduler, pipeline bookkeeping)."""
    total = trainer.clock.live()
    stages = getattr(trainer.pipeline, "seconds", {stage: 0.0 for stage in PIPELINE_STAGES})
    own = stats.time_parts(trainer.slipstream)
    parts = {
        "data": max(0.0, trainer.state.data_seconds - own["classify"] - own["serving"]),
        "input_all_to_all": stages["input_all_to_all"],
        "forward": max(0.0, stages["forward"] - own["count"]),
        "backward": stages["backward"],
        "optimizer": stages["optimizer"],
        "slipstream": own["overhead"],
        "serving": own["serving"],
    }
    parts["other"] = max(0.0, total - sum(parts.values()))
    return {"total": total, **parts}


def run_summary(trainer: "Trainer", val: Dict[str, Any], test: Optional[Dict[str, Any]]) -> Dict[str, Any]:
    """The metrics part of summary.json. Collective: all ranks enter (the policy's counters, the
    cache and traffic summaries, the downsampling's and the wire's sums)."""
    st, env, checkpointer = trainer.state, trainer.env, trainer.checkpointer
    slip = stats.summary(trainer.slipstream)  # all ranks
    st.samples_seen = slip["samples_seen"]
    cache = embedding_cache_summary(trainer.model, env.device)  # all ranks
    traffic = embedding_traffic_summary(  # all ranks
        trainer.model, stats.serving(trainer.slipstream), st.samples_trained, env.local_world_size
    )
    # the CPU seconds every rank spent in training, summed (one SUM all-reduce, all ranks)
    cpu = float(all_reduce_(torch.tensor([st.train_cpu_seconds], dtype=torch.float64)).item())
    probe = trainer.precision_probe
    detail, lever, overhead, peak = (
        slip.pop(k) for k in ("slipstream", "serve_lever", "slipstream_overhead_seconds", "slipstream_state_bytes")
    )
    return {
        "steps": st.step,
        "epochs": st.epoch + 1 if st.step else 0,
        "samples_seen": st.samples_seen,
        "samples_trained": st.samples_trained,
        "train_seconds": round(st.train_seconds, 3),
        # the host CPU time of every rank's process in training (all its threads; a GPU's
        # kernels not in it), summed: the work done; ranks x train_seconds less it, the waits
        "train_cpu_seconds": round(cpu, 3),
        "eval_seconds": round(st.eval_seconds, 3),
        "checkpoint_seconds": round(st.checkpoint_seconds, 3),
        "checkpoints_saved_this_attempt": checkpointer.saved if checkpointer else 0,
        "last_checkpoint": str(checkpointer.last_path) if checkpointer and checkpointer.last_path else None,
        "resumed_from": trainer.resumed_from,
        "samples_per_second": st.samples_trained / st.train_seconds if st.train_seconds else 0.0,
        "val_auc": val["auc"],
        "val_logloss": val["logloss"],
        "test_auc": test["auc"] if test else None,
        "test_logloss": test["logloss"] if test else None,
        "test_ctr": test["ctr"] if test else None,
        "test_predicted_ctr": test["predicted_ctr"] if test else None,
        **{k: v for k, v in slip.items() if k != "samples_seen"},
        "eval_logit_offset": trainer.eval_logit_offset(),
        "precision": {
            "requested": trainer.cfg.precision.value, "chosen": trainer.precision.value,
            "reason": trainer.precision_reason, **({"probe": probe.record} if probe and probe.record else {}),
        },  # fmt: skip
        "negative_downsampling": trainer.downsampling.summary(),  # all ranks
        "serve_lever": lever,
        "slipstream_overhead_seconds": overhead,
        "slipstream_state_bytes": peak,
        "embedding_cache": cache,
        **traffic,
        # all ranks: the bytes the nodes' interfaces sent over the training steps
        "wire": trainer.wire.summary(trainer.cfg.batch_size * env.world_size, traffic["off_rank_bytes_per_sample"]),
        "time_breakdown_rank0": {k: round(v, 3) for k, v in time_breakdown(trainer).items()},
        "slipstream": detail,
        "eval_history": st.history,
    }
