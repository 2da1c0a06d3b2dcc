"""Process-group set-up: device and backend chosen from the hardware, ranks from torchrun's env."""

from __future__ import annotations

import datetime
import logging
import os
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional

import torch
import torch.distributed as dist

logger = logging.getLogger(__name__)

# Under nccl: a gloo group over the same ranks for collectives on CPU tensors (the per-step
# lock-step flag, counters, Python objects). Routing those through nccl would copy them to the
# GPU and back, and the copy back is a device sync that stalls the pipeline every step.
_CPU_GROUP: Any = None


@dataclass(frozen=True)
class DistEnv:
    """Where this process sits in the job."""

    rank: int
    local_rank: int
    world_size: int
    local_world_size: int
    device: torch.device
    backend: str

    @property
    def is_rank0(self) -> bool:
        return self.rank == 0


def resolve_device(requested: str, local_rank: int) -> torch.device:
    """``auto`` means cuda:<local_rank> when a GPU is visible, else cpu."""
    if requested not in ("auto", "cpu", "cuda"):
        raise ValueError(f"trainer.device={requested!r}: use auto, cpu or cuda")
    if requested == "cuda" or (requested == "auto" and torch.cuda.is_available()):
        if not torch.cuda.is_available():
            raise ValueError(
                "trainer.device=cuda but torch sees no GPU (torch.cuda.is_available() is False); "
                "use trainer.device=auto or cpu"
            )
        gpus = torch.cuda.device_count()
        if local_rank >= gpus:
            # local_rank % gpus would put two ranks on one GPU: each half as fast, and the
            # planner's memory per device would be wrong
            raise ValueError(
                f"local rank {local_rank} but this node has {gpus} visible GPU(s): one rank per "
                f"GPU. Fix: start at most {gpus} processes per node (--nproc / nproc_per_node), "
                "or make more GPUs visible (CUDA_VISIBLE_DEVICES)"
            )
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
        return device
    return torch.device("cpu")


def backend_for(device: torch.device) -> str:
    """The process-group backend for ``device``: nccl on CUDA, gloo on CPU."""
    return "nccl" if device.type == "cuda" else "gloo"


def init_distributed(device: str = "auto", timeout_s: float = 600.0) -> DistEnv:
    """Join the job torchrun/TorchX started, or form a 1-process group when run bare.

    A 1-process gloo group keeps one code path: DMP, the planner and the collectives all work the
    same with world size 1.
    """
    global _CPU_GROUP
    if "RANK" not in os.environ:
        # Bare `slipstream-train`: a single-process job on a free local port.
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", str(_free_port()))
        os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", LOCAL_WORLD_SIZE="1")
    rank = int(os.environ["RANK"])
    world_size = int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    local_world_size = int(os.environ.get("LOCAL_WORLD_SIZE", str(world_size)))
    dev = resolve_device(device, local_rank)
    backend = backend_for(dev)
    if not dist.is_initialized():
        dist.init_process_group(
            backend=backend,
            timeout=datetime.timedelta(seconds=timeout_s),
            device_id=dev if dev.type == "cuda" else None,
            **_attempt_store(rank, world_size, timeout_s),
        )
        if backend == "nccl":
            # Collective: every rank creates it, right after the default group.
            _CPU_GROUP = dist.new_group(backend="gloo", timeout=datetime.timedelta(seconds=timeout_s))
    return DistEnv(rank, local_rank, world_size, local_world_size, dev, backend)


