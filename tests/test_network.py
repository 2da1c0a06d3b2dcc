"""The emulated cluster of benchmarks/network.py: a shaped link carries its rate, nothing is left
behind, and the project trains across two namespaces through torchrun's multi-node launch.

Skipped, with the reason, where the machine cannot build it (no root, no ip/tc, no tbf)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from benchmarks import netns

ROOT = Path(__file__).resolve().parents[1]


def _skip_reason():
    why = netns.preflight()
    if why:
        return why
    try:
        with netns.Cluster(2, tag=f"{__import__('os').getpid()}t") as c:
            c.shape("50mbit")
    except netns.ClusterError as e:
        return str(e)
    return None


SKIP = _skip_reason()
needs_cluster = pytest.mark.skipif(SKIP is not None, reason=f"no emulated cluster here: {SKIP}")

SINK = "import socket,sys\ns=socket.socket();s.setsockopt(socket.SOL_SOCKET,socket.SO_REUSEADDR,1)\n" \
       "s.bind((sys.argv[1],int(sys.argv[2])));s.listen(1);print('ready',flush=True)\nc,_=s.accept();n=0\n" \
       "while True:\n  b=c.recv(1<<20)\n  if not b: break\n  n+=len(b)\nprint(n,flush=True)\n"
SOURCE = "import socket,sys\nc=socket.create_connection((sys.argv[1],int(sys.argv[2])))\n" \
         "c.sendall(b'x'*int(sys.argv[3]));c.close()\n"


@needs_cluster
def test_a_50mbit_link_carries_its_rate_and_nothing_is_left_behind():
    before = set(netns.ours())
    payload = 12_000_000  # about 2 s at 50 Mbit/s
    with netns.Cluster(2) as cluster:
        cluster.shape("50mbit")
        a, b = cluster.nodes
        sink = subprocess.Popen(["ip", "netns", "exec", b.ns, sys.executable, "-c", SINK, b.addr, "29700"],
                                stdout=subprocess.PIPE, text=True)
        assert sink.stdout.readline().strip() == "ready"
        tx0 = cluster.tx_bytes()[0]
        start = time.perf_counter()
        subprocess.run(["ip", "netns", "exec", a.ns, sys.executable, "-c", SOURCE, b.addr, "29700", str(payload)],
                       check=True, timeout=60)
        received = int(sink.stdout.readline())
        seconds = time.perf_counter() - start
        sink.wait(timeout=10)
        sent = cluster.tx_bytes()[0] - tx0
        names = set(netns.ours())
    assert received == payload
    assert sent >= payload  # the counter sees every byte, headers too
    rate = sent * 8 / seconds
    assert abs(rate - 50e6) <= 0.15 * 50e6, f"{rate / 1e6:.1f} Mbit/s over a 50mbit link"
    assert len(names - before) == 2  # the two nodes existed while it ran
    assert set(netns.ours()) == before, "namespaces left behind"
    out = subprocess.run(["ip", "link", "show"], capture_output=True, text=True).stdout
    assert "eth0@" not in out and "eth1@" not in out, "a veth end left in the root namespace"


@needs_cluster
def test_smoke_trains_on_two_nodes_across_the_namespaces(tmp_path):
    from benchmarks.network import Job, run_job

    before = set(netns.ours())
    with netns.Cluster(2) as cluster:
        cluster.shape("200mbit")
        job = Job("off", ["experiment=smoke", "trainer.max_steps=10", "trainer.eval_every_steps=0",
                          "trainer.checkpoint.enabled=false"])
        res = run_job(cluster, job, seed=0, run_dir=tmp_path / "run", timeout_s=300,
                      base=["trainer.progress_bar=false", "trainer.tensorboard=false"])
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["world_size"] == 2 and summary["steps"] == 10
    # one rank per node: the embedding all-to-alls crossed the link
    assert res["wire_bytes_per_sample"] > summary["a2a_bytes_per_sample"]["embedding"] / 2 > 0
    assert all(b > 0 for b in res["wire_bytes_per_node"])
    # each node's trainer read its own interface over the training steps: the wire agrees with
    # the program's count of what left the ranks (TCP/IP and Ethernet headers on top)
    wire = summary["wire"]
    assert wire["interfaces"] == ["eth0"] and wire["nodes_read"] == 2 and wire["steps"] == 10
    assert 1.0 <= wire["wire_over_program"] <= 1.08, wire
    assert res["wire_train"] == wire
    assert set(netns.ours()) == before


def test_a_seed_range_that_is_empty_or_negative_is_refused_in_one_line(capsys):
    if netns.preflight():
        pytest.skip(f"no emulated cluster here: {netns.preflight()}")
    from benchmarks.network import main

    for argv in (["--seeds", "0"], ["--first-seed", "-1"]):
        assert main([*argv, "--rates", "none"]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "give at least one seed" in err[0], err


def test_alternate_order_reverses_the_jobs_on_every_other_seed(monkeypatch, tmp_path):
    """--order alternate: seed 0 runs the jobs as given, seed 1 reversed, seed 2 as given; each
    run records its position. fixed (the default) keeps the order on every seed."""
    import benchmarks.network as network

    class FakeCluster:
        def __init__(self, nodes):
            pass

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def shape(self, rate):
            pass

    ran = []

    def fake_run(cluster, job, seed, run_dir, timeout_s, base, golden):
        ran.append((seed, job.name))
        return {"job": job.name, "seed": seed}

    monkeypatch.setattr(network.netns, "preflight", lambda: None)
    monkeypatch.setattr(network.netns, "remove_stale", lambda: [])
    monkeypatch.setattr(network.netns, "Cluster", FakeCluster)
    monkeypatch.setattr(network, "run_job", fake_run)
    monkeypatch.setattr(network, "summarize", lambda runs, jobs, rates, pair_with: {})
    monkeypatch.setattr(network, "figure", lambda *a: None)
    monkeypatch.setattr(network, "print_table", lambda *a: None)
    for order, expected in (
        ("alternate", [(0, "off"), (0, "on"), (1, "on"), (1, "off"), (2, "off"), (2, "on")]),
        ("fixed", [(0, "off"), (0, "on"), (1, "off"), (1, "on"), (2, "off"), (2, "on")]),
    ):
        ran.clear()
        out = tmp_path / f"{order}.json"
        argv = ["--rates", "none", "--seeds", "3", "--job", "off=slipstream=off", "--job", "on=",
                "--order", order, "--out", str(out)]
        assert network.main(argv) == 0
        assert ran == expected
        result = json.loads(out.read_text())
        assert result["order"] == order
        assert [(r["seed"], r["job"], r["position"]) for r in result["runs"]] == [
            (s, j, 0 if i % 2 == 0 else 1) for i, (s, j) in enumerate(expected)
        ]
