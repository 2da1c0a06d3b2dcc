"""``trainer.profile_steps``: a short torch.profiler trace of steady-state training steps.

The trace covers ``steps`` steps from ``first`` (the middle of the run by default, past the
pipeline's fill and Slipstream's first choices) and is written as a Chrome trace
(chrome://tracing, Perfetto) to ``<run_dir>/profile/trace_rank<r>.json`` by every rank: on a GPU
it shows the kernels, the copies and where the host waited for the device.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

import torch

__all__ = ["StepProfiler"]


class StepProfiler:
    """Starts the profiler before step ``first`` and stops it after ``first + steps - 1``."""

    def __init__(self, steps: int, first: int, out_dir: Path, rank: int, cuda: bool) -> None:
        self.steps, self.first = int(steps), max(1, int(first))
        self.path = out_dir / f"trace_rank{rank}.json"
        self.cuda = cuda
        self._prof: Optional[Any] = None
        self.written: Optional[Path] = None

    def before_step(self, step: int) -> None:
        """``step``: the step about to run."""
        if self.steps and step == self.first and self._prof is None:
            activities = [torch.profiler.ProfilerActivity.CPU]
            if self.cuda:
                activities.append(torch.profiler.ProfilerActivity.CUDA)
            self._prof = torch.profiler.profile(activities=activities)
            self._prof.__enter__()

    def after_step(self, step: int) -> None:
        if self._prof is not None and step >= self.first + self.steps - 1:
            self.close()

    def close(self) -> None:
        """Stop and write the trace (also when the run ends inside the profiled steps)."""
        if self._prof is None:
            return
        prof, self._prof = self._prof, None
        prof.__exit__(None, None, None)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        prof.export_chrome_trace(str(self.path))
        self.written = self.path
