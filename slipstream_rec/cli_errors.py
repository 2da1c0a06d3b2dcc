"""The one place where the command-line tools turn a bad input into one line and exit code 2.

The project's errors for a bad config value, a missing path or an unreadable input are
``ValueError``s (``ConfigError`` among them) and ``OSError``s (``FileNotFoundError``) whose
message names the key or file and the fix. ``run_cli`` prints such an error as one line,
``<prog>: error: <message>``, and returns 2; ``--debug`` or ``HYDRA_FULL_ERROR=1`` (Hydra's own
switch) re-raises it instead, with the traceback. An error raised outside this package (a
library's ``ValueError``) gets the same one line plus where it came from and the ``--debug``
hint, since its message was not written to stand alone.

Every rank prints its own line: under torchrun, the first rank to exit makes the agent stop
the others, so a line printed only by rank 0 could be lost. Under ``slipstream-train --nproc N``
(``slipstream_rec.launcher``) each rank writes its line into the launcher's error directory
instead, and the launcher prints one of them: one line, however many ranks.
"""

from __future__ import annotations

import os
import sys
import time
import traceback
from pathlib import Path
from typing import Callable, Tuple

# Bad input, as the project reports it: a config value or data value (ValueError, ConfigError),
# or a path that is missing or unreadable (FileNotFoundError, PermissionError, ...).
USER_ERRORS = (ValueError, OSError)
EXIT_BAD_INPUT = 2
_PACKAGE_DIR = Path(__file__).resolve().parent


def wants_traceback(debug: bool = False) -> bool:
    """``--debug`` or ``HYDRA_FULL_ERROR=1``: show tracebacks instead of one-line errors."""
    return debug or os.environ.get("HYDRA_FULL_ERROR", "") == "1"


def _raised_in_package(error: BaseException) -> bool:
    """Whether the innermost frame of the traceback is in this package's code."""
    frames = traceback.extract_tb(error.__traceback__)
    if not frames:
        return True
    try:
        Path(frames[-1].filename).resolve().relative_to(_PACKAGE_DIR)
        return True
    except ValueError:
        return False


def one_line(error: BaseException) -> str:
    """The error's message on one line (whitespace runs, newlines included, become one space)."""
    text = " ".join(str(error).split())
    if not text:
        text = type(error).__name__
    if isinstance(error, OSError) and not isinstance(error, FileNotFoundError) and error.filename:
        text = text if str(error.filename) in text else f"{text}: {error.filename}"
    if not _raised_in_package(error):
        where = traceback.extract_tb(error.__traceback__)[-1]
        text += (
            f" ({type(error).__name__} raised in {Path(where.filename).name}:{where.lineno}; "
            "rerun with --debug for the traceback)"
        )
    return text


# Set by slipstream_rec.launcher for the ranks it starts: where each rank leaves its error line.
ERROR_DIR_ENV = "SLIPSTREAM_ERROR_DIR"


def emit_error_line(line: str) -> None:
    """Print ``line`` on stderr, or, for a rank of ``slipstream-train --nproc``, leave it (with
    the time, so that the launcher shows the first) for the launcher to print once."""
    directory = os.environ.get(ERROR_DIR_ENV)
    if not directory:
        print(line, file=sys.stderr, flush=True)
        return
    path = Path(directory) / f"rank{os.environ.get('RANK', '0')}.err"
    tmp = path.with_suffix(".tmp")
    tmp.write_text(f"{time.time_ns()}\t{line}\n")
    tmp.replace(path)


def print_error(prog: str, error: BaseException) -> None:
    emit_error_line(f"{prog}: error: {one_line(error)}")


def run_cli(prog: str, body: Callable[[], int], debug: bool = False, also: Tuple[type, ...] = ()) -> int:
    """``body()``'s exit code; a bad-input error (``USER_ERRORS`` and ``also``) is one line on
    stderr and exit code 2."""
    try:
        return body()
    except USER_ERRORS + also as e:
        if wants_traceback(debug):
            raise
        print_error(prog, e)
        return EXIT_BAD_INPUT
