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

import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

import torch
import torch.distributed as dist

from slipstream_rec.distributed import all_reduce_
from slipstream_rec.training.config import PipelineKind, Precision

__all__ = ["resolve_precision", "machine_bf16", "PrecisionProbe"]

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
PROBE_START = 4  # steps before the probe: the first ones pay one-time costs (allocation, warm-up)
PROBE_BLOCK = 4  # steps of one candidate in a row, fp32 and bf16 taking turns
# The probe decides at the end of a turn from its second on (each candidate timed over at least
# 2 * PROBE_BLOCK steps) where one candidate's median is already this much past the rule's line:
# such a decision is not near the line, and the rest of the probe would run the slower one for
# nothing (on clicklog 8 more fp32 steps, 37 ms each). Wider than the serve lever's 10%: a
# wrong choice here lasts the whole run.
PROBE_EARLY = 0.20


@dataclass
class PrecisionProbe:
    """bf16 kept only where the run's own steps measure it faster (``trainer.precision=auto``).

    The machine's flags say whether bf16 *can* be fast; whether it is depends on the model: bf16
    speeds up the dense layers, and where the embedding lookups and their fused updates carry
    the step it buys nothing and its casts cost (measured: a 7M-row log whose step took 150 ms
    in bf16 against 138 in fp32, issue 29). So after ``PROBE_START`` steps the trainer runs
    ``steps`` steps of each candidate, in turns of ``PROBE_BLOCK`` (drift and the count steps
    fall on both alike), times each step, and at the end the ranks agree on the slowest rank's
    median per candidate (one MAX all-reduce, all ranks at the same step): bf16 stays where its
    median step is at least ``min_gain`` faster than fp32's, else fp32 is kept for the rest of
    the run. The probe's steps train as usual, in the precision of their turn. At the end of
    every turn from the second (``checks``) the ranks agree on the medians so far too, and where
    one candidate is ``PROBE_EARLY`` past the rule's line the probe decides there (``early``).
    """

    steps: int  # trainer.precision_probe_steps: steps timed per candidate
    min_gain: float  # trainer.precision_min_gain
    times: Dict[str, List[float]] = field(default_factory=lambda: {"fp32": [], "bf16": []})
    chosen: Optional[Precision] = None  # None: still probing
    record: Dict[str, Any] = field(default_factory=dict)

    @property
    def last_step(self) -> int:
        return PROBE_START + 2 * self.steps

    @property
    def ended(self) -> Optional[int]:
        """The step the probe decided at (``last_step`` or a turn's end; None: still probing):
        every step after ``PROBE_START`` until then was timed, one time each."""
        if self.chosen is None:
            return None
        return PROBE_START + len(self.times["fp32"]) + len(self.times["bf16"])

    def checks(self, step: int) -> bool:
        """Whether the probe may decide early after ``step``: the end of a turn (a block of each
        candidate), from the second on, before the last step."""
        since = step - PROBE_START
        return (
            self.chosen is None and step < self.last_step and since >= 4 * PROBE_BLOCK
            and since % (2 * PROBE_BLOCK) == 0
        )  # fmt: skip

    @property
    def last_probed(self) -> int:
        """The probe's last timed step: the step it decided at, or, still probing, its last."""
        return self.ended if self.ended is not None else self.last_step

    def probed(self, step: int) -> bool:
        """Whether step ``step`` was (or is) one of the probe's timed steps, its decision's
        included: on a GPU each ends with a host wait (the sync audit's ``probe`` steps)."""
        return PROBE_START < step <= self.last_probed

    def candidate(self, step: int) -> Optional[str]:
        """The precision step ``step`` (1-based) runs in while probing; None outside the probe."""
        if self.chosen is not None or not PROBE_START < step <= self.last_step:
            return None
        return ("fp32", "bf16")[((step - PROBE_START - 1) // PROBE_BLOCK) % 2]

    def dtype(self, step: int) -> Optional[torch.dtype]:
        """The autocast dtype for step ``step``: the probe's turn, then the choice."""
        turn = self.candidate(step)
        name = turn or (self.chosen.value if self.chosen is not None else "bf16")
        return torch.bfloat16 if name == "bf16" else None

    def observe(self, step: int, seconds: float) -> None:
        turn = self.candidate(step)
        if turn is not None:
            self.times[turn].append(float(seconds))

    def early(self, fp32_s: float, bf16_s: float) -> Optional[Tuple[Precision, str]]:
        """The rule on the agreed medians of the steps timed so far (pure): decided (``decide``)
        where one candidate is over ``PROBE_EARLY`` past the line (bf16 faster than fp32 less
        ``min_gain`` by that much, or slower by that much), None where the probe runs on."""
        line = fp32_s * (1.0 - self.min_gain)
        if bf16_s * (1.0 + PROBE_EARLY) <= line or bf16_s >= line * (1.0 + PROBE_EARLY):
            return self.decide(fp32_s, bf16_s, early=True)
        return None

    def decide(self, fp32_s: float, bf16_s: float, early: bool = False) -> Tuple[Precision, str]:
        """The rule on the agreed medians (pure)."""
        self.chosen = Precision.bf16 if bf16_s <= fp32_s * (1.0 - self.min_gain) else Precision.fp32
        faster = 1.0 - bf16_s / fp32_s if fp32_s > 0 else 0.0
        each = min(len(self.times["fp32"]), len(self.times["bf16"])) if early else self.steps
        why = (
            f"auto: {self.chosen.value}, timed on this run: bf16 {1e3 * bf16_s:.1f} ms per step against "
            f"fp32 {1e3 * fp32_s:.1f} ms ({100 * faster:+.1f}% faster, needs {100 * self.min_gain:+.1f}%; "
            f"median of {each} steps each"
            + (f", {100 * PROBE_EARLY:g}% past the line: decided before the probe's {self.steps})" if early else ")")
        )  # fmt: skip
        self.record = {"fp32_ms_per_step": round(1e3 * fp32_s, 3), "bf16_ms_per_step": round(1e3 * bf16_s, 3),
                       "steps_each": each, "min_gain": self.min_gain}  # fmt: skip
        return self.chosen, why

    def unfinished(self, step: int) -> str:
        """What the precision's reason adds where the run ended at ``step`` inside the probe."""
        if self.chosen is not None or step <= PROBE_START:
            return ""
        return (
            f" (its timing did not finish: the run ended before step {self.last_step}, and steps "
            f"{PROBE_START + 1}-{step} took turns in fp32 and bf16)"
        )

    def time_step(self, step: int, start: float, device: torch.device) -> Optional[Tuple[Precision, str]]:
        """Time step ``step``, which began at ``start`` (perf_counter), if it is a probe step; at
        the probe's last step the decision, at a turn's end (``checks``) one if it is clear
        (collective at both: all ranks, the same step)."""
        if self.candidate(step) is not None:
            if device.type == "cuda":
                torch.cuda.synchronize(device)  # probe steps only: the kernels' time too
            self.observe(step, time.perf_counter() - start)
        if step == self.last_step:
            return self.agree_and_decide()
        return self.agree_and_decide(early=True) if self.checks(step) else None

    def agree_and_decide(self, early: bool = False) -> Optional[Tuple[Precision, str]]:
        """The slowest rank's medians, then ``decide`` (at ``last_step``) or ``early`` (at a
        turn's end: None where it is not clear yet). Collective: all ranks."""
        medians = torch.tensor([statistics.median(self.times["fp32"]), statistics.median(self.times["bf16"])],
                               dtype=torch.float64)  # fmt: skip
        fp32_s, bf16_s = all_reduce_(medians, dist.ReduceOp.MAX).tolist()  # all ranks, one step
        return self.early(fp32_s, bf16_s) if early else self.decide(fp32_s, bf16_s)

    def state_dict(self) -> Dict[str, Any]:
        return {"times": {k: list(v) for k, v in self.times.items()},
                "chosen": None if self.chosen is None else self.chosen.value, "record": dict(self.record)}  # fmt: skip

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        self.times = {k: list(v) for k, v in state["times"].items()}
        self.chosen = None if state["chosen"] is None else Precision(state["chosen"])
        self.record = dict(state["record"])
