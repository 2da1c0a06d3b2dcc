"""Starting, stopping and continuing runs as a user does (issue 32): a run directory another job
trains into is refused, naming that job's process; a dead job's lock is taken over with a note;
Ctrl-C ends with one line, exit code 130 and the way to resume, which works when followed; a
resume that would train nothing says so and how to train on, and following the finished-run
refusal's own advice trains new steps without calling the run "another configuration".
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

import slipstream_rec.distributed as distributed
from slipstream_rec import train

TOKEN_ENV = "SLIPSTREAM_JOB_TOKEN"  # slipstream_rec.run_lock.TOKEN_ENV (imported where used, so
# that each test here fails on the code before it for its own reason)

SMOKE = ["experiment=smoke", "trainer.progress_bar=false", "trainer.tensorboard=false"]
# long enough to be interrupted mid-run, with a checkpoint every 10 steps
LONG = [*SMOKE, "trainer.max_steps=0", "trainer.epochs=50", "trainer.checkpoint.every_steps=10"]


def _env() -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("HYDRA_FULL_ERROR", "WORLD_SIZE", "RANK")}
    env.pop(TOKEN_ENV, None)
    return dict(env, OMP_NUM_THREADS="1")


def _train(cwd: Path, *argv: str, timeout: int = 300) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "slipstream_rec.train", *argv]
    return subprocess.run(cmd, cwd=cwd, env=_env(), capture_output=True, text=True, timeout=timeout)


def _holder(cwd: Path, run_dir: str) -> subprocess.Popen:
    """Another job's process holding run_dir's lock (as rank 0 of a running job does)."""
    code = (
        "import sys, time; from pathlib import Path; from slipstream_rec import run_lock; "
        f"run_lock.acquire(Path({run_dir!r})); print('held', flush=True); time.sleep(300)"
    )
    p = subprocess.Popen([sys.executable, "-c", code], cwd=cwd, env=_env(), stdout=subprocess.PIPE, text=True)
    assert p.stdout.readline().strip() == "held"
    return p


# -- one job per run directory ------------------------------------------------------------------


def test_a_run_directory_in_use_is_refused_naming_the_process(tmp_path, monkeypatch, capsys):
    """A second run into the directory of a running one stops before it starts; the first one
    goes on undisturbed."""
    cmd = [sys.executable, "-m", "slipstream_rec.train", *LONG, "trainer.run_dir=runs/a"]
    first = subprocess.Popen(cmd, cwd=tmp_path, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 240
        while not _text(tmp_path / "runs/a/metrics.jsonl") and time.monotonic() < deadline:
            assert first.poll() is None, first.communicate()[1][-3000:]
            time.sleep(0.2)
        monkeypatch.chdir(tmp_path)
        monkeypatch.delenv("WORLD_SIZE", raising=False)

        def tripwire(*args, **kwargs):
            raise AssertionError("the second run got as far as starting a process group")

        monkeypatch.setattr(distributed, "init_distributed", tripwire)
        records = len(_text(tmp_path / "runs/a/metrics.jsonl").splitlines())
        assert train.main([*SMOKE, "trainer.run_dir=runs/a"]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "Traceback" not in err[0], err
        assert f"trainer.run_dir=runs/a is in use by pid {first.pid} on {socket.gethostname()}" in err[0]
        assert "Fix:" in err[0]
        time.sleep(1)
        assert first.poll() is None  # the first run is still training, its records kept
        assert len(_text(tmp_path / "runs/a/metrics.jsonl").splitlines()) >= records
    finally:
        first.send_signal(signal.SIGINT)
        first.communicate(timeout=120)


def test_the_lock_is_taken_atomically_by_one_job_only(tmp_path):
    """The check before start can race with another job's start: acquire itself refuses."""
    from slipstream_rec import run_lock

    holder = _holder(tmp_path, str(tmp_path / "runs/a"))
    try:
        with pytest.raises(ValueError, match=f"in use by pid {holder.pid} on"):
            run_lock.acquire(tmp_path / "runs/a")
    finally:
        holder.kill()
        holder.wait()


def test_a_dead_jobs_lock_is_taken_over_with_a_note(tmp_path):
    from slipstream_rec import run_lock

    holder = _holder(tmp_path, str(tmp_path / "runs/a"))
    holder.kill()  # SIGKILL: nothing released, the lock file stays behind
    holder.wait()
    assert (tmp_path / "runs/a/run.lock").is_file()
    run_lock.check_free(tmp_path / "runs/a")  # no error: nobody holds it
    note = run_lock.acquire(tmp_path / "runs/a")
    try:
        assert note and f"from pid {holder.pid} on {socket.gethostname()}" in note
    finally:
        run_lock.release(tmp_path / "runs/a")
    assert not (tmp_path / "runs/a").exists()  # the lock file was all it held


def test_the_ranks_of_one_job_share_its_lock(tmp_path, monkeypatch):
    """What --nproc relies on: the launcher holds the lock, its ranks carry its token."""
    from slipstream_rec import run_lock

    monkeypatch.setenv(TOKEN_ENV, "launcher:test")
    code = (
        "import time; from pathlib import Path; from slipstream_rec import run_lock; "
        f"run_lock.acquire(Path({str(tmp_path / 'r')!r})); print('held', flush=True); time.sleep(300)"
    )
    env = dict(_env(), **{TOKEN_ENV: "launcher:test"})
    p = subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE, text=True)
    try:
        assert p.stdout.readline().strip() == "held"
        run_lock.check_free(tmp_path / "r")
        assert run_lock.acquire(tmp_path / "r") is None  # the job's own lock: no error
        run_lock.release(tmp_path / "r")  # not ours to remove
        assert (tmp_path / "r/run.lock").is_file()
    finally:
        p.kill()
        p.wait()


