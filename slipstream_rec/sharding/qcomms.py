"""Quantized comms: ``sharding.qcomms`` as TorchRec's codec registry, and what it puts on the wire.

TorchRec's ``QCommsConfig`` + ``get_qcomm_codecs`` give one codec per pooled-embedding
collective (all-to-all, reduce-scatter) and direction, in the precision asked on every backend
(bf16 included on gloo, where TorchRec's registry would send fp16). The registry
goes to the sharder DMP builds the output dists with, and to the planner's only with
``sharding.qcomms.plan_as=quantized`` (it then costs the communication with the codec's element
size; by default it plans as for fp32 comms, ``plan.planner_sharders``).

The byte meter of ``SlipstreamShardedEBC`` counts the fp32 pooled embeddings and gradients it
hands to each output dist; the codec encodes them inside the collective. ``wire_factor`` says
how many bytes each of those fp32 bytes becomes on the wire, from the codec's own
``calc_quantized_size`` (fp16 and bf16: 1/2; int8: 40 bytes per 32 values = 0.3125); it is
linear in the length, so the factor of the totals is exact.
"""

from __future__ import annotations

import math
from typing import Any, Dict, Optional, Tuple

import torch
from torchrec.distributed.fbgemm_qcomm_codec import (
    CommType,
    get_qcomm_codecs,
)
from torchrec.distributed.fbgemm_qcomm_codec import QCommsConfig as TorchRecQCommsConfig
from torchrec.distributed.types import CommOp, QuantizedCommCodec, ShardingPlan, ShardingType

from slipstream_rec.sharding.config import CommPrecision, QCommsConfig, ShardingConfig
from slipstream_rec.sharding.qcomms_switch import SwitchedCodec

# The collectives of the pooled embeddings that this project's sharding types use: the
# all-to-all (table_wise, column_wise, table_column_wise) and the reduce-scatter (row_wise,
# table_row_wise). The sequence all-to-all is for EmbeddingCollection, which the model lacks.
_COMM_OPS = [CommOp.POOLED_EMBEDDINGS_ALL_TO_ALL, CommOp.POOLED_EMBEDDINGS_REDUCE_SCATTER]


def _comm_type(p: CommPrecision) -> CommType:
    return CommType(p.value)


def codecs_registry(cfg: QCommsConfig) -> Optional[Dict[str, Any]]:
    """TorchRec's codec registry for ``cfg``, one codec pair per pooled-embedding collective
    (None: off, fp32 both ways)."""
    if not cfg.enabled:
        return None
    scale = cfg.backward_loss_scale
    if scale is not None:
        if not (math.isfinite(scale) and scale > 0):
            raise ValueError(
                f"sharding.qcomms.backward_loss_scale={scale}: the gradients are multiplied by it before "
                "they are encoded and divided after. Fix: a positive number (1024 keeps a batch mean's "
                "gradients in fp16's normal range), or null for none"
            )
        if cfg.backward not in (CommPrecision.fp16, CommPrecision.bf16):
            raise ValueError(
                f"sharding.qcomms.backward_loss_scale={scale} with sharding.qcomms.backward="
                f"{cfg.backward.value}: TorchRec scales only fp16 and bf16 gradients (it would drop the "
                "scale). Fix: sharding.qcomms.backward=fp16 (or bf16), or sharding.qcomms.backward_loss_scale=null"
            )
    # TorchRec's get_qcomm_codecs_registry turns bf16 into fp16 wherever the device is a CPU
    # (written for a gloo without bf16 reductions); torch 2.13's gloo sums and exchanges bf16
    # (tests/sharding/test_qcomms.py sends it), so the codecs are built per collective here and
    # bf16 goes on the wire as asked, as it does on NCCL. The registry's other fallbacks are
    # for fp8 / mx4, which the options do not offer.
    asked = TorchRecQCommsConfig(forward_precision=_comm_type(cfg.forward), backward_precision=_comm_type(cfg.backward))
    registry = {op.name: get_qcomm_codecs(asked) for op in _COMM_OPS}
    if scale is not None:
        for codecs in registry.values():
            codecs.backward = RescaledCodec(codecs.backward, scale)
    return registry


class RescaledCodec(QuantizedCommCodec):
    """A codec whose values are multiplied by ``scale`` before ``inner`` encodes them and divided
    by it after ``inner`` decodes them (``sharding.qcomms.backward_loss_scale``). TorchRec's own
    ``backward_loss_scale`` (fbgemm 1.8's codec) divides the *encoded* fp16 tensor before
    decoding it, which returns a gradient of 1e-6 to fp16's subnormals, with the bits it lost
    (measured: 7.4e-3 of the largest value off, scaled or not); here the division is in the
    decoded fp32, so the scaled value's 11 bits arrive."""

    def __init__(self, inner: Any, scale: float) -> None:
        self.inner, self.scale = inner, float(scale)

    def encode(self, input_tensor: torch.Tensor, ctx: Optional[Any] = None) -> torch.Tensor:
        return self.inner.encode(input_tensor * self.scale, ctx)

    def decode(self, input_grad: torch.Tensor, ctx: Optional[Any] = None) -> torch.Tensor:
        decoded = self.inner.decode(input_grad, ctx)
        return decoded.float().div_(self.scale).to(decoded.dtype)

    @property
    def quantized_dtype(self) -> torch.dtype:
        return self.inner.quantized_dtype

    def calc_quantized_size(self, input_len: int, ctx: Optional[Any] = None) -> int:
        return self.inner.calc_quantized_size(input_len, ctx)

    def create_context(self) -> Optional[Any]:
        return self.inner.create_context()

    def padded_size(self, input_tensor: torch.Tensor, dim_per_rank: Any, my_rank: int, qcomm_ctx: Any) -> Any:
        return self.inner.padded_size(input_tensor, dim_per_rank, my_rank, qcomm_ctx)

    @property
    def _comm_precision(self) -> Any:  # what wire_precision reads from fbgemm's codec
        return self.inner._comm_precision


