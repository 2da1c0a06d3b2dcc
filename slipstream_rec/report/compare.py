"""Run against the first run: config differences and the comparison table's figures."""

from __future__ import annotations

import json
import math
from typing import Any, Dict, List, Optional, Tuple

from slipstream_rec.report.runs import Run

# Keys that differ between any two runs by construction and say nothing about the experiment.
IGNORED_CONFIG_KEYS = ("trainer.run_dir",)
ABSENT = "(absent)"


def config_diff(runs: List[Run]) -> Tuple[List[str], List[Optional[Dict[str, Any]]]]:
    """Keys whose value differs from the first run's in at least one run, and per run the keys
    (of those) that differ from the first run with this run's value. ``None`` for a run without
    a config (and for every run if the first has none)."""
    first = runs[0].flat_config if runs[0].config is not None else None
    per_run: List[Optional[Dict[str, Any]]] = []
    keys: set = set()
    for run in runs:
        if first is None or run.config is None:
            per_run.append(None)
            continue
        flat = run.flat_config
        diff = {}
        for key in sorted(set(first) | set(flat)):
            if key in IGNORED_CONFIG_KEYS:
                continue
            mine, theirs = flat.get(key, ABSENT), first.get(key, ABSENT)
            if mine != theirs:
                diff[key] = mine
        keys |= set(diff)
        per_run.append(diff)
    return sorted(keys), per_run


def show(value: Any) -> str:
    """A config value as YAML would show it (strings bare)."""
    if isinstance(value, str):
        return value
    return json.dumps(value)


def _num(value: Any) -> Optional[float]:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None


def comparison_rows(runs: List[Run]) -> List[Dict[str, Any]]:
    """One row per run; every figure None where the run lacks it. Speedup, dAUC, ideal speedup
    and efficiency need complete runs (and, for the first two, a complete first run)."""
    first = runs[0]
    base_seconds = _num(first.get("train_seconds"))
    base_auc = _num(first.get("test_auc"))
    _, diffs = config_diff(runs)
    rows = []
    for run, diff in zip(runs, diffs):
        seconds = _num(run.get("train_seconds"))
        skip = _num(run.get("skip_fraction"))
        test_auc = _num(run.get("test_auc"))
        speedup = base_seconds / seconds if base_seconds and seconds else None
        ideal = 1.0 / (1.0 - skip) if skip is not None and skip < 1 else None
        rows.append(
            {
                "label": run.label,
                "path": str(run.path),
                "status": run.status,
                "policy": run.policy,
                "config_diff": diff,
                "samples_trained": run.samples_trained(),
                "last_step": run.get("steps") if run.complete else (run.last_train() or {}).get("step"),
                "samples_skipped": run.get("samples_skipped"),
                "samples_seen": run.get("samples_seen"),
                "skip_fraction": skip,
                "train_seconds": seconds,
                "speedup": speedup,
                "val_auc": _num(run.get("val_auc")),
                "test_auc": test_auc,
                "test_logloss": _num(run.get("test_logloss")),
                "dauc": test_auc - base_auc if test_auc is not None and base_auc is not None else None,
                "ideal_speedup": ideal,
                "efficiency": speedup / ideal if speedup is not None and ideal else None,
            }
        )
    return rows
