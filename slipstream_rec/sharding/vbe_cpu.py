"""A vectorized CPU kernel for FBGEMM's ``generate_vbe_metadata``, which serving's per-feature
batch sizes (TorchRec's variable-batch KJTs) reach in every embedding lookup.

FBGEMM's own CPU kernel of this op walks every (table, rank, sample) and reads and writes
single elements through tensor indexing: on these CPUs it took 687 ms per call for 26 tables x
2048 bags (measured with the profiler, 2 ranks, table-wise), ten times the whole lookup. Its
CUDA kernel is a plain parallel one, so a GPU run is untouched: only the CPU dispatch key is
replaced, by the same mapping computed with a handful of tensor ops.

What it computes (FBGEMM's ``generate_vbe_metadata_cpu``): for each table t, rank r and sample
b < the rank's batch of t, at position ``B_offsets[t] + B_offsets_rank_per_feature[t, r] + b``,
``row_output_offsets`` = ``output_offsets_feature_rank[r * T + t] + b * D_t`` (where the bag's
row starts in the output) and ``b_t_map`` = ``t << info_B_num_bits | (B_offsets_rank_per_feature
[t, r] + b)`` (the bag's table and sample, packed).
"""

from __future__ import annotations

from typing import Optional, Tuple

import torch

__all__ = ["generate_vbe_metadata_cpu", "install"]

_installed: list = []  # the library object keeping the registration alive


def generate_vbe_metadata_cpu(
    B_offsets: torch.Tensor,
    B_offsets_rank_per_feature: torch.Tensor,
    output_offsets_feature_rank: torch.Tensor,
    D_offsets: torch.Tensor,
    D: int,
    nobag: bool,
    max_B_feature_rank: int,
    info_B_num_bits: int,
    total_B: int,
    vbe_output_offsets: Optional[torch.Tensor] = None,
) -> Tuple[torch.Tensor, torch.Tensor]:
    num_tables = B_offsets.numel() - 1
    ranks = B_offsets_rank_per_feature.size(1) - 1
    assert num_tables > 0 and ranks > 0, (num_tables, ranks)
    assert output_offsets_feature_rank.numel() == ranks * num_tables + 1
    per_rank = B_offsets_rank_per_feature.to(torch.int64)
    sizes = (per_rank[:, 1:] - per_rank[:, :-1]).reshape(-1)  # (T * R,), table-major
    count = int(sizes.sum())
    segment = torch.repeat_interleave(torch.arange(sizes.numel()), sizes, output_size=count)
    starts = torch.cumsum(sizes, 0) - sizes
    b = torch.arange(count) - starts.index_select(0, segment)  # the sample within its (t, r)
    t, r = segment // ranks, segment % ranks
    dims = (D_offsets[1:] - D_offsets[:-1]).to(torch.int64)
    sample = per_rank[:, :-1].reshape(-1).index_select(0, segment) + b  # B_start_r_t + b
    position = B_offsets.to(torch.int64).index_select(0, t) + sample
    row_output_offsets = torch.empty(int(total_B), dtype=output_offsets_feature_rank.dtype)
    row_output_offsets[position] = (
        output_offsets_feature_rank.to(torch.int64).index_select(0, r * num_tables + t) + b * dims.index_select(0, t)
    ).to(output_offsets_feature_rank.dtype)
    b_t_map = torch.empty(int(total_B), dtype=B_offsets.dtype)
    packed = (t << info_B_num_bits) | sample
    # the C++ kernel writes uint32 bits into the int32 tensor: wrap above 2^31 the same way
    b_t_map[position] = torch.where(packed >= 2**31, packed - 2**32, packed).to(B_offsets.dtype)
    out = vbe_output_offsets if vbe_output_offsets is not None else row_output_offsets
    return out, b_t_map


def _dispatch(*args: object) -> Tuple[torch.Tensor, torch.Tensor]:
    return generate_vbe_metadata_cpu(*args)  # type: ignore[arg-type]  # looked up per call


def install() -> bool:
    """Register ``generate_vbe_metadata_cpu`` as FBGEMM's CPU kernel of the op (once per
    process); False where FBGEMM has no such op."""
    if _installed:
        return True
    import fbgemm_gpu  # noqa: F401  - defines the fbgemm ops

    if not hasattr(torch.ops.fbgemm, "generate_vbe_metadata"):
        return False
    import warnings

    lib = torch.library.Library("fbgemm", "IMPL")
    with warnings.catch_warnings():  # "overriding a previously registered kernel": the point
        warnings.simplefilter("ignore")
        lib.impl("generate_vbe_metadata", _dispatch, "CPU")
    _installed.append(lib)
    return True
