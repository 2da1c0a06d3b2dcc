"""The wire meter: which interfaces it reads, what it leaves out, and that one reader per node
counts the node's bytes once. The agreement with the program's count on a real 2-process run is
in tests/test_train.py (over loopback) and tests/test_network.py (across two namespaces)."""

from __future__ import annotations

from pathlib import Path

import pytest

from slipstream_rec.training.wire_meter import WireMeter, resolve_interfaces


def _sysfs(root: Path, **counters: int) -> Path:
    for name, value in counters.items():
        stats = root / name / "statistics"
        stats.mkdir(parents=True, exist_ok=True)
        (stats / "tx_bytes").write_text(f"{value}\n")
    return root


def _set(root: Path, name: str, value: int) -> None:
    (root / name / "statistics" / "tx_bytes").write_text(f"{value}\n")


def test_auto_reads_the_interfaces_gloo_binds_to(tmp_path):
    root = _sysfs(tmp_path, eth0=0, eth1=0, lo=0)
    assert resolve_interfaces("auto", {"GLOO_SOCKET_IFNAME": "eth0"}, root) == ["eth0"]
    assert resolve_interfaces("auto", {"GLOO_SOCKET_IFNAME": "eth0,eth1"}, root) == ["eth0", "eth1"]
    # NCCL's exact names are taken; its prefix and exclusion forms are not names
    assert resolve_interfaces("auto", {"NCCL_SOCKET_IFNAME": "eth1"}, root) == ["eth1"]
    assert resolve_interfaces("auto", {"NCCL_SOCKET_IFNAME": "^docker,lo"}, root) == []
    assert resolve_interfaces("auto", {}, root) == []  # one node, loopback: no wire
    assert resolve_interfaces("none", {"GLOO_SOCKET_IFNAME": "eth0"}, root) == []
    assert resolve_interfaces("lo", {}, root) == ["lo"]


def test_a_named_interface_that_is_not_there_names_the_key_and_what_is(tmp_path):
    root = _sysfs(tmp_path, eth0=0, lo=0)
    with pytest.raises(ValueError, match=r"trainer.wire_interface='eth9': no interface eth9 .*eth0, lo"):
        resolve_interfaces("eth9", {}, root)


def test_the_meter_counts_its_running_spans_only(tmp_path):
    root = _sysfs(tmp_path, eth0=1000, eth1=50)
    meter = WireMeter(["eth0", "eth1"], reads=True, root=root)
    meter.resume()
    _set(root, "eth0", 1400)  # a step: 400 + 60 bytes
    _set(root, "eth1", 110)
    with meter.paused():  # an evaluation: 5000 bytes left out
        _set(root, "eth0", 6400)
    assert meter.running
    _set(root, "eth0", 6500)  # another step: 100
    meter.pause()
    _set(root, "eth0", 9999)  # after training
    meter.resume()
    meter.resume()  # resuming a running meter keeps its start
    _set(root, "eth0", 10_009)
    meter.pause()
    meter.pause()  # pausing twice counts once
    assert meter.tx_bytes == 400 + 60 + 100 + 10
    with meter.paused():  # paused stays paused
        pass
    assert not meter.running


def test_only_the_node_s_first_rank_reads(tmp_path):
    meter = WireMeter(["eth0"], reads=False, root=tmp_path / "absent")  # reading would raise
    meter.resume()
    with meter.paused():
        pass
    meter.pause()
    assert meter.tx_bytes == 0 and not meter.reads


def test_summary_sets_the_wire_beside_the_program(tmp_path):
    root = _sysfs(tmp_path, eth0=0)
    meter = WireMeter(["eth0"], reads=True, root=root)
    meter.resume()
    _set(root, "eth0", 1_050_000)
    meter.steps = 10
    out = meter.summary(samples_per_step=1000, program={"total": 100.0, "dense": 40.0})
    assert out["tx_bytes"] == 1_050_000 and out["nodes_read"] == 1 and out["steps"] == 10
    assert out["bytes_per_sample"] == 105.0
    assert out["wire_over_program"] == 1.05
    assert meter.running  # the summary does not stop a running meter
    assert WireMeter([], reads=True).summary(1000, {"total": 1.0})["interfaces"] is None


def _bytes_each_collective_sends(env):
    """lo's sent bytes around each collective of a 4 MiB fp32 buffer per rank (2 ranks)."""
    import torch
    import torch.distributed as dist

    def tx() -> int:
        return int(Path("/sys/class/net/lo/statistics/tx_bytes").read_text())

    n = 1 << 20
    x = torch.randn(n)
    ops = {
        "all_to_all": lambda: dist.all_to_all_single(torch.empty(n), x),
        "reduce_scatter": lambda: dist.reduce_scatter_tensor(torch.empty(n // 2), x),
        "all_gather": lambda: dist.all_gather_into_tensor(torch.empty(2 * n), x),
        "all_reduce": lambda: dist.all_reduce(x),
    }
    sent = {}
    for name, op in ops.items():
        # lo carries every process's local traffic, which only ever adds bytes: the least of
        # three readings is the collective's own
        readings = []
        for _ in range(3):
            dist.barrier()
            before = tx()
            op()
            dist.barrier()
            readings.append((tx() - before) / (2 * 4 * n))  # per rank, over the buffer it gave
        sent[name] = min(readings)
    return sent


@pytest.mark.skipif(not Path("/sys/class/net/lo/statistics/tx_bytes").is_file(), reason="no loopback counter")
def test_the_rates_the_byte_count_assumes_are_what_gloo_sends():
    """Both ranks on one host: every byte they send each other crosses lo once, so its counter is
    the wire; the rates off_rank_bytes applies must be what it reads (headers within 3%)."""
    from slipstream_rec.training.embedding_traffic import off_rank_factors, reduce_scatter_rate, split_factors
    from tests.dist_harness import run_workers

    sent = run_workers(_bytes_each_collective_sends, world_size=2)[0]
    ring, a2a = off_rank_factors(2)["dense"], off_rank_factors(2)["output"]
    split = split_factors(2, 2, "gloo")
    expect = {
        "all_to_all": a2a,
        "reduce_scatter": reduce_scatter_rate(2, "gloo"),
        "all_gather": split["gradient/row_wise"],
        "all_reduce": ring,
    }
    assert split["output/row_wise"] == split["output/table_row_wise"] == reduce_scatter_rate(2, "gloo")
    for name, rate in expect.items():
        assert rate <= sent[name] <= rate * 1.03, (name, sent[name], rate)


def test_split_factors_follow_the_collectives():
    from slipstream_rec.training.embedding_traffic import split_factors

    # 4 ranks on 2 nodes of 2 (gloo): table-row-wise reduce-scatters within the node (its own
    # 2(L-1)/L = 1.0), then sends half of the node's half across (0.25); back, half across and
    # the node's other rank's all-gather (1)
    f = split_factors(4, 2, "gloo")
    assert f["output/table_row_wise"] == pytest.approx(1.0 + 0.25)
    assert f["gradient/table_row_wise"] == pytest.approx(0.5 + 1)
    assert f["output/row_wise"] == pytest.approx(1.5) and f["gradient/row_wise"] == 3
    # one rank per node: table-row-wise is an all-to-all; NCCL's reduce-scatter sends (W-1)/W
    g = split_factors(4, 1, "nccl")
    assert g["output/table_row_wise"] == g["gradient/table_row_wise"] == pytest.approx(0.75)
    assert g["output/row_wise"] == pytest.approx(0.75)
