"""Multi-process gloo harness, in the manner of TorchRec's MultiProcessTestBase.

``run_workers(fn, world_size, **kwargs)`` starts ``world_size`` spawned processes that form a
gloo process group on a free localhost port, calls ``fn(env, **kwargs)`` in each and returns the
results in rank order. A failure in any rank raises here with that rank's traceback.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import queue
import socket
import traceback
from typing import Any, Callable, List


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _worker(rank: int, world_size: int, port: int, fn: Callable[..., Any], kwargs: dict, out: Any) -> None:
    os.environ.update(
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        RANK=str(rank),
        WORLD_SIZE=str(world_size),
        LOCAL_RANK=str(rank),
        LOCAL_WORLD_SIZE=str(world_size),
        OMP_NUM_THREADS="1",
    )
    try:
        import torch

        torch.set_num_threads(1)
        from slipstream_rec.distributed import close_distributed, init_distributed

        env = init_distributed("cpu", timeout_s=120)
        try:
            result = fn(env, **kwargs)
        finally:
            close_distributed()
        out.put((rank, "ok", result))
    except BaseException:  # noqa: BLE001 - report every failure to the parent
        out.put((rank, "error", traceback.format_exc()))


def run_workers(fn: Callable[..., Any], world_size: int = 2, timeout_s: float = 300.0, **kwargs: Any) -> List[Any]:
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    port = _free_port()
    procs = [
        ctx.Process(target=_worker, args=(rank, world_size, port, fn, kwargs, out), daemon=True)
        for rank in range(world_size)
    ]
    for p in procs:
        p.start()
    results: dict[int, Any] = {}
    errors: List[str] = []
    try:
        for _ in range(world_size):
            rank, status, payload = out.get(timeout=timeout_s)
            if status == "ok":
                results[rank] = payload
            else:
                errors.append(f"rank {rank} failed:\n{payload}")
                break  # the other ranks may be stuck in a collective: stop them below
    except queue.Empty:
        errors.append(f"timed out after {timeout_s}s waiting for ranks {sorted(set(range(world_size)) - set(results))}")
    finally:
        for p in procs:
            p.join(timeout=5 if not errors else 0.5)
            if p.is_alive():
                p.terminate()
    if errors:
        raise AssertionError("\n".join(errors))
    return [results[r] for r in range(world_size)]
