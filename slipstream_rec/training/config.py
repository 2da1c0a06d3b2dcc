"""Trainer configuration: batch, length of training, evaluation, logging, device."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Optional, Union

from slipstream_rec.checkpoint.config import CheckpointConfig
from slipstream_rec.training.host_memory import HostMemory
from slipstream_rec.validation import check_fields


class PipelineKind(Enum):
    """How steps are scheduled."""

    sparse_dist = "sparse_dist"  # TorchRec TrainPipelineSparseDist: input all-to-all overlapped
    base = "base"  # TorchRec TrainPipelineBase: no overlap (for debugging and comparison)


class Precision(Enum):
    """Arithmetic of the training forward's dense part."""

    fp32 = "fp32"  # everything in float32
    # torch.autocast to bfloat16 around the training forward: the MLPs and the interaction run
    # in bf16 (weights, optimizer state and the embedding lookups stay fp32; the loss is fp32).
    # Evaluation and the quality check's scoring run in fp32.
    bf16 = "bf16"
    # bf16 where the machine runs it natively (CUDA compute capability >= 8.0; a CPU with
    # avx512_bf16 or AMX), fp32 elsewhere or with pipeline=base (training/precision.py).
    auto = "auto"


class DDPCommHook(Enum):
    """What DDP's gradient all-reduces send (PyTorch's DDP communication hooks)."""

    none = "none"  # DDP's own all-reduce, in the gradients' dtype (fp32)
    fp16 = "fp16"  # fp16_compress_hook: each bucket cast to fp16 for the all-reduce, back after
    bf16 = "bf16"  # bf16_compress_hook: the same in bf16 (fp32's range, fewer mantissa bits)


@dataclass
class DownsamplingConfig:
    """Uniform negative downsampling (training/downsampling.py), beside any Slipstream policy:
    a fraction f of the non-clicks dropped at random before the policy sees what remains (He et
    al. 2014); evaluation adds log(1 - f) to every logit so predicted click rates stay calibrated.
    conf/downsampling/ selects off, auto or fixed."""

    # A number forces that rate from the first step (0: none); "auto" chooses it from the click
    # rate of the first look-ahead (the rule: negatives_per_click) and lowers it while training
    # if it costs (the guard). A whole number is that rate, as the docs write it (`=0`).
    rate: Union[float, int, str] = 0.0
    # auto: the rule keeps at least this many non-clicks per click (f = 1 - m c / (1 - c)).
    negatives_per_click: float = 25.0
    # auto: steps between two guard checks, each over the batches trained since the last (0:
    # no guard; the first window is measured, never acted on).
    guard_steps: int = 100
    # auto: the most gradient noise downsampling may add, as a fraction of the variance of the
    # gradient with respect to the logits (f / (1 - f) x the non-clicks' share of it, measured
    # on held-out samples); above it the guard lowers f.
    max_noise: float = 0.05

    def __post_init__(self) -> None:
        # `rate=0` arrives as the int 0: the code reads a float rate or "auto".
        if isinstance(self.rate, int) and not isinstance(self.rate, bool):
            self.rate = float(self.rate)

    def validate(self) -> None:
        checks = [
            (
                "rate",
                self.rate == "auto" or (not isinstance(self.rate, str) and 0 <= self.rate < 1),
                "auto (chosen from the data and guarded) or a fraction of the non-clicks in [0, 1) "
                "(0: none; 1 would drop every non-click)",
            ),
            ("negatives_per_click", self.negatives_per_click > 0, "a positive number of non-clicks per click"),
            ("guard_steps", self.guard_steps >= 0, "0 (no guard) or a step count"),
            ("max_noise", self.max_noise > 0, "a positive fraction of the gradient's variance"),
        ]
        check_fields("downsampling", self, checks)


