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
from typing import List, Optional

from slipstream_rec.cli_errors import ERROR_DIR_ENV

EXIT_LOST_RANK = 3


def torchrun_argv(nproc: int, max_restarts: int, overrides: List[str]) -> List[str]:
    """torchrun's arguments for N local ranks of ``slipstream_rec.train`` with ``overrides``."""
    return [
        "--standalone", f"--nproc-per-node={nproc}", f"--max-restarts={max_restarts}",
        "-m", "slipstream_rec.train", *overrides,
    ]  # fmt: skip


def first_error_line(directory: Path) -> Optional[str]:
    """The earliest error line a rank left (the cause; later ones are usually its echo)."""
    found = []
    for path in directory.glob("rank*.err"):
        stamp, _, line = path.read_text().partition("\t")
        found.append((int(stamp), line.strip()))
    return min(found)[1] if found else None


def launch(nproc: int, max_restarts: int, overrides: List[str]) -> int:
    """Start the ranks and wait; the exit code of the job (0, or the failed rank's)."""
    from torch.distributed import run as torchrun
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

    # torch's agent logs every failure and shutdown at WARNING / ERROR and prints a banner when
    # it sets OMP_NUM_THREADS: the ranks' own lines say what happened.
    for name in ("torch.distributed", "torch.distributed.elastic", "torch.distributed.run"):
        logging.getLogger(name).setLevel(logging.CRITICAL)
    os.environ.setdefault("OMP_NUM_THREADS", "1")  # torchrun's default for N > 1, without its banner
    with tempfile.TemporaryDirectory(prefix="slipstream-errors-") as errors:
        os.environ[ERROR_DIR_ENV] = errors  # inherited by the ranks
        try:
            torchrun.run(torchrun.parse_args(torchrun_argv(nproc, max_restarts, overrides)))
            return 0
        except ChildFailedError as e:
            rank, failure = e.get_first_failure()
            line = first_error_line(Path(errors))
            if line is not None:
                print(line, file=sys.stderr, flush=True)
                return failure.exitcode if failure.exitcode in (2, EXIT_LOST_RANK) else 1
            if failure.exitcode < 0:  # killed by a signal: a lost rank
                name = signal.Signals(-failure.exitcode).name
                print(f"slipstream-train: error: rank {rank} was killed by {name} (out of memory, or "
                      "stopped from outside); checkpoints allow a rerun to continue. Fix: rerun the same "
                      "command, or add --max-restarts N to restart lost ranks", file=sys.stderr, flush=True)  # fmt: skip
                return EXIT_LOST_RANK
            print(f"slipstream-train: error: rank {rank} exited with code {failure.exitcode}; its "
                  "output above says why", file=sys.stderr, flush=True)  # fmt: skip
            return 1
        finally:
            os.environ.pop(ERROR_DIR_ENV, None)
