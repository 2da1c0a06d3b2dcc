#!/usr/bin/env bash
# The GPU check in one call (issue 12), at most about 8 minutes on one GPU:
#   1. the GPU tests (tests/test_gpu.py, pytest -m gpu);
#   2. 1-GPU nccl trainings on the synthetic data: paper_plus and off with fused_uvm_caching
#      (GPU cache of 5% of each table's rows: smaller than the tables, the cold rows in host
#      memory; FBGEMM's cache statistics on), and paper_plus with fused (every row in GPU memory);
#   3. off and serve (Slipstream's serve action) on the quick click log, fused_uvm_caching;
#   4. one line per training: samples/s, skip fraction, served fraction, embedding all-to-all
#      bytes per trained sample, GPU-cache hit rate, host-to-device bytes, test AUC (summary.json).
# Without a CUDA device it runs what it can on CPU (the planner's CUDA-topology tests, the cache
# flush and precision tests, one short 2-process CPU training with paper_plus and fused) and says
# what it skipped and why. Exit status: 0 when everything that ran passed.
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

report() {  # report NAME RUN_DIR: one line from summary.json
  "$PY" - "$1" "$2" <<'EOF'
import json, sys
name, run = sys.argv[1], sys.argv[2]
try:
    s = json.load(open(f"{run}/summary.json"))
except OSError as e:
    print(f"{name:28s} no summary ({e})"); sys.exit(1)
cache = s.get("embedding_cache") or {}
hit = cache.get("hit_rate")
h2d = cache.get("h2d_bytes")
print(f"{name:28s} samples/s={s['samples_per_second']:.0f} skip_fraction={s['skip_fraction']:.3f} "
      f"cache_hit_rate={'n/a' if hit is None else f'{hit:.4f}'} "
      f"h2d_MB={'n/a' if h2d is None else f'{h2d / 2**20:.1f}'} test_auc={s['test_auc']:.4f} "
      f"slipstream_state_MB={s.get('slipstream_state_bytes', 0) / 2**20:.2f} steps={s['steps']} "
      f"served_fraction={s.get('served_fraction', 0):.3f} "
      f"a2a_bytes_per_sample={(s.get('a2a_bytes_per_sample') or {}).get('total', 0):.0f}")
EOF
}

train() {  # train NAME TIMEOUT_S LAUNCHER... -- OVERRIDES...
  local name=$1 limit=$2; shift 2
  local run="$OUT/runs/$name"
  rm -rf "$run"
  if timeout "$limit" "$@" "trainer.run_dir=$run" >"$OUT/$name.log" 2>&1; then
    report "$name" "$run" || failed=1
  else
    echo "$name: FAILED or timed out after ${limit}s (log: $OUT/$name.log)"; tail -5 "$OUT/$name.log"; failed=1
  fi
}

COMMON=(data=synthetic "data.root=$DATA" trainer.progress_bar=false trainer.tensorboard=false
        trainer.eval_every_steps=0 trainer.checkpoint.enabled=false)

if "$PY" -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null; then
  "$PY" -c "import torch; print('CUDA:', torch.cuda.get_device_name(0), '| torch', torch.__version__)"
  step "GPU tests (pytest -m gpu tests/test_gpu.py)"
  timeout 240 "$PY" -m pytest -q -m gpu tests/test_gpu.py || failed=1

  step "1-GPU nccl trainings (600 steps of 4096)"
  GPU=(trainer.device=cuda trainer.max_steps=600 trainer.batch_size=4096)
  CACHING=(sharding.compute_kernel=fused_uvm_caching sharding.cache_load_factor=0.05 sharding.cache_stats=true)
  train paper_plus_uvm_caching 150 "$BIN/slipstream-train" "${COMMON[@]}" "${GPU[@]}" slipstream=paper_plus "${CACHING[@]}"
  train off_uvm_caching 120 "$BIN/slipstream-train" "${COMMON[@]}" "${GPU[@]}" slipstream=off "${CACHING[@]}"
  train paper_plus_fused 120 "$BIN/slipstream-train" "${COMMON[@]}" "${GPU[@]}" slipstream=paper_plus sharding.compute_kernel=fused

  step "1-GPU nccl trainings, off and serve on the quick click log (fused_uvm_caching)"
  QUICK=(experiment=clicklog_quick "data.root=$DATA" trainer.progress_bar=false trainer.tensorboard=false
         trainer.checkpoint.enabled=false trainer.device=cuda)
  train off_clicklog_quick 150 "$BIN/slipstream-train" "${QUICK[@]}" slipstream=off "${CACHING[@]}"
  train serve_clicklog_quick 150 "$BIN/slipstream-train" "${QUICK[@]}" slipstream=serve "${CACHING[@]}"
else
  echo "SKIPPED (no CUDA device: torch.cuda.is_available() is False on this machine):"
  echo "  - tests/test_gpu.py (pytest -m gpu): they need a GPU, nccl and the CUDA fbgemm-gpu"
  echo "  - the 1-GPU nccl trainings with fused_uvm_caching and fused, and their cache hit rates:"
  echo "    FBGEMM's caching kernels (fused_uvm_caching, fused_uvm) exist on CUDA only"
  echo "  - off and serve on one GPU (nccl, fused_uvm_caching): samples/s, bytes, cache hit rate"
  step "CPU: planner on a CUDA topology, cache flush before snapshots, precision, key-value refusal"
  timeout 300 "$PY" -m pytest -q tests/sharding/test_plan.py tests/training/test_precision.py \
    tests/slipstream/test_scale.py || failed=1

  step "CPU: a short 2-process gloo training, paper_plus with fused (the GPU run's fused line)"
  CPU=(trainer.max_steps=120 trainer.batch_size=1024 data.synthetic.num_train=300000
       data.synthetic.num_val=20000 data.synthetic.num_test=20000 data.name=gpu_check_cpu
       slipstream.count_steps=40 slipstream.snapshot_interval=20)
  train paper_plus_fused_cpu 240 "$BIN/torchrun" --standalone --nproc_per_node 2 -m slipstream_rec.train \
    "${COMMON[@]}" "${CPU[@]}" slipstream=paper_plus sharding.compute_kernel=fused

  step "CPU: serve on the quick click log, 2-process gloo (the GPU run's serve line)"
  train serve_clicklog_quick_cpu 240 "$BIN/torchrun" --standalone --nproc_per_node 2 -m slipstream_rec.train \
    experiment=clicklog_quick "data.root=$DATA" trainer.progress_bar=false trainer.tensorboard=false \
    trainer.checkpoint.enabled=false slipstream=serve sharding.compute_kernel=fused
fi

step "done"
[ "$failed" = 0 ] && echo "gpu_check: OK" || echo "gpu_check: FAILED (see above)"
exit "$failed"
