"""Per-sample classification of a batch's lookups against the stale-row state (vectorised).

A KJT is feature-major: ``lengths`` has F*B entries, entry ``f*B + b`` is the bag size of
sample ``b`` for feature ``f``. All reductions here are segment reductions over those bags,
then a sum/max over the F axis of the (F, B) view -- no Python loop over samples.

Conventions (shared with ``threshold.threshold_for_target`` and ``decide.SkipDecider``):

* a row is stale for threshold T iff ``change < T`` (strict);
* a sample with no lookups at all is never skippable (its max change is +inf);
* ``alpha == 1``: skippable iff every lookup is stale, which is exactly ``max change < T``.
"""

from __future__ import annotations

from typing import Optional, Tuple

import torch
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from slipstream_rec.slipstream.rows import RowIndex, RowState

__all__ = [
    "lookups_per_sample",
    "per_sample_max_change",
    "stale_counts_per_sample",
    "stale_fraction_per_sample",
    "skippable",
    "skippable_by_threshold",
    "validate_alpha",
]

_INF = float("inf")


def validate_alpha(alpha: float) -> float:
    """``alpha`` in (0, 1]; raises ValueError naming ``slipstream.alpha``."""
    a = float(alpha)
    if not (0.0 < a <= 1.0):
        raise ValueError(
            f"slipstream.alpha must be in (0, 1] (fraction of a sample's lookups that must be "
            f"stale for it to be skippable; 1.0 = all of them), got {alpha!r}"
        )
    return a


def _layout(kjt: KeyedJaggedTensor) -> Tuple[int, int, torch.Tensor, bool]:
    """(num_keys F, stride B, lengths (F*B,), all_ones) of a uniform-stride KJT."""
    if kjt.variable_stride_per_key():
        raise ValueError("variable-stride KJTs are not supported by slipstream")
    num_keys = len(kjt.keys())
    stride = kjt.stride()
    lengths = kjt.lengths()
    if lengths.numel() != num_keys * stride:
        raise ValueError(
            f"KJT has {lengths.numel()} lengths for {num_keys} keys x stride {stride}"
        )
    all_ones = kjt.values().numel() == lengths.numel() and bool((lengths == 1).all())
    return num_keys, stride, lengths, all_ones


def lookups_per_sample(kjt: KeyedJaggedTensor) -> torch.Tensor:
    """Number of lookups (ids over all features) of each sample, int64 (B,)."""
    num_keys, stride, lengths, _ = _layout(kjt)
    if num_keys == 0:
        return torch.zeros(stride, dtype=torch.int64)
    return lengths.view(num_keys, stride).sum(0, dtype=torch.int64)


_Layout = Tuple[int, int, torch.Tensor, bool]


def _sample_max(
    kjt: KeyedJaggedTensor, per_lookup: torch.Tensor, layout: Optional[_Layout] = None
) -> torch.Tensor:
    """Per-sample max of a float per-lookup tensor; +inf for a sample without lookups."""
    num_keys, stride, lengths, all_ones = layout or _layout(kjt)
    if num_keys == 0 or stride == 0:
        return torch.full((stride,), _INF, dtype=per_lookup.dtype)
    if all_ones:
        return per_lookup.view(num_keys, stride).amax(0)
    seg = torch.segment_reduce(per_lookup, "max", lengths=lengths, unsafe=True, initial=-_INF)
    out = seg.view(num_keys, stride).amax(0)
    empty = lengths.view(num_keys, stride).sum(0) == 0
    return out.masked_fill_(empty, _INF)


def _sample_counts(
    kjt: KeyedJaggedTensor, per_lookup: torch.Tensor, layout: Optional[_Layout] = None
) -> Tuple[torch.Tensor, torch.Tensor]:
    """(count of True per sample, lookups per sample), both int64 (B,), for a bool per-lookup tensor."""
    num_keys, stride, lengths, all_ones = layout or _layout(kjt)
    if num_keys == 0 or stride == 0:
        z = torch.zeros(stride, dtype=torch.int64)
        return z, z.clone()
    if all_ones:
        hit = per_lookup.view(num_keys, stride).sum(0, dtype=torch.int64)
        return hit, torch.full((stride,), num_keys, dtype=torch.int64)
    # Segment sums via a cumsum: exact in int64, and faster than scatter_add on CPU.
    cs = torch.zeros(per_lookup.numel() + 1, dtype=torch.int64)
    torch.cumsum(per_lookup, 0, dtype=torch.int64, out=cs[1:])
    ends = torch.cumsum(lengths, 0, dtype=torch.int64)
    seg = cs[ends] - cs[ends - lengths]
    hit = seg.view(num_keys, stride).sum(0)
    total = lengths.view(num_keys, stride).sum(0, dtype=torch.int64)
    return hit, total


