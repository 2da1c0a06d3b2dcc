"""``slipstream-train --nproc N``: N local ranks, started through torch.distributed.run's API.

The configuration is composed and checked once, here, for a world of N ranks (``preflight``);
only then are the ranks started, by ``torch.distributed.run.run`` with ``--standalone`` (what
``torchrun --standalone --nproc-per-node N`` does), so elastic restarts (``--max-restarts``)
work as under torchrun. Each rank leaves its error line in a directory of this launcher
(``cli_errors.emit_error_line``) instead of printing it, and torch's agent is kept quiet: the
command ends with rank 0's ``done:`` line, or with one error line (the first a rank wrote) and
that rank's exit code (2: bad input, 3: a lost or stuck rank), never with N copies of the line
and torchrun's ``ChildFailedError`` traceback.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Dict, List, Optional, Tuple

from slipstream_rec.cli_errors import ERROR_DIR_ENV

if TYPE_CHECKING:
    from slipstream_rec.config import JobConfig
    from torch.distributed.elastic.multiprocessing.errors import ProcessFailure

EXIT_LOST_RANK = 3


def torchrun_argv(nproc: int, max_restarts: int, overrides: List[str]) -> List[str]:
    """torchrun's arguments for N local ranks of ``slipstream_rec.train`` with ``overrides``."""
    return [
        "--standalone", f"--nproc-per-node={nproc}", f"--max-restarts={max_restarts}",
        "-m", "slipstream_rec.train", *overrides,
    ]  # fmt: skip


def first_error_line(directory: Path) -> Optional[Tuple[int, str]]:
    """(rank, line) of the earliest error line a rank left (the cause; later ones are usually
    its echo on the other ranks), or None."""
    found = []
    for path in directory.glob("rank*.err"):
        stamp, _, line = path.read_text().partition("\t")
        found.append((int(stamp), int(path.stem.removeprefix("rank")), line.strip()))
    return min(found)[1:] if found else None


def explain_failure(failures: Dict[int, "ProcessFailure"], errors: Path) -> Tuple[str, int]:
    """The one line and the exit code for a job whose ranks failed."""
    def killed(rank: int, failure: "ProcessFailure") -> Tuple[str, int]:
        sig = signal.Signals(-failure.exitcode)
        why = (
            # NCCL's watchdog aborts the process when a collective outlives its timeout
            "NCCL's watchdog: a collective waited longer than trainer.collective_timeout_s for "
            "another rank, see the ranks' logs; or out of memory"
            if sig == signal.SIGABRT
            else "out of memory, or stopped from outside"
        )
        return (
            f"slipstream-train: error: rank {rank} was killed by {sig.name} ({why}). Fix: rerun the "
            "same command (it resumes from the newest checkpoint), or add --max-restarts N to "
            "restart lost ranks", EXIT_LOST_RANK,
        )  # fmt: skip

    # The agent stops the other ranks with SIGTERM once one fails: that is not the cause.
    signalled = sorted((r, f) for r, f in failures.items() if f.exitcode < 0)
    for rank, failure in signalled:
        if -failure.exitcode != signal.SIGTERM:  # the cause: the others only lost a peer
            return killed(rank, failure)
    found = first_error_line(errors)
    if found is not None:
        rank, line = found
        # The rank that wrote the earliest line may have been stopped by the agent (SIGTERM)
        # after writing it, once a peer with the same error exited first: that peer's code.
        own = [failures[rank].exitcode] if rank in failures and failures[rank].exitcode > 0 else []
        exited = own + [f.exitcode for _, f in sorted(failures.items()) if f.exitcode > 0]
        code = exited[0] if exited else 1
        return line, code if code in (2, EXIT_LOST_RANK, 130) else 1
    if signalled:
        return killed(*signalled[0])
    rank, failure = min(failures.items())
    return f"slipstream-train: error: rank {rank} exited with code {failure.exitcode}; its output above says why", 1


def interrupted_line(errors: Path) -> str:
    """The line for a Ctrl-C: rank 0's (it knows the step and the checkpoint), else any rank's."""
    lines = {}
    for path in errors.glob("rank*.err"):
        lines[int(path.stem.removeprefix("rank"))] = path.read_text().partition("\t")[2].strip()
    ours = [lines[r] for r in sorted(lines) if "interrupted" in lines[r]]
    return ours[0] if ours else "slipstream-train: interrupted before training started (nothing was trained)"


def launch(nproc: int, max_restarts: int, overrides: List[str], job: Optional["JobConfig"] = None) -> int:
    """Start the ranks and wait; the exit code of the job (0, or the failed rank's)."""
    import uuid

    from torch.distributed import run as torchrun
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

    from slipstream_rec import run_lock
    from slipstream_rec.interrupt import EXIT_INTERRUPTED

    # torch's agent logs every failure and shutdown at WARNING / ERROR and prints a banner when
    # it sets OMP_NUM_THREADS: the ranks' own lines say what happened.
    # Elastic's modules set their own loggers' levels (LOGLEVEL, WARNING by default), so the
    # parents' level is not enough: every torch.distributed logger imported so far is silenced.
    names = [n for n in logging.root.manager.loggerDict if n.startswith("torch.distributed")]
    for name in ("torch.distributed", "torch.distributed.elastic", "torch.distributed.run", *names):
        logging.getLogger(name).setLevel(logging.CRITICAL)
    os.environ.setdefault("OMP_NUM_THREADS", "1")  # torchrun's default for N > 1, without its banner
    # The launcher holds the run directory for its ranks (and their restarts): they carry its
    # token, so rank 0 finds the lock its own job's.
    os.environ[run_lock.TOKEN_ENV] = f"launcher:{uuid.uuid4()}"
    run_dir = Path(job.trainer.run_dir) if job is not None and job.trainer.run_dir else None
    with tempfile.TemporaryDirectory(prefix="slipstream-errors-") as errors:
        os.environ[ERROR_DIR_ENV] = errors  # inherited by the ranks
        try:
            if run_dir is not None:
                note = run_lock.acquire(run_dir)
                if note:
                    print(f"slipstream-train: note: {note}", file=sys.stderr, flush=True)
            torchrun.run(torchrun.parse_args(torchrun_argv(nproc, max_restarts, overrides)))
            return 0
        except ChildFailedError as e:
            line, code = explain_failure(e.failures, Path(errors))
            print(line, file=sys.stderr, flush=True)
            return code
        except (SignalException, KeyboardInterrupt) as e:
            if isinstance(e, SignalException) and e.sigval != signal.SIGINT:
                raise
            # torch's agent has stopped the ranks (each left its line) before raising this.
            print(interrupted_line(Path(errors)), file=sys.stderr, flush=True)
            return EXIT_INTERRUPTED
        finally:
            os.environ.pop(ERROR_DIR_ENV, None)
            os.environ.pop(run_lock.TOKEN_ENV, None)
            if run_dir is not None:
                run_lock.release(run_dir)
