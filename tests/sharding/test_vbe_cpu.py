"""Our CPU kernel of FBGEMM's ``generate_vbe_metadata`` against FBGEMM's own and a plain loop.

FBGEMM's kernel runs in a fresh interpreter (this process may have replaced it already: serving
installs ours); the loop is the published algorithm written out, element by element.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

from slipstream_rec.sharding.vbe_cpu import generate_vbe_metadata_cpu
from tests._fixtures import _inputs

# (batch per table per rank, dims per table, info_B_num_bits)
CASES = [
    ([[3, 1], [2, 2], [1, 4]], [8, 4, 16], 26),
    ([[5], [1], [7], [2]], [16, 16, 16, 16], 26),
    ([[0, 2], [3, 0]], [4, 8], 20),  # a rank with no bags of a table
]


def _loop(per_rank, dims, bits):
    b_offsets, per_feature, out_offsets, d_offsets, total = _inputs(per_rank, dims)
    rows, btmap = [None] * total, [None] * total
    tables, ranks = len(per_rank), len(per_rank[0])
    for t in range(tables):
        for r in range(ranks):
            start = int(per_feature[t, r])
            for b in range(per_rank[t][r]):
                at = int(b_offsets[t]) + start + b
                rows[at] = int(out_offsets[r * tables + t]) + b * dims[t]
                btmap[at] = (t << bits) | (start + b)
    return rows, btmap


_FBGEMM = """
import json, sys, torch, fbgemm_gpu
from tests._fixtures import _inputs
out = []
for per_rank, dims, bits in json.loads(sys.argv[1]):
    b, pf, oo, do, total = _inputs(per_rank, dims)
    rows, bt = torch.ops.fbgemm.generate_vbe_metadata(b, pf, oo, do, max(dims), False, max(map(max, per_rank)), bits, total)
    out.append([rows.tolist(), bt.tolist(), str(rows.dtype), str(bt.dtype)])
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def fbgemm_results():
    done = subprocess.run([sys.executable, "-c", _FBGEMM, json.dumps(CASES)], capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("case", range(len(CASES)))
def test_ours_equals_fbgemms_kernel_and_the_loop(case, fbgemm_results):
    per_rank, dims, bits = CASES[case]
    b_offsets, per_feature, out_offsets, d_offsets, total = _inputs(per_rank, dims)
    rows, btmap = generate_vbe_metadata_cpu(
        b_offsets, per_feature, out_offsets, d_offsets, max(dims), False, max(map(max, per_rank)), bits, total
    )
    assert (rows.tolist(), btmap.tolist()) == _loop(per_rank, dims, bits)
    theirs_rows, theirs_bt, rows_dtype, bt_dtype = fbgemm_results[case]
    assert rows.tolist() == theirs_rows and btmap.tolist() == theirs_bt
    assert (str(rows.dtype), str(btmap.dtype)) == (rows_dtype, bt_dtype)


def test_install_replaces_the_cpu_kernel_in_this_process(monkeypatch):
    from slipstream_rec.sharding import vbe_cpu

    assert vbe_cpu.install() and vbe_cpu.install()  # once, then a no-op
    calls = []
    ours = vbe_cpu.generate_vbe_metadata_cpu
    monkeypatch.setattr(vbe_cpu, "generate_vbe_metadata_cpu", lambda *a: calls.append(1) or ours(*a))
    per_rank, dims, bits = CASES[0]
    b_offsets, per_feature, out_offsets, d_offsets, total = _inputs(per_rank, dims)
    rows, btmap = torch.ops.fbgemm.generate_vbe_metadata(
        b_offsets, per_feature, out_offsets, d_offsets, max(dims), False, 4, bits, total
    )
    assert (rows.tolist(), btmap.tolist()) == _loop(per_rank, dims, bits)
    assert calls == [1]  # the op ran ours