# -- Ctrl-C -----------------------------------------------------------------------------------


def _interrupt_when(cwd: Path, argv: list, ready) -> subprocess.CompletedProcess:
    """Start a run, send SIGINT (what Ctrl-C sends) once ``ready(cwd)``, and wait for it."""
    cmd = [sys.executable, "-m", "slipstream_rec.train", *argv]
    p = subprocess.Popen(cmd, cwd=cwd, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 240
    while not ready(cwd) and p.poll() is None and time.monotonic() < deadline:
        time.sleep(0.2)
    assert p.poll() is None, "the run ended before it could be interrupted"
    p.send_signal(signal.SIGINT)
    out, err = p.communicate(timeout=120)
    return subprocess.CompletedProcess(cmd, p.returncode, out, err)


def _text(path: Path) -> str:
    try:
        return path.read_text()
    except FileNotFoundError:
        return ""


def _has_checkpoint(cwd: Path, run_dir: str = "runs/i") -> bool:
    return any((cwd / run_dir / "checkpoints").glob("step_*[0-9]"))


def _interrupted_line(r: subprocess.CompletedProcess) -> str:
    assert r.returncode == 130, r.stderr[-3000:]
    assert "Traceback" not in r.stderr and "KeyboardInterrupt" not in r.stderr, r.stderr[-3000:]
    lines = [l for l in r.stderr.splitlines() if "interrupted" in l]
    assert len(lines) == 1, r.stderr[-3000:]
    return lines[0]


def test_ctrl_c_is_one_line_exit_130_and_rerunning_resumes(tmp_path):
    argv = [*LONG, "trainer.run_dir=runs/i"]
    line = _interrupted_line(_interrupt_when(tmp_path, argv, _has_checkpoint))
    assert line.startswith("slipstream-train: interrupted at step "), line
    assert line.endswith(": rerun the same command to resume"), line
    step, saved = int(line.split("at step ")[1].split(",")[0]), int(line.split("checkpoint at step ")[1].split(":")[0])
    assert 10 <= saved <= step and saved % 10 == 0
    assert not (tmp_path / "runs/i/run.lock").exists()  # released on the way out
    # following the line: the same command continues from that checkpoint
    r = _interrupt_when(tmp_path, argv, lambda cwd: '"kind": "resume"' in _text(cwd / "runs/i/metrics.jsonl"))
    records = [json.loads(l) for l in (tmp_path / "runs/i/metrics.jsonl").read_text().splitlines()]
    assert any(rec.get("kind") == "resume" and rec.get("step") == saved for rec in records), records[-3:]
    _interrupted_line(r)


def test_ctrl_c_without_a_run_dir_names_the_one_to_resume(tmp_path):
    line = _interrupted_line(_interrupt_when(tmp_path, LONG, lambda cwd: any(cwd.glob("runs/*/checkpoints/step_*[0-9]"))))
    (run_dir,) = list((tmp_path / "runs").iterdir())
    assert line.endswith(f"to resume, rerun the same command with trainer.run_dir=runs/{run_dir.name}"), line


def test_ctrl_c_under_nproc_is_one_line_for_all_ranks(tmp_path):
    argv = ["--nproc", "2", *LONG, "trainer.run_dir=runs/i"]
    r = _interrupt_when(tmp_path, argv, _has_checkpoint)
    line = _interrupted_line(r)
    assert line.endswith(": rerun the same command to resume"), line
    assert "SignalException" not in r.stderr and "death signal" not in r.stderr, r.stderr[-3000:]
    assert not (tmp_path / "runs/i/run.lock").exists()


# -- resuming a finished run, as its refusal advises ----------------------------------------------


def test_the_finished_run_refusals_advice_trains_on(tmp_path):
    assert _train(tmp_path, *SMOKE, "trainer.run_dir=runs/a").returncode == 0
    r = _train(tmp_path, *SMOKE, "trainer.run_dir=runs/a")
    assert r.returncode == 2 and "trainer.resume=runs/a/checkpoints with the new trainer.run_dir" in r.stderr
    # the advice without more steps: the checkpoint is at max_steps, nothing would be trained
    r = _train(tmp_path, *SMOKE, "trainer.run_dir=runs/b", "trainer.resume=runs/a/checkpoints")
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr[-3000:]
    error = [l for l in r.stderr.splitlines() if "error:" in l]
    assert len(error) == 1 and "is at step 20 and this run plans 20 steps" in error[0], r.stderr[-3000:]
    assert "Fix: train on with trainer.max_steps=40" in error[0]
    assert "done:" not in r.stdout and not (tmp_path / "runs/b").exists()
    # the fix, followed: 20 new steps, and the warning names the one key that changed
    r = _train(tmp_path, *SMOKE, "trainer.run_dir=runs/b", "trainer.resume=runs/a/checkpoints", "trainer.max_steps=40")
    assert r.returncode == 0, r.stderr[-3000:]
    summary = json.loads((tmp_path / "runs/b/summary.json").read_text())
    assert summary["steps"] == 40 and summary["resumed_from"]["step"] == 20
    warnings = [l for l in r.stderr.splitlines() if "another configuration" in l]
    assert len(warnings) == 1 and "(trainer.max_steps: 20 -> 40)" in warnings[0], warnings


def test_resuming_into_a_new_run_dir_alone_is_not_another_configuration():
    from slipstream_rec.config import config_hash, load_config

    base = load_config(["experiment=smoke"])
    moved = load_config(["experiment=smoke", "trainer.run_dir=runs/b", "trainer.resume=runs/a/checkpoints"])
    assert config_hash(base) == config_hash(moved)
    assert config_hash(base) != config_hash(load_config(["experiment=smoke", "trainer.max_steps=40"]))
