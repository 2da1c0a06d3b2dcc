"""The project's EmbeddingBagCollection sharder.

DMP maps a module's exact type to one sharder. Ours differs from TorchRec's in one respect for
now: it offers row-wise and table-row-wise sharding on CPU as well (TorchRec lists them only for
CUDA, though they train correctly on gloo). Slipstream's per-shard tracking extends exactly this
class, so every code path, Slipstream off included, goes through it.
"""

from __future__ import annotations

from typing import List

from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
from torchrec.distributed.types import ShardingType

# Every sharding type this project supports, on every device type.
SUPPORTED_SHARDING_TYPES: List[str] = [
    ShardingType.DATA_PARALLEL.value,
    ShardingType.TABLE_WISE.value,
    ShardingType.ROW_WISE.value,
    ShardingType.COLUMN_WISE.value,
    ShardingType.TABLE_ROW_WISE.value,
    ShardingType.TABLE_COLUMN_WISE.value,
]


class SlipstreamEmbeddingBagCollectionSharder(EmbeddingBagCollectionSharder):
    """EmbeddingBagCollection sharder offering every sharding type on CPU (gloo) and GPU (nccl)."""

    def sharding_types(self, compute_device_type: str) -> List[str]:
        stock = super().sharding_types(compute_device_type)
        # Keep TorchRec's own extras (e.g. grid sharding on CUDA) after ours.
        return SUPPORTED_SHARDING_TYPES + [t for t in stock if t not in SUPPORTED_SHARDING_TYPES]
