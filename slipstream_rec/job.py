"""The training recipe, step by step: data, model, sharding, optimizers, loop, summary.

Read top to bottom, this is what one run does on every rank.
"""

from __future__ import annotations

import datetime
import logging
import os
import platform
from pathlib import Path
from typing import Any, Dict, Optional

import torch
import torch.distributed as dist

from slipstream_rec import interrupt, run_lock
from slipstream_rec.checkpoint.manager import Checkpointer
from slipstream_rec.config import JobConfig, config_hash, to_yaml
from slipstream_rec.data.datasets import ensure_dataset
from slipstream_rec.data.loader import NpyBatchLoader
from slipstream_rec.data.meta import load_meta
from slipstream_rec.distributed import DistEnv, all_gather_objects, broadcast_object
from slipstream_rec.interrupt import Interrupted, resume_overrides
from slipstream_rec.model.dlrm import build_model, embedding_bag_configs
from slipstream_rec.optim import build_optimizer, fuse_embedding_optimizer
from slipstream_rec.preflight import fixed_run_dir, policy_cannot_act
from slipstream_rec.resume_rules import check_trains_something, config_changes
from slipstream_rec.sharding.plan import describe_plan, shard_model
from slipstream_rec.sharding.qcomms import codecs_registry, qcomms_summary
from slipstream_rec.sharding.qcomms_guard import make_comms_guard
from slipstream_rec.sharding.qcomms_switch import make_comms_probe, make_comms_switch
from slipstream_rec.slipstream.controller import SlipstreamController
from slipstream_rec.training.comm_hooks import install_ddp_comm_hook
from slipstream_rec.training.config import DDPCommHook
from slipstream_rec.training.downsampling import NegativeDownsampler
from slipstream_rec.training.embedding_traffic import run_meter
from slipstream_rec.training.host_memory import apply_host_memory
from slipstream_rec.training.metric_log import MetricLog, write_json_atomic
from slipstream_rec.training.run_state import planned_steps
from slipstream_rec.training.trainer import Trainer

logger = logging.getLogger(__name__)


def choose_run_dir(job: JobConfig, env: DistEnv) -> Path:
    """One run directory for all ranks (rank 0's choice); nothing is written yet.

    Collective: all ranks enter (broadcast of rank 0's choice, all-gather of config hashes).
    """
    run_id = os.environ.get("TORCHELASTIC_RUN_ID", "")
    # Plain torchrun without --rdzv-id gives every job the run id "none", and timestamps differ
    # between ranks: rank 0's choice is the one every rank uses.
    if env.is_rank0 and fixed_run_dir(job) is None:
        if int(os.environ.get("TORCHELASTIC_MAX_RESTARTS", "0") or 0) > 0:
            logger.warning(
                "torchrun --max-restarts without --rdzv-id/--standalone and without "
                "trainer.run_dir: a restarted attempt gets a new timestamped run directory and "
                "cannot find this attempt's checkpoints. Fix: set trainer.run_dir (or --rdzv-id)"
            )
    default = fixed_run_dir(job) or Path(f"runs/{datetime.datetime.now():%Y%m%d-%H%M%S}-{os.getpid()}")
    run_dir = Path(broadcast_object(str(default)))
    hashes = all_gather_objects(config_hash(job))
    if len(set(hashes)) != 1:
        raise RuntimeError(
            f"ranks resolved different configurations (hashes {hashes}); launch every rank with "
            "the same overrides and the same conf/ directory"
        )
    return run_dir


def write_run_config(run_dir: Path, job: JobConfig, env: DistEnv, resumed_step: Optional[int]) -> None:
    """Rank 0 creates the run directory and writes ``config.yaml``, once the run really starts
    (the model, optimizers and any checkpoint loaded), so a refused start changes nothing.

    A resumed run whose configuration changed keeps the earlier one as
    ``config.until_step_N.yaml`` (it applied up to step N). Collective: all ranks enter.
    """
    if env.is_rank0:
        run_dir.mkdir(parents=True, exist_ok=True)
        path, text = run_dir / "config.yaml", to_yaml(job)
        if resumed_step is not None and path.is_file() and path.read_text() != text:
            path.replace(run_dir / f"config.until_step_{resumed_step}.yaml")
        path.write_text(text)
    dist.barrier()  # all ranks: nobody writes into the directory before it exists