def per_sample_max_change(
    kjt: KeyedJaggedTensor, index: RowIndex, change: RowState
) -> torch.Tensor:
    """Each sample's largest ``change`` over all its lookups (all features), float32 (B,).

    ``change`` holds every row's change (``RowState``: sparse, O(hot rows)); a sample with no
    lookups gets +inf (never skippable).
    """
    per_lookup = change.lookup_changes(index, kjt)
    return _sample_max(kjt, per_lookup)


def stale_counts_per_sample(
    kjt: KeyedJaggedTensor, index: RowIndex, stale_mask: torch.Tensor
) -> Tuple[torch.Tensor, torch.Tensor]:
    """(stale lookups, all lookups) per sample, int64 (B,) each; ``stale_mask`` is per flat row."""
    return _sample_counts(kjt, stale_mask.index_select(0, index.flat_keys(kjt)))


def stale_fraction_per_sample(
    kjt: KeyedJaggedTensor, index: RowIndex, stale_mask: torch.Tensor
) -> torch.Tensor:
    """Fraction (float32, (B,)) of each sample's lookups that hit stale rows; 0 with no lookups."""
    hit, total = stale_counts_per_sample(kjt, index, stale_mask)
    frac = hit.to(torch.float64) / total.clamp(min=1).to(torch.float64)
    return frac.to(torch.float32)


def _skippable_from_counts(hit: torch.Tensor, total: torch.Tensor, alpha: float) -> torch.Tensor:
    if alpha == 1.0:
        return (hit == total) & (total > 0)  # exact integer comparison
    # count/total in float64, as a Python reference loop `hit / total >= alpha` computes it.
    frac = hit.to(torch.float64) / total.clamp(min=1).to(torch.float64)
    return (frac >= alpha) & (total > 0)


def skippable(
    kjt: KeyedJaggedTensor, index: RowIndex, stale_mask: torch.Tensor, alpha: float = 1.0
) -> torch.Tensor:
    """Bool (B,): samples whose lookups are stale enough to skip.

    ``alpha == 1.0``: every lookup stale (integer comparison). Otherwise the stale fraction is
    ``>= alpha``. A sample with no lookups is never skippable.
    """
    alpha = validate_alpha(alpha)
    hit, total = stale_counts_per_sample(kjt, index, stale_mask)
    return _skippable_from_counts(hit, total, alpha)


def skippable_by_threshold(
    kjt: KeyedJaggedTensor,
    index: RowIndex,
    change: RowState,
    threshold: Optional[float],
    alpha: float = 1.0,
) -> torch.Tensor:
    """``skippable(kjt, index, change < threshold, alpha)`` without building the full row mask.

    Only the looked-up rows are compared, so the cost is O(lookups), not O(num_rows).
    ``threshold`` None means no threshold yet: nothing is skippable.
    """
    alpha = validate_alpha(alpha)
    layout = _layout(kjt)
    num_keys, stride, lengths, _ = layout
    if threshold is None:
        return torch.zeros(stride, dtype=torch.bool)
    per_lookup = change.lookup_changes(index, kjt)
    if alpha == 1.0:
        # all stale <=> max change < T; the empty-sample max is +inf, never < T... unless T is
        # +inf, hence the explicit lookup-count check.
        ok = _sample_max(kjt, per_lookup, layout) < float(threshold)
        if float(threshold) == _INF and num_keys:
            ok &= lengths.view(num_keys, stride).sum(0) > 0
        return ok
    hit, total = _sample_counts(kjt, per_lookup < float(threshold), layout)
    return _skippable_from_counts(hit, total, alpha)
