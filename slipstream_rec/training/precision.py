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

Where the machine has fast bf16, auto then times both on the run's own first steps and keeps
bf16 only where it measures faster (``PrecisionProbe``, ``trainer.precision_probe_steps``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional, Tuple

import torch
import torch.distributed as dist

from slipstream_rec.distributed import all_reduce_
from slipstream_rec.training.config import PipelineKind, Precision
from slipstream_rec.step_probe import PROBE_BLOCK, PROBE_EARLY, PROBE_START, StepProbe

__all__ = ["PROBE_BLOCK", "PROBE_EARLY", "PROBE_START", "PrecisionProbe", "machine_bf16", "resolve_precision"]

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


# ---- trainer.precision=auto on a machine with fast bf16: timed on the run's own steps --------
class PrecisionProbe(StepProbe):
    """bf16 kept only where the run's own steps measure it faster (``trainer.precision=auto``).

    The machine's flags say whether bf16 *can* be fast; whether it is depends on the model: bf16
    speeds up the dense layers, and where the embedding lookups and their fused updates carry
    the step it buys nothing and its casts cost (measured: a 7M-row log whose step took 150 ms
    in bf16 against 138 in fp32, issue 29). So after ``PROBE_START`` steps the trainer times
    ``steps`` steps of fp32 and of bf16 in turns (``StepProbe``, step_probe.py): bf16 stays where
    its median step is at least ``min_gain`` faster than fp32's, else fp32 is kept for the rest
    of the run.
    """

    def __init__(self, steps: int, min_gain: float) -> None:
        super().__init__(steps, min_gain, base=Precision.fp32.value, trial=Precision.bf16.value)

    @property
    def chosen(self) -> Optional[Precision]:
        return None if self.picked is None else Precision(self.picked)

    def dtype(self, step: int) -> Optional[torch.dtype]:
        """The autocast dtype for step ``step``: the probe's turn, then the choice."""
        name = self.candidate(step) or self.picked or Precision.bf16.value
        return torch.bfloat16 if name == Precision.bf16.value else None

    def decide(self, fp32_s: float, bf16_s: float, early: bool = False) -> Tuple[Precision, str]:
        picked, why = super().decide(fp32_s, bf16_s, early)
        return Precision(picked), why
