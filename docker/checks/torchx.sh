# `torchx run -s local_cwd` of the project's component (launch/components.py:train), 2 ranks, 5 steps.
run=runs/image-check-torchx
rm -rf "$run"
torchx run -s local_cwd launch/components.py:train -j 1x2 -- experiment=smoke trainer.max_steps=5 \
  trainer.progress_bar=false "trainer.run_dir=$run"
python - "$run/summary.json" <<'PY'
import json
import sys

s = json.load(open(sys.argv[1]))
assert (s["steps"], s["world_size"]) == (5, 2), f"steps {s['steps']}, world_size {s['world_size']}: expected 5, 2"
print(f"ok: torchx run: {s['steps']} steps on {s['world_size']} ranks, val_auc {s['val_auc']:.4f}")
PY
