"""One run directory, one job: ``<run_dir>/run.lock`` says which process trains into it.

Two jobs writing one run directory would interleave their checkpoints and TensorBoard events
and leave one job's ``metrics.jsonl``. Rank 0 of a job holds an exclusive ``flock`` on the lock
file for the whole run; the file names the holder (pid, host, job token). The kernel drops the
lock when the holder dies, however it dies, so a lock left by a killed run is stale by
construction: the next run takes it over, with a note. The job token is the same on every rank
and across elastic restarts of one job (the launcher's, or torchrun's run id), so a job never
refuses its own lock: ``slipstream-train --nproc`` holds it in the launcher for its ranks.
"""

from __future__ import annotations

import errno
import fcntl
import os
import socket
from pathlib import Path
from typing import Dict, Optional

LOCK_NAME = "run.lock"
# Set by slipstream-train --nproc for the ranks it starts: they belong to the launcher's lock.
TOKEN_ENV = "SLIPSTREAM_JOB_TOKEN"

_held: Dict[Path, int] = {}  # run_dir -> descriptor of the lock file this process holds


def job_token() -> str:
    """The same string on every rank of one job, different for another job."""
    token = os.environ.get(TOKEN_ENV)
    if token:
        return token
    run_id = os.environ.get("TORCHELASTIC_RUN_ID", "")
    if run_id not in ("", "none"):  # torchrun --standalone / --rdzv-id, TorchX: one per job
        return f"torchelastic:{run_id}"
    return f"pid:{os.getpid()}@{socket.gethostname()}"


def _holder(path: Path) -> Dict[str, str]:
    try:
        words = path.read_text().split()
    except OSError:
        return {}
    return dict(w.split("=", 1) for w in words if "=" in w)


def _in_use(run_dir: Path, holder: Dict[str, str]) -> ValueError:
    lock = run_dir / LOCK_NAME
    return ValueError(
        f"trainer.run_dir={run_dir} is in use by pid {holder.get('pid', '?')} on "
        f"{holder.get('host', '?')} (another run trains into it; {lock} is locked). Fix: wait "
        "for that run to end, or choose another trainer.run_dir"
    )


def _try_lock(fd: int, mode: int) -> bool:
    try:
        fcntl.flock(fd, mode | fcntl.LOCK_NB)
        return True
    except OSError as e:
        if e.errno in (errno.EAGAIN, errno.EACCES):
            return False
        raise


def check_free(run_dir: Path) -> None:
    """Raise the in-use error if another job holds ``run_dir``; writes nothing."""
    lock = run_dir / LOCK_NAME
    try:
        fd = os.open(lock, os.O_RDONLY)
    except FileNotFoundError:
        return
    try:
        holder = _holder(lock)
        if holder.get("token") != job_token() and not _try_lock(fd, fcntl.LOCK_SH):
            raise _in_use(run_dir, holder)
    finally:
        os.close(fd)  # also drops the shared lock taken to test


def acquire(run_dir: Path) -> Optional[str]:
    """Take the lock of ``run_dir`` (created if missing) for this process; a note if it took
    over the lock of a run that is gone, else None. Raises the in-use error."""
    run_dir.mkdir(parents=True, exist_ok=True)
    lock = run_dir / LOCK_NAME
    while True:
        fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
        holder = _holder(lock)
        if not _try_lock(fd, fcntl.LOCK_EX):
            os.close(fd)
            if holder.get("token") == job_token():
                return None  # the launcher of this job holds it for its ranks
            raise _in_use(run_dir, holder)
        try:
            same_file = os.stat(lock).st_ino == os.fstat(fd).st_ino
        except FileNotFoundError:
            same_file = False
        if same_file:  # not a file its holder removed while we waited to open it
            break
        os.close(fd)
    holder = _holder(lock)  # read under the lock: what the last holder left
    me = f"pid={os.getpid()} host={socket.gethostname()} token={job_token()}\n"
    os.ftruncate(fd, 0)
    os.pwrite(fd, me.encode(), 0)
    _held[run_dir] = fd
    if holder and holder.get("token") != job_token():
        return (
            f"took over {lock} from pid {holder.get('pid', '?')} on {holder.get('host', '?')}, "
            "which no longer holds it (that run ended without releasing it)"
        )
    return None


def release(run_dir: Path) -> None:
    """Drop the lock this process holds on ``run_dir`` (no-op otherwise); removes the run
    directory again if the lock file was all it held (a start refused after the lock)."""
    fd = _held.pop(run_dir, None)
    if fd is None:
        return
    try:
        (run_dir / LOCK_NAME).unlink()
    except FileNotFoundError:
        pass
    os.close(fd)
    try:
        run_dir.rmdir()  # only if empty
    except OSError:
        pass
