"""``slipstream-train --nproc N`` (slipstream_rec/launcher.py), run as a user runs it: the config
is checked once, N ranks start through torch.distributed.run's API, and the command ends with
rank 0's result line or one error line, never N copies and torchrun's traceback."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Dict, List, Optional

BIN = Path(sys.executable).parent
SMOKE = ["experiment=smoke", "trainer.progress_bar=false"]


def _train(cwd: Path, *args: str, env: Optional[Dict[str, str]] = None) -> subprocess.CompletedProcess:
    full = {k: v for k, v in os.environ.items()
            if not k.startswith(("SLIPSTREAM_FAULT", "HYDRA_FULL_ERROR", "RANK", "WORLD_SIZE", "TORCHELASTIC"))}  # fmt: skip
    full.update(OMP_NUM_THREADS="1", **(env or {}))
    return subprocess.run([str(BIN / "slipstream-train"), *args], cwd=cwd, env=full, capture_output=True, text=True, timeout=300)


def _the_one_error_line(result: subprocess.CompletedProcess) -> str:
    """stderr's only error line, which is its last line; no traceback (ours or torchrun's)."""
    err = result.stderr
    assert "Traceback" not in err and "ChildFailedError" not in err, err[-3000:]
    errors = [line for line in err.splitlines() if "error" in line.lower()]
    assert len(errors) == 1, err[-3000:]
    assert err.strip().splitlines()[-1] == errors[0] and errors[0].startswith("slipstream-train: error: ")
    return errors[0]


def test_a_bad_key_is_one_line_before_any_rank_starts(tmp_path):
    r = _train(tmp_path, "--nproc", "2", *SMOKE, "trainer.bach_size=64")
    assert r.returncode == 2
    assert "did you mean trainer.batch_size?" in _the_one_error_line(r)
    assert not (tmp_path / "runs").exists() and not (tmp_path / "data").exists()


def test_the_batch_check_uses_the_launched_world_size(tmp_path):
    from tests._fixtures import write_dataset

    path = write_dataset(tmp_path / "d", {"train": 300, "val": 40, "test": 40})
    r = _train(tmp_path, "--nproc", "2", "data.source=npy", f"data.path={path}", "trainer.batch_size=200")
    assert r.returncode == 2
    assert "Fix: trainer.batch_size=4 (37 steps per epoch; at most 150 fits)" in _the_one_error_line(r)  # 300 rows / 2 ranks


def test_an_error_on_every_rank_is_printed_once(tmp_path):
    # found only once the model is sharded, on both ranks: the launcher shows one of the lines
    r = _train(tmp_path, "--nproc", "2", *SMOKE, "sharding=column_wise", "sharding.column_shard_dim=3")
    assert r.returncode == 2
    assert "sharding.column_shard_dim=3 does not divide the embedding dim" in _the_one_error_line(r)


def test_two_ranks_train_and_end_with_rank_0s_result_line(tmp_path):
    r = _train(tmp_path, "--nproc", "2", *SMOKE, "trainer.run_dir=runs/two")
    assert r.returncode == 0, r.stderr[-3000:]
    last = r.stdout.strip().splitlines()[-1]
    assert last.startswith("done: slipstream=off ") and "summary=runs/two/summary.json" in last
    assert r.stdout.count("done: ") == 1  # rank 0 only
    assert json.loads((tmp_path / "runs" / "two" / "summary.json").read_text())["world_size"] == 2


def test_max_restarts_restarts_a_killed_rank_which_resumes_from_its_checkpoint(tmp_path):
    args = ["--nproc", "2", *SMOKE, "trainer.run_dir=runs/r", "trainer.checkpoint.every_steps=8"]
    kill = {"SLIPSTREAM_FAULT_STEP": "13", "SLIPSTREAM_FAULT_RANK": "1"}  # SIGKILL, first attempt only
    lost = _train(tmp_path, *args, env=kill)
    assert lost.returncode == 3
    assert "rank 1 was killed by SIGKILL" in _the_one_error_line(lost)
    restarted = _train(tmp_path, "--max-restarts", "1", *args[:-2], "trainer.run_dir=runs/r2", args[-1], env=kill)
    assert restarted.returncode == 0, restarted.stderr[-3000:]
    summary = json.loads((tmp_path / "runs" / "r2" / "summary.json").read_text())
    assert summary["resumed_from"]["step"] == 8 and summary["steps"] == 20


def test_nproc_is_refused_under_torchrun_and_max_restarts_needs_it(tmp_path):
    r = _train(tmp_path, "--nproc", "2", *SMOKE, env={"RANK": "0"})
    assert r.returncode == 2 and "under torchrun or TorchX leave it out" in r.stderr
    r = _train(tmp_path, "--max-restarts", "1", *SMOKE)
    assert r.returncode == 2 and "goes with --nproc" in r.stderr


def test_a_rank_killed_by_sigabrt_is_explained_as_nccls_watchdog(tmp_path):
    # NCCL's watchdog aborts a rank whose collective outlived its timeout: the line says so
    # instead of "out of memory"; the peers stopped by the agent (SIGTERM) are not the cause.
    import signal
    from types import SimpleNamespace

    from slipstream_rec.launcher import EXIT_LOST_RANK, explain_failure

    failures = {0: SimpleNamespace(exitcode=-signal.SIGTERM), 1: SimpleNamespace(exitcode=-signal.SIGABRT)}
    line, code = explain_failure(failures, tmp_path)
    assert code == EXIT_LOST_RANK and line.startswith("slipstream-train: error: rank 1 was killed by SIGABRT")
    assert "NCCL's watchdog" in line and "trainer.collective_timeout_s" in line
    line, _ = explain_failure({0: SimpleNamespace(exitcode=-signal.SIGKILL)}, tmp_path)
    assert "killed by SIGKILL (out of memory, or stopped from outside)" in line


def test_the_earliest_line_s_rank_stopped_by_the_agent_keeps_its_peer_s_exit_code(tmp_path):
    # Both ranks found the same bad input; rank 0 wrote first, rank 1 exited first (code 2) and the
    # agent stopped rank 0 (SIGTERM) on its way out: still one line and exit code 2, not 1.
    import signal
    from types import SimpleNamespace

    from slipstream_rec.launcher import explain_failure

    (tmp_path / "rank0.err").write_text("100\tslipstream-train: error: the cause")
    (tmp_path / "rank1.err").write_text("101\tslipstream-train: error: the echo")
    failures = {0: SimpleNamespace(exitcode=-signal.SIGTERM), 1: SimpleNamespace(exitcode=2)}
    assert explain_failure(failures, tmp_path) == ("slipstream-train: error: the cause", 2)
    assert explain_failure({1: SimpleNamespace(exitcode=2)}, tmp_path) == ("slipstream-train: error: the cause", 2)
    failures = {0: SimpleNamespace(exitcode=1), 1: SimpleNamespace(exitcode=2)}  # its own code first
    assert explain_failure(failures, tmp_path) == ("slipstream-train: error: the cause", 1)
