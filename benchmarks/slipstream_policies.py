"""Slipstream policies side by side: off, track_only and paper_plus (and more with --policies).

Runs `slipstream-train slipstream=<policy>` under torchrun with 2 processes, alternating the
policies within each repeat so that machine noise hits all alike, on the same data and seed.
Prints per policy: train seconds, samples trained, skip fraction, validation/test AUC and log
loss, speedup vs off, ideal speedup 1/(1 - skip fraction) and efficiency (speedup / ideal).
Writes raw figures to benchmarks/results/slipstream_<name>.json, keeps every run directory under
benchmarks/results/runs/<name>/<policy>-r<repeat> and, at the end, writes the report of all runs
(`python -m slipstream_rec.report`; the first policy's first repeat is the reference) into
benchmarks/results/report_<name>/report.html. Both folders of <name> are cleared at start.

With ``--random-control POLICY``, each repeat also runs the control right after POLICY:
``slipstream=random`` starting to skip at the step POLICY first skipped and skipping at the rate
that gives POLICY's skip count (``slipstream_rec.report.random_control``; label
``random@POLICY``). Same data, seed, first skipped step and number of trained samples: POLICY's
staleness selection is worth something only if its AUC beats the control's.

With ``--vary-seed``, repeat r runs every policy with ``trainer.seed=r`` (model initialisation
and the skip draws change; the data does not). Runs are deterministic on CPU, so repeats with one
seed differ only in seconds; varying the seed measures how much AUC moves from seed to seed.

After the medians, the paired results: each policy against off with the same seed (the same
repeat without ``--vary-seed``) and against its control, mean over seeds with the 95% interval
(``slipstream_rec.report.paired``, the code behind the report's frontier figure and its table,
so the print, the JSON's ``paired`` and the report show the same numbers). The report's
``paired_results.md`` is that table in markdown.

    .venv/bin/python benchmarks/slipstream_policies.py                       # default config
    .venv/bin/python benchmarks/slipstream_policies.py --name skewed data=synthetic_skewed
    .venv/bin/python benchmarks/slipstream_policies.py --policies off,paper_plus --random-control paper_plus
"""

from __future__ import annotations

import argparse
import json
import shlex
import shutil
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Dict, List

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks._runner import COLLAPSE_AUC, ROOT, alternating, run_policy  # noqa: E402
from slipstream_rec.report.paired import as_dict, paired_results, text_table  # noqa: E402
from slipstream_rec.report.runs import load_run  # noqa: E402
from slipstream_rec.report.random_control import random_control_overrides  # noqa: E402


