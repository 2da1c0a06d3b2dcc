"""What the benchmark scripts share: one training run under torchrun, the order that alternates
runs within a seed, and the pairing of runs by seed.

A script is run as a file (``.venv/bin/python benchmarks/<script>.py``), which puts benchmarks/
on the path but not the repository root. Each script that imports from benchmarks/ or the
package first puts the root there, then imports from ``benchmarks.*``:

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from benchmarks._runner import ROOT, run_policy  # noqa: E402

so that a script imported by another (or by a test, from the root) is the same module.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Callable, Dict, Iterator, List, Optional, Sequence, Tuple, TypeVar

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
# A run that ends this far below its paired (same-seed) off run is flagged: a collapse, not noise
# (paired differences spread by about 0.0005 on this project's data).
COLLAPSE_AUC = 0.005
FIELDS = ["train_seconds", "train_cpu_seconds", "samples_trained", "samples_seen", "samples_skipped",
          "skip_fraction", "val_auc", "val_logloss", "test_auc", "test_logloss", "slipstream_overhead_seconds",
          "steps", "threshold", "hot_rows", "stale_rows", "first_skip_step", "target_skip_fraction",
          "quality_decisions", "policy"]

L = TypeVar("L")


def run_policy(choice: List[str], nproc: int, overrides: List[str], run_dir: Path) -> Dict:
    """One run; ``choice`` selects the policy (``slipstream=<name>`` and its own overrides)."""
    env = dict(os.environ, OMP_NUM_THREADS="1", PATH=f"{BIN}{os.pathsep}{os.environ['PATH']}")
    cmd = [
        str(BIN / "torchrun"), "--standalone", "--nproc_per_node", str(nproc), "-m", "slipstream_rec.train",
        *choice, "trainer.eval_every_steps=0", "trainer.progress_bar=false",
        "trainer.tensorboard=false", f"trainer.run_dir={run_dir}", *overrides,
    ]
    out = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit(f"failed: {' '.join(cmd)}\n{out.stderr[-3000:]}")
    summary = json.loads((run_dir / "summary.json").read_text())
    return {k: summary.get(k) for k in FIELDS}


def in_turn(labels: Sequence[L], r: int) -> List[L]:
    """The labels in the order the ``r``-th seed (from 0) runs them: as given on even seeds,
    reversed on odd ones, so that machine noise (a slow first run, a warm cache) hits all alike."""
    return list(labels) if r % 2 == 0 else list(reversed(labels))


def alternating(labels: Sequence[L], seeds: int) -> Iterator[Tuple[int, L]]:
    """(seed, label) for every label once per seed 0..seeds-1, in ``in_turn`` order."""
    for r in range(seeds):
        for label in in_turn(labels, r):
            yield r, label


def run_alternately(labels: Sequence[str], seeds: int, run: Callable[[str, int], Dict]) -> Dict[str, List[Dict]]:
    """``run(label, seed)`` in ``alternating`` order: each label's results, in seed order."""
    runs: Dict[str, List[Dict]] = {label: [] for label in labels}
    for r, label in alternating(labels, seeds):
        runs[label].append(run(label, r))
    return runs


def pair_by_seed(mine: List[Dict], base: List[Dict], value: Callable[[Dict, Dict], float]) -> List[float]:
    """``value(a, b)`` of each seed's two runs: ``mine``'s and ``base``'s, both in seed order."""
    return [value(a, b) for a, b in zip(mine, base)]


def auc_difference(a: Dict, b: Dict) -> float:
    """Test AUC of ``a`` less that of ``b`` (runs of the same seed)."""
    return a["test_auc"] - b["test_auc"]


def fmt_cell(v: Optional[float], spec: str, width: int) -> str:
    """A table cell: ``v`` in ``spec``, right-aligned to ``width``; blank for None."""
    return f"{'' if v is None else format(v, spec):>{width}}"
