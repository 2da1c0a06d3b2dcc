"""Serving's variable-batch EBC output laid back out per sample by one gather, not FBGEMM's
``batch_index_select_dim0``.

Serving's compacted batches (``slipstream/serve/split.py``) reach the sharded EBC as
variable-batch KJTs (TorchRec's VBE): feature f sends S_f bags and each sample's bag is
``inverse[f, b]``. The output dists return each feature's S_f pooled rows, and TorchRec's
``VariableBatchEmbeddingBagCollectionAwaitable`` lays them out per sample with
``torch.ops.fbgemm.batch_index_select_dim0``. On CPU that op and its backward were the costliest
part of a serving step: 200 steps serving always on 2 emulated nodes at dim 128 took 26.9 s
through it and 22.7 s through the gather below (docs/results/serve.md). The same layout is one
gather of rows: for features of one width, ``F.embedding`` of the flat rows by ``inverse[f, b]``
plus feature f's first row, sample-major, whose backward sums each sample's gradient into its row
(each kept bag is one sample's; the shared empty bag's sum has no lookup to reach). Tables of
different widths gather per feature. Same values, same gradients
(``tests/sharding/test_vbe_output.py``), on any device, no host read.
"""

from __future__ import annotations

from typing import Any, List

import torch
import torch.nn.functional as F
from torchrec.distributed.embeddingbag import (
    VariableBatchEmbeddingBagCollectionAwaitable,
    construct_output_kt,
)
from torchrec.sparse.jagged_tensor import KeyedTensor

__all__ = ["GatheredVariableBatchOutput", "per_sample_rows"]


def per_sample_rows(flat: torch.Tensor, indices: torch.Tensor, rows: List[int], widths: List[int]) -> torch.Tensor:
    """``flat``: feature f's ``rows[f]`` x ``widths[f]`` values after feature f-1's; ``indices``
    (F, B): the row of feature f that sample b reads. Returns (B, sum of widths), feature f's
    columns after feature f-1's: what ``batch_index_select_dim0(..., permute_output_dim_0_1=True)``
    returns, by a gather whose backward is a scatter-add."""
    num_features, batch = indices.shape
    assert num_features == len(rows) == len(widths), (indices.shape, len(rows), len(widths))
    if len(set(widths)) == 1:
        width = widths[0]
        firsts = torch.tensor([0] + rows[:-1], dtype=indices.dtype).cumsum(0).to(indices.device, non_blocking=True)
        at = (indices + firsts.unsqueeze(1)).t().reshape(-1)  # sample-major: b's features in order
        return F.embedding(at, flat.view(-1, width)).view(batch, num_features * width)
    parts, start = [], 0
    for f, (n, width) in enumerate(zip(rows, widths)):
        parts.append(F.embedding(indices[f], flat[start : start + n * width].view(n, width)))
        start += n * width
    return torch.cat(parts, dim=1)


class GatheredVariableBatchOutput(VariableBatchEmbeddingBagCollectionAwaitable):
    """TorchRec's variable-batch EBC output with ``per_sample_rows`` in place of its FBGEMM
    gather; everything else (the dists' waits, the inverse indices' permutation, the resize
    awaitables, the feature permutation and the KeyedTensor) as TorchRec's ``_wait_impl``."""

    @classmethod
    def of(cls, torchrec_awaitable: Any) -> "GatheredVariableBatchOutput":
        """The same output, waited by this class: TorchRec builds its awaitable inside
        ``compute_and_output_dist``; this one takes its fields as they are, before any wait."""
        assert type(torchrec_awaitable) is VariableBatchEmbeddingBagCollectionAwaitable, type(torchrec_awaitable)
        a = torchrec_awaitable
        return cls(
            awaitables=a._awaitables, inverse_indices=a._inverse_indices,
            inverse_indices_permute_indices=a._inverse_indices_permute_indices,
            batch_size_per_feature_pre_a2a=a._batch_size_per_feature_pre_a2a,
            uncombined_embedding_dims=a._uncombined_embedding_dims, embedding_names=a._embedding_names,
            embedding_dims=a._embedding_dims, permute_op=a._permute_op, module_fqn=a._module_fqn,
            sharding_types=a._sharding_types, resize_awaitables=a._resize_awaitables,
        )  # fmt: skip

    def _wait_impl(self) -> KeyedTensor:
        embeddings = [w.wait() for w in self._awaitables]
        _keys, inverse = self._inverse_indices
        permute = self._inverse_indices_permute_indices
        indices = inverse if permute is None else torch.index_select(inverse, 0, permute)
        out = per_sample_rows(
            embeddings[0] if len(embeddings) == 1 else torch.cat(embeddings),
            indices.view(len(self._uncombined_embedding_dims), -1),
            list(self._batch_size_per_feature_pre_a2a),
            list(self._uncombined_embedding_dims),
        )
        if self._resize_awaitables is not None:
            for awaitable in self._resize_awaitables:
                awaitable.wait()
        return construct_output_kt(
            embeddings=[self._permute_op(out)],
            embedding_names=self._embedding_names,
            embedding_dims=self._embedding_dims,
        )