def write_report(run_dirs: List[Path], out: Path) -> None:
    cmd = [sys.executable, "-m", "slipstream_rec.report", *map(str, run_dirs), "-o", str(out)]
    result = subprocess.run(cmd, cwd=ROOT)
    if result.returncode != 0:
        raise SystemExit(f"report failed (exit {result.returncode}): {' '.join(cmd)}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--policies", default="off,track_only,paper_plus")
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--vary-seed", action="store_true", help="repeat r uses trainer.seed=r")
    p.add_argument("--nproc", type=int, default=2)
    p.add_argument("--name", default="default", help="name of this setting in the results file")
    p.add_argument("--random-control", default="", metavar="POLICY",
                   help="after each run of POLICY, run slipstream=random at its measured skip fraction")
    p.add_argument("overrides", nargs="*", help="Hydra overrides applied to every run")
    args = p.parse_args()
    policies = args.policies.split(",")
    control_of = args.random_control
    if control_of and control_of not in policies:
        raise SystemExit(f"--random-control {control_of}: not among --policies {args.policies}")
    if control_of and any(o.replace(" ", "").lower() == "slipstream.negatives_only=true" for o in args.overrides):
        raise SystemExit(
            "--random-control with slipstream.negatives_only=true is not supported: the control's "
            "fraction of non-clicks would need the label rate. Run slipstream=random "
            "slipstream.negatives_only=true slipstream.random_skip_fraction=<skip / (1 - ctr)> by hand."
        )
    control = f"random@{control_of}"
    labels = policies + ([control] if control_of else [])

    runs_root = ROOT / "benchmarks" / "results" / "runs" / args.name
    report = ROOT / "benchmarks" / "results" / f"report_{args.name}"
    for stale in (runs_root, report):  # this setting's runs and report of an earlier invocation
        if stale.exists():
            shutil.rmtree(stale)
    runs_root.mkdir(parents=True)
    runs: Dict[str, List[Dict]] = {label: [] for label in labels}

    def measure(label: str, choice: List[str], r: int) -> Dict:
        seed = [f"trainer.seed={r}"] if args.vary_seed else []
        res = run_policy(choice, args.nproc, [*args.overrides, *seed], runs_root / f"{label}-r{r}")
        runs[label].append(res)
        print(f"repeat {r} {label:>11}: {res['train_seconds']:.1f}s trained {res['samples_trained']} "
              f"skip {res['skip_fraction']:.3f} val_auc {res['val_auc']:.4f} test_auc {res['test_auc']:.4f}",
              flush=True)
        return res

    for r, pol in alternating(policies, args.repeats):
        res = measure(pol, [f"slipstream={pol}"], r)
        if pol == control_of:  # the control right after its reference, at its skip fraction
            try:
                choice = ["slipstream=random", *random_control_overrides(res)]
            except ValueError as e:  # nothing skipped: the control at fraction 0 is off itself
                print(f"repeat {r} {control}: {e}; running slipstream=off in its place", flush=True)
                choice = ["slipstream=off"]
            measure(control, choice, r)

    def med(pol: str, key: str) -> float:
        return statistics.median(x[key] for x in runs[pol])

    base = med("off", "train_seconds") if "off" in runs else None
    print(f"\nsetting {args.name}: median over {args.repeats} repeats"
          f"{' (seeds 0..%d)' % (args.repeats - 1) if args.vary_seed else ''}, {args.nproc} ranks, "
          f"overrides {args.overrides}")
    header = ("policy", "train s", "samples trained", "skip", "val AUC", "val logloss", "test AUC",
              "test logloss", "speedup", "ideal", "efficiency")
    print(" | ".join(header))
    table = {}
    for pol in labels:
        skip = med(pol, "skip_fraction")
        secs = med(pol, "train_seconds")
        speedup = base / secs if base else float("nan")
        ideal = 1.0 / (1.0 - skip) if skip < 1 else float("inf")
        row = {
            "train_seconds": secs, "samples_trained": med(pol, "samples_trained"), "skip_fraction": skip,
            "val_auc": med(pol, "val_auc"), "val_logloss": med(pol, "val_logloss"),
            "test_auc": med(pol, "test_auc"), "test_logloss": med(pol, "test_logloss"),
            "speedup_vs_off": speedup, "ideal_speedup": ideal, "efficiency": speedup / ideal,
        }
        table[pol] = row
        print(f"{pol} | {secs:.1f} | {row['samples_trained']:.0f} | {skip:.3f} | {row['val_auc']:.4f} | "
              f"{row['val_logloss']:.4f} | {row['test_auc']:.4f} | {row['test_logloss']:.4f} | "
              f"{speedup:.3f} | {ideal:.3f} | {speedup / ideal:.2f}")
    flagged = []
    if "off" in runs:  # paired by repeat (by seed with --vary-seed)
        for label in labels:
            for r, (x, o) in enumerate(zip(runs[label], runs["off"])):
                if x["test_auc"] < o["test_auc"] - COLLAPSE_AUC:
                    flagged.append({"label": label, "repeat": r, "test_auc": x["test_auc"], "off": o["test_auc"]})
                    print(f"FLAG {label} repeat {r}: test AUC {x['test_auc']:.4f} is more than "
                          f"{COLLAPSE_AUC} below its paired off's {o['test_auc']:.4f}")
    # Paired by seed (by repeat without --vary-seed), from the run directories by the code the
    # report uses: its frontier, its table and this print show the same numbers.
    run_dirs = [runs_root / f"{label}-r{r}" for label in labels for r in range(args.repeats)]
    results, notes = paired_results([load_run(d) for d in run_dirs])
    print("\npaired with off of the same seed (and with the control): mean over the pairs [95% interval]")
    print(text_table(results), end="")
    for note in notes:
        print(f"note: {note}")
    out = ROOT / "benchmarks" / "results" / f"slipstream_{args.name}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    # the command that made this file, as the docs quote it
    command = shlex.join([".venv/bin/python", "benchmarks/slipstream_policies.py", *sys.argv[1:]])
    out.write_text(json.dumps({"command": command, "setting": args.name, "overrides": args.overrides, "repeats": args.repeats,
                               "vary_seed": args.vary_seed, "flagged": flagged,
                               "runs": runs, "median": table, "paired": [as_dict(r) for r in results]},
                              indent=2) + "\n")
    print(f"raw: {out.relative_to(ROOT)}")
    write_report(run_dirs, report)


if __name__ == "__main__":
    main()
