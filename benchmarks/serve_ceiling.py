"""The ceiling of per-lookup serving: which share of each sharded table's lookups hit stale rows.

For each dataset (``--data LABEL=OVERRIDES``) one ``slipstream=serve`` run (fp32, no negative
downsampling, seed 0), then from its ``summary.json`` and rank 0's ``metrics.jsonl``:
- per table, the share of its lookups served from the replica, over the whole run and over the
  second half (the difference of the running counts the serve records carry, rank 0), and the
  table's sharding type (data-parallel tables are looked up locally anyway: serving them saves
  no bytes, but their bags still take slots);
- the slots sent through the shards over all bags (``slots_fraction``: what the pooled-embedding
  and gradient all-to-alls shrink to), and its floor in the second half, 1 minus the least
  served table's share: S per feature is the largest number of one table's bags that keep a
  sharded lookup, on any rank;
- the embedding bytes per trained sample against ``off``'s on the same seed, by kind.

Writes ``benchmarks/results/serve_ceiling.json`` (``--out``) and prints one table per dataset.

    .venv/bin/python benchmarks/serve_ceiling.py \
        --data clicklog_quick="experiment=clicklog_quick" \
        --data clicklog_raw_quick="experiment=clicklog_quick data=clicklog_raw data.name=clicklog_raw_quick" \
        --data synthetic_quick="experiment=skewed_quick data.synthetic.zipf_exponent=1.1 data.name=synthetic_quick" \
        --data movielens_1m="data=movielens_1m model=dlrm_small model.dense_arch_layer_sizes=[64,16] trainer.batch_size=1024 slipstream.count_steps=40 slipstream.count_fraction=0.25 slipstream.snapshot_interval=20"
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, List

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks._runner import ROOT, run_policy  # noqa: E402

COMMON = ["trainer.precision=fp32", "downsampling=off", "trainer.seed=0"]


def _records(run_dir: Path) -> List[Dict[str, Any]]:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if r.get("kind") == "slipstream" and "lookups_by_feature" in r]


def measure(label: str, overrides: List[str], work: Path, nproc: int) -> Dict[str, Any]:
    out: Dict[str, Any] = {"label": label, "overrides": overrides}
    summaries = {}
    for policy in ("off", "serve"):
        run_dir = work / f"{label}_{policy}"
        t0 = time.perf_counter()
        run_policy([f"slipstream={policy}"], nproc, COMMON + overrides, run_dir)
        summaries[policy] = json.loads((run_dir / "summary.json").read_text())
        out[f"{policy}_wall_s"] = round(time.perf_counter() - t0, 1)
    serve, off = summaries["serve"], summaries["off"]
    plan = serve.get("sharding_plan") or {}
    records = _records(work / f"{label}_serve")
    tables = list(plan)  # the tables in the model's feature order, as the counts are
    assert len(tables) == len(serve["served_by_feature"]), "one count per table"
    half = next((r for r in records if r["step"] >= serve["steps"] // 2), None)
    last = records[-1] if records else None
    per_table = []
    for f, table in enumerate(tables):
        row = {"table": table, "sharding": plan.get(table), "served_run": serve["served_by_feature"][f]}
        if half is not None and last is not None and last is not half:
            seen = last["lookups_by_feature"][f] - half["lookups_by_feature"][f]
            hit = last["served_by_feature"][f] - half["served_by_feature"][f]
            row["served_second_half"] = round(hit / seen, 4) if seen else 0.0
        per_table.append(row)
    out["per_table"] = per_table
    out["served_fraction"] = serve["served_fraction"]
    out["slots_fraction"] = serve["slots_fraction"]
    if half is not None and last is not None and last is not half:
        out["slots_fraction_second_half"] = round(
            (last["slots_sent"] - half["slots_sent"]) / max(1, last["bags_split"] - half["bags_split"]), 4
        )
        least = min(per_table, key=lambda r: r.get("served_second_half", 1.0))
        out["least_served_table"] = least
    out["bytes_per_sample"] = {"off": off["a2a_bytes_per_sample"], "serve": serve["a2a_bytes_per_sample"]}
    out["test_auc"] = {"off": off["test_auc"], "serve": serve["test_auc"]}
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--data", action="append", required=True, metavar="LABEL=OVERRIDES")
    p.add_argument("--nproc", type=int, default=2)
    p.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "serve_ceiling.json")
    args = p.parse_args()
    results = []
    with tempfile.TemporaryDirectory(prefix="serve_ceiling_") as tmp:
        for spec in args.data:
            label, _, rest = spec.partition("=")
            r = measure(label, shlex.split(rest), Path(tmp), args.nproc)
            results.append(r)
            b_off, b_srv = r["bytes_per_sample"]["off"], r["bytes_per_sample"]["serve"]
            print(f"\n{label}: served {r['served_fraction']:.3f} of lookups, slots {r['slots_fraction']:.3f} "
                  f"(second half {r.get('slots_fraction_second_half')}), embedding bytes/sample "
                  f"{b_off['embedding']:.0f} -> {b_srv['embedding']:.0f} (+push {b_srv['push']:.0f}, "
                  f"replica {b_srv['replica']:.0f}); test AUC {r['test_auc']['off']:.4f} -> {r['test_auc']['serve']:.4f}")
            for row in r["per_table"]:
                print(f"  {row['table']:24s} {str(row['sharding']):15s} run {row['served_run']:.3f} "
                      f"second half {row.get('served_second_half', float('nan')):.3f}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"command": " ".join(shlex.quote(a) for a in sys.argv), "results": results}, indent=1))
    print(f"\nwrote {args.out}")


if __name__ == "__main__":
    main()
