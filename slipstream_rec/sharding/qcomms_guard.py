"""``sharding.qcomms.when=auto``'s quality guard: the quantized comms' error read on the run's own
tensors, and fp32 for the rest of the run where it passes its bounds.

Quantizing loses bits: fp16 keeps 11 of a normal value (a relative error of about 3e-4, root mean
square), bf16 8, int8 a row's range over 255 steps; values under fp16's normal range (6.1e-5,
where a mean loss's gradients over thousands of samples sit) keep fewer or none, which the
scales (``sharding.qcomms.backward_loss_scale``, ``trainer.ddp_comm_hook_scale``) are for. How
much a run loses is a property of its tensors, so the guard reads it there:

* every ``guard_every_steps`` steps (after the comms probe's turns, while the quantized comms
  run) the switch marks the step as measured; each switched codec and the switched DDP hook then
  decode what they encoded and add, per direction (``forward``: the pooled embeddings,
  ``backward``: their gradients, ``all_reduce``: the gradients DDP all-reduces), the squared
  difference, the squared original and the values lost and sent into tensors on the device (no
  host sync in the step);
* after that step every rank enters one SUM all-reduce of the sums and reads each direction's
  relative error (the root of the summed squared error over the summed squared original, over
  all ranks) and its share of values lost (sent non-zero, arrived as zero or not finite); past
  ``max_error`` or ``max_lost`` on any, the switch goes off for the rest of the run (fp32, as the
  probe's fp32 turns) and the reason is recorded.

What is sent is never changed by the measurement: the encoded tensor goes on the wire as it
would; the decoded copy is only compared.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

import torch
import torch.distributed as dist

from slipstream_rec.distributed import all_reduce_

__all__ = ["DIRECTIONS", "CommsErrors", "CommsGuard", "make_comms_guard"]

DIRECTIONS = ("forward", "backward", "all_reduce")
SUMS = 4  # per direction: squared error, squared original, values lost, values sent (non-zero)


class CommsErrors:
    """The measured step's sums per direction (``SUMS``) on the device of the tensors measured
    (local; ``take`` hands them to the guard's all-reduce). A value is lost where it was not
    zero and arrives as zero (under fp16's smallest subnormal, 6e-8) or not finite (past its
    largest, 65504)."""

    def __init__(self) -> None:
        self.sums: Dict[str, torch.Tensor] = {}

    @torch.no_grad()
    def add(self, direction: str, exact: torch.Tensor, received: torch.Tensor) -> None:
        """Count ``received`` (what the far side decodes) against ``exact`` (what was encoded)."""
        assert direction in DIRECTIONS, direction
        exact = exact.detach().to(torch.float64)
        received = received.detach().to(torch.float64).reshape(exact.shape)
        diff = received - exact
        sent = exact != 0
        lost = sent & ((received == 0) | ~received.isfinite())
        sums = torch.stack([diff.square().sum(), exact.square().sum(), lost.sum().to(exact.dtype), sent.sum().to(exact.dtype)])
        prev = self.sums.get(direction)
        self.sums[direction] = sums if prev is None else prev + sums.to(prev.device)

    def take(self, device: torch.device) -> torch.Tensor:
        """The sums as one float64 tensor on ``device`` (``SUMS`` per direction in ``DIRECTIONS``
        order; zeros where nothing was measured), and empties them."""
        out = torch.zeros(SUMS * len(DIRECTIONS), dtype=torch.float64, device=device)
        for i, direction in enumerate(DIRECTIONS):
            if direction in self.sums:
                out[SUMS * i : SUMS * (i + 1)] += self.sums[direction].to(device)
        self.sums = {}
        return out


def measured(sums: List[float]) -> Dict[str, Dict[str, float]]:
    """Each measured direction's relative error (root of the squared error over the squared
    original) and share of values lost, from the all-reduced sums (``CommsErrors.take``'s
    layout); a direction nothing was sent in is left out."""
    out = {}
    for i, direction in enumerate(DIRECTIONS):
        err, ref, lost, sent = sums[SUMS * i : SUMS * (i + 1)]
        if sent > 0:
            out[direction] = {"error": math.sqrt(err / ref) if math.isfinite(err) else math.inf, "lost": lost / sent}
    return out


@dataclass
class CommsGuard:
    """Measures the quantized comms every ``every`` steps after ``probe``'s turns and turns them
    off for good where a direction's relative error passes ``max_error`` or its share of values
    lost passes ``max_lost``."""

    switch: Any  # the run's CommsSwitch (its ``measuring`` and ``errors`` are read by the codecs and the hook)
    every: int  # steps between measured steps
    max_error: float  # the relative error past which the comms go back to fp32
    max_lost: float  # the share of values lost past which they do
    probe: Optional[Any] = None  # the comms probe: the guard measures after its last step
    checks: int = 0
    last: Dict[str, Dict[str, float]] = field(default_factory=dict)  # the latest check's, per direction
    worst: Dict[str, Dict[str, float]] = field(default_factory=dict)  # the largest of each so far
    tripped_at: Optional[int] = None  # the step it turned them off at
    reason: str = ""
    checked_at: int = -1  # the last step measured in this process (the sync audit's step kind)

    @property
    def start(self) -> int:
        """The guard measures after this step (the probe's last; a measurement would time into its turns)."""
        return self.probe.last_step if self.probe is not None else 0

    def due(self, step: int) -> bool:
        return self.tripped_at is None and step > self.start and step % self.every == 0

    def before_step(self, step: int) -> None:
        """Set the switch for step ``step``, after the probe set it: off for good once tripped;
        measured where due while the quantized comms run. Local, the same on every rank (the
        switch and the trip are agreed)."""
        self.switch.on = self.switch.on and self.tripped_at is None
        self.switch.measuring = self.switch.on and self.due(step)

    def after_step(self, step: int, device: torch.device) -> Optional[Dict[str, Any]]:
        """After a measured step: the ranks' summed figures, the rule, and the check's record
        (None after any other step). Collective where the step was measured (every rank: the
        switch is the same on all)."""
        if not self.switch.measuring:
            return None
        self.switch.measuring = False
        self.checked_at = step
        sums = all_reduce_(self.switch.errors.take(device), dist.ReduceOp.SUM).tolist()  # all ranks
        self.last = measured(sums)
        self.checks += 1
        for direction, figures in self.last.items():
            worst = self.worst.setdefault(direction, {"error": 0.0, "lost": 0.0})
            for name, value in figures.items():
                worst[name] = max(value, worst[name])
        bounds = {"error": self.max_error, "lost": self.max_lost}
        over = [f"{d} {name} {v:.3g} > {bounds[name]:g}" for d, figures in self.last.items()
                for name, v in figures.items() if not v <= bounds[name]]  # fmt: skip
        if over:
            self.tripped_at = step
            self.switch.on = False
            self.reason = (
                f"guard: fp32 from step {step + 1}: what the quantized comms lost at step {step} passed "
                f"sharding.qcomms.max_error / max_lost ({', '.join(over)}; values lost to fp16's range "
                "are what sharding.qcomms.backward_loss_scale and trainer.ddp_comm_hook_scale keep)"
            )
        return {**{d: dict(f) for d, f in self.last.items()}, "tripped": bool(over)}

    def summary(self) -> Dict[str, Any]:
        """summary.json's ``qcomms.guard``."""
        return {"every_steps": self.every, "max_error": self.max_error, "max_lost": self.max_lost, **self.state_dict()}

    def state_dict(self) -> Dict[str, Any]:
        return {"checks": self.checks, "last": copy.deepcopy(self.last), "worst": copy.deepcopy(self.worst),
                "tripped_at": self.tripped_at, "reason": self.reason}  # fmt: skip

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        self.checks, self.tripped_at, self.reason = state["checks"], state["tripped_at"], state["reason"]
        self.last, self.worst = copy.deepcopy(state["last"]), copy.deepcopy(state["worst"])


def make_comms_guard(cfg: Any, switch: Optional[Any], probe: Optional[Any]) -> Optional[CommsGuard]:
    """The guard ``sharding.qcomms.when=auto`` asks for (None: nothing switched, or
    ``guard_every_steps=0``). Its keys were checked at composition (``QCommsConfig.validate``)."""
    if switch is None or cfg.guard_every_steps == 0:
        return None
    return CommsGuard(switch, cfg.guard_every_steps, cfg.max_error, cfg.max_lost, probe)
