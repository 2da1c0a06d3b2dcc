"""Throughput of slipstream_rec's baseline (policy off) vs a plain TorchRec golden-example loop.

Same model (DLRM Criteo-reference sizes), same data files, same batch per rank, same sharding
type, 2 ranks under torchrun; runs alternate (ours, golden, ours, golden, ...) so that machine
noise hits both alike. Prints a table and the median ratio ours/golden; writes the raw figures
to benchmarks/results/baseline_throughput.json.

    .venv/bin/python benchmarks/baseline_throughput.py [--steps 300] [--repeats 3] [--sharding table_wise]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


def _env() -> dict:
    env = dict(os.environ, OMP_NUM_THREADS="1")
    env["PATH"] = f"{BIN}{os.pathsep}{env['PATH']}"
    return env


def _torchrun(args: list[str], nproc: int) -> str:
    cmd = [str(BIN / "torchrun"), "--standalone", "--nproc_per_node", str(nproc), *args]
    out = subprocess.run(cmd, cwd=ROOT, env=_env(), capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit(f"failed: {' '.join(cmd)}\n{out.stderr[-3000:]}")
    return out.stdout


def run_ours(steps: int, batch: int, sharding: str, nproc: int, extra: list[str]) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        _torchrun(
            [
                "-m", "slipstream_rec.train", f"trainer.max_steps={steps}",
                f"trainer.batch_size={batch}", f"sharding={sharding}", "trainer.eval_every_steps=0",
                "trainer.test_at_end=false", "trainer.progress_bar=false", "trainer.tensorboard=false",
                # the baseline: slipstream=off in fp32 whatever the defaults (overrides may follow)
                f"trainer.run_dir={tmp}", "slipstream=off", "trainer.precision=fp32", *extra,
            ],
            nproc,
        )
        s = json.loads((Path(tmp) / "summary.json").read_text())
    return {
        "runner": "slipstream_rec", "steps": s["steps"], "samples": s["samples_trained"],
        "train_seconds": s["train_seconds"], "samples_per_second": s["samples_per_second"],
        "sharding": sorted(set(s["sharding_plan"].values())), "dataset": s["dataset"],
    }


def run_golden(data: str, steps: int, batch: int, sharding: str, nproc: int, extra: list[str] = ()) -> dict:
    """One run of the golden loop (``extra``: more of its arguments, e.g. --seed, --test)."""
    out = _torchrun(
        [
            "benchmarks/torchrec_golden_loop.py", "--data", data, "--steps", str(steps),
            "--batch-size", str(batch), "--sharding", sharding, *extra,
        ],
        nproc,
    )
    return json.loads([line for line in out.splitlines() if line.startswith("{")][-1])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--batch-size", type=int, default=2048)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--sharding", default="table_wise")
    p.add_argument("--nproc", type=int, default=2)
    p.add_argument("overrides", nargs="*", help="extra Hydra overrides for our runs (e.g. data=...)")
    args = p.parse_args()

    rows = []
    # The first of our runs also generates/locates the dataset that the golden loop then reads.
    for i in range(args.repeats):
        ours = run_ours(args.steps, args.batch_size, args.sharding, args.nproc, args.overrides)
        golden = run_golden(ours["dataset"], args.steps, args.batch_size, args.sharding, args.nproc)
        rows += [dict(ours, repeat=i), dict(golden, repeat=i)]
        print(
            f"repeat {i}: ours {ours['samples_per_second']:,.0f} samples/s  "
            f"golden {golden['samples_per_second']:,.0f} samples/s  "
            f"ratio {ours['samples_per_second'] / golden['samples_per_second']:.3f}",
            flush=True,
        )
    ratios = [
        a["samples_per_second"] / b["samples_per_second"] for a, b in zip(rows[0::2], rows[1::2])
    ]
    result = {
        "steps": args.steps, "batch_size_per_rank": args.batch_size, "nproc": args.nproc,
        "sharding": args.sharding, "runs": rows, "ratios": ratios,
        "median_ratio": statistics.median(ratios),
    }
    out = ROOT / "benchmarks" / "results" / "baseline_throughput.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"median ours/golden throughput ratio over {args.repeats} alternating pairs: "
          f"{result['median_ratio']:.3f} (target >= 0.95); raw: {out.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