def wire_precision(registry: Optional[Dict[str, Any]], direction: str) -> str:
    """What the codecs of ``direction`` (forward / backward) send: fp32 when off."""
    if not registry:
        return CommPrecision.fp32.value
    codec = getattr(registry[CommOp.POOLED_EMBEDDINGS_ALL_TO_ALL.name], direction)
    return str(codec._comm_precision.name).lower()  # fbgemm's SparseType: FP16, INT8, ...


def wire_factor(registry: Optional[Dict[str, Any]], direction: str) -> float:
    """Bytes on the wire per fp32 byte handed to the pooled-embedding collectives."""
    if not registry:
        return 1.0
    codec = getattr(registry[CommOp.POOLED_EMBEDDINGS_ALL_TO_ALL.name], direction)
    # the configured codec's rate, whatever sharding.qcomms.when=auto's switch says now: the
    # bytes sent while it was off are counted apart (qcomms_switch.PLAIN)
    codec = codec.inner if isinstance(codec, SwitchedCodec) else codec
    values = 32 * 1024  # a multiple of int8's 32-value rows: the factor is exact
    wire = codec.calc_quantized_size(values, codec.create_context())
    return wire * torch.empty((), dtype=codec.quantized_dtype).element_size() / (values * 4)


def qcomms_summary(cfg: QCommsConfig, registry: Optional[Dict[str, Any]]) -> Dict[str, Any]:
    """summary.json's ``qcomms``: what was asked, what went on the wire, bytes per fp32 byte."""
    return {
        "forward": cfg.forward.value,
        "backward": cfg.backward.value,
        "forward_on_wire": wire_precision(registry, "forward"),
        "backward_on_wire": wire_precision(registry, "backward"),
        "forward_wire_factor": wire_factor(registry, "forward"),
        "backward_wire_factor": wire_factor(registry, "backward"),
        "backward_loss_scale": cfg.backward_loss_scale,
        "plan_as": cfg.plan_as.value,
        "when": cfg.when.value,
    }


# Sharding types whose pooled embeddings go through a reduce-scatter: TorchRec 1.8 gives its
# int8 codec no quantization context there and fails in the first step ("Unexpected `None`").
_REDUCE_SCATTER = {ShardingType.ROW_WISE.value, ShardingType.TABLE_ROW_WISE.value}
INT8_ROW = 32  # fbgemm's int8 rows: values quantized 32 at a time (ROW_DIM_DEFAULT)


def check_qcomms(cfg: ShardingConfig, plan: ShardingPlan, batch_size: int) -> None:
    """Refuse, in one line naming the key and the fix, what TorchRec's codecs refuse later, in
    the middle of a step: int8 on a reduce-scatter (row_wise, table_row_wise tables), and int8
    where the batch per rank times the width a rank sends is not a multiple of its 32-value rows
    (the all-to-all asserts ``input_len % 32 == 0``). Evaluation batches are not checked: they
    are near-equal splits of each rank's rows and can fail the same assert where the width is
    not a multiple of 32. Local: every rank checks the same plan and config."""
    q = cfg.qcomms
    for direction in ("forward", "backward"):
        if getattr(q, direction) is not CommPrecision.int8:
            continue
        key = f"sharding.qcomms.{direction}=int8"
        rs = sorted(
            table
            for module_plan in plan.plan.values()
            for table, ps in module_plan.items()  # type: ignore[union-attr]
            if ps.sharding_type in _REDUCE_SCATTER
        )
        if rs:
            raise ValueError(
                f"{key}: TorchRec's int8 codec does not run on the reduce-scatter of row_wise / "
                f"table_row_wise tables ({', '.join(rs[:4])}{' ...' if len(rs) > 4 else ''} here). "
                f"Fix: sharding.qcomms.{direction}=fp16 (or bf16), or keep those tables off row-wise "
                "(sharding.type=table_wise or sharding.table_overrides)"
            )
        for (sharding_type, rank), width in sorted(_a2a_widths(plan).items()):
            if batch_size * width % INT8_ROW:
                up = -(-batch_size // INT8_ROW) * INT8_ROW
                raise ValueError(
                    f"{key} quantizes {INT8_ROW} values at a time: trainer.batch_size x the "
                    f"embedding width a rank sends must be a multiple of {INT8_ROW}, and it is "
                    f"{batch_size} x {width} on rank {rank} ({sharding_type}). Fix: "
                    f"trainer.batch_size={up} (any multiple of {INT8_ROW}), or "
                    f"sharding.qcomms.{direction}=fp16"
                )


def _a2a_widths(plan: ShardingPlan) -> Dict[Tuple[str, int], int]:
    """(sharding type, rank) -> the summed width of the pooled embeddings that rank sends in
    that type's all-to-all (its shards' columns), for every all-to-all sharding type."""
    widths: Dict[Tuple[str, int], int] = {}
    for module_plan in plan.plan.values():
        for ps in module_plan.values():  # type: ignore[union-attr]
            if ps.sharding_type in _REDUCE_SCATTER or ps.sharding_type == ShardingType.DATA_PARALLEL.value:
                continue
            for shard in ps.sharding_spec.shards:  # type: ignore[union-attr]
                key = (ps.sharding_type, shard.placement.rank())
                widths[key] = widths.get(key, 0) + int(shard.shard_sizes[1])
    return widths
