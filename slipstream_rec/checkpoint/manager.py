"""Saving and restoring a run: sharded model and optimizers through torch.distributed.checkpoint
(DCP), everything else as one small file per rank, published atomically (see ``store.py``).

What is where:
- DCP (``.metadata`` + ``__<rank>_0.distcp``): ``model.state_dict()`` (embedding shards as
  ShardedTensors, dense weights) and ``optimizer.state_dict()`` (the fused TBE optimizer's
  per-row state as ShardedTensors, the dense and data-parallel optimizers' state). DCP stores each
  shard with its global offsets, so a checkpoint loads into another world size or sharding plan.
- ``rank<r>.pt``: what the trainer hands in (``TrainState``, LR schedule, RNG states, Slipstream
  state, the data position with the batches the pipeline had prefetched). Plain tensors and
  Python values, read back with ``torch.load(weights_only=True)``.

``save`` and ``find`` and ``load`` are collectives: every rank enters them at the same step.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any, Callable, Dict, Optional

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn

from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner

from slipstream_rec import interrupt
from slipstream_rec.checkpoint import optim_state
from slipstream_rec.checkpoint.config import CheckpointConfig
from slipstream_rec.checkpoint.store import CheckpointInfo, CheckpointStore, resolve
from slipstream_rec.distributed import DistEnv, all_gather_objects, all_reduce_, broadcast_object, cpu_group

logger = logging.getLogger(__name__)

# What a rank's file holds, by version: 2 has the Slipstream controller's state by component and
# negative downsampling's beside it; a file of another version is refused in one line.
LOCAL_STATE_FORMAT = 2


def rank_file(path: Path, rank: int) -> Path:
    return Path(path) / f"rank{rank}.pt"


class Checkpointer:
    """One per run, on every rank."""

    def __init__(
        self,
        cfg: CheckpointConfig,
        root: Path,
        env: DistEnv,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        meta: Dict[str, Any],
    ) -> None:
        # meta: recorded in every manifest (e.g. the sharding plan and config hash).
        cfg.validate()
        self.cfg = cfg
        self.store = CheckpointStore(root)
        self.env = env
        self.model = model
        self.optimizer = optimizer
        self.meta = meta
        self.saved = 0
        self.seconds = 0.0
        self.last_path: Optional[Path] = None
        self.last_step = -1  # the step of the last checkpoint written or resumed from
        self.last_train_s = 0.0  # training seconds at that step

    # ---- when to save (collective) ---------------------------------------------------------
    def due(self, step: int, train_seconds: Callable[[], float]) -> bool:
        """Whether to save after ``step``: every_steps, or every_minutes of training by rank 0's
        clock. Collective: all ranks enter one MAX all-reduce every check_every_steps steps."""
        c = self.cfg
        if not c.enabled:
            return False
        due = bool(c.every_steps) and step % c.every_steps == 0
        if c.every_minutes and step % c.check_every_steps == 0:
            late = train_seconds() - self.last_train_s >= 60.0 * c.every_minutes
            flag = torch.tensor([1.0 if (late and self.env.is_rank0) else 0.0])
            due = bool(all_reduce_(flag, dist.ReduceOp.MAX).item()) or due  # all ranks
        return due

    def mark_saved(self, step: int, train_seconds: float) -> None:
        """``step`` is on disk (written, or the checkpoint a run resumed from)."""
        self.last_step, self.last_train_s = step, train_seconds

    def _tensor_state(self) -> Dict[str, Any]:
        optim = optim_state.to_checkpoint(self.optimizer.state_dict())
        return {"model": self.model.state_dict(), "optim": optim}

    def _check_keys(self, info: CheckpointInfo, state: Dict[str, Any]) -> None:
        """Every tensor this rank needs is in the checkpoint (all ranks: one all-gather)."""
        saved = set(dcp.FileSystemReader(str(info.path)).read_metadata().state_dict_metadata)
        wanted = set(_flat_keys(state))
        missing = sorted(wanted - saved - optim_state.optional_keys(wanted))
        problems = [p for p in all_gather_objects(missing) if p]  # all ranks
        if problems:
            keys = sorted({k for p in problems for k in p})
            raise ValueError(
                f"checkpoint {info.path} lacks {len(keys)} tensor(s) this model needs, e.g. "
                f"{keys[:4]}. Fix: resume with the model, dataset and optimizer the run was "
                "started with (optim.embedding.type and the model shape must match)"
            )

    # ---- save (collective) -----------------------------------------------------------------
    def save(self, step: int, local_state: Dict[str, Any]) -> Path:
        """Write a checkpoint of ``step``; returns its final path. Collective: all ranks. A
        Ctrl-C meanwhile takes effect once it is written (``interrupt.deferred``)."""
        with interrupt.deferred():
            return self._save(step, local_state)

    def _save(self, step: int, local_state: Dict[str, Any]) -> Path:
        t0 = time.perf_counter()
        env = self.env
        # All ranks: rank 0 creates the .partial directory before anyone writes into it.
        partial = Path(broadcast_object(str(self.store.prepare(step)) if env.is_rank0 else None))
        dcp.save(self._tensor_state(), checkpoint_id=partial, process_group=cpu_group())
        tmp = partial / f"rank{env.rank}.pt.tmp"
        torch.save({"format": LOCAL_STATE_FORMAT, "rank": env.rank, **local_state}, tmp)
        tmp.replace(rank_file(partial, env.rank))
        dist.barrier(group=cpu_group())  # all ranks: every file of this checkpoint is written
        final = self.store.final_dir(step)
        if env.is_rank0:
            self.store.publish(
                step,
                {"world_size": env.world_size, "saved_at": time.time(), **self.meta},
            )
            removed = self.store.prune(self.cfg.keep_last)
            logger.info(
                "checkpoint: step %d -> %s (%.1f s)%s", step, final, time.perf_counter() - t0,
                f", removed {len(removed)} older" if removed else "",
            )
        dist.barrier(group=cpu_group())  # all ranks: nobody goes on before it is published
        self.saved += 1
        self.seconds += time.perf_counter() - t0
        self.last_path = final
        return final

    # ---- find and load (collective) --------------------------------------------------------
    def find(self, resume: str) -> Optional[CheckpointInfo]:
        """The checkpoint to continue from, per ``trainer.resume``. Collective: all ranks.

        ``auto``: the newest sound checkpoint under the root, or None (a fresh run); ``never``:
        None, but refuses a root that already holds checkpoints (they would be overwritten);
        a path: that checkpoint, or the newest sound one under that directory (an error if none).
        Unsound checkpoints (incomplete, truncated, damaged) are skipped with a warning.
        """
        problem: Optional[str] = None
        found: Optional[CheckpointInfo] = None
        if self.env.is_rank0:
            found, problem = self._find_rank0(resume)
        # All ranks: rank 0 looked at the files; everyone acts on the same answer.
        found, problem = broadcast_object((found, problem))
        if problem is not None:
            raise ValueError(problem)
        return found

    def _find_rank0(self, resume: str) -> tuple:
        if resume == "never":
            existing = self.store.complete()
            if existing:
                return None, (
                    f"trainer.resume=never but {self.store.root} already holds checkpoints (newest: "
                    f"step {existing[-1].step}) that this run would overwrite. Fix: continue it with "
                    "trainer.resume=auto, choose a new trainer.run_dir, or delete that directory"
                )
            return None, None
        target = self.store.root if resume == "auto" else Path(resume)
        if resume != "auto" and not target.exists():
            return None, (
                f"trainer.resume={resume}: no such file or directory. Fix: give a checkpoint "
                "directory (step_NNNNNNNNN) or a checkpoints directory, or trainer.resume=auto"
            )
        found, skipped = resolve(target, self.cfg.verify)
        for reason in skipped:
            logger.warning("checkpoint skipped, not loaded: %s", reason)
        if found is None and resume != "auto":
            return None, (
                f"trainer.resume={resume}: no sound checkpoint there"
                + (f" ({'; '.join(skipped)})" if skipped else "")
                + ". Fix: point it at a complete checkpoint, or use trainer.resume=auto"
            )
        return found, None

    def load(self, info: CheckpointInfo) -> Dict[str, Any]:
        """Load model and optimizer state in place; returns this rank's local state (the file of
        the same rank when the world size is unchanged, else rank 0's). Collective: all ranks."""
        t0 = time.perf_counter()
        live_optim = self.optimizer.state_dict()
        state = {"model": self.model.state_dict(), "optim": optim_state.to_checkpoint(live_optim)}
        self._check_keys(info, state)  # all ranks
        try:
            dcp.load(
                state,
                checkpoint_id=info.path,
                process_group=cpu_group(),
                # only the optional keys may be absent: _check_keys made sure of it
                planner=DefaultLoadPlanner(allow_partial_load=True),
            )
        except Exception as e:  # noqa: BLE001 - DCP wraps per-rank failures; name the cause
            text = str(e)
            hint = ""
            if "Size mismatch" in text and "momentum" in text:
                hint = (
                    " A table's row-wise optimizer state has one entry per row and column shard, "
                    "so it cannot move to a plan with a different number of column shards for that "
                    "table. Fix: keep that table's sharding (sharding.column_shard_dim), or resume "
                    "with a plan that does not column-shard it."
                )
            raise ValueError(f"cannot load checkpoint {info.path}: {text.strip()[:2000]}.{hint}") from e
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(optim_state.from_checkpoint(state["optim"], live_optim))
        same_world = info.world_size == self.env.world_size
        local = torch.load(
            rank_file(info.path, self.env.rank if same_world else 0), map_location="cpu", weights_only=True
        )
        if local.get("format") != LOCAL_STATE_FORMAT:
            raise ValueError(
                f"{rank_file(info.path, self.env.rank)} has format {local.get('format')!r}, this "
                f"version reads {LOCAL_STATE_FORMAT}. Fix: resume with the version that wrote it"
            )
        self.seconds += time.perf_counter() - t0
        local["same_world_size"] = same_world
        return local


def _flat_keys(state: Dict[str, Any], prefix: str = "") -> list:
    """Keys as DCP names them: nested dict keys joined with dots."""
    keys = []
    for k, v in state.items():
        name = f"{prefix}{k}"
        if isinstance(v, dict):
            keys.extend(_flat_keys(v, name + "."))
        else:
            keys.append(name)
    return keys
