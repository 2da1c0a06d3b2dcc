"""The headline: the main job's defaults against TorchRec's golden loop and ``off``, side by side.

Per dataset (``--datasets``, each a ``conf/data`` option) and seed r, three runs of one epoch on
the same npy files, 2 ranks, 2048 samples per rank per step, in alternating order so that machine
noise hits all alike:

* ``golden``: TorchRec's golden training loop (benchmarks/torchrec_golden_loop.py: fp32, no
  skipping, TorchRec's planner and default sharders, its own Criteo reader), ``--seed r``;
* ``off``: this trainer with ``slipstream=off trainer.precision=fp32``: stock TorchRec training
  through our loop, the quality baseline;
* ``defaults``: the main job as a user gets it (no override but the data and the seed):
  ``slipstream=serve``, ``trainer.precision=auto``, ``downsampling=auto``, with serving
  and bf16 each kept only where the run measures them faster (``serve_when=auto``, the
  precision probe);
* ``serve_always`` (asked for by ``--arms``): the defaults with ``slipstream.serve_when=always``,
  serving whatever it costs (the main job before the serve lever);
* ``off_auto`` (asked for by ``--arms``): ``slipstream=off`` with the other defaults (precision
  auto, downsampling auto): every lever but Slipstream.

Printed and written to ``benchmarks/results/headline.json``: per run train seconds (evaluations
excluded, timed the same way in both loops), samples trained per second, test AUC and log loss,
and calibration (mean predicted against observed click rate on test); per dataset and arm the
means, the speedup over ``golden`` (its train seconds over the arm's, per seed) and the paired
test AUC against ``off`` and ``golden``; and the issue's targets, met or not.

    .venv/bin/python benchmarks/headline.py --seeds 3                      # clicklog_raw and clicklog
    .venv/bin/python benchmarks/headline.py --seeds 1 --datasets synthetic --arms off,defaults
    .venv/bin/python benchmarks/headline.py --datasets instacart --batch-size 128   # fetched first
    .venv/bin/python benchmarks/headline.py --datasets data/my_log                   # a converted directory

A dataset is a ``conf/data`` option (the logs of ``benchmarks/external_logs.py`` are fetched
first) or a directory ``slipstream-data`` converted (read as ``data.source=npy``).
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
from benchmarks.baseline_throughput import run_golden as golden_loop  # noqa: E402
from benchmarks.external_logs import ensure as ensure_external  # noqa: E402

ARMS = {
    "golden": None, "off": ["slipstream=off", "trainer.precision=fp32"], "defaults": [],
    "serve_always": ["slipstream.serve_when=always"], "off_auto": ["slipstream=off", "downsampling=auto"],
}  # fmt: skip
EXTRA = ["samples_per_second", "test_ctr", "test_predicted_ctr", "precision", "negative_downsampling", "served_fraction",
         "dataset", "serve_lever", "time_breakdown_rank0"]  # fmt: skip
# The issue's targets: speedup over golden (train seconds) per dataset, and the quality bounds.
SPEEDUP_TARGET = {"clicklog_raw": 3.0, "clicklog": 1.3}
MIN_PAIRED_AUC, MIN_SEED_AUC, CALIBRATION = -0.001, -0.002, 0.05


def data_overrides(dataset: str) -> List[str]:
    """How a training run names ``dataset``: a converted directory or a ``conf/data`` option."""
    return ["data.source=npy", f"data.path={dataset}"] if Path(dataset).is_dir() else [f"data={dataset}"]


def dataset_path(dataset: str, overrides: List[str]) -> Path:
    """The npy directory of a dataset, generated or converted if needed (what a training run would use)."""
    from slipstream_rec.config import load_config
    from slipstream_rec.data.datasets import ensure_dataset

    ensure_external(dataset)
    return Path(ensure_dataset(load_config([*data_overrides(dataset), *overrides]).data))


def run_golden(data: Path, seed: int, nproc: int, batch: int) -> Dict:
    """One epoch of TorchRec's golden loop with TorchRec's planner, then its test evaluation."""
    res = golden_loop(str(data), 0, batch, "auto", nproc, ["--seed", str(seed), "--test"])
    res["samples_trained"] = res.pop("samples")
    return res


def run_ours(choice: List[str], dataset: str, seed: int, nproc: int, run_dir: Path, extra: List[str]) -> Dict:
    overrides = [*data_overrides(dataset), *extra, f"trainer.seed={seed}", "trainer.checkpoint.enabled=false"]
    res = run_policy(choice, nproc, overrides, run_dir)
    summary = json.loads((run_dir / "summary.json").read_text())
    res.update({k: summary.get(k) for k in EXTRA})
    return res


def summarize(runs: Dict[str, List[Dict]], dataset: str) -> Dict[str, Dict]:
    """Means per arm, speedup over golden and paired test AUC against off and golden, per seed."""
    table = {}
    for arm, mine in runs.items():
        row: Dict = {
            "train_seconds": statistics.mean(x["train_seconds"] for x in mine),
            "samples_per_second": statistics.mean(x["samples_per_second"] for x in mine),
            "test_auc": statistics.mean(x["test_auc"] for x in mine),
            "test_logloss": statistics.mean(x["test_logloss"] for x in mine),
            "calibration_per_seed": [x["test_predicted_ctr"] / x["test_ctr"] for x in mine],
        }
        for base in ("golden", "off"):
            if base in runs and base != arm:
                row[f"paired_test_auc_vs_{base}_per_seed"] = pair_by_seed(mine, runs[base], auc_difference)
                row[f"paired_test_auc_vs_{base}"] = statistics.mean(row[f"paired_test_auc_vs_{base}_per_seed"])
        for base in ("golden", "off"):
            if base in runs and arm != base:
                row[f"speedup_vs_{base}_per_seed"] = pair_by_seed(mine, runs[base], lambda a, b: b["train_seconds"] / a["train_seconds"])
                row[f"speedup_vs_{base}"] = statistics.mean(row[f"speedup_vs_{base}_per_seed"])
        table[arm] = row
    d = table.get("defaults")
    if d is not None and "paired_test_auc_vs_off" in d:
        target = SPEEDUP_TARGET.get(dataset)
        per_seed = d["paired_test_auc_vs_off_per_seed"]
        d["targets"] = {
            "speedup_vs_golden": None if target is None or "speedup_vs_golden" not in d
            else {"target": target, "met": d["speedup_vs_golden"] >= target},
            "paired_test_auc_vs_off": {"target": MIN_PAIRED_AUC, "met": d["paired_test_auc_vs_off"] >= MIN_PAIRED_AUC},
            "no_seed_below": {"target": MIN_SEED_AUC, "met": min(per_seed) >= MIN_SEED_AUC},
            "calibration_within": {"target": CALIBRATION, "met": all(abs(c - 1) <= CALIBRATION for c in d["calibration_per_seed"])},
            # issue 29: never slower than the stock recipe on any seed, never worse than -0.001
            "never_slower_than_off": None if "speedup_vs_off_per_seed" not in d
            else {"target": 1.0, "met": min(d["speedup_vs_off_per_seed"]) >= 1.0},
            "no_seed_below_vs_off": {"target": MIN_PAIRED_AUC, "met": min(per_seed) >= MIN_PAIRED_AUC},
        }  # fmt: skip
    return table


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--datasets", default="clicklog_raw,clicklog", help="conf/data options, comma-separated")
    p.add_argument("--arms", default="golden,off,defaults", help=f"a subset of {','.join(ARMS)}")
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--nproc", type=int, default=2)
    p.add_argument("--batch-size", type=int, default=2048, help="samples per rank per step, every arm")
    p.add_argument("--name", default="headline", help="results file benchmarks/results/<name>.json")
    p.add_argument("overrides", nargs="*", help="Hydra overrides of the data for every run (ours and the golden loop's files)")
    args = p.parse_args()
    arms = [a for a in args.arms.split(",") if a]
    unknown = sorted(set(arms) - set(ARMS))
    if unknown:
        raise SystemExit(f"--arms {args.arms}: unknown {unknown}; use a subset of {','.join(ARMS)}")
    results: Dict[str, Dict] = {}
    for dataset in [d for d in args.datasets.split(",") if d]:
        data = dataset_path(dataset, args.overrides)
        meta = json.loads((data / "meta.json").read_text())
        if "golden" in arms and (meta["num_dense"], meta["num_sparse"]) != (13, 26):
            raise SystemExit(
                f"headline.py: --datasets {dataset}: the golden loop reads TorchRec's Criteo layout (13 dense, 26 "
                f"sparse columns) and this data has {meta['num_dense']} and {meta['num_sparse']}. Fix: leave golden "
                "out of --arms (e.g. --arms off,defaults,off_auto)"
            )
        runs_root = ROOT / "benchmarks" / "results" / "runs" / f"{args.name}_{Path(dataset).name}"
        if runs_root.exists():  # an earlier invocation's runs: a run directory is never trained twice
            shutil.rmtree(runs_root)

        def one(arm: str, r: int) -> Dict:
            if arm == "golden":
                res = run_golden(data, r, args.nproc, args.batch_size)
            else:
                extra = [*args.overrides, f"trainer.batch_size={args.batch_size}"]
                res = run_ours(ARMS[arm], dataset, r, args.nproc, runs_root / f"{arm}-s{r}", extra)
            print(f"{dataset} seed {r} {arm:>8}: train {res['train_seconds']:.1f} s, "
                  f"{res['samples_per_second']:.0f} samples/s, test AUC {res['test_auc']:.4f}, "
                  f"predicted/observed CTR {res['test_predicted_ctr'] / res['test_ctr']:.3f}", flush=True)
            return res

        runs = run_alternately(arms, args.seeds, one)
        results[dataset] = {"data": str(data), "table": summarize(runs, dataset), "runs": runs}
    print(f"\n{args.seeds} seeds, {args.nproc} ranks")
    print("dataset | arm | train s | samples/s | speedup vs golden (per seed) | test AUC | paired vs off (per seed) | predicted/observed CTR")
    for dataset, res in results.items():
        for arm, row in res["table"].items():
            speed = row.get("speedup_vs_golden")
            pair = row.get("paired_test_auc_vs_off")
            print(f"{dataset} | {arm} | {row['train_seconds']:.1f} | {row['samples_per_second']:.0f} | "
                  + (f"{speed:.2f}x ({', '.join(f'{s:.2f}' for s in row['speedup_vs_golden_per_seed'])})" if speed else "-")
                  + f" | {row['test_auc']:.4f} | "
                  + (f"{pair:+.4f} ({', '.join(f'{d:+.4f}' for d in row['paired_test_auc_vs_off_per_seed'])})" if pair is not None else "-")
                  + f" | {', '.join(f'{c:.3f}' for c in row['calibration_per_seed'])}")
            if "targets" in row:
                print(f"  targets: {json.dumps({k: v for k, v in row['targets'].items() if v})}")
    out = ROOT / "benchmarks" / "results" / f"{args.name}.json"
    command = " ".join(["benchmarks/headline.py", *sys.argv[1:]])
    out.write_text(json.dumps({"command": command, "seeds": args.seeds, "arms": arms, "overrides": args.overrides,
                               "results": results}, indent=2) + "\n")
    print(f"raw: {out.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
