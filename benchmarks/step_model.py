"""A step-time model for N GPUs: the step from its dense compute, the bytes per sample by kind, and
the fabric's bandwidth and latency; checked against the emulated cluster, then asked about
clusters we do not have (docs/scale.md).

The step is TorchRec's ``TrainPipelineSparseDist``: the ids of step i+1 travel while step i
computes (``input``: exposed only past the compute), the pooled embeddings' all-to-all is waited
for by the over-arch (``forward``), the gradients' all-to-all and the dense all-reduce end the
backward (``backward``), serve's pushes and replica syncs run every k steps (``serve``). Each
phase takes the longer of its intra-node bytes over NVLink and its cross-node bytes over the NIC,
plus a latency per collective:

    step = compute + sum over phases of exposed(phase)

The emulated cluster's links are tc token buckets: a phase after an idle gap sends the bucket
(``netns.tbf_burst_bytes``) at the veth's speed, so there each phase is charged its bytes less the
bucket; a NIC has no bucket.

    .venv/bin/python benchmarks/step_model.py check benchmarks/results/network_model_*.json
    .venv/bin/python benchmarks/step_model.py predict benchmarks/results/network_wire_clicklog_dim128.json \\
        --out benchmarks/results/step_model_predictions.json

``check`` predicts every shaped run of the results from the unshaped run of the same job and node
count (its compute) and the run's own bytes, and prints the error. ``predict`` scales a measured
run's bytes to the fabrics below (weak scaling: the same batch per GPU) and sets the published
communication shares beside them.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Optional

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks import netns  # noqa: E402
from benchmarks._runner import fmt_cell  # noqa: E402

PHASES = ("input", "forward", "backward", "serve", "control")
PHASE_OF = {"input": "input", "output": "forward", "gradient": "backward", "dense": "backward",
            "data_parallel": "backward", "push": "serve", "replica": "serve", "control": "control",
            "tracking": "control"}  # fmt: skip
# collectives per occurrence of a phase: the ids' all-to-all (lengths and values travel in one
# KJTAllToAll); the pooled embeddings'; backward the gradients' and DDP's bucketed all-reduce;
# serve's push and replica all-gather; the lock-step all-reduce (the tracking's gathers, on the
# snapshot steps, are spread over the steps with it)
COLLECTIVES = {"input": 1, "forward": 1, "backward": 2, "serve": 2, "control": 1}
A2A_KINDS = ("input", "output", "gradient")
ALL_REDUCE_KINDS = ("dense", "data_parallel")
SERVE_KINDS = ("push", "replica")


@dataclass(frozen=True)
class Fabric:
    """Where the ranks sit and what joins them."""

    name: str
    nodes: int
    ranks_per_node: int
    cross_bytes_per_s: float  # each rank's share of its node's NIC egress
    intra_bytes_per_s: float  # each rank's NVLink egress (unused with one rank per node)
    latency_s: float  # per collective
    burst_bytes: float = 0.0  # a token bucket's credit per phase (the emulation's tbf); 0 on a NIC

    @property
    def world(self) -> int:
        return self.nodes * self.ranks_per_node


@dataclass
class Phase:
    """One phase's bytes per rank per occurrence, and how often it occurs."""

    intra: float = 0.0
    cross: float = 0.0
    every: float = 1.0  # steps between occurrences (serve: its sync interval)


def exposed_seconds(name: str, phase: Phase, fabric: Fabric, compute_s: float) -> float:
    """Seconds per step the phase adds to the step."""
    if phase.intra <= 0 and phase.cross <= 0:
        return 0.0
    # the bucket refills only while the link idles: at most the rate times the compute before the
    # phase (the step's compute taken as split evenly before its two waited-for phases)
    credit = min(fabric.burst_bytes, fabric.cross_bytes_per_s * compute_s / 2)
    cross = max(0.0, phase.cross - credit) / fabric.cross_bytes_per_s
    intra = phase.intra / fabric.intra_bytes_per_s if phase.intra > 0 else 0.0
    t = max(cross, intra) + COLLECTIVES[name] * fabric.latency_s
    if name == "input":  # behind this step's compute (the pipeline's next input dist)
        t = max(0.0, t - compute_s)
    return t / phase.every


