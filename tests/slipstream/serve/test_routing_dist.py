"""Which process group each collective of a serve step takes, as under nccl (2 gloo ranks).

Under nccl the job has two groups: the default one (nccl: device tensors) and a gloo side group
for small host tensors (slipstream_rec/distributed.py). On CPU both would be gloo and the side
group does not exist, so here a second gloo group is patched in as the side group, every
collective is recorded with its group, dtype and size, and one ``serve`` step runs end to end
(the replica copied from the shards, the lock-step agreement, the split, forward and backward,
the push of the served gradients; tests/slipstream/serve/test_serve_dist.py checks its numbers). The
expectation: the rows' values and gradients (bulk) go through the main backend, everything else
Slipstream sends (keys, sizes, flags) through the side group, and TorchRec's own collectives
never touch the side group.
"""

from __future__ import annotations

import os
import sys

from tests.dist_harness import run_workers
from tests.slipstream._fixtures import serve_step_worker

_PACKAGE = os.sep + "slipstream_rec" + os.sep


def _caller() -> str:
    """Who asked for the collective: the innermost frame that is TorchRec's ("torchrec"), a
    slipstream_rec module's (distributed.py's helpers skipped), or anything else ("test");
    torch's own frames are skipped."""
    import torch

    torch_dir = os.path.dirname(torch.__file__) + os.sep
    frame = sys._getframe(2)
    while frame is not None:
        name = frame.f_code.co_filename
        if os.sep + "torchrec" + os.sep in name:
            return "torchrec"
        if _PACKAGE in name:
            if not name.endswith("distributed.py"):
                return name.split(_PACKAGE)[-1]
        elif not name.startswith(torch_dir) and name != __file__:
            return "test"
        frame = frame.f_back
    return "test"


def routing_worker(env):
    import torch
    import torch.distributed as dist

    import slipstream_rec.distributed as sd

    side = dist.new_group(backend="gloo")  # all ranks
    sd._CPU_GROUP = side
    calls = []

    def recorded(name, fn):
        def call(*args, **kwargs):
            group = kwargs.get("group")
            tensors = [a for a in args if isinstance(a, torch.Tensor)]
            tensors += [t for a in args if isinstance(a, list) for t in a if isinstance(t, torch.Tensor)]
            dtype = str(tensors[0].dtype) if tensors else "object"
            calls.append({
                "fn": name, "group": "side" if group is side else "default", "dtype": dtype,
                "numel": int(tensors[-1].numel()) if tensors else 0, "caller": _caller(),
            })  # fmt: skip
            return fn(*args, **kwargs)

        return call

    names = ["all_gather", "all_reduce", "all_gather_object", "broadcast_object_list", "all_to_all_single",
             "reduce_scatter_tensor", "all_gather_into_tensor", "broadcast"]  # fmt: skip
    saved = {n: getattr(dist, n) for n in names}
    for n in names:
        setattr(dist, n, recorded(n, saved[n]))
    try:
        serve_step_worker(env, "row_wise", 0.1)
        sd.all_reduce_(torch.tensor([1], dtype=torch.int64), dist.ReduceOp.MIN)  # a flag
    finally:
        for n in names:
            setattr(dist, n, saved[n])
        sd._CPU_GROUP = None
    return calls


def test_bulk_rows_take_the_main_backend_and_small_host_tensors_the_side_group():
    for calls in run_workers(routing_worker, world_size=2):
        ours = [c for c in calls if c["caller"] not in ("torchrec", "test")]
        bulk = [c for c in ours if c["caller"] in ("slipstream/serve/replica.py", "slipstream/serve/push.py") and c["dtype"] == "torch.float32"]
        assert {c["caller"] for c in bulk} == {"slipstream/serve/replica.py", "slipstream/serve/push.py"}, ours
        assert all(c["group"] == "default" for c in bulk), bulk  # the rows' values and gradients
        small = [c for c in ours if c not in bulk]
        assert small and all(c["group"] == "side" for c in small), small  # keys, sizes, flags
        assert {"slipstream/serve/replica.py", "slipstream/serve/push.py", "slipstream/lockstep.py"} <= {c["caller"] for c in small}
        # the push's and the replica's values are sized on the host: no size exchange on the
        # main backend (under nccl that would be read back from the GPU)
        assert not [c for c in bulk if c["dtype"] == "torch.int64"]
        theirs = [c for c in calls if c["caller"] == "torchrec"]
        assert theirs and all(c["group"] == "default" for c in theirs), theirs