def prepare_data(job: JobConfig, env: DistEnv) -> Path:
    """Local rank 0 of each node generates (or finds cached) data; the others wait.

    Collective: all ranks enter the barrier.
    """
    path = ensure_dataset(job.data) if env.local_rank == 0 else None
    dist.barrier()
    return path if path is not None else ensure_dataset(job.data)  # one "using ..." line per node


class _Progress:
    """How far ``run`` got, for the line of an interrupted run."""

    run_dir: Optional[Path] = None
    checkpointer: Optional[Checkpointer] = None
    trainer: Optional[Trainer] = None

    def interrupted(self, job: JobConfig) -> Interrupted:
        step = self.trainer.state.step if self.trainer is not None else None
        done = self.checkpointer.store.complete() if self.checkpointer is not None else []
        fixed = bool(job.trainer.run_dir or job.trainer.checkpoint.dir)
        add = resume_overrides(self.run_dir, fixed, job.trainer.resume) if self.run_dir else ""
        return Interrupted(step, done[-1].step if done else None, add)


def run(job: JobConfig, env: DistEnv) -> Dict[str, Any]:
    """Train and evaluate; returns the summary that rank 0 also writes to summary.json.

    Ctrl-C raises ``Interrupted`` (the step and the newest checkpoint), also where it reached
    this rank only as a peer leaving a collective."""
    progress = _Progress()
    try:
        return _run(job, env, progress)
    except (KeyboardInterrupt, RuntimeError) as e:
        if isinstance(e, RuntimeError) and not interrupt.received():
            raise
        raise progress.interrupted(job) from None
    finally:
        if progress.run_dir is not None:
            run_lock.release(progress.run_dir)  # rank 0's, if it holds it


def take_run_dir(run_dir: Path, env: DistEnv) -> None:
    """Rank 0 locks the run directory for this job (``run_lock``); another job's lock is a bad
    input on every rank. Collective: all ranks enter (the broadcast of rank 0's answer)."""
    note = problem = None
    if env.is_rank0:
        try:
            note = run_lock.acquire(run_dir)
        except ValueError as e:
            problem = str(e)
    problem = broadcast_object(problem)  # all ranks
    if problem is not None:
        raise ValueError(problem)
    if note:
        logger.warning("%s", note)


