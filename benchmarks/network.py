"""The network where Slipstream pays: jobs on an emulated multi-node cluster, every byte counted.

Builds ``--nodes`` network namespaces on this machine (benchmarks/netns.py: a veth pair for 2,
a bridge for more; addresses 10.199.0.x inside them only), one rank in each, and runs every job
at every link rate (``--rates``, tc's tbf on each node's egress; ``none`` unshaped) and seed
through the real multi-node launch: ``python -m torch.distributed.run --nnodes N
--nproc_per_node 1`` with the c10d rendezvous on the first node's address and gloo bound to the
node's interface (``GLOO_SOCKET_IFNAME``). The bytes each node sent are read from its
interface's counters around the run (every collective, setup and evaluation included, TCP/IP
headers too) and printed beside the program's own count (summary.json a2a_bytes_per_sample);
each trainer also reads its node's counter over its training steps alone (summary.json ``wire``,
training/wire_meter.py), which covers the same steps as the program's count.
Everything it made is removed at the end, on failure and on Ctrl-C / SIGTERM too.

A job is a name and Hydra overrides (``--job NAME=OVERRIDES``, given after ``--base``), or
TorchRec's golden loop (``--job golden=golden``, benchmarks/torchrec_golden_loop.py, with the
base's data, batch and model sizes; ``golden --qcomms fp16:bf16`` adds TorchRec's quantized
comms, through TorchRec's own registry: on a CPU it sends the bf16 gradients as fp16, where the
project's ``sharding.qcomms.backward=bf16`` sends bf16; the bytes are the same). Runs of one seed
are paired: the same data, the same seed.

Writes a results JSON (``--out``): the command, every run, a table per job and rate (train s,
samples/s, wire bytes per trained sample, the program's count, paired test AUC against
``--pair-with``), off's communication share per rate (1 - unshaped time / shaped time), and a
figure (samples/s against link rate per job, each job's unshaped rate as its ceiling).

    .venv/bin/python benchmarks/network.py --rates none,200mbit --seeds 1 --progress \
        --job off="slipstream=off trainer.precision=fp32" \
        --job off+qcomms="slipstream=off trainer.precision=fp32 sharding.qcomms.forward=fp16 sharding.qcomms.backward=bf16 trainer.ddp_comm_hook=bf16"

Without root, ``ip``/``tc`` or ``tbf`` it says so in one line and exits 2.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks import netns  # noqa: E402
from benchmarks._runner import ROOT, auc_difference, fmt_cell, in_turn  # noqa: E402

DEFAULT_BASE = "experiment=clicklog_quick trainer.progress_bar=false trainer.tensorboard=false trainer.checkpoint.enabled=false"
OFF = "slipstream=off trainer.precision=fp32"
QCOMMS = "sharding.qcomms.forward=fp16 sharding.qcomms.backward=bf16 trainer.ddp_comm_hook=bf16"  # the GPU's pair, bf16 on gloo too
DEFAULT_JOBS = [
    "golden=golden",
    "golden+qcomms=golden --qcomms fp16:bf16",
    f"off={OFF}",
    f"off+qcomms={OFF} {QCOMMS}",
    "defaults=",
]


@dataclass
class Job:
    name: str
    overrides: List[str] = field(default_factory=list)  # Hydra overrides, or golden's arguments

    @property
    def golden(self) -> bool:
        return bool(self.overrides) and self.overrides[0] == "golden"

    @classmethod
    def parse(cls, spec: str) -> "Job":
        name, sep, rest = spec.partition("=")
        if not sep or not name:
            raise ValueError(f"--job {spec!r}: use NAME=OVERRIDES (e.g. off=\"slipstream=off\"), or NAME=golden")
        return cls(name, shlex.split(rest))


_PORT = [29600]


def _launch(node: netns.Node, first: netns.Node, nodes: int, run_id: str, target: List[str], log: Path) -> subprocess.Popen:
    """One node's torchrun, inside its namespace (its own process group, to stop it whole)."""
    cmd = [
        "ip", "netns", "exec", node.ns, "env", *(f"{k}={v}" for k, v in netns.node_env(node).items()),
        f"PYTHONPATH={ROOT}", "OMP_NUM_THREADS=1",
        sys.executable, "-m", "torch.distributed.run", "--nnodes", str(nodes), "--nproc_per_node", "1",
        "--rdzv_backend", "c10d", "--rdzv_endpoint", f"{first.addr}:{_PORT[0]}", "--rdzv_id", run_id,
        "--local_addr", node.addr,
        # the first node hosts the rendezvous store: torchrun matches the endpoint against the
        # machine's hostname, which is the same in every namespace, so say it
        "--rdzv_conf", f"is_host={int(node is first)}", *target,
    ]  # fmt: skip
    return subprocess.Popen(cmd, cwd=ROOT, stdout=log.open("w"), stderr=subprocess.STDOUT, start_new_session=True)


