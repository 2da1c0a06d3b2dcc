"""The run directory as one job leaves it (slipstream_rec/job.py, preflight.py), through the
installed ``slipstream-train`` in one process: a refused resume changes nothing in the run
directory, a finished run is not trained again in place, and a policy that cannot act within
the run says so in one line at the start."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Dict, List, Optional

import pytest

BIN = Path(sys.executable).parent
# 20 steps with a checkpoint every 8; the smoke run is killed after step 10 (exit 13) on request.
SMOKE = ["experiment=smoke", "trainer.progress_bar=false", "trainer.checkpoint.every_steps=8",
         "trainer.eval_every_steps=0"]  # fmt: skip


def _train(cwd: Path, *overrides: str, env: Optional[Dict[str, str]] = None) -> subprocess.CompletedProcess:
    full = {k: v for k, v in os.environ.items() if not k.startswith(("SLIPSTREAM_FAULT", "HYDRA_FULL_ERROR", "RANK", "WORLD_SIZE"))}
    full.update(OMP_NUM_THREADS="1", **(env or {}))
    cmd = [str(BIN / "slipstream-train"), *SMOKE, "trainer.run_dir=runs/r", *overrides]
    return subprocess.run(cmd, cwd=cwd, env=full, capture_output=True, text=True, timeout=300)


def _files(run_dir: Path) -> Dict[str, bytes]:
    """Every file of the run directory but the checkpoints and run.lock, by name. run.lock says
    which process holds the directory, not what the run did: the crashed run leaves its own
    behind, and the next start takes it over and removes it (tests/test_run_lifecycle.py)."""
    return {p.name: p.read_bytes() for p in run_dir.iterdir() if p.is_file() and p.name != "run.lock"}


def _error_lines(result: subprocess.CompletedProcess) -> List[str]:
    assert "Traceback" not in result.stderr, result.stderr[-3000:]
    return [line for line in result.stderr.splitlines() if "error:" in line]


def test_a_refused_resume_and_a_finished_run_leave_the_run_directory_as_it_was(tmp_path):
    run_dir = tmp_path / "runs" / "r"
    crashed = _train(tmp_path, "slipstream=paper_plus", env={"SLIPSTREAM_FAULT_STEP": "10", "SLIPSTREAM_FAULT": "exit"})
    assert crashed.returncode == 13, crashed.stderr[-3000:]
    # paper_plus cannot skip in 20 steps (count_steps 100 + snapshot_interval 50): one line says so
    warned = [l for l in crashed.stdout.splitlines() if "slipstream=paper_plus skips no stale input" in l]
    assert len(warned) == 1 and "it trains 20 steps" in warned[0], crashed.stdout[-3000:]
    assert "slipstream.count_steps=100" in warned[0] and "Fix:" in warned[0] and "slipstream=off" in warned[0]
    assert (run_dir / "checkpoints" / "step_000000008").is_dir()
    before = _files(run_dir)
    assert set(before) == {"config.yaml", "metrics.jsonl"}

    # Another policy cannot continue the tracking checkpoint: refused, and nothing was rewritten.
    other = _train(tmp_path, "slipstream=off")
    assert other.returncode == 2
    lines = _error_lines(other)
    assert len(lines) == 1 and "slipstream.policy=off" in lines[0] and "Fix:" in lines[0], other.stderr[-3000:]
    assert _files(run_dir) == before, "the refused resume rewrote the run directory"

    # The same policy continues it to the end, each step recorded once.
    resumed = _train(tmp_path, "slipstream=paper_plus")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["resumed_from"]["step"] == 8 and summary["steps"] == 20
    records = [json.loads(l) for l in (run_dir / "metrics.jsonl").read_text().splitlines()]
    train_steps = [r["step"] for r in records if r["kind"] == "train"]
    assert train_steps == sorted(set(train_steps))
    finished = _files(run_dir)

    # Training the finished run again: refused before anything starts, with the way on.
    again = _train(tmp_path, "slipstream=paper_plus")
    assert again.returncode == 2
    lines = _error_lines(again)
    assert len(lines) == 1 and "trainer.run_dir=runs/r holds a finished run (summary.json)" in lines[0], again.stderr
    assert "trainer.resume=runs/r/checkpoints" in lines[0]
    assert _files(run_dir) == finished
    assert sum(r["kind"] == "eval" for r in map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines())) == sum(
        r["kind"] == "eval" for r in records
    )


def test_policy_cannot_act_names_the_step_it_would_start_at():
    from slipstream_rec.config import load_config
    from slipstream_rec.preflight import policy_cannot_act

    job = load_config(["slipstream=paper_plus"])  # count_steps 100, snapshot_interval 50
    assert policy_cannot_act(job, 151) is None  # the step after the second snapshot skips
    assert "acts from step 150 on" in policy_cannot_act(job, 150)
    assert policy_cannot_act(load_config(["slipstream=off"]), 8) is None
    random = load_config(["slipstream=random"])  # warmup_steps 150
    assert "slipstream.warmup_steps=150" in policy_cannot_act(random, 100)
    assert policy_cannot_act(random, 151) is None
    # the fix it proposes makes the same run act
    small = policy_cannot_act(job, 8)
    scaled = small.split("scale the policy to the run (", 1)[1].split(")", 1)[0].split()
    assert policy_cannot_act(load_config(["slipstream=paper_plus", *scaled]), 8) is None
