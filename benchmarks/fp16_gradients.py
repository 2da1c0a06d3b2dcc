"""How many of the gradients the fp16 comms carry fall below fp16's normal range.

Runs the training job on 2 local ranks with the backward's quantized comms and the fp16 DDP
hook on, both at scale 1 (so their scaled paths, ``RescaledCodec`` and ``scaled_fp16_hook``,
sit in the step and change nothing), and counts what each is handed on every ``--every``-th
call: the nonzero values, those below fp16's smallest normal (6.1e-5: kept with fewer than 11
bits) and those below half its smallest subnormal (sent as 0). Prints one JSON line, the two
ranks summed:

    .venv/bin/python benchmarks/fp16_gradients.py data=clicklog trainer.max_steps=400

Any further arguments are the job's overrides (``slipstream=off trainer.precision=fp32
downsampling=off`` and the comms keys are set here).
"""

from __future__ import annotations

import atexit
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Dict, List

FP16_NORMAL = 2.0**-14  # fp16's smallest normal value
FP16_TO_ZERO = 2.0**-25  # half its smallest subnormal: below it, the cast gives 0
FIXED = ["slipstream=off", "trainer.precision=fp32", "downsampling=off", "trainer.progress_bar=false",
         "trainer.test_at_end=false", "trainer.checkpoint.enabled=false", "sharding.qcomms.forward=fp16",
         "sharding.qcomms.backward=fp16", "sharding.qcomms.backward_loss_scale=1",
         "trainer.ddp_comm_hook=fp16", "trainer.ddp_comm_hook_scale=1"]  # fmt: skip


def _worker(out_dir: str, every: int, overrides: List[str]) -> None:
    """In each rank: count what the two scaled paths are handed, then train."""
    import torch

    import slipstream_rec.sharding.qcomms as qcomms
    import slipstream_rec.training.comm_hooks as hooks
    from slipstream_rec.train import main

    counts: Dict[str, Dict[str, int]] = {k: {"calls": 0, "values": 0, "nonzero": 0, "subnormal": 0, "to_zero": 0}
                                         for k in ("pooled_embedding_gradients", "dense_all_reduce")}  # fmt: skip

    def note(kind: str, t: torch.Tensor) -> None:
        c = counts[kind]
        c["calls"] += 1
        if c["calls"] % every:
            return
        a = t.detach().abs().float()
        nz = a[a > 0]
        c["values"] += a.numel()
        c["nonzero"] += nz.numel()
        c["subnormal"] += int((nz < FP16_NORMAL).sum())
        c["to_zero"] += int((nz < FP16_TO_ZERO).sum())

    encode = qcomms.RescaledCodec.encode
    qcomms.RescaledCodec.encode = lambda self, t, ctx=None: note("pooled_embedding_gradients", t) or encode(self, t, ctx)
    make_hook = hooks.scaled_fp16_hook

    def counting_hook(scale: float):  # type: ignore[no-untyped-def]
        inner = make_hook(scale)

        def scaled_fp16_compress_hook(state, bucket):  # type: ignore[no-untyped-def]
            note("dense_all_reduce", bucket.buffer())
            return inner(state, bucket)

        return scaled_fp16_compress_hook

    hooks.scaled_fp16_hook = counting_hook
    atexit.register(lambda: Path(out_dir, f"rank{os.environ.get('RANK', '0')}.json").write_text(json.dumps(counts)))
    main([*FIXED, *overrides])


def main(argv: List[str]) -> int:
    every = 20
    with tempfile.TemporaryDirectory(prefix="fp16-gradients-") as tmp:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
               __file__, "--worker", tmp, str(every), f"trainer.run_dir={tmp}/run", *argv]  # fmt: skip
        subprocess.run(cmd, check=True)
        ranks = [json.loads(p.read_text()) for p in sorted(Path(tmp).glob("rank*.json"))]
    out = {}
    for kind in ranks[0]:
        total = {k: sum(r[kind][k] for r in ranks) for k in ranks[0][kind]}
        nz = max(1, total["nonzero"])
        out[kind] = {**total, "subnormal_share": total["subnormal"] / nz, "to_zero_share": total["to_zero"] / nz}
    print(json.dumps({"overrides": argv, "sampled_every": every, "ranks": len(ranks), **out}))
    return 0


if __name__ == "__main__":
    if sys.argv[1:2] == ["--worker"]:
        _worker(sys.argv[2], int(sys.argv[3]), sys.argv[4:])
    else:
        sys.exit(main(sys.argv[1:]))
