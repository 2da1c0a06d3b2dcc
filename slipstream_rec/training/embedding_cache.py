"""The GPU cache of the fused_uvm_caching tables, as summary.json reports it (embedding_cache)."""

from __future__ import annotations

from typing import Dict, Optional

import torch
from torch import nn

from slipstream_rec.distributed import all_reduce_
from slipstream_rec.sharding.sharded import SlipstreamShardedEBC, cache_stats

_KEYS = [
    "calls", "requested_indices", "unique_indices", "unique_misses", "conflict_unique_misses",
    "conflict_misses", "h2d_bytes",
]  # fmt: skip


def embedding_cache_summary(model: nn.Module, device: torch.device) -> Optional[Dict[str, Optional[float]]]:
    """GPU-cache statistics of the caching tables summed over ranks (where FBGEMM gathers them:
    sharding.cache_stats on CUDA), with ``hit_rate`` = 1 - unique misses / unique indices; None
    when no rank has any. Collective: all ranks enter one SUM all-reduce, caching tables or not."""
    local = None
    if device.type == "cuda":  # the same on every rank
        try:
            units = [u for m in model.modules() if isinstance(m, SlipstreamShardedEBC) for u in m.units]
        except ValueError:  # key-value kernels (slipstream=off): no weight views, no UVM cache
            units = []
        local = cache_stats(units)
    values = [1.0 if local is not None else 0.0] + [local[k] if local else 0.0 for k in _KEYS]
    total = all_reduce_(torch.tensor(values, dtype=torch.float64)).tolist()  # all ranks
    if total[0] == 0:
        return None
    out: Dict[str, Optional[float]] = {k: v for k, v in zip(_KEYS, total[1:])}
    unique = out["unique_indices"] or 0.0
    out["hit_rate"] = 1.0 - (out["unique_misses"] or 0.0) / unique if unique else None
    return out
