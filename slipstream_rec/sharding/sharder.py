"""The project's EmbeddingBagCollection sharder.

DMP maps a module's exact type to one sharder. Ours differs from TorchRec's in two respects:
it offers row-wise and table-row-wise sharding on CPU as well (TorchRec lists them only for
CUDA, though they train correctly on gloo), and it builds ``SlipstreamShardedEBC``, the sharded
module that tracks its own hot rows. Every policy, ``off`` included, goes through it; with
``off`` the tracking is never switched on.
"""

from __future__ import annotations

from typing import Dict, List, Optional, Type

import torch
from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
from torchrec.distributed.types import ParameterSharding, ShardingEnv, ShardingType
from torchrec.modules.embedding_modules import EmbeddingBagCollection

from slipstream_rec.sharding.sharded import SlipstreamShardedEBC

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
    """EmbeddingBagCollection sharder: every sharding type on CPU (gloo) and GPU (nccl), and
    shards that can count and snapshot their own rows."""

    def sharding_types(self, compute_device_type: str) -> List[str]:
        stock = super().sharding_types(compute_device_type)
        # Keep TorchRec's own extras (e.g. grid sharding on CUDA) after ours.
        return SUPPORTED_SHARDING_TYPES + [t for t in stock if t not in SUPPORTED_SHARDING_TYPES]

    def shard(
        self,
        module: EmbeddingBagCollection,
        params: Dict[str, ParameterSharding],
        env: ShardingEnv,
        device: Optional[torch.device] = None,
        module_fqn: Optional[str] = None,
    ) -> SlipstreamShardedEBC:
        return SlipstreamShardedEBC(
            module=module,
            table_name_to_parameter_sharding=params,
            env=env,
            fused_params=self.fused_params,
            device=device,
            qcomm_codecs_registry=self.qcomm_codecs_registry,
            module_fqn=module_fqn,
            sharded_module_order_overwrite=self._sharded_module_order_overwrite,
        )

    @property
    def sharded_module_type(self) -> Type[SlipstreamShardedEBC]:
        return SlipstreamShardedEBC
