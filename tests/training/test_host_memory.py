"""trainer.host_memory: with ``keep`` a step's freed large blocks come back without page faults;
with ``system`` (glibc's defaults) each comes back as fresh pages. Each mode runs in a fresh
interpreter: the setting is process-wide and stays for the process's life."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from slipstream_rec.training.host_memory import HostMemory, _libc

PROBE = r"""
import json, resource, sys
import torch
from slipstream_rec.training.host_memory import HostMemory, apply_host_memory

record = apply_host_memory(HostMemory(sys.argv[1]))
# a step's temporaries: 8, 27 and 64 MB (the last above glibc's largest dynamic mmap threshold),
# allocated, written and freed, step after step
sizes = [8 << 20, 27 << 20, 64 << 20]
faults = []
for _ in range(10):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    blocks = [torch.empty(n, dtype=torch.uint8) for n in sizes]
    for block in blocks:
        block.fill_(1)
    del blocks, block
    faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
print(json.dumps({"record": record, "pages": sum(sizes) // 4096, "faults": faults}))
"""


def _probe(mode: str) -> dict:
    out = subprocess.run([sys.executable, "-c", PROBE, mode], capture_output=True, text=True, check=True, timeout=120)
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(_libc() is None, reason="keep acts through glibc's mallopt; this C library is not glibc")
def test_keep_reuses_a_freed_block_where_the_system_default_faults_it_in_again():
    system, keep = _probe("system"), _probe("keep")
    assert system["record"]["applied"] is False and keep["record"]["applied"] is True
    pages = keep["pages"]
    # the first step faults every page in either mode
    assert system["faults"][0] >= 0.9 * pages and keep["faults"][0] >= 0.9 * pages
    # glibc's defaults: the 64 MB block is unmapped on free, every step faults it in again
    # (measured: 16385 of the 25344 pages, step after step)
    assert all(f >= 0.5 * pages for f in system["faults"][-3:]), system
    # keep: what a step frees stays in the heap (measured: glibc settles within 5 steps, then
    # no fault at all)
    assert all(f < 0.05 * pages for f in keep["faults"][-3:]), keep

def test_system_leaves_the_allocator_alone():
    assert HostMemory("system") is HostMemory.system
    record = json.loads(json.dumps(_probe("system")["record"]))
    assert record == {"mode": "system", "applied": False, "reason": "the C library's defaults"}