def _attempt_store(rank: int, world_size: int, timeout_s: float) -> Dict[str, Any]:
    """``init_process_group`` arguments that scope this restart attempt's keys, when needed.

    torchrun (c10d rendezvous, torch 2.13) shares its TCPStore with the workers and keeps it
    across restarts (``TORCHELASTIC_USE_AGENT_STORE=True``). A restarted attempt then reads the
    dead attempt's keys, e.g. gloo peer addresses, and fails with "Connection refused" or hangs
    (measured here; pytorch/pytorch#135712). The workers of one node share one restart count, so
    a per-attempt prefix fixes restarts on one node. Across nodes the counts can differ after an
    elastic membership change: multi-node jobs with restarts should also set
    ``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1`` for torchrun (the TorchX component does), which
    gives every attempt a fresh store.
    """
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
        return {}
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    store = dist.TCPStore(
        os.environ["MASTER_ADDR"],
        int(os.environ["MASTER_PORT"]),
        world_size,
        is_master=False,
        timeout=datetime.timedelta(seconds=timeout_s),
    )
    return {
        "store": dist.PrefixStore(f"slipstream/attempt_{attempt}", store),
        "rank": rank,
        "world_size": world_size,
    }


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def collective_device() -> torch.device:
    """Where tensors must live for a collective: the current GPU under nccl, else the CPU."""
    if dist.is_initialized() and dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def cpu_group() -> Any:
    """The group for collectives on CPU tensors: the gloo side group under nccl, else None (the
    default group, which is gloo itself)."""
    return _CPU_GROUP


def all_reduce_(t: torch.Tensor, op: Any = None) -> torch.Tensor:
    """In-place all-reduce of ``t`` wherever it lives. A CPU tensor under nccl goes through the
    gloo side group (no device copy, no device sync); otherwise it is moved to the backend's
    device and back. Collective: all ranks enter. A no-op without a process group."""
    if not dist.is_initialized():
        return t
    op = op if op is not None else dist.ReduceOp.SUM
    if t.device.type == "cpu" and _CPU_GROUP is not None:
        dist.all_reduce(t, op=op, group=_CPU_GROUP)
        return t
    dev = collective_device()
    work = t.to(dev)
    dist.all_reduce(work, op=op)
    if work is not t:
        t.copy_(work)
    return t


def gather_varlen(
    t: torch.Tensor, lengths: Optional[List[int]] = None, with_lengths: bool = False, bulk: bool = False,
    meter: Optional[Callable[[int], None]] = None,
) -> Any:
    """Concatenate every rank's 1-D tensor (lengths may differ), in rank order, on every rank.

    Routing: ``bulk`` (row values and gradients: the replica, the push) goes through the main
    backend, moved to its device (the GPU under nccl) and returned there; anything else is a
    small host tensor (keys, counts, flags) and is routed like ``all_reduce_`` (the gloo side
    group under nccl) and returned where it came from. ``lengths``: every rank's numel, when the
    caller knows them (no size exchange, so nothing is read back from a device); else they are
    exchanged first. ``with_lengths``: return ``(tensor, lengths)``. ``meter``: called with the
    bytes this rank gave (its size in the exchange, its part padded to the longest), which each
    of the other ranks receives.
    Collective: all ranks enter (one all_gather of the sizes unless ``lengths``, then one of
    the values padded to the longest).
    """
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return (t, [t.numel()]) if with_lengths else t
    home = collective_device() if bulk else t.device
    group = _CPU_GROUP if not bulk and t.device.type == "cpu" and _CPU_GROUP is not None else None
    if group is None:
        t = t.to(collective_device())  # nccl gathers CUDA tensors only
    world = dist.get_world_size()
    given = 0
    if lengths is None:
        n = torch.tensor([t.numel()], dtype=torch.int64, device=t.device)
        sizes = [torch.zeros_like(n) for _ in range(world)]
        dist.all_gather(sizes, n, group=group)
        lengths = torch.cat(sizes).tolist()  # one read (of a device tensor under nccl: a sync)
        given += n.element_size()
    assert lengths[dist.get_rank()] == t.numel(), "lengths[rank] is this rank's numel"
    if meter is not None:
        meter(given + max(lengths) * t.element_size())
    padded = torch.zeros(max(lengths), dtype=t.dtype, device=t.device)
    padded[: t.numel()] = t
    parts: List[torch.Tensor] = [torch.empty_like(padded) for _ in range(world)]
    dist.all_gather(parts, padded, group=group)
    out = torch.cat([p[:k] for p, k in zip(parts, lengths)]).to(home)
    return (out, list(lengths)) if with_lengths else out


