"""``sharding.qcomms.when=auto``: the quantized comms kept only where the run's own steps pay.

Quantized comms halve the pooled embeddings' all-to-alls, their gradients and (with
``trainer.ddp_comm_hook``) the dense all-reduce. Across nodes, where the link is the cost, that
is most of a step (measured over two emulated nodes at 200mbit: 1.7x ``off``'s speed,
docs/performance.md); on one machine the collectives are cheap and the encoding and the lost
bits buy nothing. No setting knows which; a clock does.

* ``CommsSwitch``: one flag, on (quantized) or off (fp32), read by every codec of the run's
  registry (``SwitchedCodec``) and by the DDP hook (training/comm_hooks.py) on each call. Off,
  a codec is TorchRec's no-op codec (``NoOpQuantizedCommCodec``): the fp32 tensor itself goes on
  the wire, as without a registry; the hook is the plain all-reduce. It flips only between
  steps, on every rank at the same step (the probe's turns and its decision are the ranks'
  agreement), so a step's forward and backward send alike and the ranks' collectives match.
  On the guard's steps (qcomms_guard.py) the codecs and the hook also measure what they lose.
* ``CommsProbe``: a ``StepProbe`` (step_probe.py) of ``fp32`` against ``quantized``
  comms, after the precision probe's turns; it sets the switch for each of its steps and, at its
  decision, for the rest of the run.

The byte meters follow the switch: the sharded module counts what it hands the output dists
while the switch is off apart (``SlipstreamShardedEBC.plain_bytes``, sent at fp32), and the
hook's meter counts each step at the bytes of the all-reduce that ran.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, Optional

import torch
from torchrec.distributed.types import NoOpQuantizedCommCodec, QuantizedCommCodec

from slipstream_rec.sharding.config import QCommsConfig, QCommsWhen
from slipstream_rec.sharding.qcomms_guard import CommsErrors
from slipstream_rec.step_probe import PROBE_START, StepProbe

__all__ = ["CommsProbe", "CommsSwitch", "SwitchedCodec", "PLAIN", "make_comms_probe", "make_comms_switch", "registry_switch", "switch_registry"]

FP32, QUANTIZED = "fp32", "quantized"  # the probe's candidates
PLAIN = "plain:"  # a byte meter's key for what went at fp32 with the codecs switched off


@dataclass
class CommsSwitch:
    """Whether the quantized comms run now (True) or fp32 ones (False), and whether this step's
    encodings are measured for the guard (qcomms_guard.py). Local state that every rank changes
    at the same step."""

    on: bool = True
    measuring: bool = False
    errors: CommsErrors = field(default_factory=CommsErrors)  # the measured step's sums


class SwitchedCodec(QuantizedCommCodec):
    """``inner`` while ``switch.on``, TorchRec's no-op codec (fp32 on the wire) while it is off.
    Each call reads the switch: an encode, its sizes and its decode fall in one step."""

    def __init__(self, inner: Any, switch: CommsSwitch, direction: str = "forward") -> None:
        self.inner, self.switch, self.plain = inner, switch, NoOpQuantizedCommCodec()
        self.direction = direction  # the guard's name for what it encodes: forward, backward

    def _now(self) -> Any:
        return self.inner if self.switch.on else self.plain

    def encode(self, input_tensor: torch.Tensor, ctx: Optional[Any] = None) -> torch.Tensor:
        codec = self._now()
        out = codec.encode(input_tensor, ctx)
        if self.switch.measuring and codec is self.inner:  # the guard's step: what the far side will decode
            self.switch.errors.add(self.direction, input_tensor, codec.decode(out, ctx))
        return out

    def decode(self, input_grad: torch.Tensor, ctx: Optional[Any] = None) -> torch.Tensor:
        return self._now().decode(input_grad, ctx)

    @property
    def quantized_dtype(self) -> torch.dtype:
        return self.inner.quantized_dtype if self.switch.on else torch.float32

    def calc_quantized_size(self, input_len: int, ctx: Optional[Any] = None) -> int:
        return self._now().calc_quantized_size(input_len, ctx)

    def create_context(self) -> Optional[Any]:
        return self._now().create_context()

    def padded_size(self, input_tensor: torch.Tensor, dim_per_rank: Any, my_rank: int, qcomm_ctx: Any) -> Any:
        return self._now().padded_size(input_tensor, dim_per_rank, my_rank, qcomm_ctx)

    @property
    def _comm_precision(self) -> Any:  # what qcomms.wire_precision reads: the configured codec's
        return self.inner._comm_precision


def switch_registry(registry: Dict[str, Any], switch: CommsSwitch) -> Dict[str, Any]:
    """Every codec of ``registry`` behind ``switch`` (in place; returns it)."""
    for codecs in registry.values():
        codecs.forward = SwitchedCodec(codecs.forward, switch, "forward")
        codecs.backward = SwitchedCodec(codecs.backward, switch, "backward")
    return registry


def registry_switch(registry: Optional[Dict[str, Any]]) -> Optional[CommsSwitch]:
    """The switch behind ``registry``'s codecs (None: none, or not switched)."""
    for codecs in (registry or {}).values():
        if isinstance(codecs.forward, SwitchedCodec):
            return codecs.forward.switch
    return None


class CommsProbe(StepProbe):
    """fp32 against quantized comms, timed in turns on the run's steps (``StepProbe``); it sets
    ``switch`` for each step it times and, once decided, keeps the winner on."""

    def __init__(self, switch: CommsSwitch, steps: int, min_gain: float, start: int = PROBE_START) -> None:
        super().__init__(steps, min_gain, base=FP32, trial=QUANTIZED, start=start)
        self.switch = switch

    def before_step(self, step: int) -> None:
        """Set the switch for step ``step``: the probe's turn, the decision after it, and the
        configured (quantized) comms before the probe. Local, the same on every rank."""
        name = self.candidate(step) or self.picked or QUANTIZED
        self.switch.on = name == QUANTIZED


def make_comms_switch(cfg: QCommsConfig, hook_quantized: bool) -> Optional[CommsSwitch]:
    """The run's switch where ``sharding.qcomms.when=auto`` has something to switch (codecs, or
    a quantizing ``trainer.ddp_comm_hook``: ``hook_quantized``); None otherwise."""
    if cfg.when is QCommsWhen.auto and (cfg.enabled or hook_quantized):
        return CommsSwitch()
    return None


def make_comms_probe(cfg: QCommsConfig, switch: Optional[CommsSwitch]) -> Optional[CommsProbe]:
    """The probe ``sharding.qcomms.when=auto`` asks for (None where nothing is switched or
    ``probe_steps=0``, and for ``when=always``); its start is the trainer's (after the precision
    probe). Its keys' values were checked at composition (``QCommsConfig.validate``)."""
    if cfg.when is not QCommsWhen.auto or switch is None or cfg.probe_steps == 0:
        return None
    return CommsProbe(switch, cfg.probe_steps, cfg.min_gain)
