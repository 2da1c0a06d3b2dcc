"""Fault injection for testing recovery: make one rank die or stall at a chosen step.

Driven by environment variables so that the launcher (torchrun, TorchX, a test) can inject a
fault without a config change; a run without them never does anything here:

- ``SLIPSTREAM_FAULT_STEP``: after this training step (required to enable injection);
- ``SLIPSTREAM_FAULT_RANK``: on this global rank (default 0);
- ``SLIPSTREAM_FAULT``: ``kill`` (SIGKILL itself, default: a crash with no cleanup at all),
  ``exit`` (exit code 13) or ``hang`` (sleep for an hour: the other ranks' next collective must
  time out, see ``trainer.collective_timeout_s``);
- ``SLIPSTREAM_FAULT_ATTEMPTS``: only on restart attempts below this (default 1: the first
  attempt, ``TORCHELASTIC_RESTART_COUNT=0``), so a restarted job runs through.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import time
from dataclasses import dataclass
from typing import Mapping, Optional

logger = logging.getLogger(__name__)

KINDS = ("kill", "exit", "hang")


@dataclass
class FaultInjector:
    step: Optional[int] = None  # None: inactive
    kind: str = "kill"

    @classmethod
    def from_env(cls, rank: int, environ: Optional[Mapping[str, str]] = None) -> "FaultInjector":
        env = os.environ if environ is None else environ
        raw = env.get("SLIPSTREAM_FAULT_STEP")
        if not raw:
            return cls()
        try:
            step = int(raw)
            target = int(env.get("SLIPSTREAM_FAULT_RANK", "0"))
            attempts = int(env.get("SLIPSTREAM_FAULT_ATTEMPTS", "1"))
            restart = int(env.get("TORCHELASTIC_RESTART_COUNT", "0"))
        except ValueError as e:
            raise ValueError(f"SLIPSTREAM_FAULT_* environment variables must be integers: {e}") from e
        kind = env.get("SLIPSTREAM_FAULT", "kill")
        if kind not in KINDS:
            raise ValueError(f"SLIPSTREAM_FAULT={kind!r}: use one of {', '.join(KINDS)}")
        if rank != target or restart >= attempts:
            return cls()
        return cls(step=step, kind=kind)

    def after_step(self, step: int) -> None:
        if self.step is None or step != self.step:
            return
        print(f"fault injection: {self.kind} after step {step} (pid {os.getpid()})", file=sys.stderr, flush=True)
        if self.kind == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        elif self.kind == "exit":
            os._exit(13)
        else:
            time.sleep(3600)
