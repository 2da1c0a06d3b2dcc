"""Two ways to run a step, timed on the run's own steps: keep the trial only where it is faster.

A setting that may pay (bf16 autocast, quantized comms) depends on the machine, the model and
the link, so the trainer times it instead of assuming it: after ``start`` steps it runs
``steps`` steps of each candidate, the ``base`` and the ``trial``, in turns of ``PROBE_BLOCK``
(drift and the steps that count or sync fall on both alike), times each step, and at the end the
ranks agree on the slowest rank's median per candidate (one MAX all-reduce, all ranks at the
same step): the trial stays where its median step is at least ``min_gain`` faster than the
base's, else the base runs for the rest of the run. The probe's steps train as usual, each in
its turn's way. At the end of every turn from the second (``checks``) the ranks agree on the
medians so far too, and where one candidate is ``PROBE_EARLY`` past the rule's line the probe
decides there (``early``): the rest of the probe would run the slower one for nothing.

The rule is pure (``decide``, ``early``: unit-tested on recorded timings); ``time_step`` and
``agree_and_decide`` are what the trainer calls after each step. ``trainer.precision=auto``
(precision.py) and ``sharding.qcomms.when=auto`` (sharding/qcomms_switch.py) each run one, one
after the other.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple

import torch
import torch.distributed as dist

from slipstream_rec.distributed import all_reduce_

__all__ = ["PROBE_BLOCK", "PROBE_EARLY", "PROBE_START", "StepProbe", "start_after"]

PROBE_START = 4  # steps before a probe: the first ones pay one-time costs (allocation, warm-up)
PROBE_BLOCK = 4  # steps of one candidate in a row, the two taking turns
# The probe decides at the end of a turn from its second on (each candidate timed over at least
# 2 * PROBE_BLOCK steps) where one candidate's median is already this much past the rule's line:
# such a decision is not near the line, and the rest of the probe would run the slower one for
# nothing (on clicklog 8 more fp32 steps, 37 ms each). Wider than the serve lever's 10%: a
# wrong choice here lasts the whole run.
PROBE_EARLY = 0.20


@dataclass
class StepProbe:
    """``base`` or ``trial`` for the rest of the run, from the run's own timed steps."""

    steps: int  # steps timed per candidate
    min_gain: float  # how much faster the trial's median step must be (0.05: 5%)
    base: str  # the candidate kept unless the trial pays (its name in records and reasons)
    trial: str
    start: int = PROBE_START  # the probe's turns start after this step
    times: Dict[str, List[float]] = field(default_factory=dict)
    picked: Optional[str] = None  # None: still probing
    record: Dict[str, Any] = field(default_factory=dict)
    reason: str = ""  # why it picked what it did ("": still probing)

    def __post_init__(self) -> None:
        assert self.base != self.trial, self.base
        self.times = self.times or {self.base: [], self.trial: []}

    @property
    def last_step(self) -> int:
        return self.start + 2 * self.steps

    @property
    def ended(self) -> Optional[int]:
        """The step the probe decided at (``last_step`` or a turn's end; None: still probing):
        every step after ``start`` until then was timed, one time each."""
        if self.picked is None:
            return None
        return self.start + len(self.times[self.base]) + len(self.times[self.trial])

    def checks(self, step: int) -> bool:
        """Whether the probe may decide early after ``step``: the end of a turn (a block of each
        candidate), from the second on, before the last step."""
        since = step - self.start
        return (
            self.picked is None and step < self.last_step and since >= 4 * PROBE_BLOCK
            and since % (2 * PROBE_BLOCK) == 0
        )  # fmt: skip

    @property
    def last_probed(self) -> int:
        """The probe's last timed step: the step it decided at, or, still probing, its last."""
        return self.ended if self.ended is not None else self.last_step

    def probed(self, step: int) -> bool:
        """Whether step ``step`` was (or is) one of the probe's timed steps, its decision's
        included: on a GPU each ends with a host wait (the sync audit's ``probe`` steps)."""
        return self.start < step <= self.last_probed

    def candidate(self, step: int) -> Optional[str]:
        """The candidate step ``step`` (1-based) runs while probing; None outside the probe."""
        if self.picked is not None or not self.start < step <= self.last_step:
            return None
        return (self.base, self.trial)[((step - self.start - 1) // PROBE_BLOCK) % 2]

    def observe(self, step: int, seconds: float) -> None:
        turn = self.candidate(step)
        if turn is not None:
            self.times[turn].append(float(seconds))

    def early(self, base_s: float, trial_s: float) -> Optional[Tuple[Any, str]]:
        """The rule on the agreed medians of the steps timed so far (pure): decided (``decide``)
        where one candidate is over ``PROBE_EARLY`` past the line (the trial faster than the
        base less ``min_gain`` by that much, or slower by that much), None where it runs on."""
        line = base_s * (1.0 - self.min_gain)
        if trial_s * (1.0 + PROBE_EARLY) <= line or trial_s >= line * (1.0 + PROBE_EARLY):
            return self.decide(base_s, trial_s, early=True)
        return None

    def decide(self, base_s: float, trial_s: float, early: bool = False) -> Tuple[Any, str]:
        """The rule on the agreed medians (pure): the picked candidate's name and why."""
        self.picked = self.trial if trial_s <= base_s * (1.0 - self.min_gain) else self.base
        faster = 1.0 - trial_s / base_s if base_s > 0 else 0.0
        each = min(len(self.times[self.base]), len(self.times[self.trial])) if early else self.steps
        why = (
            f"auto: {self.picked}, timed on this run: {self.trial} {1e3 * trial_s:.1f} ms per step against "
            f"{self.base} {1e3 * base_s:.1f} ms ({100 * faster:+.1f}% faster, needs {100 * self.min_gain:+.1f}%; "
            f"median of {each} steps each"
            + (f", {100 * PROBE_EARLY:g}% past the line: decided before the probe's {self.steps})" if early else ")")
        )  # fmt: skip
        self.record = {f"{self.base}_ms_per_step": round(1e3 * base_s, 3),
                       f"{self.trial}_ms_per_step": round(1e3 * trial_s, 3),
                       "steps_each": each, "min_gain": self.min_gain}  # fmt: skip
        self.reason = why
        return self.picked, why

    def unfinished(self, step: int) -> str:
        """What a reason adds where the run ended at ``step`` inside the probe."""
        if self.picked is not None or step <= self.start:
            return ""
        return (
            f" (its timing did not finish: the run ended before step {self.last_step}, and steps "
            f"{self.start + 1}-{step} took turns in {self.base} and {self.trial})"
        )

    def time_step(self, step: int, start: float, device: torch.device) -> Optional[Tuple[Any, str]]:
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

    def agree_and_decide(self, early: bool = False) -> Optional[Tuple[Any, str]]:
        """The slowest rank's medians, then ``decide`` (at ``last_step``) or ``early`` (at a
        turn's end: None where it is not clear yet). Collective: all ranks."""
        medians = torch.tensor([statistics.median(self.times[self.base]), statistics.median(self.times[self.trial])],
                               dtype=torch.float64)  # fmt: skip
        base_s, trial_s = all_reduce_(medians, dist.ReduceOp.MAX).tolist()  # all ranks, one step
        return self.early(base_s, trial_s) if early else self.decide(base_s, trial_s)

    def state_dict(self) -> Dict[str, Any]:
        return {"times": {k: list(v) for k, v in self.times.items()}, "chosen": self.picked,
                "record": dict(self.record), "reason": self.reason}  # fmt: skip

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        self.times = {k: list(v) for k, v in state["times"].items()}
        self.picked = state["chosen"]
        self.record = dict(state["record"])
        self.reason = state.get("reason", "")  # a checkpoint from before the probe kept it: none


def start_after(earlier: Optional[StepProbe]) -> int:
    """Where a probe that follows ``earlier`` starts: after its planned last step (its turns
    would switch the step under the later probe's), or at ``PROBE_START`` without one."""
    return earlier.last_step if earlier is not None else PROBE_START
