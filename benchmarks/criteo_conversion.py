"""Criteo conversion throughput and peak memory: is memory bounded by the chunk, not the file?

Writes Criteo-format files of growing size (``python -m slipstream_rec.data.generated.criteo_text``, rows
drawn from the synthetic teacher: Criteo Kaggle's 26 cardinalities x 0.01, at most 100k values a
feature, ~254 bytes a row like the real files), converts each with ``slipstream-data criteo``
in its own process (default encoding: vocab, every training value kept) and measures wall time
and the converter's peak RSS (``wait4``'s ru_maxrss of that process). Prints and writes
benchmarks/results/criteo_conversion.json.

    .venv/bin/python benchmarks/criteo_conversion.py --sizes-gb 0.5,2 --work /tmp/criteo_bench
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


def run_measured(cmd, env=None) -> tuple[float, int, str]:
    """(wall seconds, peak RSS in MiB of the process, stdout) of one command."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    out = proc.stdout.read() if proc.stdout else ""
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"failed ({proc.returncode}): {' '.join(map(str, cmd))}\n{out[-3000:]}")
    return wall, usage.ru_maxrss // 1024, out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--sizes-gb", default="0.5,2", help="file sizes to convert (GB, comma-separated)")
    p.add_argument("--work", type=Path, default=Path("/tmp/criteo_bench"))
    p.add_argument("--keep", action="store_true", help="keep the generated files and outputs")
    p.add_argument("--out", type=Path, default=ROOT / "benchmarks/results/criteo_conversion.json")
    args = p.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, OMP_NUM_THREADS="1")
    results = []
    for size in [float(s) for s in args.sizes_gb.split(",")]:
        raw = args.work / f"criteo_{size:g}gb.tsv"
        if not raw.is_file():
            t0 = time.perf_counter()
            subprocess.run([sys.executable, "-m", "slipstream_rec.data.generated.criteo_text", "--out", str(raw),
                            "--size-gb", str(size)], cwd=ROOT, env=env, check=True)
            print(f"generated {raw} in {time.perf_counter() - t0:.0f}s", flush=True)
        out_dir = args.work / f"out_{size:g}gb"
        shutil.rmtree(out_dir, ignore_errors=True)
        cmd = [str(BIN / "slipstream-data"), "criteo", "--no-progress", "--input", str(raw), "--out", str(out_dir),
               f"data.root={args.work / 'cache'}"]
        wall, rss, log = run_measured(cmd, env)
        meta = json.loads((out_dir / "meta.json").read_text())
        rows = sum(meta["rows"].values())
        rec = {
            "file_gb": round(raw.stat().st_size / 1e9, 3),
            "rows": rows,
            "seconds": round(wall, 1),
            "rows_per_second": round(rows / wall),
            "mb_per_second": round(raw.stat().st_size / 1e6 / wall, 1),
            "peak_rss_mib": rss,
            "table_rows": meta["num_embeddings_per_feature"],
            "command": " ".join(map(str, cmd)),
        }
        results.append(rec)
        print(json.dumps({k: v for k, v in rec.items() if k != "table_rows"}), flush=True)
        if not args.keep:
            shutil.rmtree(out_dir, ignore_errors=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"machine": f"{os.cpu_count()} cores", "results": results}, indent=1) + "\n")
    print("\n| file GB | rows | seconds | rows/s | MB/s | peak RSS MiB |\n|---|---|---|---|---|---|")
    for r in results:
        print(f"| {r['file_gb']} | {r['rows']:,} | {r['seconds']} | {r['rows_per_second']:,} | {r['mb_per_second']} | {r['peak_rss_mib']} |")
    if not args.keep:
        for r in args.work.glob("criteo_*gb.tsv"):
            r.unlink()


if __name__ == "__main__":
    main()
