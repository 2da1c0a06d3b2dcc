"""What serve's push puts on the wire (slipstream/serve/push.py): the int8 push's remainders."""

import torch

from slipstream_rec.slipstream.rows import RowIndex
from slipstream_rec.slipstream.serve.push import ServedGradients
from slipstream_rec.slipstream.serve.wire_rows import decode_rows
from tests.slipstream._util import int8_row

DIM = 4


_int8 = int8_row  # the reference rounding, value by value (tests/slipstream/_util.py)


def _sent(sums: ServedGradients, keys, grads):
    keys = torch.tensor(keys)
    return decode_rows(sums._on_wire(keys, torch.stack(grads)).reshape(-1), DIM, torch.int8)


def test_an_int8_push_adds_what_the_last_ones_rounding_left_to_a_row_pushed_again():
    sums = ServedGradients(RowIndex(["f"], [100]), DIM, wire_dtype=torch.int8)
    a1, b1 = torch.tensor([1.0, 0.003, -0.3, 0.0021]), torch.tensor([0.5, 0.25, 0.125, 0.0])
    first = _sent(sums, [3, 7], [a1, b1])
    torch.testing.assert_close(first, torch.stack([_int8(a1), _int8(b1)]), rtol=1e-6, atol=0.0)
    assert first[0, 1] == 0 and first[0, 3] == 0  # below a 254th of the largest: rounded away
    # row 3 again (7 not, 9 new): 3's remainder is added to its sum first, 7's is dropped
    a2, c2 = torch.tensor([1.0, 0.003, -0.3, 0.0021]), torch.tensor([0.0, 2.0, 0.0, -1.0])
    second = _sent(sums, [3, 9], [a2, c2])
    carried = a2 + (a1 - _int8(a1))
    torch.testing.assert_close(second, torch.stack([_int8(carried), _int8(c2)]), rtol=1e-6, atol=1e-9)
    assert second[0, 1] > 0  # 0.006 together: a step now
    assert sums._carry_keys.tolist() == [3, 9]


def test_int8_pushes_of_a_small_element_deliver_it_within_one_rounding_step():
    # the same sum pushed 50 times: the small element (a 500th of the largest) arrives in total,
    # less at most what the last push left; without the remainders it would never arrive
    sums = ServedGradients(RowIndex(["f"], [10]), DIM, wire_dtype=torch.int8)
    g = torch.tensor([1.0, 0.002, -0.5, 0.0])
    total = torch.zeros(DIM)
    for _ in range(50):
        total += _sent(sums, [2], [g])[0]
    assert abs(float(total[1]) - 50 * 0.002) <= 1.0 / 254 * (1 + 2**-7) + 1e-6
    assert float(total[1]) > 0.09


def test_a_bf16_push_keeps_no_remainder():
    sums = ServedGradients(RowIndex(["f"], [10]), DIM, wire_dtype=torch.bfloat16)
    rows = sums._on_wire(torch.tensor([2]), torch.tensor([[1.0, 0.002, -0.5, 0.0]]))
    assert rows.dtype is torch.bfloat16 and sums._carry_keys.numel() == 0


def test_the_remainders_survive_a_checkpoint():
    sums = ServedGradients(RowIndex(["f"], [10]), DIM, wire_dtype=torch.int8)
    _sent(sums, [2, 5], [torch.tensor([1.0, 0.002, -0.5, 0.0]), torch.tensor([0.1, 0.0, 0.0, 0.0003])])
    resumed = ServedGradients(RowIndex(["f"], [10]), DIM, wire_dtype=torch.int8)
    resumed.load_state_dict(sums.state_dict())
    g = [torch.tensor([0.3, 0.001, 0.0, 0.0]), torch.tensor([0.2, 0.0, 0.0, 0.0])]
    assert torch.equal(_sent(resumed, [2, 5], g), _sent(sums, [2, 5], g))
    older = {k: v for k, v in sums.state_dict().items() if not k.startswith("carry")}  # before them
    ServedGradients(RowIndex(["f"], [10]), DIM, wire_dtype=torch.int8).load_state_dict(older)
