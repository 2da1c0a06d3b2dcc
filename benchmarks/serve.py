"""Slipstream's serve action against off, side by side and paired by seed.

For each seed r (``trainer.seed=r``) every setting runs once, in alternating order (so machine
noise hits all alike), on the same data. Printed and written to
``benchmarks/results/serve_<name>.json``: per setting and seed the served fraction, the bytes per
trained sample given to the embedding collectives (input ids, pooled embeddings, gradients; from
``summary.json``, counted from the tensors), samples/s and test AUC / log loss; then per setting
the means, the paired differences to ``off`` (test AUC, bytes, samples/s ratio) and whether
``samples_trained`` equals ``off``'s.

A setting is ``label=override,override,...`` (its overrides on top of the common ones); ``off``
is always run (``slipstream=off``, or the overrides ``--off`` gives: the reference every other
setting is paired with), and ``serve`` unless ``--no-serve`` (another lever measured against
``off``).
``--curve`` adds serve at several targets D (``slipstream.target_skip_fraction``): the served
fraction against the paired test AUC.

    .venv/bin/python benchmarks/serve.py --name clicklog --seeds 3
    .venv/bin/python benchmarks/serve.py --name clicklog_raw --seeds 3 data.clicklog.base_ctr=0.02
    .venv/bin/python benchmarks/serve.py --name quick_curve --seeds 2 --curve 0.3,0.6,0.9 experiment=clicklog_quick

How far apart the runs of one seed land when nothing but the rounding and the embedding tables'
random initial values changes (the noise floor of a paired AUC; docs/performance.md):

    .venv/bin/python benchmarks/serve.py --name auc_noise_clicklog --seeds 3 --no-serve \
        --off slipstream=off,trainer.precision=fp32,sharding=table_wise \
        --setting init=slipstream=off,trainer.precision=fp32,sharding=row_wise \
        --setting bf16=slipstream=off,trainer.precision=bf16,sharding=table_wise
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
from pathlib import Path
from typing import Dict, List

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks._runner import ROOT, auc_difference, pair_by_seed, run_alternately, run_policy  # noqa: E402

EXTRA = ["served_fraction", "slots_fraction", "a2a_bytes_per_sample", "samples_per_second", "replica", "rows_updated_per_step",
         "time_breakdown_rank0"]  # fmt: skip


def run(choice: List[str], nproc: int, overrides: List[str], run_dir: Path) -> Dict:
    out = run_policy(choice, nproc, overrides, run_dir)
    summary = json.loads((run_dir / "summary.json").read_text())
    out.update({k: summary.get(k) for k in EXTRA})
    return out


def settings_from(args: argparse.Namespace) -> Dict[str, List[str]]:
    settings = {"off": [o for o in args.off.split(",") if o]}
    if not args.no_serve:
        settings["serve"] = ["slipstream=serve"]
    for spec in args.setting:
        label, _, overrides = spec.partition("=")
        settings[label] = [o for o in overrides.split(",") if o]
    for d in [x for x in args.curve.split(",") if x]:
        settings[f"serve_D{d}"] = ["slipstream=serve", f"slipstream.target_skip_fraction={d}"]
    return settings


def paired(runs: Dict[str, List[Dict]], label: str) -> Dict:
    """Means over seeds and the differences to off on the same seed."""
    mine, off = runs[label], runs["off"]
    d_auc = pair_by_seed(mine, off, auc_difference)
    bytes_ratio = pair_by_seed(mine, off, lambda a, b: a["a2a_bytes_per_sample"]["total"] / b["a2a_bytes_per_sample"]["total"])
    speed = pair_by_seed(mine, off, lambda a, b: a["samples_per_second"] / b["samples_per_second"])
    # embedding traffic: the all-to-alls plus what serving adds (pushes, replica syncs)
    emb = lambda x: sum(x["a2a_bytes_per_sample"].get(k, 0) for k in ("embedding", "push", "replica"))  # noqa: E731
    emb_ratio = pair_by_seed(mine, off, lambda a, b: emb(a) / emb(b))
    out = {
        "seeds": len(mine),
        "served_fraction": statistics.mean(x["served_fraction"] for x in mine),
        "bytes_per_sample": {
            k: statistics.mean(x["a2a_bytes_per_sample"][k] for x in mine) for k in ("input", "output", "gradient", "total")
        },
        "bytes_vs_off": statistics.mean(bytes_ratio),
        "embedding_bytes_vs_off": statistics.mean(emb_ratio),
        "slots_fraction": statistics.mean(x.get("slots_fraction") or 1.0 for x in mine),
        "samples_per_second_vs_off": statistics.mean(speed),
        "samples_per_second_vs_off_per_seed": speed,
        "paired_test_auc": statistics.mean(d_auc),
        "paired_test_auc_per_seed": d_auc,
        "paired_test_auc_std": statistics.stdev(d_auc) if len(d_auc) > 1 else 0.0,
        "test_auc": statistics.mean(x["test_auc"] for x in mine),
        "test_logloss": statistics.mean(x["test_logloss"] for x in mine),
        "samples_trained_equal_off": all(pair_by_seed(mine, off, lambda a, b: a["samples_trained"] == b["samples_trained"])),
    }
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--name", default="default", help="name of this comparison in the results file")
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--nproc", type=int, default=2)
    p.add_argument("--setting", action="append", default=[], metavar="LABEL=OVERRIDES",
                   help="another setting, e.g. serve_t05=slipstream=serve,slipstream.max_threshold=0.05")
    p.add_argument("--off", default="slipstream=off", metavar="OVERRIDES",
                   help="the reference setting's overrides, comma-separated (default: slipstream=off)")
    p.add_argument("--curve", default="", metavar="D,D,...", help="serve at these targets D too")
    p.add_argument("--no-serve", action="store_true",
                   help="no serve setting: only off and the --setting ones (another lever against off)")
    p.add_argument("overrides", nargs="*", help="Hydra overrides applied to every run")
    args = p.parse_args()
    settings = settings_from(args)
    runs_root = ROOT / "benchmarks" / "results" / "runs" / f"serve_{args.name}"
    if runs_root.exists():  # an earlier invocation's runs: a run directory is never trained twice
        shutil.rmtree(runs_root)

    def one(label: str, r: int) -> Dict:
        res = run(settings[label], args.nproc, [*args.overrides, f"trainer.seed={r}"], runs_root / f"{label}-s{r}")
        print(f"seed {r} {label:>14}: served {res['served_fraction']:.3f} bytes/sample "
              f"{res['a2a_bytes_per_sample']['total']:.0f} samples/s {res['samples_per_second']:.0f} "
              f"test AUC {res['test_auc']:.4f}", flush=True)
        return res

    runs = run_alternately(list(settings), args.seeds, one)
    table = {label: paired(runs, label) for label in settings}
    print(f"\n{args.name}: {args.seeds} seeds, {args.nproc} ranks, overrides {args.overrides}")
    print("setting | served | slots | bytes/sample (in/out/grad) | bytes vs off | embedding+push+replica vs off | "
          "samples/s vs off | paired test AUC (per seed)")
    for label, row in table.items():
        b = row["bytes_per_sample"]
        print(f"{label} | {row['served_fraction']:.3f} | {row['slots_fraction']:.3f} | {b['total']:.0f} ({b['input']:.0f}/"
              f"{b['output']:.0f}/{b['gradient']:.0f}) | {row['bytes_vs_off']:.3f} | {row['embedding_bytes_vs_off']:.3f} | "
              f"{row['samples_per_second_vs_off']:.3f} | "
              f"{row['paired_test_auc']:+.4f} ({', '.join(f'{d:+.4f}' for d in row['paired_test_auc_per_seed'])})"
              f"{'' if row['samples_trained_equal_off'] else ' samples_trained differs from off'}")
    out = ROOT / "benchmarks" / "results" / f"serve_{args.name}.json"
    command = " ".join(["benchmarks/serve.py", *sys.argv[1:]])
    out.write_text(json.dumps({"name": args.name, "command": command, "overrides": args.overrides,
                               "seeds": args.seeds, "settings": settings, "table": table, "runs": runs},
                              indent=2) + "\n")
    print(f"raw: {out.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
