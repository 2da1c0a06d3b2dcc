"""Where metrics go: a JSONL file, TensorBoard and a progress bar, all written by rank 0 only."""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Any, Callable, Dict, Optional


def _jsonable(value: Any) -> Any:
    # JSON has no NaN; write null so that every JSON reader can load the file.
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


class MetricLog:
    """Rank 0 writes ``metrics.jsonl`` (one record per event) and TensorBoard scalars.

    On other ranks every method is a no-op, so callers need no rank branches.
    """

    def __init__(
        self,
        run_dir: Path,
        enabled: bool,
        tensorboard: bool,
        progress_bar: bool,
        total_steps: int,
        resume_step: Optional[int] = None,
        every_steps: int = 1,
        samples_per_step: int = 0,
    ) -> None:
        # resume_step: the run continues from a checkpoint of this step; records of later steps
        # (written before the interruption, trained again now) are dropped from metrics.jsonl
        # and TensorBoard so that each step appears once.
        # every_steps: the train record's cadence (trainer.log_every_steps); samples_per_step:
        # the global batch, for its samples per second.
        self._enabled = enabled
        self.every_steps = every_steps
        self._samples_per_step = samples_per_step
        self._window = (time.perf_counter(), 0)  # (clock, step) where the throughput window began
        self._file = None
        self._tb = None
        self._bar = None
        self._start = time.time()
        # The files open with the first record, when the run has really started: a start refused
        # before it (a checkpoint that does not fit) leaves the run directory as it was.
        self._run_dir, self._tensorboard, self._resume_step = run_dir, tensorboard, resume_step
        if not enabled:
            return
        if progress_bar:
            from tqdm import tqdm

            # disable=None: shown on a terminal, silent in log files (CI, TorchX log capture).
            self._bar = tqdm(
                total=total_steps, desc="train", unit="step", dynamic_ncols=True, mininterval=1.0, disable=None
            )

    def log(self, kind: str, step: int, values: Dict[str, Any]) -> None:
        """One record: ``{"kind": kind, "step": step, "time": seconds since start, **values}``."""
        if not self._enabled:
            return
        record = {"kind": kind, "step": step, "time": round(time.time() - self._start, 3)}
        record.update({k: _jsonable(v) for k, v in values.items()})
        if self._file is None:
            self._open()
        assert self._file is not None
        self._file.write(json.dumps(record) + "\n")
        if self._tb is not None:
            for key, value in values.items():
                if isinstance(value, (int, float)) and not isinstance(value, bool):
                    self._tb.add_scalar(f"{kind}/{key}", value, step)
        if self._bar is not None and kind == "train":
            self._bar.set_postfix(
                {k: f"{v:.4g}" for k, v in values.items() if k in ("loss", "samples_per_second")}
            )

    def due(self, step: int) -> bool:
        """``step`` writes a train record."""
        return step % self.every_steps == 0

    def start_window(self, step: int) -> None:
        """The throughput window begins now, at ``step`` (the start of an epoch)."""
        self._window = (time.perf_counter(), step)

    def pause_window(self) -> None:
        """Time spent since is not training (an evaluation, a checkpoint): the window's clock
        restarts, its steps are kept."""
        self._window = (time.perf_counter(), self._window[1])

    def maybe_log(self, step: int, loss: Any, values: Callable[[], Dict[str, Any]]) -> None:
        """The ``train`` record on its steps (every ``every_steps``): the loss (a host read of
        it on those steps only), the samples per second since the last record, and ``values()``,
        computed on rank 0 only. Local, no collective."""
        if not self.due(step):
            return
        now = time.perf_counter()
        start, start_step = self._window
        rate = (step - start_step) * self._samples_per_step / max(now - start, 1e-9)
        self._window = (now, step)
        if self._enabled:
            self.log("train", step, {"loss": float(loss), "samples_per_second": rate, **values()})

    def _open(self) -> None:
        path = self._run_dir / "metrics.jsonl"
        resume_step = self._resume_step
        if resume_step is not None and path.exists():
            _truncate_after(path, resume_step)
        # A fresh start (no checkpoint to continue) replaces the records of an earlier attempt.
        self._file = open(path, "a" if resume_step is not None else "w", buffering=1)
        if self._tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            purge = None if resume_step is None else resume_step + 1
            self._tb = SummaryWriter(log_dir=str(self._run_dir / "tensorboard"), purge_step=purge)

    def advance(self, steps: int = 1) -> None:
        if self._bar is not None:
            self._bar.update(steps)

    def write(self, message: str) -> None:
        """Print a line on rank 0 without breaking the progress bar."""
        if not self._enabled:
            return
        if self._bar is not None:
            self._bar.write(message)
        else:
            print(message, flush=True)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None
        if self._tb is not None:
            self._tb.close()
            self._tb = None
        if self._file is not None:
            self._file.close()
            self._file = None


def _truncate_after(path: Path, step: int) -> None:
    """Keep the records of steps <= ``step`` (rewritten under a temporary name, then renamed).
    A line cut short by a crash is dropped too."""
    kept = []
    for line in path.read_text().splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict) and int(record.get("step", 0)) <= step:
            kept.append(line)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text("".join(k + "\n" for k in kept))
    tmp.replace(path)


def write_json_atomic(path: Path, payload: Dict[str, Any]) -> None:
    """Write to a temporary name and rename, so a reader never sees a half-written file."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps({k: _jsonable(v) for k, v in payload.items()}, indent=2) + "\n")
    tmp.replace(path)
