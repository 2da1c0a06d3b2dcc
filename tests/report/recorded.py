"""Recorded run directories without training: the files a finished run writes, with chosen figures.

``config.yaml`` is the composed job config as the trainer writes it (``job.py``: ``to_yaml`` of
``load_config(overrides)``); ``summary.json`` holds the summary fields the report reads;
``metrics.jsonl`` one train record and the final val and test evaluation (as a run with
``trainer.eval_every_steps=0`` writes them). A test chooses the AUCs and seconds, so it knows the
paired differences without the code under test.
"""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path
from typing import Any, Dict, Optional, Sequence, Tuple

from slipstream_rec.config import load_config, to_yaml
from slipstream_rec.report.random_control import random_control_overrides

STEPS = 1000
GLOBAL_BATCH = 1024


@lru_cache(maxsize=None)
def config_yaml(overrides: Tuple[str, ...]) -> str:
    return to_yaml(load_config(list(overrides)))


def write_run(run_dir: Path, overrides: Sequence[str], test_auc: float, train_seconds: float,
              skip_fraction: float = 0.0, first_skip_step: Optional[int] = None, test_logloss: float = 0.5,
              policy: str = "off") -> Dict[str, Any]:
    """Write one finished run's files; returns its summary."""
    run_dir.mkdir(parents=True)
    seen = STEPS * GLOBAL_BATCH
    skipped = int(round(skip_fraction * seen))
    summary = {
        "steps": STEPS, "samples_seen": seen, "samples_trained": seen - skipped, "samples_skipped": skipped,
        "skip_fraction": skipped / seen, "train_seconds": train_seconds, "val_auc": test_auc + 0.002,
        "val_logloss": test_logloss - 0.01, "test_auc": test_auc, "test_logloss": test_logloss,
        "first_skip_step": first_skip_step, "policy": policy,
    }
    (run_dir / "config.yaml").write_text(config_yaml(tuple(overrides)))
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    records = [
        {"kind": "train", "step": STEPS, "time": train_seconds, "loss": 0.5, "samples_trained": seen - skipped,
         "skip_fraction": skipped / seen, "threshold": None},
        {"kind": "eval", "step": STEPS, "time": train_seconds + 1, "split": "val", "samples_trained": seen - skipped,
         "auc": summary["val_auc"], "logloss": summary["val_logloss"]},
        {"kind": "eval", "step": STEPS, "time": train_seconds + 2, "split": "test", "samples_trained": seen - skipped,
         "auc": test_auc, "logloss": test_logloss},
    ]
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return summary


def control_overrides(policy_summary: Dict[str, Any]) -> list:
    """What ``benchmarks/slipstream_policies.py --random-control`` runs after a policy's run."""
    return ["slipstream=random", *random_control_overrides(policy_summary)]