def _stop(procs: List[subprocess.Popen]) -> None:
    for p in procs:
        if p.poll() is None:
            try:
                os.killpg(p.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
    for p in procs:
        try:
            p.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()


def dataset_and_model(base: List[str]) -> Dict[str, Any]:
    """The npy directory (generated once, here, not inside a timed run) and what golden needs."""
    from slipstream_rec.config import load_config
    from slipstream_rec.data.datasets import ensure_dataset

    job = load_config(base)
    return {
        "data": str(ensure_dataset(job.data)),
        "batch_size": job.trainer.batch_size,
        "dense": job.model.dense_arch_layer_sizes,
        "over": job.model.over_arch_layer_sizes,
        "dim": job.model.embedding_dim,
    }


def run_job(cluster: netns.Cluster, job: Job, seed: int, run_dir: Path, timeout_s: float = 3600.0,
            base: Optional[List[str]] = None, golden: Optional[Dict[str, Any]] = None) -> Dict[str, Any]:
    """One run of ``job`` on every node of ``cluster``; its result with the bytes on the wire."""
    base = list(base if base is not None else shlex.split(DEFAULT_BASE))
    run_dir.mkdir(parents=True, exist_ok=True)
    _PORT[0] += 1  # a fresh rendezvous port per run (no TIME_WAIT clash with the last)
    if job.golden:
        g = golden or dataset_and_model(base)
        target = [
            "benchmarks/torchrec_golden_loop.py", "--data", g["data"], "--steps", "0", "--test",
            "--batch-size", str(g["batch_size"]), "--sharding", "auto", "--seed", str(seed),
            "--dense-arch", ",".join(map(str, g["dense"])), "--over-arch", ",".join(map(str, g["over"])),
            "--embedding-dim", str(g["dim"]), *job.overrides[1:],
        ]  # fmt: skip
    else:
        target = ["-m", "slipstream_rec.train", *base, *job.overrides, f"trainer.seed={seed}",
                  f"trainer.run_dir={run_dir}"]  # fmt: skip
    logs = [run_dir / f"node{i}.log" for i in range(len(cluster.nodes))]
    tx0 = cluster.tx_bytes()
    start = time.perf_counter()
    run_id = f"{job.name}-{seed}-{os.getpid()}-{_PORT[0]}".replace("+", "_")
    procs = [_launch(node, cluster.nodes[0], len(cluster.nodes), run_id, target, log)
             for node, log in zip(cluster.nodes, logs)]  # fmt: skip
    try:
        deadline = time.monotonic() + timeout_s
        while any(p.poll() is None for p in procs):
            if any(p.returncode not in (None, 0) for p in procs) or time.monotonic() > deadline:
                break
            time.sleep(0.5)
    finally:
        _stop(procs)  # on every way out: the nodes' trainers never outlive the run
    wall = time.perf_counter() - start
    failed = [i for i, p in enumerate(procs) if p.returncode != 0]
    if failed:
        tail = logs[failed[0]].read_text()[-3000:]
        raise RuntimeError(f"{job.name} (seed {seed}) failed on node {failed[0]}; its log {logs[failed[0]]} ends:\n{tail}")
    tx = [b - a for a, b in zip(tx0, cluster.tx_bytes())]
    if job.golden:
        lines = [ln for log in logs for ln in log.read_text().splitlines() if ln.startswith('{"runner"')]
        res = json.loads(lines[-1])
        samples, program, off_rank = res["samples"], None, None
    else:
        res = json.loads((run_dir / "summary.json").read_text())
        samples, program = res["samples_trained"], res["a2a_bytes_per_sample"]
        off_rank = res.get("off_rank_bytes_per_sample")
    return {
        "job": job.name, "seed": seed, "wall_seconds": round(wall, 1),
        "train_seconds": res["train_seconds"], "samples_trained": samples,
        # every rank's process CPU seconds in training, summed: the work done; ranks x train s less
        # it is the time the ranks waited (on the link, on each other)
        "train_cpu_seconds": res.get("train_cpu_seconds"),
        "samples_per_second": samples / res["train_seconds"], "test_auc": res.get("test_auc"),
        "wire_bytes_per_node": tx, "wire_bytes_per_sample": sum(tx) / samples if samples else None,
        "program_bytes_per_sample": program,
        "program_off_rank_bytes_per_sample": off_rank,
        # the trainer's own reading of each node's counter over its training steps (ours only)
        "wire_train": None if job.golden else res.get("wire"),
        "qcomms": res.get("qcomms"), "ddp_comm_hook": res.get("ddp_comm_hook"),
        "sharding_types": sorted(set(res["sharding_plan"].values())) if isinstance(res.get("sharding_plan"), dict)
        else res.get("sharding"),
        "sharding_plan": res.get("sharding_plan") if isinstance(res.get("sharding_plan"), dict) else None,
        # what the levers chose and why (ours only): precision, serving's decisions, downsampling
        "precision": res.get("precision"), "serve_lever": res.get("serve_lever"),
        "served_fraction": res.get("served_fraction"),
        # what the step-time model reads (benchmarks/step_model.py)
        "steps": res.get("steps"), "world_size": res.get("world_size"), "slots_fraction": res.get("slots_fraction"),
        "row_wise_bytes_per_sample": res.get("row_wise_bytes_per_sample"), "replica": res.get("replica"),
        "negative_downsampling_rate": (res.get("negative_downsampling") or {}).get("rate"),
        "time_breakdown_rank0": res.get("time_breakdown_rank0"),
        # Slipstream's own host seconds by part, rank 0's (count, snapshot,
        # sync, push, serve, ...): where its share of time_breakdown_rank0 goes
        "slipstream_seconds": (res.get("slipstream") or {}).get("seconds"),
    }  # fmt: skip


def _train_wire(mine: List[Dict[str, Any]], off: List[Dict[str, float]]) -> Dict[str, Any]:
    per = [(m.get("wire_train") or {}).get("bytes_per_sample") for m in mine]
    if not per or any(p is None for p in per):
        return {"wire_train_bytes_per_sample": None, "wire_train_over_program": None,
                "wire_train_minus_dense_bytes_per_sample": None}  # fmt: skip
    wire = statistics.mean(per)
    prog = statistics.mean(o["total"] for o in off) if off else None
    dense = statistics.mean(o["dense"] + o["data_parallel"] for o in off) if off else None
    return {
        "wire_train_bytes_per_sample": wire,
        "wire_train_over_program": wire / prog if prog else None,
        "wire_train_minus_dense_bytes_per_sample": wire - dense if dense is not None else None,
    }


def summarize(runs: List[Dict[str, Any]], jobs: List[str], rates: List[str], pair_with: str) -> Dict[str, Any]:
    """The table (per job and rate: means over seeds, paired AUC) and off's communication share."""
    def pick(job: str, rate: str) -> List[Dict[str, Any]]:
        return [r for r in runs if r["job"] == job and r["rate"] == rate]

    table = []
    for job in jobs:
        for rate in rates:
            mine = pick(job, rate)
            if not mine:
                continue
            ref = {r["seed"]: r for r in pick(pair_with, rate)}
            paired = [auc_difference(m, ref[m["seed"]]) for m in mine  # paired by seed
                      if m["seed"] in ref and m["test_auc"] is not None and ref[m["seed"]]["test_auc"] is not None]
            prog = [m["program_bytes_per_sample"]["total"] for m in mine if m["program_bytes_per_sample"]]
            off = [m["program_off_rank_bytes_per_sample"] for m in mine if m.get("program_off_rank_bytes_per_sample")]
            table.append({
                "job": job, "rate": rate, "seeds": len(mine),
                "train_seconds": statistics.mean(m["train_seconds"] for m in mine),
                "train_cpu_seconds": statistics.mean(cpu) if (cpu := [m.get("train_cpu_seconds") for m in mine])
                and None not in cpu else None,
                "samples_per_second": statistics.mean(m["samples_per_second"] for m in mine),
                "wire_bytes_per_sample": statistics.mean(m["wire_bytes_per_sample"] for m in mine),
                "program_bytes_per_sample": statistics.mean(prog) if prog else None,
                # what leaves the ranks by the program's count, by kind (means over seeds), and the
                # wire less the dense and data-parallel all-reduces' estimate: the embedding side
                "program_off_rank_bytes_per_sample": {k: statistics.mean(o[k] for o in off) for k in off[0]} if off else None,
                "wire_minus_dense_bytes_per_sample": statistics.mean(m["wire_bytes_per_sample"] for m in mine)
                - statistics.mean(o["dense"] + o["data_parallel"] for o in off) if off else None,
                # the wire over the training steps only (the trainer's meter): the same steps as the
                # program's count, so the two should agree; less the dense estimate, the embedding side
                **_train_wire(mine, off),
                "test_auc": statistics.mean(m["test_auc"] for m in mine if m["test_auc"] is not None)
                if any(m["test_auc"] is not None for m in mine) else None,
                f"paired_auc_vs_{pair_with}": statistics.mean(paired) if paired and job != pair_with else None,
            })  # fmt: skip
    share = {}
    unshaped = pick(pair_with, "none")
    for rate in rates:
        shaped = pick(pair_with, rate)
        if rate != "none" and unshaped and shaped:
            t0 = statistics.mean(r["train_seconds"] for r in unshaped)
            share[rate] = 1 - t0 / statistics.mean(r["train_seconds"] for r in shaped)
    return {"table": table, "communication_share": {"job": pair_with, "by_rate": share}}


def figure(summary: Dict[str, Any], rates: List[str], path: Path) -> None:
    """samples/s against link rate per job, its unshaped rate as a dashed ceiling."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    shaped = sorted((r for r in rates if r != "none"), key=lambda r: netns.rate_bits(r) or 0)
    by_job: Dict[str, Dict[str, float]] = {}
    for row in summary["table"]:
        by_job.setdefault(row["job"], {})[row["rate"]] = row["samples_per_second"]
    for i, (job, pts) in enumerate(by_job.items()):
        color = f"C{i}"
        xs = [netns.rate_bits(r) / 1e6 for r in shaped if r in pts]
        ax.plot(xs, [pts[r] for r in shaped if r in pts], "o-", color=color, label=job)
        if "none" in pts:
            ax.axhline(pts["none"], color=color, linestyle="--", linewidth=0.8)
    share = summary["communication_share"]["by_rate"]
    for r, s in share.items():
        ax.annotate(f"{summary['communication_share']['job']} comm {s:.0%}", (netns.rate_bits(r) / 1e6, 0),
                    xycoords=("data", "axes fraction"), textcoords="offset points", xytext=(0, 6), fontsize=7, ha="center")
    if shaped:
        ax.set_xscale("log")
    ax.set_xlabel("link rate per node, Mbit/s (dashed: unshaped)")
    ax.set_ylabel("trained samples / s")
    ax.set_title(f"{len(summary.get('nodes', [])) or ''} emulated nodes, one rank each")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def print_table(summary: Dict[str, Any], pair_with: str) -> None:
    key = f"paired_auc_vs_{pair_with}"
    print(f"{'job':<16} {'rate':<8} {'train s':>8} {'CPU s':>7} {'samples/s':>10} {'wire B/s.':>10} {'program B/s.':>12} "
          f"{'off-rank B/s.':>13} {'wire-dense':>10} {'train wire':>10} {'/program':>8} {'t.w.-dense':>10} "
          f"{'test AUC':>9} {'paired':>8}")  # fmt: skip
    for row in summary["table"]:
        prog, off = row["program_bytes_per_sample"], row.get("program_off_rank_bytes_per_sample")
        emb = row.get("wire_minus_dense_bytes_per_sample")
        off_total = None if off is None else off["total"]
        auc, paired = row["test_auc"], row[key]
        print(f"{row['job']:<16} {row['rate']:<8} {row['train_seconds']:>8.1f} "
              f"{fmt_cell(row.get('train_cpu_seconds'), '.1f', 7)} {row['samples_per_second']:>10.0f} "
              f"{row['wire_bytes_per_sample']:>10.0f} {'' if prog is None else f'{prog:.0f}':>12} "
              f"{'' if off_total is None else f'{off_total:.0f}':>13} "
              f"{'' if emb is None else f'{emb:.0f}':>10} {fmt_cell(row.get('wire_train_bytes_per_sample'), '.0f', 10)} "
              f"{fmt_cell(row.get('wire_train_over_program'), '.3f', 8)} "
              f"{fmt_cell(row.get('wire_train_minus_dense_bytes_per_sample'), '.0f', 10)} "
              f"{'' if auc is None else f'{auc:.4f}':>9} {'' if paired is None else f'{paired:+.4f}':>8}")  # fmt: skip
    for rate, s in summary["communication_share"]["by_rate"].items():
        print(f"{pair_with}'s communication share at {rate}: {s:.1%} (1 - unshaped time / shaped time)")
    print("CPU s: every rank's process CPU seconds in training, summed. wire B/sample: every byte "
          "the nodes' interfaces sent (setup, evaluation and TCP/IP headers included) over trained samples; "
          "program B/sample: summary.json's count, every rank's sends including the share a rank sends itself, "
          "training collectives only; off-rank B/sample: the same less each rank's share to itself "
          "(summary.json off_rank_bytes_per_sample: a 2-rank all-to-all keeps half, gloo's ring all-reduce "
          "sends 2(W-1)/W of its buffer); wire-dense: the wire less the off-rank dense and data-parallel "
          "all-reduces, the embedding side on the wire. The wire also carries evaluation, setup and TCP/IP "
          "headers. train wire: the trainer's own reading of each node's counter over its "
          "training steps (summary.json wire: evaluations, checkpoints and setup left out), /program: its "
          "ratio to the off-rank count, t.w.-dense: it less the dense estimate")


def _raise_on(signum: int, _frame: Any) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--nodes", type=int, default=2, help="namespaces, one rank each (more than 2: over a bridge)")
    p.add_argument("--rates", default="none,1gbit,200mbit", help="link rates per node, tc's form; none = unshaped")
    p.add_argument("--seeds", type=int, default=1, help="seeds 0..N-1, every job on each (paired)")
    p.add_argument("--first-seed", type=int, default=0,
                   help="start at this seed (seeds K..K+N-1): one more seed beside a results file's")
    p.add_argument("--base", default=DEFAULT_BASE, help="overrides every job of ours starts from (and golden's data)")
    p.add_argument("--job", action="append", help="NAME=OVERRIDES or NAME=golden [golden args]; repeat (default: "
                   + "; ".join(DEFAULT_JOBS) + ")")  # fmt: skip
    p.add_argument("--pair-with", default="off", help="the job whose test AUC the others are paired against")
    p.add_argument("--out", default="benchmarks/results/network.json")
    p.add_argument("--timeout", type=float, default=3600.0, help="seconds one run may take")
    p.add_argument("--progress", action="store_true", help="one line per run")
    p.add_argument("--order", choices=("fixed", "alternate"), default="fixed",
                   help="the jobs in the order given on every seed (fixed), or reversed on every other seed "
                        "(alternate: a drift of the machine within a pair falls on each job alike)")
    args = p.parse_args(argv)

    why = netns.preflight()
    if why:
        print(f"network.py: error: {why}", file=sys.stderr)
        return 2
    try:
        jobs = [Job.parse(s) for s in (args.job or DEFAULT_JOBS)]
        rates = [r.strip() for r in args.rates.split(",") if r.strip()]
        for r in rates:
            netns.rate_bits(r)
        if args.seeds < 1 or args.first_seed < 0:
            raise ValueError(f"--seeds {args.seeds} --first-seed {args.first_seed}: give at least one seed "
                             "and a first seed of 0 or more")
    except ValueError as e:
        print(f"network.py: error: {e}", file=sys.stderr)
        return 2
    base = shlex.split(args.base)
    stale = netns.remove_stale()
    if stale:
        print(f"removed namespaces left by killed runs: {' '.join(stale)}")
    old = {s: signal.signal(s, _raise_on) for s in (signal.SIGTERM, signal.SIGHUP)}
    runs: List[Dict[str, Any]] = []
    out = ROOT / args.out  # an absolute --out stays as it is
    try:
        golden = dataset_and_model(base) if any(j.golden for j in jobs) else None
        with netns.Cluster(args.nodes) as cluster, tempfile.TemporaryDirectory(prefix="network-") as tmp:
            cluster.shape(rates[0])  # tbf is tried before any run: refused here, one line
            n = 0
            for seed in range(args.first_seed, args.first_seed + args.seeds):
                for rate in rates:
                    cluster.shape(rate)
                    # jobs alternate within a seed and rate: noise hits all alike; --order alternate
                    # also reverses them on every other seed, so that neither always runs first
                    turn = in_turn(jobs, seed - args.first_seed) if args.order == "alternate" else jobs
                    for position, job in enumerate(turn):
                        n += 1
                        res = run_job(cluster, job, seed, Path(tmp) / f"{n}", args.timeout, base, golden)
                        res["rate"] = rate
                        res["position"] = position  # 0: this job ran first of its seed and rate
                        runs.append(res)
                        if args.progress:
                            prog = res["program_bytes_per_sample"]
                            print(f"[{n}/{args.seeds * len(rates) * len(jobs)}] {job.name} seed {seed} {rate}: "
                                  f"train {res['train_seconds']:.1f} s, {res['samples_per_second']:.0f} samples/s, "
                                  f"wire {res['wire_bytes_per_sample']:.0f} B/sample"
                                  + (f", program {prog['total']:.0f}" if prog else "")
                                  + (f", test AUC {res['test_auc']:.4f}" if res["test_auc"] is not None else ""),
                                  flush=True)  # fmt: skip
    except netns.ClusterError as e:
        print(f"network.py: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"network.py: interrupted after {len(runs)} runs; namespaces removed", file=sys.stderr)
        return 130
    finally:
        for s, h in old.items():
            signal.signal(s, h)
    summary = summarize(runs, [j.name for j in jobs], rates, args.pair_with)
    summary["nodes"] = [f"node {i}" for i in range(args.nodes)]
    out.parent.mkdir(parents=True, exist_ok=True)
    fig = out.with_suffix(".png")
    result = {
        "command": " ".join(shlex.quote(a) for a in [sys.executable, *sys.argv]) if argv is None
        else " ".join(["benchmarks/network.py", *argv]),
        "nodes": args.nodes, "rates": rates, "seeds": args.seeds,
        "first_seed": args.first_seed, "order": args.order, "base": base,
        "jobs": {j.name: j.overrides for j in jobs}, "runs": runs, **summary, "figure": str(fig),
    }  # fmt: skip
    out.write_text(json.dumps(result, indent=1))  # before the figure: a plotting error loses no run
    figure(summary, rates, fig)
    print_table(summary, args.pair_with)
    print(f"wrote {out} and {fig}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
