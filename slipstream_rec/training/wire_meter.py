"""The bytes the node's network interface sent while it trained: the kernel's count, to set beside
the program's own (``off_rank_bytes_per_sample``), over the same steps.

The network benchmark (benchmarks/network.py) can read each node's counter only around a whole
job, setup, evaluations and the test pass included; those are not training traffic, and at dim 128
they are a sixth of what the wire carries. The trainer knows where its training steps begin and
end, so the meter reads the counter there and pauses over evaluations and checkpoints.

What the counter holds: every frame the interface sent (Ethernet, IP and TCP headers, the ACKs of
what the node received, any other process's traffic through it). What it misses: RDMA (NCCL over
InfiniBand or RoCE bypasses the kernel's interfaces), and traffic on other interfaces.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional

import torch

from slipstream_rec.distributed import all_reduce_

SYS_NET = Path("/sys/class/net")


def _names(value: str) -> List[str]:
    return [n.strip() for n in value.split(",") if n.strip()]


def resolve_interfaces(setting: str, environ: Optional[Dict[str, str]] = None, root: Path = SYS_NET) -> List[str]:
    """The interfaces ``trainer.wire_interface`` names on this node ([]: no metering).

    ``auto``: those gloo binds to (``GLOO_SOCKET_IFNAME``, a comma-separated list), else those of
    ``NCCL_SOCKET_IFNAME`` when it lists exact names (not NCCL's ``^``/``=`` prefix forms); none
    when neither is set (one node over loopback has no wire). ``none``: off. Anything else: a
    comma-separated list of interface names, each of which must exist here.
    """
    env = os.environ if environ is None else environ
    if setting == "none":
        return []
    if setting == "auto":
        for var in ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME"):
            names = _names(env.get(var, ""))
            if names and all((root / n).is_dir() for n in names):
                return names
        return []
    names = _names(setting)
    missing = [n for n in names if not (root / n / "statistics" / "tx_bytes").is_file()]
    if not names or missing:
        have = sorted(p.name for p in root.iterdir()) if root.is_dir() else []
        raise ValueError(
            f"trainer.wire_interface={setting!r}: no interface {', '.join(missing) or '(empty)'} on this node "
            f"(it has: {', '.join(have) or 'none'}); name one of them, or set auto or none"
        )
    return names


class WireMeter:
    """Bytes sent through ``interfaces`` while the meter runs; one reader per node.

    The counter belongs to the node, so only local rank 0 reads it (``reads``): ranks sharing a
    node would count its bytes once each. ``resume``/``pause`` bracket the training loop of an
    epoch; ``paused()`` leaves out what runs inside it (evaluations, checkpoints). Reading is one
    small file per edge: no device work, nothing inside a step.
    """

    def __init__(self, interfaces: List[str], reads: bool, root: Path = SYS_NET) -> None:
        self.interfaces = list(interfaces)
        self.reads = bool(interfaces) and reads
        self.root = root
        self.tx_bytes = 0
        self.steps = 0  # training steps run while metered (this attempt)
        self._since: Optional[int] = None  # the counter when the meter last resumed

    @classmethod
    def from_config(cls, setting: str, local_rank: int) -> "WireMeter":
        return cls(resolve_interfaces(setting), reads=local_rank == 0)

    def _read(self) -> int:
        return sum(int((self.root / n / "statistics" / "tx_bytes").read_text()) for n in self.interfaces)

    @property
    def running(self) -> bool:
        return self._since is not None

    def resume(self) -> None:
        if self.reads and self._since is None:
            self._since = self._read()

    def pause(self) -> None:
        if self._since is not None:
            self.tx_bytes += self._read() - self._since
            self._since = None

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """Leave out what runs inside (an evaluation, a checkpoint); resumes only if it ran."""
        was = self.running
        self.pause()
        try:
            yield
        finally:
            if was:
                self.resume()

    def summary(self, samples_per_step: int, program: Optional[Dict[str, float]]) -> Dict[str, Any]:
        """Every node's bytes, summed (collective: all ranks; a rank that does not read adds 0).

        ``program``: the program's off-rank bytes per trained sample by kind (its ``total`` is set
        beside the wire's). The two cover the same steps unless the run resumed (the program's
        count is the whole run's, the meter's this attempt's).
        """
        with self.paused():  # the bytes so far, the collective's own left out
            values = torch.tensor([float(self.tx_bytes), float(self.reads)], dtype=torch.float64)
            all_reduce_(values)  # all ranks, once, at the end of training (gloo's side group under nccl)
        tx, readers = values.tolist()
        if not readers:
            return {"interfaces": None, "reason": "no interface to read (trainer.wire_interface; one node has no wire)"}
        samples = self.steps * samples_per_step
        per_sample = tx / samples if samples else None
        prog = (program or {}).get("total")
        return {
            "interfaces": self.interfaces,
            "nodes_read": int(readers),
            "steps": self.steps,
            "tx_bytes": int(tx),
            "bytes_per_sample": round(per_sample, 1) if per_sample is not None else None,
            "program_off_rank_bytes_per_sample": round(prog, 1) if prog is not None else None,
            # > 1: the wire carried more than the program counted (headers, ACKs, small collectives
            # the program leaves out: lock-step, logging, barriers)
            "wire_over_program": round(per_sample / prog, 4) if per_sample and prog else None,
        }