def step_seconds(compute_s: float, phases: Dict[str, Phase], fabric: Fabric) -> Dict[str, float]:
    """The step and what each phase adds to it. However well the phases hide behind the compute,
    a step cannot be shorter than its bytes at the link's rate (over a step a token bucket gives
    no more than its rate either): ``link_bound`` is what that floor adds."""
    out = {"compute": compute_s}
    for name in PHASES:
        out[name] = exposed_seconds(name, phases.get(name, Phase()), fabric, compute_s)
    phased = sum(out.values())
    floor = max(
        sum(p.cross / p.every for p in phases.values()) / fabric.cross_bytes_per_s,
        sum(p.intra / p.every for p in phases.values()) / fabric.intra_bytes_per_s,
    )  # fmt: skip
    out["link_bound"] = max(0.0, floor - phased)
    out["total"] = phased + out["link_bound"]
    return out


# ---- the emulated cluster: a network.py run's own bytes ----------------------------------------
def emulated_fabric(rate: str, nodes: int) -> Fabric:
    bits = netns.rate_bits(rate)
    assert bits is not None, "an unshaped link has no rate to model"
    return Fabric(f"{nodes} emulated nodes, {rate}", nodes, 1, bits / 8, float("inf"), 0.0,
                  float(netns.tbf_burst_bytes(bits)))  # fmt: skip


def sync_every(run: Dict[str, Any]) -> float:
    """Steps between serve's pushes (1 without serving)."""
    replica = run.get("replica") or {}
    pushes, steps = replica.get("pushes") or 0, run.get("steps") or 0
    return steps / pushes if pushes and steps else 1.0


def run_phases(run: Dict[str, Any]) -> Dict[str, Phase]:
    """Bytes per rank per occurrence of each phase of a run with one rank per node: everything that
    leaves a rank crosses the link (the program's off-rank count, times the run's measured wire /
    program ratio where it has one: headers)."""
    off = run["program_off_rank_bytes_per_sample"]
    per_rank = run["samples_trained"] / run["steps"] / run["world_size"]  # samples per rank per step
    headers = (run.get("wire_train") or {}).get("wire_over_program") or 1.0
    every = sync_every(run)
    phases = {name: Phase(every=every if name == "serve" else 1.0) for name in PHASES}
    for kind, name in PHASE_OF.items():
        phases[name].cross += off.get(kind, 0.0) * per_rank * headers * (every if name == "serve" else 1.0)
    return phases


def check(runs: List[Dict[str, Any]], nodes: int) -> List[Dict[str, Any]]:
    """Every shaped run predicted from the unshaped run of its job (the compute per step)."""
    rows = []
    for run in runs:
        if run["rate"] == "none":
            continue
        base = [r for r in runs if r["job"] == run["job"] and r["rate"] == "none" and r["seed"] == run["seed"]
                and r.get("file") == run.get("file")]  # the same base configuration
        if not base:
            continue
        compute = base[0]["train_seconds"] / base[0]["steps"]
        parts = step_seconds(compute, run_phases(run), emulated_fabric(run["rate"], nodes))
        measured = run["train_seconds"] / run["steps"]
        rows.append({
            "job": run["job"], "nodes": nodes, "rate": run["rate"], "seed": run["seed"], "file": run.get("file"),
            "unshaped_ms": round(compute * 1e3, 2), "measured_ms": round(measured * 1e3, 2),
            "predicted_ms": round(parts["total"] * 1e3, 2), "error": round(parts["total"] / measured - 1, 4),
            "phases_ms": {k: round(v * 1e3, 2) for k, v in parts.items()},
        })  # fmt: skip
    return rows