@dataclass
class TrainerConfig:
    """The training loop around the sharded model."""

    # Samples per rank per step; the global batch is batch_size * world size.
    batch_size: int = 2048
    # Passes over the training split.
    epochs: int = 1
    # Stop after this many steps in total (0: run all epochs).
    max_steps: int = 0
    # Evaluate on the validation split every this many steps (0: only at the end).
    eval_every_steps: int = 0
    # Samples per rank per evaluation step (0: the training batch size).
    eval_batch_size: int = 0
    # Evaluate on the test split at the end.
    test_at_end: bool = True
    # Log loss and throughput every this many steps.
    log_every_steps: int = 50
    # Base seed; rank r seeds its embedding shards with seed + r.
    seed: int = 0
    # auto (cuda + nccl when a GPU is visible, else cpu + gloo), cpu or cuda.
    device: str = "auto"
    # Run directory shared by all ranks (null: runs/<TORCHELASTIC_RUN_ID or a timestamp>).
    run_dir: Optional[str] = None
    # Step scheduler: sparse_dist (TorchRec's TrainPipelineSparseDist) or base.
    pipeline: PipelineKind = PipelineKind.sparse_dist
    # Write TensorBoard event files into <run_dir>/tensorboard (rank 0).
    tensorboard: bool = True
    # Show a tqdm progress bar (rank 0).
    progress_bar: bool = True
    # auto (bf16 where the machine runs it natively, else fp32; the summary says which and why),
    # fp32, or bf16 (autocast of the training forward's dense arch; needs pipeline=sparse_dist).
    precision: Precision = Precision.auto
    # auto, where the machine has fast bf16: steps timed per candidate (fp32, bf16), taking turns
    # early in the run, to keep bf16 only where it measures faster (training/precision.py;
    # decided after 8 each where one is far past the line); 0: decide from the machine alone (no
    # clock: reproducible).
    precision_probe_steps: int = 16
    # auto: bf16 is kept only where its median step takes at most (1 - this) of fp32's.
    precision_min_gain: float = 0.05
    # Batches between two agreements of the ranks that each still has a batch (Slipstream skips
    # different numbers of samples per rank, so they run out at different steps). 1: one small
    # all-reduce every step; k > 1: one every k steps, each rank building its next k batches
    # ahead (classified up to k steps earlier; up to k - 1 batches per rank dropped at the end).
    lockstep_every_steps: int = 1
    # Compression of DDP's gradient all-reduces (the dense arch and any data-parallel tables):
    # none, fp16 or bf16 (PyTorch's fp16_compress_hook / bf16_compress_hook). Halves their bytes.
    ddp_comm_hook: DDPCommHook = DDPCommHook.none
    # fp16 hook only: each gradient bucket multiplied by this before its fp16 cast and divided
    # after the all-reduce: a batch mean's small gradients (many below fp16's normal range,
    # 6.1e-5) keep their bits. Each rank's scaled values are clamped to fp16's largest over the
    # world size, so the sum cannot overflow (a gradient past 65504 / this is clipped there).
    # null: PyTorch's fp16_compress_hook.
    ddp_comm_hook_scale: Optional[float] = None
    # Seconds a collective may wait before the job fails instead of hanging (a dead or stuck
    # rank): the surviving ranks exit with an error naming this key, and torchrun restarts them.
    collective_timeout_s: float = 600.0
    # Where to continue from: "auto" (the newest sound checkpoint of this run directory, or a
    # fresh start if there is none), "never" (fresh; refuses a directory that has checkpoints),
    # or a path (one checkpoint directory, or a checkpoints directory: its newest sound one).
    resume: str = "auto"
    # Count, per training step, the ops that would make the host wait for a GPU (.item(),
    # nonzero, unique, ...; training/sync_audit.py) into <run_dir>/sync_audit_rank<r>.json. A
    # diagnostic: it slows every step; needs pipeline=sparse_dist.
    sync_audit: bool = False
    # Profile this many training steps with torch.profiler (0: off), from the middle of the run,
    # into <run_dir>/profile/trace_rank<r>.json (Chrome trace; training/profiling.py).
    profile_steps: int = 0
    # The network interface(s) whose sent bytes summary.json's `wire` reports over the training
    # steps, beside the program's own count (training/wire_meter.py): auto (the interfaces
    # GLOO_SOCKET_IFNAME or NCCL_SOCKET_IFNAME name; none when unset), none, or a comma-separated
    # list of names. Read by local rank 0 only: the counter is the node's.
    wire_interface: str = "auto"
    # Freed host memory between steps: keep (stays in the process for the next step: glibc
    # makes each step's large temporaries fresh pages otherwise, measured 1.45x slower on the
    # variable-batch path; training/host_memory.py) or system (the C library's defaults).
    host_memory: HostMemory = HostMemory.keep
    # Checkpoint saving (when, how many kept, where).
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)

    def validate(self) -> None:
        checks = [
            ("batch_size", self.batch_size > 0, "a positive number of samples per rank"),
            ("epochs", self.epochs > 0, "at least 1"),
            ("max_steps", self.max_steps >= 0, "0 (no cap) or a positive step count"),
            ("eval_every_steps", self.eval_every_steps >= 0, "0 (end only) or a step count"),
            ("eval_batch_size", self.eval_batch_size >= 0, "0 (= batch_size) or positive"),
            ("log_every_steps", self.log_every_steps > 0, "a positive step count"),
            ("collective_timeout_s", self.collective_timeout_s > 0, "positive seconds"),
            ("lockstep_every_steps", self.lockstep_every_steps >= 1, "1 (every step) or more steps"),
            ("profile_steps", self.profile_steps >= 0, "0 (off) or a number of steps"),
            ("precision_probe_steps", self.precision_probe_steps >= 0, "0 (no timing) or a number of steps"),
            ("precision_min_gain", -1 < self.precision_min_gain < 1, "a fraction in (-1, 1) (0.05: 5% faster)"),
            (
                "precision",
                self.precision is not Precision.bf16 or self.pipeline is PipelineKind.sparse_dist,
                "fp32 or auto with trainer.pipeline=base (bf16 autocast is wired into the sparse_dist pipeline)",
            ),
            ("resume", bool(self.resume), "auto, never or a checkpoint path"),
            ("wire_interface", bool(self.wire_interface.strip()), "auto, none or an interface name such as eth0"),
            (
                "sync_audit",
                not self.sync_audit or self.pipeline is PipelineKind.sparse_dist,
                "false with trainer.pipeline=base (the audit follows the sparse_dist pipeline's batches)",
            ),
        ]
        check_fields("trainer", self, checks)
        self.checkpoint.validate()
