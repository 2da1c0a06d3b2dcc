"""Ctrl-C: one line saying where training stopped and how to go on, and exit code 130.

``install()`` (every rank, in the entry point) turns the first SIGINT into KeyboardInterrupt as
Python does, and ignores the ones after it: the terminal and torch's agent each send one, and a
second one inside the cleanup would end the process with a traceback. ``received()`` also tells
a collective failure that is only the echo of a peer's Ctrl-C (the peer left the process group)
from a real one. ``job.run`` turns the interrupt into ``Interrupted``, which knows the step.
"""

from __future__ import annotations

import contextlib
import signal
from pathlib import Path
from typing import Any, Optional

EXIT_INTERRUPTED = 130  # 128 + SIGINT, what a shell reports for a Ctrl-C'd command

_received = False
_deferring = 0  # depth of deferred() blocks: a SIGINT there waits for the block's end
_pending = False


def _on_sigint(signum, frame) -> None:  # noqa: ARG001 - signal handler signature
    global _received, _pending
    if _received:
        return  # already unwinding: let the cleanup finish and the line be printed
    _received = True
    if _deferring:
        _pending = True
        return
    raise KeyboardInterrupt


@contextlib.contextmanager
def deferred() -> Any:
    """Hold a SIGINT that arrives inside the block until it ends. A checkpoint being written
    is finished first: raised inside a writer's callback, the KeyboardInterrupt reaches torch's
    serializer as a broken stream ("unexpected pos"), a RuntimeError and a traceback instead of
    the one line (measured). Not raised if the block itself fails."""
    global _deferring, _pending
    _deferring += 1
    try:
        yield
    finally:
        _deferring -= 1
    if not _deferring and _pending:
        _pending = False
        raise KeyboardInterrupt


def install() -> Any:
    """Our SIGINT handler in place of Python's default one (a SIGINT ignored by the parent, or
    someone else's handler, stays); returns the previous handler for ``restore``."""
    global _received, _pending
    _received, _pending = False, False
    previous = signal.getsignal(signal.SIGINT)
    if previous is signal.default_int_handler:
        signal.signal(signal.SIGINT, _on_sigint)
    return previous


def restore(previous: Any) -> None:
    if signal.getsignal(signal.SIGINT) is _on_sigint:
        signal.signal(signal.SIGINT, previous)


def received() -> bool:
    return _received


class Interrupted(Exception):
    """Training was stopped by SIGINT at ``step`` (None: before it started);
    ``checkpoint_step`` is the newest checkpoint on disk (None: none yet); ``add`` the overrides
    a rerun needs to resume from it ("" when the same command resumes)."""

    def __init__(self, step: Optional[int], checkpoint_step: Optional[int], add: str) -> None:
        self.step, self.checkpoint_step, self.add = step, checkpoint_step, add
        super().__init__(self.line())

    def line(self) -> str:
        where = "before training started" if self.step is None else f"at step {self.step}"
        if self.checkpoint_step is None:
            return f"interrupted {where}, no checkpoint yet: rerunning the same command starts again from step 0"
        last = f"last checkpoint at step {self.checkpoint_step}"
        if not self.add:
            return f"interrupted {where}, {last}: rerun the same command to resume"
        return f"interrupted {where}, {last}: to resume, rerun the same command with {self.add}"


def resume_overrides(run_dir: Path, run_dir_fixed: bool, resume: str) -> str:
    """What a rerun must add to find this run's checkpoints: the default run directory is new
    for every command (a timestamp, or torchrun's random run id under --nproc), and
    trainer.resume=<path> would go back to that path."""
    add = [] if run_dir_fixed else [f"trainer.run_dir={run_dir}"]
    if resume != "auto":
        add.append("trainer.resume=auto")
    return " ".join(add)
