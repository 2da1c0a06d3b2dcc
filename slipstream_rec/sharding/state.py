"""Moving weights between an unsharded model and its DMP-sharded twin."""

from __future__ import annotations

from typing import Dict

import torch
from torch.distributed._shard.sharded_tensor import ShardedTensor
from torch.distributed.tensor import DTensor
from torchrec.distributed.model_parallel import DistributedModelParallel


@torch.no_grad()
def load_full_state_dict(dmp: DistributedModelParallel, full: Dict[str, torch.Tensor]) -> None:
    """Copy full (unsharded) tensors into this rank's shards, in place.

    ``full`` is the ``state_dict()`` of the unsharded module that DMP wraps. Every rank passes the
    same ``full``; each copies only the slices it owns (no communication). Local shards of the
    fused TBE are views of its weights, so the copy reaches the kernel directly.
    """
    target = dmp.state_dict()
    missing = sorted(set(target) - set(full))
    if missing:
        raise KeyError(f"full state dict lacks {missing[:5]}{' ...' if len(missing) > 5 else ''}")
    for key, dst in target.items():
        src = full[key]
        if isinstance(dst, ShardedTensor):
            for shard in dst.local_shards():
                slices = tuple(
                    slice(offset, offset + size)
                    for offset, size in zip(shard.metadata.shard_offsets, shard.metadata.shard_sizes)
                )
                shard.tensor.copy_(src[slices])
        elif isinstance(dst, DTensor):
            raise NotImplementedError(f"{key}: DTensor shards are not supported yet")
        else:
            dst.copy_(src)