# ---- clusters we do not have: a measured run's bytes scaled ------------------------------------
@dataclass
class Workload:
    """What one GPU does per step, independent of the fabric: its batch, the all-to-all buffers per
    sample (the pooled embeddings as a table-wise plan sends them), the all-reduced parameter
    bytes, and serve's per-rank sync bytes per occurrence at ``world0`` ranks."""

    name: str
    batch_per_rank: float
    a2a_per_sample: Dict[str, float]
    all_reduce_bytes: float
    serve_off_rank: float
    serve_every: float
    world0: int

    @classmethod
    def from_run(cls, run: Dict[str, Any], name: Optional[str] = None, qcomms: bool = False) -> "Workload":
        """``run``: a network.py record. A row-wise table's pooled output is counted at the size its
        reduce-scatter takes (every rank's samples), which at scale a table-wise plan would not
        send: it is taken at one rank's share. ``qcomms``: what TorchRec's fp16 / bf16 comms and the
        fp16 DDP hook would send instead (half of each fp32 byte of the pooled embeddings, their
        gradients and the all-reduces)."""
        w0 = run["world_size"]
        per_rank = run["samples_trained"] / run["steps"] / w0
        a2a = dict(run["program_bytes_per_sample"])
        rw = run.get("row_wise_bytes_per_sample") or {}
        a2a["output"] -= rw.get("output/row_wise", 0.0) * (1 - 1 / w0)
        off = run["program_off_rank_bytes_per_sample"]
        ring0 = 2 * (w0 - 1) / w0
        all_reduce = sum(off.get(k, 0.0) for k in ALL_REDUCE_KINDS) * per_rank / ring0
        every = sync_every(run)
        serve = sum(off.get(k, 0.0) for k in SERVE_KINDS) * per_rank * every
        half = 0.5 if qcomms else 1.0
        return cls(
            name or run["job"], per_rank,
            {k: a2a.get(k, 0.0) * (half if k != "input" else 1.0) for k in A2A_KINDS},
            all_reduce * half, serve, every, w0,
        )  # fmt: skip

    def phases(self, fabric: Fabric) -> Dict[str, Phase]:
        w, local, nodes = fabric.world, fabric.ranks_per_node, fabric.nodes
        phases = {name: Phase() for name in PHASES}
        for kind in A2A_KINDS:  # 1/W stays, (L-1)/W over NVLink, (W-L)/W across nodes
            x = self.a2a_per_sample[kind] * self.batch_per_rank
            phases[PHASE_OF[kind]].intra += x * (local - 1) / w
            phases[PHASE_OF[kind]].cross += x * (w - local) / w
        # hierarchical ring: 2(L-1)/L of the buffer within the node, the node's 2(N-1)/N across
        # its nodes' ring split over its L NICs
        phases["backward"].intra += self.all_reduce_bytes * 2 * (local - 1) / local
        phases["backward"].cross += self.all_reduce_bytes * 2 * (nodes - 1) / nodes / local
        if self.serve_off_rank and w > 1:  # what leaves a rank grows as (W-1)/W; split as above
            out = self.serve_off_rank * ((w - 1) / w) / ((self.world0 - 1) / self.world0)
            phases["serve"] = Phase(out * (local - 1) / (w - 1), out * (w - local) / (w - 1), self.serve_every)
        return phases


GB = 1e9
# Per rank: NVLink 4 about 370 GB/s of all-to-all per H100 (of 450 GB/s each way); a 400G NIC
# per GPU about 48 GB/s (DGX H100, SuperPOD); one 100 GbE NIC shared by 8 GPUs: 12 GB/s / 8.
FABRICS = [
    Fabric("8 GPUs, one node, NVLink", 1, 8, float("inf"), 370 * GB, 15e-6),
    Fabric("16 nodes x 8 GPUs, 400G InfiniBand per GPU", 16, 8, 48 * GB, 370 * GB, 30e-6),
    Fabric("2 nodes x 8 GPUs, one 100 GbE NIC per node", 2, 8, 12 * GB / 8, 370 * GB, 50e-6),
]
# The embedding communication's published share of a DLRM step, closest to each fabric.
PUBLISHED = {
    FABRICS[0].name: (0.25, "EMBark (NVIDIA): the embedding all-to-all, DLRM-DCNv2 on one DGX H100"),
    FABRICS[1].name: (0.51, "EMBark: the same on 128 H100 (16 DGX nodes)"),
    FABRICS[2].name: (0.60, "Feng et al. (SC'24): over 60% on 32 A100 across 8 nodes (not this fabric)"),
}


def compute_for_share(w: "Workload", fabric: Fabric, share: float) -> float:
    """The compute per step at which ``w``'s exposed communication is ``share`` of its step (the
    ids' all-to-all hides behind the compute, so the exposure falls as the compute grows: bisection)."""
    def excess(c: float) -> float:  # decreasing in c
        exposed = step_seconds(c, w.phases(fabric), fabric)["total"] - c
        return exposed * (1 - share) / share - c

    lo, hi = 0.0, 1.0
    while excess(hi) > 0:
        hi *= 2
    for _ in range(100):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if excess(mid) > 0 else (lo, mid)
    return (lo + hi) / 2


