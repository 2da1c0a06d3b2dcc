"""Run against the first run: config differences and the comparison table's figures."""

from __future__ import annotations

import json
import math
from pathlib import Path
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


# data.source -> the settings block it reads (slipstream_rec/config.py's _DATA_BLOCKS); the
# other blocks' settings are in every config.yaml but describe data the run never read.
DATA_BLOCKS = {"synthetic": "synthetic", "clicklog": "clicklog", "criteo": "criteo", "tabular": "tabular",
               "movielens_1m": "movielens"}
# How the data is read, not which rows are in its splits.
NOT_THE_DATA = ("data.root", "data.mmap", "data.shuffle")


def data_identity(run: Run) -> Optional[Dict[str, Any]]:
    """The settings that make a run's dataset and split: the top-level ``data.*`` keys and the
    block of its ``data.source``; without a config, the dataset directory summary.json names."""
    if run.config is not None:
        flat = run.flat_config
        block = f"data.{DATA_BLOCKS.get(str(flat.get('data.source')), '-')}."
        return {k: v for k, v in flat.items() if k.startswith("data.") and k not in NOT_THE_DATA
                and (k.count(".") == 1 or k.startswith(block))}
    dataset = (run.summary or {}).get("dataset")
    return {"dataset": Path(str(dataset)).name} if dataset else None


def other_dataset(first: Run, run: Run) -> Optional[str]:
    """Why ``run`` is of another dataset or split than ``first`` (the first differing keys), or
    None where they are the same or either is unknown."""
    mine, theirs = data_identity(run), data_identity(first)
    if mine is None or theirs is None or mine == theirs:
        return None
    keys = sorted(k for k in set(mine) | set(theirs) if mine.get(k, ABSENT) != theirs.get(k, ABSENT))
    shown = ", ".join(f"{k}={show(mine.get(k, ABSENT))} vs {show(theirs.get(k, ABSENT))}" for k in keys[:3])
    return shown + (f" and {len(keys) - 3} more" if len(keys) > 3 else "")


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
        # Seconds and AUCs of two datasets are not a speedup and a quality cost.
        other = other_dataset(first, run)
        comparable = other is None
        speedup = base_seconds / seconds if base_seconds and seconds and comparable else None
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
                "dauc": test_auc - base_auc if test_auc is not None and base_auc is not None and comparable else None,
                "other_dataset": other,
                "ideal_speedup": ideal,
                "efficiency": speedup / ideal if speedup is not None and ideal else None,
            }
        )
    return rows