def exchange_varlen(
    parts: List[torch.Tensor], lengths: Optional[List[int]] = None, with_lengths: bool = False, bulk: bool = False
) -> Any:
    """All-to-all of 1-D tensors of any length: ``parts[r]`` goes to rank r; returns what every
    rank sent to this one, concatenated in rank order.

    Routing as ``gather_varlen``: ``bulk`` values through the main backend (returned on its
    device), small host tensors through the gloo side group under nccl. ``lengths``: what each
    rank sends here, when the caller knows it (no size exchange); else exchanged first.
    ``with_lengths``: return ``(tensor, lengths)``. Collective: all ranks enter (one all_to_all
    of the sizes unless ``lengths``, then one of the values).
    """
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return (parts[0], [parts[0].numel()]) if with_lengths else parts[0]
    world = dist.get_world_size()
    assert len(parts) == world, "one part per rank"
    t = torch.cat(parts)
    home = collective_device() if bulk else t.device
    group = _CPU_GROUP if not bulk and t.device.type == "cpu" and _CPU_GROUP is not None else None
    if group is None:
        t = t.to(collective_device())
    sent = [int(p.numel()) for p in parts]
    if lengths is None:
        mine = torch.tensor(sent, dtype=torch.int64, device=t.device)
        theirs = torch.empty_like(mine)
        dist.all_to_all_single(theirs, mine, group=group)
        lengths = theirs.tolist()
    out = torch.empty(sum(lengths), dtype=t.dtype, device=t.device)
    dist.all_to_all_single(out, t, output_split_sizes=list(lengths), input_split_sizes=sent, group=group)
    out = out.to(home)
    return (out, list(lengths)) if with_lengths else out


def broadcast_object(obj: Any, src: int = 0) -> Any:
    """Rank ``src``'s value on every rank. Collective: all ranks enter."""
    box: List[Any] = [obj]
    dist.broadcast_object_list(box, src=src, group=_CPU_GROUP)
    return box[0]


def all_gather_objects(obj: Any) -> List[Any]:
    """Every rank's value, in rank order. Collective: all ranks enter."""
    out: List[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj, group=_CPU_GROUP)
    return out


_TIMEOUT_MARKS = ("timed out", "timeout", "watchdog")
_PEER_MARKS = ("connection closed by peer", "connection reset", "broken pipe", "connection refused")


def explain_collective_failure(error: BaseException, timeout_s: float) -> Optional[str]:
    """A readable account of a collective that failed because another rank is gone or stuck,
    or None for any other error."""
    if not isinstance(error, RuntimeError):
        return None
    text = str(error).lower()
    rank = os.environ.get("RANK", "?")
    if any(mark in text for mark in _PEER_MARKS):
        return (
            f"rank {rank} lost its connection to another rank during a collective: that rank "
            "died (see its log). Under torchrun --max-restarts / TorchX max_retries the job "
            "restarts and resumes from its newest checkpoint (trainer.resume=auto)."
        )
    if any(mark in text for mark in _TIMEOUT_MARKS):
        return (
            f"rank {rank}: a collective waited longer than trainer.collective_timeout_s={timeout_s:g} s "
            "for another rank, which is stuck or gone (see the other ranks' logs). Fix: find "
            "what stalled it; if steps, evaluations or checkpoints legitimately take longer, "
            "raise trainer.collective_timeout_s."
        )
    return None


def close_distributed() -> None:
    global _CPU_GROUP
    if dist.is_initialized():
        dist.destroy_process_group()  # every group, the gloo side group included
    _CPU_GROUP = None
