"""The sync audit's counter (slipstream_rec/training/sync_audit.py) on ops whose answer is known:
which ops wait for a device, and how each is classified (host, data side, device)."""

from __future__ import annotations

import torch

from slipstream_rec.training.sync_audit import SyncAudit, steady_means


def _one_step(audit: SyncAudit, fn) -> dict:
    with audit:
        fn()
    audit.end_step(len(audit.steps) + 1, [])
    return audit.steps[-1]


def test_reads_of_device_values_are_device_syncs_and_reads_of_host_values_are_not():
    w = torch.randn(8)
    audit = SyncAudit([w])
    host = torch.arange(8.0)

    def step():
        x = w * 2  # derived from a device tensor: a device tensor
        x.sum().item()  # sync
        bool((x > 0).any())  # sync
        x[x > 0]  # boolean mask: its size is read from the device
        torch.nonzero(x)
        torch.unique(x)
        x.tolist()  # not an aten op, counted all the same
        torch.repeat_interleave(torch.arange(8), torch.ones(8, dtype=torch.int64) * 0 + (x > 9).long())
        torch.repeat_interleave(torch.arange(8), (x > 9).long(), output_size=0)  # sized by the host: no sync
        host.sum().item()  # a host value: host
        host[host > 3]  # host

    s = _one_step(audit, step)
    assert s["counts"]["other"] == 7, s["ops"]  # called from this file: neither ours nor TorchRec's
    assert s["counts"]["host"] == 2 and s["counts"]["ours"] == 0 and s["counts"]["data"] == 0, s["ops"]


def test_a_copy_to_the_host_is_a_sync_and_gives_a_host_tensor():
    w = torch.randn(4)
    audit = SyncAudit([w])
    out = {}

    def step():
        out["h"] = (w + 1).cpu()
        out["h"].sum().item()  # reading the host copy waits for nothing more

    s = _one_step(audit, step)
    assert s["counts"] == {"data": 0, "host": 1, "torchrec": 0, "ours": 0, "other": 1}, s["ops"]
    assert not audit.is_device(out["h"])


def test_in_place_writes_taint_their_target_and_the_data_side_is_counted_apart():
    w = torch.randn(4)
    audit = SyncAudit([w])
    buf = torch.zeros(4)

    def step():
        buf.add_(w)  # written from a device tensor: now a device tensor
        buf.sum().item()
        def loader():  # the data side's work happens while the pipeline pulls a batch
            b = torch.ones(3)
            b.sum().item()
            yield b

        for b in audit.data_side(loader()):
            b.sum().item()  # after the pull: a host read of the step

    s = _one_step(audit, step)
    assert s["counts"]["other"] == 1 and s["counts"]["data"] == 1 and s["counts"]["host"] == 1, s["ops"]


def test_paused_stretches_are_not_counted_and_steps_are_grouped_by_kind():
    w = torch.randn(4)
    audit = SyncAudit([w])
    with audit:
        w.sum().item()
        audit.end_step(1, [])
        with audit.paused():  # an evaluation
            w.sum().item()
        w.sum().item()
        w.sum().item()
        audit.end_step(2, ["log"])
    means = steady_means(audit.steps, 1)
    assert means["plain"]["other"] == 1 and means["log"]["other"] == 2 and means["all"]["other"] == 1.5
    assert torch.Tensor.tolist is not None and w.sum().item() is not None  # restored after the audit
