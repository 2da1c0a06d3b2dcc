# The GPU image on a machine without a GPU: torch, fbgemm-gpu and torchrec are the pins of
# pins.json (pyproject's [tool.slipstream_rec.stack.gpu], passed by the host), torch is a CUDA build,
# and the self-check passes, saying that no GPU is available, instead of crashing.
stack=$(python - "$(dirname "$0")/pins.json" <<'PY'
import json
import sys
from importlib import metadata

import torch

pins = json.load(open(sys.argv[1]))


def have(dist):
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


bad = [f"{d} {have(d)} (pin {v})" for d, v in pins.items() if (have(d) or "").split("+")[0] != v]
bad += ["fbgemm-gpu-cpu is installed next to fbgemm-gpu"] if have("fbgemm-gpu-cpu") else []
bad += [f"torch {torch.__version__} is not a CUDA build"] if torch.version.cuda is None else []
if bad:
    sys.exit("not the pinned CUDA stack: " + "; ".join(bad))
print(f"cuda_version={torch.version.cuda}")
print(f"pinned CUDA stack: torch {torch.__version__} (CUDA {torch.version.cuda}), "
      f"fbgemm-gpu {have('fbgemm-gpu')}, torchrec {have('torchrec')}")
PY
)
echo "$stack"
out=$(slipstream-train --self-check 2>&1) || { echo "$out"; echo "the self-check failed"; exit 1; }
echo "$out"
if ! grep -Eq "^ +cuda +not available" <<<"$out"; then echo "the self-check did not report 'cuda not available'"; exit 1; fi
if ! grep -Eq "^ +variant +gpu\$" <<<"$out"; then echo "the self-check did not find the gpu variant"; exit 1; fi
echo "ok: $(tail -1 <<<"$stack"); the self-check passes and reports no GPU"
