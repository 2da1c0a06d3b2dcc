"""How serve's own collectives put rows of values on the wire (``slipstream.sync_precision``).

The push sends per-row gradient sums and the replica sync sends per-row differences from the
copy every rank holds (``push.py``, ``replica.py``); both go through these three functions, so a
row costs the same on either and the byte meters count what the collective was given.

- ``float32``: the values as they are (4 bytes each).
- ``bfloat16``: each value rounded to bf16 (2 bytes; within 2^-8 of itself).
- ``int8``: each row at one scale, TorchRec's row-wise INT8 comms in spirit: the row's largest
  magnitude / 127, rounded up to a bf16 (travelling as 2 int8 bytes after the row; bf16 has
  fp32's range, so a push's sums of 1e-6 keep their scale where fp16's would be subnormal), each
  value rounded to the nearest multiple of it (1 byte each; within 1/254 x (1 + 2^-7) of the
  row's largest magnitude: rounding the scale up costs at most its last bit, and no value
  clamps). Symmetric, so a row of zeros stays zeros and no bias is sent. At dim 16 a row's 18
  bytes against bf16's 32 (an fp32 scale's 20); at dim 128, 130 against 256.

Everything stays on the tensors' device (no host read): under nccl the encode and decode are
kernels beside the collectives.
"""

from __future__ import annotations

import torch

__all__ = ["WIRE_KINDS", "decode_rows", "encode_rows", "row_width"]

WIRE_KINDS = (torch.float32, torch.bfloat16, torch.int8)
_SCALE_BYTES = 2  # a bf16 scale per int8 row
_LEVELS = 127.0  # int8's symmetric range: -127..127 (-128 unused)
_BF16_LOW_BITS = 0xFFFF  # the fp32 bits a bf16 drops


def _bf16_at_least(x: torch.Tensor) -> torch.Tensor:
    """The smallest bf16 >= each finite x >= 0 (fp32 in): its dropped low 16 bits carried up."""
    bits = x.float().contiguous().view(torch.int32)
    return ((bits + _BF16_LOW_BITS) & ~_BF16_LOW_BITS).view(torch.float32).to(torch.bfloat16)


def row_width(wire: torch.dtype, cols: int) -> int:
    """Elements of ``wire`` that a row of ``cols`` values takes on the wire."""
    assert wire in WIRE_KINDS, f"a wire kind of {WIRE_KINDS}, not {wire}"
    return cols + _SCALE_BYTES if wire is torch.int8 else cols


@torch.no_grad()
def encode_rows(rows: torch.Tensor, wire: torch.dtype) -> torch.Tensor:
    """(n, cols) float values -> the 1-D ``wire`` tensor of n rows of ``row_width`` elements."""
    assert rows.dim() == 2, "rows as (n, cols)"
    if wire is not torch.int8:
        assert wire in WIRE_KINDS, f"a wire kind of {WIRE_KINDS}, not {wire}"
        return rows.to(wire).reshape(-1)
    if rows.shape[0] == 0:
        return torch.zeros(0, dtype=torch.int8, device=rows.device)
    rows = rows.float()
    scale = _bf16_at_least(rows.abs().amax(1, keepdim=True) / _LEVELS)  # (n, 1), bf16
    wide = scale.float()
    safe = torch.where(wide > 0, wide, torch.ones_like(wide))  # a row of zeros: zeros
    q = (rows / safe).round_().clamp_(-_LEVELS, _LEVELS).to(torch.int8)
    return torch.cat([q, scale.contiguous().view(torch.int8)], 1).reshape(-1)


@torch.no_grad()
def decode_rows(flat: torch.Tensor, cols: int, wire: torch.dtype) -> torch.Tensor:
    """``encode_rows``' inverse: the 1-D wire tensor -> (n, cols) float32, on its device."""
    width = row_width(wire, cols)
    assert flat.numel() % max(width, 1) == 0, "whole rows on the wire"
    rows = flat.view(-1, width)
    if wire is not torch.int8:
        return rows.float()
    if rows.shape[0] == 0:
        return torch.zeros(0, cols, device=flat.device)
    # the scale bytes copied to a storage of their own, aligned for the bf16 view
    scale = torch.empty(rows.shape[0], _SCALE_BYTES, dtype=torch.int8, device=rows.device)
    scale = scale.copy_(rows[:, cols:]).view(torch.bfloat16).float()  # (n, 1)
    return rows[:, :cols].float() * scale
