"""``trainer.ddp_comm_hook``: PyTorch's DDP communication hooks on the model's all-reduces, and
the bytes those all-reduces are given.

DMP wraps the dense part of the model (bottom and top MLPs, interaction) in one
DistributedDataParallel, and the lookups of data-parallel tables in another each. Every training
step all-reduces every gradient of each (``static_graph``, no unused parameters), so the bytes a
rank gives to them are fixed per step: the parameters' element count times the element size on
the wire (4 for fp32; 2 under ``fp16_compress_hook`` / ``bf16_compress_hook``, which cast each
bucket before the all-reduce and back after it). The meter adds them once per training forward
of each DDP module (training mode, grad enabled: evaluation and Slipstream's scoring send
nothing) into the run's byte meter as ``dense`` (the dense arch) and ``data_parallel`` (the
data-parallel tables).

The hooks below carry no annotations: DDP reads a hook's signature and takes only
``dist.GradBucket`` itself, not the string this module's postponed annotations would give it.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Dict, List, MutableMapping, Optional

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel

from slipstream_rec.training.config import DDPCommHook

def bf16_all_reduce_hook(process_group, bucket):  # type: ignore[no-untyped-def]
    """PyTorch's ``bf16_compress_hook`` itself, registered under this name: DDP refuses a hook
    *named* ``bf16_compress_hook`` without CUDA and NCCL 2.10 (a check from before gloo reduced
    bf16); torch 2.13's gloo sums bf16, so on CPU the bucket goes on the wire in bf16 as it does
    on NCCL (tests/training/test_comm_hooks.py counts it)."""
    return default_hooks.bf16_compress_hook(process_group, bucket)


_HOOKS: Dict[DDPCommHook, Callable[..., Any]] = {
    DDPCommHook.fp16: default_hooks.fp16_compress_hook,
    DDPCommHook.bf16: bf16_all_reduce_hook,
}
_CASTS = {DDPCommHook.fp16: torch.float16, DDPCommHook.bf16: torch.bfloat16}  # what PyTorch's hooks cast to
_WIRE_BYTES = {hook: dtype.itemsize for hook, dtype in _CASTS.items()}
FP16_MAX = float(torch.finfo(torch.float16).max)


def scaled_fp16_hook(scale: float) -> Callable[..., Any]:
    """``trainer.ddp_comm_hook=fp16`` with ``trainer.ddp_comm_hook_scale``: PyTorch's fp16
    compression, the bucket multiplied by ``scale`` / world size in its own precision before the
    cast (PyTorch casts first and divides in fp16, losing the bits of values already
    subnormal) and divided by ``scale`` after the all-reduce. The gradients of a mean loss over
    thousands of samples sit largely below fp16's normal range (6.1e-5), where fp16 keeps few
    bits or none; scaled, they keep 11. Each rank's scaled values are clamped to fp16's largest
    over the world size, so the sum cannot overflow: a gradient past fp16's range / ``scale`` is
    clipped there (at scale 1024 on 2 ranks, |g| > 32), where the unscaled cast would send inf.
    No host sync: tensor ops and the all-reduce only (the GPU path's step stays sync-free)."""
    assert scale > 0 and math.isfinite(scale), scale

    def scaled_fp16_compress_hook(process_group, bucket):  # type: ignore[no-untyped-def]
        group = process_group if process_group is not None else dist.group.WORLD  # as PyTorch's hooks
        world = group.size()  # type: ignore[union-attr]
        buffer = bucket.buffer()
        sent = _scaled_fp16(buffer, scale, world)

        def decompress(fut):  # type: ignore[no-untyped-def]
            return buffer.copy_(fut.value()[0]).div_(scale)  # in place, as PyTorch's hook

        return dist.all_reduce(sent, group=group, async_op=True).get_future().then(decompress)

    return scaled_fp16_compress_hook


def _scaled_fp16(buffer: torch.Tensor, scale: float, world: int) -> torch.Tensor:
    """What the scaled fp16 hook sends of one rank's ``buffer``: times ``scale`` / ``world`` in
    fp32, clamped so that ``world`` ranks' sum stays finite, cast to fp16."""
    bound = FP16_MAX / world
    return buffer.mul(scale / world).clamp_(-bound, bound).to(torch.float16)


def hook_round_trip(hook: DDPCommHook, scale: Optional[float]) -> Optional[Callable[[torch.Tensor, int], torch.Tensor]]:
    """What the all-reduce delivers of one rank's bucket under ``hook`` (the far side's copy of
    this rank's gradients: its share of the mean times the world size), for the comms guard
    (sharding/qcomms_guard.py): PyTorch's hooks cast and then divide by the world size in the
    cast's precision; the scaled hook multiplies and clamps in fp32, casts, and divides by the
    scale after the all-reduce. None: no hook, nothing lost."""
    if scale is not None:
        def scaled(buffer: torch.Tensor, world: int) -> torch.Tensor:
            return _scaled_fp16(buffer, scale, world).to(buffer.dtype).div_(scale).mul_(world)

        return scaled
    dtype = _CASTS.get(hook)
    if dtype is None:
        return None
    return lambda buffer, world: buffer.to(dtype).div_(world).to(buffer.dtype).mul_(world)


def switched_hook(
    hook: Callable[..., Any], switch: Any, round_trip: Optional[Callable[[torch.Tensor, int], torch.Tensor]] = None
) -> Callable[..., Any]:
    """``hook`` while ``switch.on`` (``sharding.qcomms.when=auto``, sharding/qcomms_switch.py),
    PyTorch's plain fp32 all-reduce hook (``allreduce_hook``) while it is off. The switch flips
    only between steps, on every rank at the same step. On the guard's measured steps each
    bucket's ``round_trip`` is compared with the bucket before the hook sends it (tensor ops
    only: no host sync)."""

    def switched_compress_hook(process_group, bucket):  # type: ignore[no-untyped-def]
        if switch.on:
            if switch.measuring and round_trip is not None:
                group = process_group if process_group is not None else dist.group.WORLD
                buffer = bucket.buffer()
                switch.errors.add("all_reduce", buffer, round_trip(buffer, group.size()))  # type: ignore[union-attr]
            return hook(process_group, bucket)
        return default_hooks.allreduce_hook(process_group, bucket)

    return switched_compress_hook


def ddp_modules(model: nn.Module) -> List[DistributedDataParallel]:
    """Every DDP inside ``model`` (DMP's dense wrapper first when it has one), once each."""
    top = getattr(model, "_dmp_wrapped_module", None)
    found = [top] if isinstance(top, DistributedDataParallel) else []
    for m in model.modules():
        # A sharded EBC keeps its lookups in a plain list (not a ModuleList): a data-parallel
        # table's DDP is found there, not by modules().
        for sub in [m, *getattr(m, "_lookups", [])]:
            if isinstance(sub, DistributedDataParallel) and all(sub is not f for f in found):
                found.append(sub)
    return found


def reduced_parameters(ddp: DistributedDataParallel) -> List[torch.Tensor]:
    """The parameters DDP all-reduces: those needing a gradient and not set aside for DMP's
    shards (``parameters_to_ignore``)."""
    ignore = set(getattr(ddp, "parameters_to_ignore", ()) or ())
    return [p for name, p in ddp.module.named_parameters() if p.requires_grad and name not in ignore]


def bytes_per_step(ddp: DistributedDataParallel, hook: DDPCommHook) -> int:
    """Bytes this rank gives to ``ddp``'s all-reduces in one training step."""
    return sum(p.numel() * _WIRE_BYTES.get(hook, p.element_size()) for p in reduced_parameters(ddp))


def install_ddp_comm_hook(
    model: nn.Module, hook: DDPCommHook, meter: Optional[MutableMapping[str, int]] = None,
    scale: Optional[float] = None, switch: Optional[Any] = None,
) -> Dict[str, Any]:
    """Register ``hook`` on every DDP of ``model`` (before its first backward), the fp16 one
    scaled by ``scale`` where given (``scaled_fp16_hook``), behind ``switch`` where given
    (``switched_hook``), and meter their bytes into ``meter``; returns summary.json's
    ``ddp_comm_hook``. Local: no collective (every rank registers the same hook, so the
    all-reduces stay matched)."""
    per_step = {"dense": 0, "data_parallel": 0}
    if scale is not None and (hook is not DDPCommHook.fp16 or not (math.isfinite(scale) and scale > 0)):
        raise ValueError(
            f"trainer.ddp_comm_hook_scale={scale} with trainer.ddp_comm_hook={hook.value}: the scale "
            "multiplies the gradients before the fp16 hook's cast and divides them after. Fix: "
            "trainer.ddp_comm_hook=fp16 with a positive scale (1024), or trainer.ddp_comm_hook_scale=null"
        )
    chosen = scaled_fp16_hook(scale) if scale is not None else _HOOKS.get(hook)
    if chosen is not None and switch is not None:
        chosen = switched_hook(chosen, switch, hook_round_trip(hook, scale))
    else:
        switch = None  # nothing to switch: every step sends as configured
    modules = ddp_modules(model)
    for i, ddp in enumerate(modules):
        if chosen is not None:
            ddp.register_comm_hook(None, chosen)  # None: DDP's own process group
        kind = "dense" if i == 0 and ddp is getattr(model, "_dmp_wrapped_module", None) else "data_parallel"
        nbytes = bytes_per_step(ddp, hook)
        per_step[kind] += nbytes
        if meter is not None:
            plain = bytes_per_step(ddp, DDPCommHook.none) if switch is not None else nbytes
            ddp.register_forward_pre_hook(_counter(meter, kind, nbytes, plain, switch))
    return {"hook": hook.value, "scale": scale, "bytes_per_step": per_step}


def _counter(
    meter: MutableMapping[str, int], kind: str, nbytes: int, plain: int, switch: Optional[Any]
) -> Callable[..., None]:
    """Count a training step's all-reduce: ``nbytes``, or ``plain`` (fp32) while ``switch`` is off."""

    def count(module: nn.Module, _args: Any) -> None:
        if module.training and torch.is_grad_enabled():
            meter[kind] = meter.get(kind, 0) + (plain if switch is not None and not switch.on else nbytes)

    return count