def _run(job: JobConfig, env: DistEnv, progress: _Progress) -> Dict[str, Any]:
    run_dir = choose_run_dir(job, env)
    take_run_dir(run_dir, env)  # all ranks
    progress.run_dir = run_dir
    data_dir = prepare_data(job, env)
    meta = load_meta(data_dir)
    tr = job.trainer
    host_memory = apply_host_memory(tr.host_memory)  # this process, before the model exists

    # Different seeds per rank, so that the row-wise shards of one table differ; DDP broadcasts
    # rank 0's dense weights anyway.
    torch.manual_seed(tr.seed + env.rank)
    model = build_model(
        job.model,
        num_dense=meta.num_dense,
        feature_names=meta.sparse_feature_names,
        num_embeddings=meta.num_embeddings_per_feature,
        dense_device=env.device,
    )
    fuse_embedding_optimizer(model, job.optim.embedding)
    tables = embedding_bag_configs(
        job.model, meta.sparse_feature_names, meta.num_embeddings_per_feature
    )
    # sharding.qcomms.when=auto: the codecs and the DDP hook behind one switch, and its probe
    switch = make_comms_switch(job.sharding.qcomms, tr.ddp_comm_hook is not DDPCommHook.none)
    comms_probe = make_comms_probe(job.sharding.qcomms, switch)
    comms_guard = make_comms_guard(job.sharding.qcomms, switch, comms_probe)
    dmp = shard_model(model, job.sharding, tables, env.device, tr.batch_size, switch=switch)
    # before the first backward; local (every rank registers the same hook)
    ddp_hook = install_ddp_comm_hook(dmp, tr.ddp_comm_hook, run_meter(dmp), tr.ddp_comm_hook_scale, switch)
    optimizer, scheduler = build_optimizer(dmp, job.optim)
    plan = describe_plan(dmp)
    checkpointer = Checkpointer(
        tr.checkpoint,
        Path(tr.checkpoint.dir) if tr.checkpoint.dir else run_dir / "checkpoints",
        env,
        dmp,
        optimizer,
        meta={"sharding_plan": plan, "config_hash": config_hash(job)},
    )
    progress.checkpointer = checkpointer
    resume = checkpointer.find(tr.resume)  # all ranks
    if resume is not None and env.is_rank0 and resume.manifest.get("config_hash") != config_hash(job):
        changes = config_changes(resume.path, job)
        # [] when only a location key differs (a checkpoint hashed before they were left out)
        if changes != []:
            logger.warning(
                "resuming %s, written with another configuration (%s): the new one applies "
                "from step %d on", resume.path,
                "; ".join(changes) if changes else "see its run's config.yaml", resume.step,
            )  # fmt: skip

    def loader(split: str, train: bool) -> NpyBatchLoader:
        return NpyBatchLoader(
            data_dir,
            split,
            batch_size=tr.batch_size if train else (tr.eval_batch_size or tr.batch_size),
            rank=env.rank,
            world_size=env.world_size,
            train=train,
            shuffle=job.data.shuffle and train,
            seed=tr.seed,
            mmap=job.data.mmap,
            # page-locked batches make the pipeline's non_blocking H2D copies asynchronous
            pin_memory=env.device.type == "cuda",
        )

    train_loader = loader("train", True)
    # negative downsampling: its own random stream per rank; the controller draws its drop mask
    # on the data side, the trainer runs its guard
    downsampling = NegativeDownsampler.from_config(job.downsampling, tr.seed, env.rank)
    slipstream = SlipstreamController(
        job.slipstream,
        dmp,
        feature_names=list(meta.sparse_feature_names),
        num_embeddings=list(meta.num_embeddings_per_feature),
        batch_size=tr.batch_size,
        seed=tr.seed,
        rank=env.rank,
        downsampling=downsampling,
    )
    total_steps = planned_steps(tr, len(train_loader))
    if resume is not None and tr.resume != "auto":  # auto in its own directory: finishes the run
        check_trains_something(tr, resume.path, resume.step, total_steps, len(train_loader))  # all ranks
    log = MetricLog(
        run_dir, env.is_rank0, tr.tensorboard, tr.progress_bar, total_steps,
        resume_step=resume.step if resume is not None else None, every_steps=tr.log_every_steps,
        samples_per_step=tr.batch_size * env.world_size,
    )  # fmt: skip
    trainer = Trainer(
        tr,
        env,
        dmp,
        optimizer,
        scheduler,
        train_loader,
        loader("val", False),
        loader("test", False) if tr.test_at_end else None,
        log,
        slipstream,
        downsampling,
        checkpointer,
        run_dir=run_dir,
        comms_probe=comms_probe,
        comms_guard=comms_guard,
    )
    progress.trainer = trainer
    try:
        if resume is not None:
            restored = trainer.load_state_dict(checkpointer.load(resume))  # all ranks
        # The run starts: until here a refused resume or a bad value wrote nothing (metrics.jsonl
        # and TensorBoard open with the first record).
        write_run_config(run_dir, job, env, resume.step if resume is not None else None)  # all ranks
        cannot_act = policy_cannot_act(job, total_steps)
        if cannot_act:
            log.write(f"warning: {cannot_act}")
        if resume is not None:
            trainer.resumed_from = {"path": str(resume.path), "step": resume.step, **restored}
            log.log("resume", resume.step, trainer.resumed_from)
            log.write(
                f"resumed from {resume.path} (step {resume.step}, written by "
                f"{resume.world_size} rank(s)); exact data position: "
                f"{restored['data_position_exact']}, exact Slipstream tracking: "
                f"{restored['slipstream_tracking_exact']}"
            )
        log.write(
            f"run_dir={run_dir} world_size={env.world_size} device={env.device} "
            f"backend={env.backend} steps={total_steps} "
            f"global_batch={tr.batch_size * env.world_size} "
            f"sharding={sorted(set(plan.values()))} {job.slipstream.chosen}"
        )
        trainer.fit()
        if trainer.audit is not None:  # trainer.sync_audit: every rank writes its own counts
            trainer.audit.write(run_dir / f"sync_audit_rank{env.rank}.json")
        if tr.checkpoint.enabled and tr.checkpoint.at_end:
            trainer.save_checkpoint()  # all ranks
        metrics = trainer.finish()
    finally:
        log.close()

    summary = {
        **metrics,
        "world_size": env.world_size,
        "device": str(env.device),
        "backend": env.backend,
        "batch_size_per_rank": tr.batch_size,
        "sharding": job.sharding.type.value,
        "sharding_plan": plan,
        "qcomms": {
            **qcomms_summary(job.sharding.qcomms, codecs_registry(job.sharding.qcomms)),
            **trainer.comms_summary(),
        },
        "ddp_comm_hook": ddp_hook,
        "host_memory": host_memory,
        "policy": job.slipstream.policy.value,
        "action": job.slipstream.action.value,
        "experiment": job.experiment,
        "model": job.model.arch.value,
        "dataset": str(data_dir),
        "dataset_teacher_auc": meta.teacher_auc,
        "config_hash": config_hash(job),
        "versions": {
            "python": platform.python_version(),
            "torch": torch.__version__,
            "torchrec": _version("torchrec"),
            "fbgemm_gpu": _version("fbgemm_gpu") or _version("fbgemm_gpu_cpu"),
        },
        "finished_at": datetime.datetime.now().isoformat(timespec="seconds"),
    }
    if env.is_rank0:
        write_json_atomic(run_dir / "summary.json", summary)
        print(
            f"done: {job.slipstream.chosen} action={summary['action']} "
            f"skip_fraction={summary['skip_fraction']:.3f}{skip_parts(summary)} "
            f"served_fraction={summary['served_fraction']:.3f} "
            f"val_auc={summary['val_auc']:.4f} val_logloss={summary['val_logloss']:.4f} "
            f"test_auc={summary['test_auc'] if summary['test_auc'] is None else round(summary['test_auc'], 4)} "
            f"samples_per_second={summary['samples_per_second']:.0f} "
            f"train_seconds={summary['train_seconds']:.1f} summary={run_dir / 'summary.json'}",
            flush=True,
        )
    return summary


def skip_parts(summary: Dict[str, Any]) -> str:
    """Where the skipped samples went when negative downsampling drops some of them: without it
    `slipstream=off ... skip_fraction=0.371` reads as the baseline dropping 37%."""
    down = summary.get("negative_downsampling") or {}
    dropped, seen = down.get("negatives_dropped") or 0, summary.get("samples_seen") or 0
    if not dropped or not seen:
        return ""
    setting = down.get("setting")
    setting = f"{setting}, rate {down.get('rate'):g}" if setting == "auto" else f"{setting:g}"
    policy = max(0.0, summary["skip_fraction"] - dropped / seen)
    return (
        f" (downsampling.rate={setting}: {dropped / seen:.3f} of the samples, non-clicks "
        f"dropped; the policy: {policy:.3f})"
    )


def _version(dist_name: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(dist_name)
    except PackageNotFoundError:
        return None
