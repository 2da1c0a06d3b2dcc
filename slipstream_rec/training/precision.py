"""``trainer.precision=auto``: bf16 autocast where this machine runs it fast, fp32 elsewhere.

bf16 autocast halves the dense layers' time where the hardware has bf16 arithmetic (measured on
a CPU with avx512_bf16: the DLRM MLPs 1.94x faster, the whole step 1.37x, docs/scale.md) and is
slower than fp32 where it has to be emulated. So auto reads the machine:

* CUDA: bf16 tensor cores, i.e. compute capability 8.0 (Ampere) or newer;
* CPU: the ``avx512_bf16`` or ``amx_bf16`` flag in /proc/cpuinfo (Linux; elsewhere the flags
  are unknown and fp32 is kept);
* ``trainer.pipeline=base``: fp32 (the autocast is wired into the sparse_dist pipeline).

Every rank decides from its own machine and the ranks agree on the lowest answer (one MIN
all-reduce), so a cluster of mixed machines trains in one precision. The summary records what
was asked, what was chosen and why. Evaluation always runs in fp32.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional, Tuple

import torch
import torch.distributed as dist

from slipstream_rec.distributed import all_reduce_
from slipstream_rec.training.config import PipelineKind, Precision

__all__ = ["resolve_precision", "machine_bf16"]

CPU_BF16_FLAGS = ("avx512_bf16", "amx_bf16")


def cpu_flags(cpuinfo: Path = Path("/proc/cpuinfo")) -> Optional[set]:
    """The first processor's feature flags, or None where /proc/cpuinfo cannot be read."""
    try:
        text = cpuinfo.read_text()
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith("flags") and ":" in line:
            return set(line.split(":", 1)[1].split())
    return None


def machine_bf16(device: torch.device, cpuinfo: Path = Path("/proc/cpuinfo")) -> Tuple[bool, str]:
    """Whether ``device`` runs bf16 arithmetic natively, and what that was read from."""
    if device.type == "cuda":
        major, minor = torch.cuda.get_device_capability(device)
        name = torch.cuda.get_device_name(device)
        if major >= 8:
            return True, f"{name}: compute capability {major}.{minor} has bf16 tensor cores"
        return False, f"{name}: compute capability {major}.{minor} < 8.0, no bf16 tensor cores"
    flags = cpu_flags(cpuinfo)
    if flags is None:
        return False, f"CPU flags unknown ({cpuinfo} unreadable)"
    have = [f for f in CPU_BF16_FLAGS if f in flags]
    if have:
        return True, f"CPU has {' and '.join(have)} ({cpuinfo})"
    return False, f"CPU has neither {' nor '.join(CPU_BF16_FLAGS)} ({cpuinfo}): bf16 would be emulated"


def resolve_precision(
    requested: Precision, device: torch.device, pipeline: PipelineKind, cpuinfo: Path = Path("/proc/cpuinfo")
) -> Tuple[Precision, str]:
    """The precision to train in and why. Collective: every rank calls it once (one MIN
    all-reduce of "this machine runs bf16 fast"), whatever ``requested`` is."""
    fast, why = machine_bf16(device, cpuinfo)
    if pipeline is not PipelineKind.sparse_dist:
        fast, why = False, f"trainer.pipeline={pipeline.value}: autocast is wired into sparse_dist"
    agreed = bool(all_reduce_(torch.tensor([1 if fast else 0], dtype=torch.int64), dist.ReduceOp.MIN).item())
    if requested is not Precision.auto:
        return requested, f"trainer.precision={requested.value}"
    if fast and not agreed:
        return Precision.fp32, f"auto: fp32, since another rank's machine has no fast bf16 ({why} here)"
    return (Precision.bf16 if agreed else Precision.fp32), f"auto: {'bf16' if agreed else 'fp32'}, {why}"
