#!/usr/bin/env bash
# The GPU check in one call, on every visible GPU (about 5 minutes on one GPU, under 10 on 8):
#   1. the GPU tests (tests/test_gpu.py and the page-locking test, pytest -m gpu) and the CPU
#      checks of the GPU path (sync audit, fake-device run, nccl routing);
#   2. off and serve on the quick click log, on 1 GPU and on all N GPUs (nccl), with
#      trainer.sync_audit=true: per plain steady-state step the device syncs of ours and of
#      TorchRec counted by the audit, and the ones CUDA itself reports
#      (torch.cuda.set_sync_debug_mode("warn")); one serve run also writes a short
#      torch.profiler trace (trainer.profile_steps) into its run directory;
#   3. paper_plus with fused_uvm_caching on the synthetic data (a GPU cache of 5% of each
#      table's rows, FBGEMM's cache statistics on);
#   4. one table: samples/s, served fraction, embedding bytes per sample, test AUC, syncs.
# Without a CUDA device it runs what it can on CPU (the CPU checks of the GPU path, the planner's
# CUDA-topology tests, a short 2-process serve training with the audit) and says what it
# skipped and why. Exit status: 0 when everything that ran passed.
#
#   benchmarks/gpu_check.sh [OUT_DIR]      (default: /tmp/slipstream_gpu_check)
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
BIN=$(dirname "$PY")
OUT=${1:-/tmp/slipstream_gpu_check}
DATA=${DATA_ROOT:-$OUT/data}
mkdir -p "$OUT"
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
failed=0
start=$(date +%s)

step() { echo; echo "== $* ($(($(date +%s) - start)) s)"; }

report() {  # report NAME RUN_DIR: one line from summary.json and sync_audit_rank0.json
  "$PY" benchmarks/gpu_check_report.py "$1" "$2"
}

train() {  # train NAME TIMEOUT_S LAUNCHER... OVERRIDES...
  local name=$1 limit=$2; shift 2
  local run="$OUT/runs/$name"
  rm -rf "$run"
  if timeout "$limit" "$@" "trainer.run_dir=$run" >"$OUT/$name.log" 2>&1; then
    report "$name" "$run" >>"$OUT/table.txt" || failed=1
    tail -1 "$OUT/table.txt"
  else
    echo "$name: FAILED or timed out after ${limit}s (log: $OUT/$name.log)"; tail -5 "$OUT/$name.log"; failed=1
  fi
}

: >"$OUT/table.txt"
QUICK=(experiment=clicklog_quick "data.root=$DATA" trainer.progress_bar=false trainer.tensorboard=false
       trainer.checkpoint.enabled=false trainer.sync_audit=true)
CPU_CHECKS=(tests/training/test_sync_audit.py tests/training/test_fake_device.py tests/slipstream/test_routing_dist.py)

if "$PY" -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null; then
  N=$("$PY" -c "import torch; print(torch.cuda.device_count())")
  "$PY" -c "import torch; print('CUDA:', torch.cuda.device_count(), 'x', torch.cuda.get_device_name(0), '| torch', torch.__version__)"
  step "GPU tests, page-locking, and the CPU checks of the GPU path"
  timeout 300 "$PY" -m pytest -q -m "gpu or not gpu" tests/test_gpu.py tests/data/test_pin_memory.py "${CPU_CHECKS[@]}" || failed=1

  step "off and serve on the quick click log: 1 GPU, then $N GPU(s) (nccl), with the sync audit"
  train off_1gpu 150 "$BIN/slipstream-train" "${QUICK[@]}" trainer.device=cuda slipstream=off
  train serve_1gpu 150 "$BIN/slipstream-train" "${QUICK[@]}" trainer.device=cuda slipstream=serve trainer.profile_steps=5
  if [ "$N" -gt 1 ]; then
    TR=("$BIN/torchrun" --standalone --nproc_per_node "$N" -m slipstream_rec.train)
    train "off_${N}gpu" 200 "${TR[@]}" "${QUICK[@]}" trainer.device=cuda slipstream=off
    train "serve_${N}gpu" 200 "${TR[@]}" "${QUICK[@]}" trainer.device=cuda slipstream=serve
  fi

  step "paper_plus with fused_uvm_caching on synthetic (300 steps of 4096)"
  train paper_plus_uvm_caching 150 "$BIN/slipstream-train" data=synthetic "data.root=$DATA" \
    trainer.progress_bar=false trainer.tensorboard=false trainer.eval_every_steps=0 \
    trainer.checkpoint.enabled=false trainer.device=cuda trainer.max_steps=300 trainer.batch_size=4096 \
    slipstream=paper_plus sharding.compute_kernel=fused_uvm_caching sharding.cache_load_factor=0.05 \
    sharding.cache_stats=true
else
  echo "SKIPPED (no CUDA device: torch.cuda.is_available() is False on this machine):"
  echo "  - tests/test_gpu.py and the page-locking test (pytest -m gpu): they need a GPU, nccl and the CUDA fbgemm-gpu"
  echo "  - off and serve on 1 and N GPUs with nccl: samples/s, CUDA's own sync warnings, the profiler trace"
  echo "  - fused_uvm_caching and its cache hit rate: FBGEMM's caching kernels exist on CUDA only"
  step "CPU: the checks of the GPU path (sync audit, fake device, routing), the planner on a CUDA topology"
  timeout 300 "$PY" -m pytest -q "${CPU_CHECKS[@]}" tests/sharding/test_plan.py tests/training/test_precision.py || failed=1

  step "CPU: serve on the quick click log, 2-process gloo, with the sync audit (the GPU run's serve line)"
  train serve_clicklog_quick_cpu 240 "$BIN/torchrun" --standalone --nproc_per_node 2 -m slipstream_rec.train \
    "${QUICK[@]}" slipstream=serve
fi

step "done"
echo "table ($OUT/table.txt):"; cat "$OUT/table.txt"
[ "$failed" = 0 ] && echo "gpu_check: OK" || echo "gpu_check: FAILED (see above)"
exit "$failed"