def predict(workloads: List["Workload"], fabrics: List[Fabric], reference: str) -> List[Dict[str, Any]]:
    """Per fabric: each workload's exposed communication per step. The compute is not measured on
    GPUs, so it is set to what makes the reference workload's share the published one, and each
    workload's step and speed-up follow from it (serving's host work hidden behind the GPU)."""
    ref = next(w for w in workloads if w.name == reference)
    rows = []
    for fabric in fabrics:
        share, source = PUBLISHED.get(fabric.name, (None, None))
        compute = compute_for_share(ref, fabric, share) if share else 0.0
        steps = {}
        for w in workloads:
            parts = step_seconds(compute, w.phases(fabric), fabric)
            steps[w.name] = parts["total"]
            rows.append({
                "fabric": fabric.name, "job": w.name, "world": fabric.world,
                "comm_ms": round((parts["total"] - compute) * 1e3, 4),
                "phases_ms": {k: round(parts[k] * 1e3, 4) for k in PHASES},
                "published_share": share, "source": source,
                "compute_ms": round(compute * 1e3, 4) if share else None,
                "step_ms": round(parts["total"] * 1e3, 4) if share else None,
            })  # fmt: skip
        for r in rows:
            if r["fabric"] == fabric.name and r["step_ms"]:
                r["speedup_vs_" + reference] = round(steps[reference] / steps[r["job"]], 3)
    return rows


def _load(paths: List[str]) -> List[Dict[str, Any]]:
    out = []
    for p in paths:
        path = Path(p)
        try:
            doc = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError) as e:
            raise SystemExit(f"step_model: {path}: {e}; give network.py results JSONs") from None
        nodes = len(doc.get("nodes") or []) or 2
        for r in doc.get("runs", []):
            needed = ("steps", "world_size", "program_off_rank_bytes_per_sample")
            if all(r.get(k) for k in needed):
                out.append({**r, "nodes": nodes, "file": str(path)})
    return out


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("check", help="predict every shaped run from its unshaped twin")
    c.add_argument("results", nargs="+")
    c.add_argument("--out")
    q = sub.add_parser("predict", help="scale a measured run to the fabrics we do not have")
    q.add_argument("results", nargs="+")
    q.add_argument("--rate", default=None, help="take the runs at this rate (default: the first)")
    q.add_argument("--reference", default="off", help="the job whose share is the published one")
    q.add_argument("--out")
    args = p.parse_args(argv)
    runs = _load(args.results)
    if not runs:
        print("step_model: no run with steps and byte counts (results of network.py since the wire meter)",
              file=sys.stderr)  # fmt: skip
        return 2
    if args.cmd == "check":
        rows = [row for n in sorted({r["nodes"] for r in runs}) for row in check([r for r in runs if r["nodes"] == n], n)]
        print(f"{'results':<34} {'job':<8} {'nodes':>5} {'rate':<8} {'unshaped ms':>11} {'measured':>9} "
              f"{'predicted':>9} {'error':>7}")  # fmt: skip
        for r in rows:
            print(f"{Path(r['file']).stem:<34} {r['job']:<8} {r['nodes']:>5} {r['rate']:<8} {r['unshaped_ms']:>11.1f} "
                  f"{r['measured_ms']:>9.1f} {r['predicted_ms']:>9.1f} {r['error']:>+7.1%}")  # fmt: skip
        if rows:
            print(f"mean |error| {statistics.mean(abs(r['error']) for r in rows):.1%} over {len(rows)} runs")
        result: Any = {"command": " ".join(sys.argv), "rows": rows}
    else:
        rate = args.rate or runs[0]["rate"]
        mine = [r for r in runs if r["rate"] == rate]
        ref = next((r for r in mine if r["job"] == args.reference), None)
        if ref is None:
            print(f"step_model: no {args.reference!r} run at {rate} in the results (--reference, --rate)", file=sys.stderr)
            return 2
        workloads = [Workload.from_run(r) for r in mine]
        # each job with TorchRec's quantized comms and the fp16 DDP hook on top (what they compose to)
        workloads += [Workload.from_run(r, name=f"{r['job']}+qcomms", qcomms=True) for r in mine]
        rows = predict(workloads, FABRICS, args.reference)
        print(f"{'fabric':<46} {'job':<16} {'comm ms':>8} {'share':>6} {'compute ms':>10} {'step ms':>8} {'speed-up':>8}")
        for r in rows:
            sp = r.get(f"speedup_vs_{args.reference}")
            print(f"{r['fabric']:<46} {r['job']:<16} {r['comm_ms']:>8.3f} {fmt_cell(r['published_share'], '.0%', 6)} "
                  f"{fmt_cell(r['compute_ms'], '.3f', 10)} {fmt_cell(r['step_ms'], '.3f', 8)} {fmt_cell(sp, '.2f', 7)}x")  # fmt: skip
        result = {"command": " ".join(sys.argv), "rate": rate, "rows": rows,
                  "workloads": [w.__dict__ for w in workloads]}  # fmt: skip
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
