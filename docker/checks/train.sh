# A 2-process 20-step training with slipstream=paper_plus; the time from the launch to the first
# logged training step (written after step 1, synthetic data generation included) is printed.
run=runs/image-check-train
rm -rf "$run"
t0=$(date +%s.%N)
OMP_NUM_THREADS=1 torchrun --standalone --nproc_per_node 2 -m slipstream_rec.train experiment=smoke \
  slipstream=paper_plus trainer.max_steps=20 trainer.log_every_steps=1 trainer.progress_bar=false \
  "trainer.run_dir=$run" > /tmp/train.log 2>&1 &
pid=$!
first=""
while kill -0 "$pid" 2>/dev/null; do
  if [ -z "$first" ] && grep -qs '"kind": "train"' "$run/metrics.jsonl"; then first=$(date +%s.%N); fi
  sleep 0.1
done
rc=0
wait "$pid" || rc=$?
cat /tmp/train.log
if [ "$rc" != 0 ]; then echo "training exited with status $rc"; exit 1; fi
if [ -z "$first" ]; then first=$(date +%s.%N); fi
python - "$run/summary.json" "$t0" "$first" <<'PY'
import json
import math
import sys

s = json.load(open(sys.argv[1]))
assert (s["steps"], s["world_size"]) == (20, 2), f"steps {s['steps']}, world_size {s['world_size']}: expected 20, 2"
assert math.isfinite(s["val_auc"]) and 0.5 < s["val_auc"] <= 1.0, f"val_auc {s['val_auc']}"
print(f"startup_to_first_step_s={float(sys.argv[3]) - float(sys.argv[2]):.1f}")
print(f"ok: 20 steps on 2 ranks, val_auc {s['val_auc']:.4f}")
PY
