"""The GPU path, end to end: run where torch sees a CUDA device (skipped elsewhere, see conftest)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
pytestmark = pytest.mark.gpu


def _env() -> dict:
    env = dict(os.environ)
    env["PATH"] = f"{BIN}{os.pathsep}{env.get('PATH', '')}"
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(key, None)
    return env


def test_self_check_on_gpu_runs_fbgemm_on_cuda_and_picks_nccl():
    proc = subprocess.run(
        [str(BIN / "slipstream-train"), "--self-check"], env=_env(), capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "ran on cpu, cuda" in proc.stdout  # needs the CUDA fbgemm-gpu (the GPU stack)
    assert "cuda:0 with backend nccl" in proc.stdout


def test_one_process_smoke_training_on_cuda_with_nccl(tmp_path):
    run_dir = tmp_path / "run"
    proc = subprocess.run(
        [sys.executable, "-m", "slipstream_rec.train", "experiment=smoke", "trainer.device=cuda",
         f"data.root={tmp_path / 'data'}", f"trainer.run_dir={run_dir}", "trainer.progress_bar=false"],
        cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["device"] == "cuda:0" and summary["backend"] == "nccl"
    assert summary["steps"] == 20 and summary["samples_trained"] == 20 * 512
    assert summary["val_auc"] > 0.55  # it learned something in 20 steps


_NO_SYNC = r"""
import torch, torch.distributed as dist
from slipstream_rec.distributed import all_reduce_, close_distributed, cpu_group, init_distributed
env = init_distributed("cuda", timeout_s=60)
assert env.backend == "nccl" and cpu_group() is not None
x = torch.ones(1, device="cuda")
torch.cuda.synchronize()
torch.cuda.set_sync_debug_mode("error")
for _ in range(3):  # the per-step lock-step flag and counters: CPU tensors
    flag = all_reduce_(torch.tensor([1], dtype=torch.int32), dist.ReduceOp.MIN)
    assert flag.item() == 1
try:  # control: the old path (to the GPU and back) is a device sync
    torch.tensor([1.0]).cuda().cpu()
    raise SystemExit("control did not sync")
except RuntimeError:
    pass
torch.cuda.set_sync_debug_mode("default")
close_distributed()
print("NO_SYNC_OK")
"""


def test_cpu_collectives_under_nccl_do_not_sync_the_device():
    proc = subprocess.run(
        [sys.executable, "-c", _NO_SYNC], cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0 and "NO_SYNC_OK" in proc.stdout, proc.stdout + proc.stderr
