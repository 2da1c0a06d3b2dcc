"""An emulated cluster on one machine: network namespaces joined by shaped links.

Each node is a network namespace with one interface and an address 10.199.0.<i+1>/24. Two nodes
are joined by a veth pair; more by a bridge in a hub namespace (one veth pair per node, the hub
end on the bridge). Every node's egress is shaped with tc's token bucket (``tbf``; this kernel
has no ``netem``), so the rate is what each node can send. Everything lives inside namespaces
this module creates, named ``ssnet<pid>-...``; ``down`` deletes them (which deletes their
interfaces too), and ``remove_stale`` deletes those whose creating process is gone.

Needs root, ``ip`` and ``tc``; ``preflight`` says in one line what is missing.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from dataclasses import dataclass, field
from typing import Dict, List, Optional

PREFIX = "ssnet"
SUBNET = "10.199.0"  # addresses only inside the namespaces made here


class ClusterError(RuntimeError):
    """The emulated cluster cannot be built here (no root, no ip/tc, no tbf)."""


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    out = subprocess.run(["ip", *args], capture_output=True, text=True)
    if check and out.returncode != 0:
        raise ClusterError(f"ip {' '.join(args)}: {out.stderr.strip()}")
    return out


def preflight() -> Optional[str]:
    """Why this machine cannot emulate the cluster, or None."""
    if os.geteuid() != 0:
        return "needs root (it creates network namespaces and tc qdiscs); run it as root"
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            return f"needs `{tool}` (apt-get install iproute2)"
    return None


def rate_bits(rate: str) -> Optional[float]:
    """tc's rate string (e.g. 200mbit, 1gbit) in bits per second; None for ``none``."""
    if rate == "none":
        return None
    m = re.fullmatch(r"(\d+(?:\.\d+)?)(k|m|g)?bit", rate.strip().lower())
    if not m:
        raise ValueError(f"rate {rate!r}: use none or tc's form, e.g. 200mbit, 1gbit, 50mbit")
    return float(m.group(1)) * {None: 1, "k": 1e3, "m": 1e6, "g": 1e9}[m.group(2)]


def tbf_burst_bytes(bits: float) -> int:
    """The token bucket each shaped link gets: 10 ms of the rate, at least 256 KiB (tbf needs
    burst >= rate / HZ). A link that sat idle that long sends that much at the veth's own speed,
    which a real NIC does not: the step-time model counts it (benchmarks/step_model.py)."""
    return max(256 * 1024, int(bits / 8 / 100))


@dataclass
class Node:
    ns: str  # namespace
    dev: str  # its interface
    addr: str  # its address


@dataclass
class Cluster:
    """``nodes`` namespaces, linked; use as a context manager (``down`` also on failure)."""

    nodes_wanted: int = 2
    tag: str = field(default_factory=lambda: str(os.getpid()))
    nodes: List[Node] = field(default_factory=list)
    hub: Optional[str] = None
    _made: List[str] = field(default_factory=list)

    def __enter__(self) -> "Cluster":
        try:
            self.up()
        except BaseException:
            self.down()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.down()

    def _netns(self, name: str) -> str:
        _ip("netns", "add", name)
        self._made.append(name)
        _ip("-n", name, "link", "set", "lo", "up")
        return name

    def up(self) -> None:
        n = self.nodes_wanted
        if n < 2:
            raise ClusterError("an emulated cluster needs at least 2 nodes")
        if n > 2:
            self.hub = self._netns(f"{PREFIX}{self.tag}-hub")
            _ip("-n", self.hub, "link", "add", "br0", "type", "bridge")
            _ip("-n", self.hub, "link", "set", "br0", "up")
        for i in range(n):
            ns = self._netns(f"{PREFIX}{self.tag}-{i}")
            self.nodes.append(Node(ns=ns, dev=f"eth{i}", addr=f"{SUBNET}.{i + 1}"))
        if n == 2:
            a, b = self.nodes
            _ip("link", "add", "name", a.dev, "netns", a.ns, "type", "veth", "peer", "name", b.dev, "netns", b.ns)
        else:
            for node in self.nodes:
                _ip("link", "add", "name", node.dev, "netns", node.ns, "type", "veth", "peer", "name",
                    f"p{node.dev}", "netns", self.hub)  # fmt: skip
                _ip("-n", self.hub, "link", "set", f"p{node.dev}", "master", "br0")
                _ip("-n", self.hub, "link", "set", f"p{node.dev}", "up")
        for node in self.nodes:
            _ip("-n", node.ns, "addr", "add", f"{node.addr}/24", "dev", node.dev)
            _ip("-n", node.ns, "link", "set", node.dev, "up")

    def shape(self, rate: str) -> None:
        """Every node's egress at ``rate`` (tc's form), or unshaped for ``none``."""
        bits = rate_bits(rate)
        for node in self.nodes:
            tc = ["ip", "netns", "exec", node.ns, "tc", "qdisc"]
            subprocess.run([*tc, "del", "dev", node.dev, "root"], capture_output=True)  # none yet: fine
            if bits is None:
                continue
            burst = tbf_burst_bytes(bits)
            out = subprocess.run([*tc, "add", "dev", node.dev, "root", "tbf", "rate", rate, "burst", str(burst),
                                  "latency", "100ms"], capture_output=True, text=True)  # fmt: skip
            if out.returncode != 0:
                raise ClusterError(f"tc cannot add a tbf qdisc here ({out.stderr.strip()}); the kernel lacks sch_tbf?")

    def tx_bytes(self) -> List[int]:
        """Bytes each node's interface has sent (the kernel's counters: every packet, headers too)."""
        out = []
        for node in self.nodes:
            info = json.loads(_ip("-n", node.ns, "-j", "-s", "link", "show", "dev", node.dev).stdout)
            out.append(int(info[0]["stats64"]["tx"]["bytes"]))
        return out

    def down(self) -> None:
        """Delete every namespace made here (their interfaces and qdiscs go with them)."""
        while self._made:
            _ip("netns", "del", self._made.pop(), check=False)
        self.nodes = []
        self.hub = None


def ours() -> List[str]:
    """The namespaces of this module present on the machine (any process's)."""
    out = _ip("netns", "list", check=False).stdout.split("\n")
    return [line.split()[0] for line in out if line.startswith(PREFIX)]


def remove_stale() -> List[str]:
    """Delete the namespaces of this module whose creating process is gone (a run killed by
    SIGKILL cannot clean up after itself); returns their names."""
    removed = []
    for name in ours():
        m = re.match(rf"{PREFIX}(\d+)-", name)
        if m and not os.path.exists(f"/proc/{m.group(1)}"):
            _ip("netns", "del", name, check=False)
            removed.append(name)
    return removed


def node_env(node: Node) -> Dict[str, str]:
    """What a process in ``node`` needs for gloo: bind to the node's interface."""
    return {"GLOO_SOCKET_IFNAME": node.dev}
