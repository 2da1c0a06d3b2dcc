"""Serving's per-sample layout of a variable-batch EBC output (``sharding/vbe_output.py``)
against FBGEMM's ``batch_index_select_dim0``, which TorchRec's own awaitable calls: the same
values forward and the same gradients backward, for tables of one width and of several.

The end-to-end check that a serving step through the sharded EBC equals an ``off`` step on
every sharding type is ``tests/slipstream/serve/test_serve_dist.py``.
"""

from __future__ import annotations

import fbgemm_gpu  # noqa: F401  - defines torch.ops.fbgemm
import pytest
import torch

from slipstream_rec.sharding.vbe_output import per_sample_rows

# (rows of each feature, widths of each feature, samples)
CASES = [
    ([3, 1, 5, 2], [4, 4, 4, 4], 6),  # one width: the single gather
    ([2, 4, 1], [8, 4, 16], 5),  # several widths: per feature
    ([1, 6], [2, 2], 7),  # a feature whose one bag every sample shares (all served)
]


def _fbgemm(flat, indices, rows, widths):
    return torch.ops.fbgemm.batch_index_select_dim0(
        inputs=flat, indices=indices.reshape(-1), input_num_indices=[indices.shape[1]] * len(rows),
        input_rows=rows, input_columns=widths, permute_output_dim_0_1=True,
    ).view(indices.shape[1], -1)  # fmt: skip


@pytest.mark.parametrize("rows, widths, batch", CASES)
def test_the_gather_equals_fbgemms_batch_index_select_forward_and_backward(rows, widths, batch):
    gen = torch.Generator().manual_seed(sum(rows) * 31 + batch)
    flat = torch.randn(sum(n * w for n, w in zip(rows, widths)), generator=gen)
    indices = torch.stack([torch.randint(0, n, (batch,), generator=gen) for n in rows])
    grad = torch.randn(batch, sum(widths), generator=gen)
    outs, grads = [], []
    for layout in (_fbgemm, per_sample_rows):
        x = flat.clone().requires_grad_(True)
        out = layout(x, indices, rows, widths)
        out.backward(grad)
        outs.append(out.detach())
        grads.append(x.grad)
    assert outs[1].shape == (batch, sum(widths))
    assert torch.equal(outs[0], outs[1])
    torch.testing.assert_close(grads[1], grads[0], rtol=0, atol=1e-6)
    # a row no sample reads gets no gradient; every sample's columns land in its own row
    assert grads[1].abs().sum() > 0


def test_sample_b_reads_row_inverse_f_b_of_each_feature_in_feature_order():
    rows, widths = [2, 3], [1, 2]
    flat = torch.arange(2 * 1 + 3 * 2, dtype=torch.float32)  # f0: rows [0], [1]; f1: [2,3], [4,5], [6,7]
    indices = torch.tensor([[1, 0], [2, 0]])
    out = per_sample_rows(flat, indices, rows, widths)
    assert out.tolist() == [[1.0, 6.0, 7.0], [0.0, 2.0, 3.0]]
