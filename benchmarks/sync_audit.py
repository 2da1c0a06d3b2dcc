"""The sync audit of TorchRec's golden loop and of our policies, side by side (docs/scale.md).

    .venv/bin/python benchmarks/sync_audit.py [--policies off,serve,paper_plus] [--first 100]

Runs ``experiment=clicklog_quick`` (2 ranks, 200 steps of 1024) once per policy with
``trainer.sync_audit=true``, and TorchRec's golden loop on the same data and batch
(``benchmarks/torchrec_golden_loop.py --sync-audit``); prints, per run, the mean per step from
step ``--first`` on (rank 0) of each class (``data``: the data side's host work; ``host``: other
host reads; ``torchrec`` / ``ours`` / ``other``: device syncs) for plain steps and for all steps,
and the ops behind our device syncs by step kind. Writes ``benchmarks/results/sync_audit.json``.
The counts do not depend on the machine's load (the seconds would).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from collections import Counter, defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks._runner import BIN, ROOT  # noqa: E402
from slipstream_rec.training.sync_audit import CLASSES, steady_means  # noqa: E402

OUT = ROOT / "benchmarks" / "results" / "sync_audit.json"


def _run(cmd: list, cwd: Path) -> None:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    result = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True)
    if result.returncode:
        sys.exit(f"{' '.join(map(str, cmd))} failed:\n{result.stderr[-3000:]}")


def ours(policy: str, work: Path) -> list:
    run = work / policy
    _run([
        BIN / "torchrun", "--standalone", "--nproc_per_node", "2", "-m", "slipstream_rec.train",
        "experiment=clicklog_quick", f"slipstream={policy}", f"trainer.run_dir={run}",
        "trainer.progress_bar=false", "trainer.tensorboard=false", "trainer.checkpoint.enabled=false",
        "trainer.test_at_end=false", "trainer.sync_audit=true",
    ], ROOT)  # fmt: skip
    return json.loads((run / "sync_audit_rank0.json").read_text())["steps"]


def golden(work: Path) -> list:
    data = next((ROOT / "data").glob("clicklog_quick-*"))  # made by the first of our runs
    prefix = work / "golden"
    _run([
        BIN / "torchrun", "--standalone", "--nproc_per_node", "2", ROOT / "benchmarks" / "torchrec_golden_loop.py",
        "--data", data, "--steps", "200", "--batch-size", "1024", "--sharding", "auto", "--sync-audit", prefix,
    ], ROOT)  # fmt: skip
    return json.loads(Path(f"{prefix}_rank0.json").read_text())["steps"]


def ops_by_kind(steps: list, first: int) -> dict:
    by, n = defaultdict(Counter), Counter()
    for s in steps:
        if s["step"] < first:
            continue
        kind = "+".join(s["kinds"]) or "plain"
        n[kind] += 1
        by[kind].update({k: v for k, v in s["ops"].items() if not k.startswith(("data:", "host:"))})
    return {k: {op: round(c / n[k], 2) for op, c in by[k].most_common()} for k in sorted(by)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--policies", default="off,serve,paper_plus")
    p.add_argument("--first", type=int, default=100, help="first step of the steady state")
    args = p.parse_args()
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        for policy in args.policies.split(","):
            results[policy] = ours(policy, work)
        results["golden"] = golden(work)
    table = {}
    print(f"{'run':>11} | {'kind':>5} | " + " | ".join(f"{c:>8}" for c in CLASSES) + " | host+device")
    for name, steps in results.items():
        means = steady_means(steps, args.first)
        table[name] = {"means": means, "device_syncs_by_kind": ops_by_kind(steps, args.first)}
        for kind in ("plain", "all"):
            m = means[kind]
            total = sum(m[c] for c in CLASSES if c != "data")
            print(f"{name:>11} | {kind:>5} | " + " | ".join(f"{m[c]:8.2f}" for c in CLASSES) + f" | {total:8.2f}")
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps({"command": " ".join(sys.argv), "first_step": args.first, "runs": table}, indent=1))
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
