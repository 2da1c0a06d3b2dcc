"""Is training robust to which samples it skips? Seeds x random skip fractions, paired with off.

For every seed, `off` and then `slipstream=random` at each fraction (2 ranks under torchrun, same
data, `trainer.seed=<seed>`). A run whose test AUC ends more than 0.005 below its paired `off`
(same seed) is flagged: at these fractions a uniform subsample should cost far less, so a flag is
a collapse (training that falls into a worse model depending on which samples it saw), not noise.
Writes benchmarks/results/robustness_<name>.json.

    .venv/bin/python benchmarks/robustness_sweep.py --name clicklog_quick experiment=clicklog_quick
    .venv/bin/python benchmarks/robustness_sweep.py --name cq_from_step0 experiment=clicklog_quick \\
        slipstream.warmup_steps=0        # the control skipping from the first step
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks._runner import COLLAPSE_AUC, ROOT, auc_difference, run_policy  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--seeds", default="0,1,2,3,4")
    p.add_argument("--fractions", default="0.05,0.1,0.2,0.3")
    p.add_argument("--nproc", type=int, default=2)
    p.add_argument("--name", default="robustness")
    p.add_argument("overrides", nargs="*", help="Hydra overrides for every run (the random runs too)")
    args = p.parse_args()
    seeds = [int(s) for s in args.seeds.split(",")]
    fractions = [float(f) for f in args.fractions.split(",")]
    # overrides that only the random runs take (slipstream.* would fail validation under off)
    common = [o for o in args.overrides if not o.startswith("slipstream.")]
    random_only = [o for o in args.overrides if o.startswith("slipstream.")]
    runs_root = ROOT / "benchmarks" / "results" / "runs" / f"robustness_{args.name}"
    if runs_root.exists():
        shutil.rmtree(runs_root)
    runs_root.mkdir(parents=True)
    results = []
    for seed in seeds:
        seed_o = [f"trainer.seed={seed}"]
        off = run_policy(["slipstream=off"], args.nproc, [*common, *seed_o], runs_root / f"off-s{seed}")
        print(f"seed {seed} off: test AUC {off['test_auc']:.4f}", flush=True)
        for f in fractions:
            choice = ["slipstream=random", f"slipstream.random_skip_fraction={f}", *random_only]
            res = run_policy(choice, args.nproc, [*common, *seed_o], runs_root / f"random{f}-s{seed}")
            diff = auc_difference(res, off)  # paired by seed
            flag = diff < -COLLAPSE_AUC
            results.append({"seed": seed, "fraction": f, "skip_fraction": res["skip_fraction"],
                            "first_skip_step": res["first_skip_step"], "test_auc": res["test_auc"],
                            "off_test_auc": off["test_auc"], "paired_diff": diff, "flagged": flag})
            print(f"seed {seed} random {f}: skip {res['skip_fraction']:.3f} from step {res['first_skip_step']} "
                  f"test AUC {res['test_auc']:.4f} paired {diff:+.4f}{'  FLAG' if flag else ''}", flush=True)
    print(f"\n{args.name}: paired test AUC difference to off, per fraction (seeds {args.seeds}); overrides {args.overrides}")
    for f in fractions:
        d = [r["paired_diff"] for r in results if r["fraction"] == f]
        print(f"random {f}: mean {statistics.mean(d):+.4f}, min {min(d):+.4f}, "
              f"per seed {', '.join(f'{v:+.4f}' for v in d)}")
    flagged = [r for r in results if r["flagged"]]
    print(f"flagged (more than {COLLAPSE_AUC} below paired off): {len(flagged)} of {len(results)}")
    out = ROOT / "benchmarks" / "results" / f"robustness_{args.name}.json"
    out.write_text(json.dumps({"name": args.name, "overrides": args.overrides, "results": results,
                               "flagged": len(flagged)}, indent=2) + "\n")
    print(f"raw: {out.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
