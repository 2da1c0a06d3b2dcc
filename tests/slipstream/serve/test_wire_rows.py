"""serve's row codec (slipstream/serve/wire_rows.py): the bytes a row takes and what comes back."""

import pytest
import torch

from slipstream_rec.slipstream.serve.wire_rows import decode_rows, encode_rows, row_width
from tests.slipstream._util import int8_row


def _rows():
    g = torch.Generator().manual_seed(3)
    rows = torch.randn(6, 16, generator=g) * torch.logspace(-6, 2, 6).unsqueeze(1)  # 8 decades
    rows[2] = 0.0  # a row of zeros
    rows[4, 5] = -7.5  # a row whose largest element is negative
    return rows


@pytest.mark.parametrize("wire, width", [(torch.float32, 16), (torch.bfloat16, 16), (torch.int8, 18)])
def test_a_row_takes_its_values_plus_a_scale_only_under_int8(wire, width):
    rows = _rows()
    flat = encode_rows(rows, wire)
    assert flat.dtype is wire and flat.dim() == 1
    assert row_width(wire, 16) == width and flat.numel() == rows.shape[0] * width
    # bytes a row costs on the wire: 64, 32, 18 (16 values and a 2-byte bf16 scale)
    assert flat.numel() * flat.element_size() // rows.shape[0] == {torch.float32: 64, torch.bfloat16: 32}.get(wire, 18)
    assert decode_rows(flat, 16, wire).shape == rows.shape


def test_int8_rows_come_back_within_a_254th_of_their_largest_element_and_zeros_exactly():
    rows = _rows()
    back = decode_rows(encode_rows(rows, torch.int8), 16, torch.int8)
    for row, got in zip(rows, back):
        largest = float(row.abs().max())
        # the reference: each value to the nearest multiple of the step, the largest / 127
        # rounded up to 8 significant bits (the scale's bf16)
        torch.testing.assert_close(got, int8_row(row), rtol=1e-6, atol=0.0)
        assert float((got - row).abs().max()) <= largest / 254 * (1 + 2**-7) * (1 + 1e-6)
        assert float(got.abs().max()) == pytest.approx(largest, rel=2**-7)  # the largest within the scale's bit
    assert torch.equal(back[2], torch.zeros(16))


def test_an_int8_scale_keeps_fp32s_range():
    # a push's sums of 1e-9 (fp16's smallest subnormal is 6e-8): their scale is a bf16, not zero
    rows = torch.randn(3, 16, generator=torch.Generator().manual_seed(0)) * 1e-9
    back = decode_rows(encode_rows(rows, torch.int8), 16, torch.int8)
    assert float((back - rows).abs().max()) <= float(rows.abs().max()) / 254 * (1 + 2**-7) * (1 + 1e-6)


def test_bf16_and_fp32_rows_come_back_as_their_casts():
    rows = _rows()
    assert torch.equal(decode_rows(encode_rows(rows, torch.float32), 16, torch.float32), rows)
    assert torch.equal(decode_rows(encode_rows(rows, torch.bfloat16), 16, torch.bfloat16), rows.bfloat16().float())


def test_no_rows_are_no_bytes():
    for wire in (torch.float32, torch.bfloat16, torch.int8):
        flat = encode_rows(torch.zeros(0, 16), wire)
        assert flat.numel() == 0 and decode_rows(flat, 16, wire).shape == (0, 16)
