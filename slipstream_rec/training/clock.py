"""The trainer's clock: training seconds, evaluations and checkpoints left out."""

from __future__ import annotations

import contextlib
import time
from typing import Any, Iterator, Optional

import torch

from slipstream_rec.timing import timed

__all__ = ["TrainClock"]


class TrainClock:
    """Wall time inside training epochs, less the evaluations and checkpoints run meanwhile
    (``state``: the trainer's ``TrainState``, whose ``train_seconds`` it keeps), and the process's
    CPU time likewise (``train_cpu_seconds``)."""

    def __init__(self, state: Any, device: torch.device) -> None:
        self.state = state
        self.device = device
        self._epoch_start: Optional[float] = None  # perf_counter at the start of the running epoch
        self._paused_before = 0.0  # eval + checkpoint seconds at that moment
        self._cpu_start: Optional[float] = None  # process_time at the start of the running epoch
        self._paused_cpu_before = 0.0  # eval + checkpoint CPU seconds at that moment

    def start_epoch(self) -> None:
        self._epoch_start = time.perf_counter()
        self._paused_before = self.state.eval_seconds + self.state.checkpoint_seconds
        self._cpu_start = time.process_time()
        self._paused_cpu_before = self.state.paused_cpu_seconds

    def end_epoch(self) -> None:
        """The epoch's training time into ``train_seconds``, the device's queued kernels counted
        too (one host wait on a GPU, at the end of an epoch)."""
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        self.state.train_seconds = self.live()
        self.state.train_cpu_seconds = self.live_cpu()
        self._epoch_start = self._cpu_start = None

    def live(self) -> float:
        """Training seconds so far, including the running epoch (evaluations excluded)."""
        st = self.state
        if self._epoch_start is None:
            return st.train_seconds
        paused = st.eval_seconds + st.checkpoint_seconds - self._paused_before
        return st.train_seconds + time.perf_counter() - self._epoch_start - paused

    @contextlib.contextmanager
    def paused(self, key: str) -> Iterator[None]:
        """A block that neither clock counts as training (an evaluation, a checkpoint): its wall
        time into the state's ``key`` (``eval_seconds``, ``checkpoint_seconds``), its CPU time into
        ``paused_cpu_seconds``."""
        with timed(self.state, key), timed(self.state, "paused_cpu_seconds", time.process_time):
            yield

    def live_cpu(self) -> float:
        """This process's CPU seconds in training so far (host threads only: a GPU's kernels are
        not in it), evaluations and checkpoints excluded."""
        st = self.state
        if self._cpu_start is None:
            return st.train_cpu_seconds
        paused = st.paused_cpu_seconds - self._paused_cpu_before
        return st.train_cpu_seconds + time.process_time() - self._cpu_start - paused

    def drained(self) -> float:
        """Training seconds so far with the device's queued work finished: the clock of the serve
        lever's windows (a host wait on a GPU, twice per window; never inside a plain step)."""
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        return self.live()
