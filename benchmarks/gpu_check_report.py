"""One line of benchmarks/gpu_check.sh's table for a finished run directory.

    python benchmarks/gpu_check_report.py NAME RUN_DIR

From ``summary.json``: samples/s, served fraction, embedding bytes per trained sample, GPU-cache
hit rate, test AUC, steps; from ``sync_audit_rank0.json`` (trainer.sync_audit=true): per plain
step of the second half of the run, the device syncs of ours and of TorchRec the audit counted
and those CUDA itself reported (``cuda``, GPU runs only). Exit 1 when the run left no summary.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def syncs(run: Path, steps: int) -> str:
    audit = run / "sync_audit_rank0.json"
    if not audit.is_file():
        return "n/a"
    plain = [s for s in json.loads(audit.read_text())["steps"] if not s["kinds"] and s["step"] >= steps // 2]
    if not plain:
        return "n/a"

    def mean(f) -> float:  # type: ignore[no-untyped-def]
        return sum(f(s) for s in plain) / len(plain)

    return (
        f"ours={mean(lambda s: s['counts']['ours'] + s['counts']['other']):.2f} "
        f"torchrec={mean(lambda s: s['counts']['torchrec']):.2f} "
        f"cuda={mean(lambda s: s.get('cuda_syncs', 0)):.2f}"
    )


def main() -> int:
    name, run = sys.argv[1], Path(sys.argv[2])
    try:
        s = json.loads((run / "summary.json").read_text())
    except OSError as e:
        print(f"{name:26s} no summary ({e})")
        return 1
    hit = (s.get("embedding_cache") or {}).get("hit_rate")
    auc = s.get("test_auc")
    print(
        f"{name:26s} samples/s={s['samples_per_second']:.0f} served={s.get('served_fraction', 0):.3f} "
        f"a2a_B/sample={(s.get('a2a_bytes_per_sample') or {}).get('total', 0):.0f} "
        f"cache_hit={'n/a' if hit is None else f'{hit:.4f}'} "
        f"test_auc={'n/a' if auc is None else f'{auc:.4f}'} steps={s['steps']} "
        f"plain-step syncs: {syncs(run, s['steps'])}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
