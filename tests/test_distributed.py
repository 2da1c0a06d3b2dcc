"""slipstream_rec.distributed: backend choice and the gloo side group for CPU collectives."""

from __future__ import annotations

import pytest
import torch

from slipstream_rec import distributed
from tests.dist_harness import run_workers


def test_backend_for_device():
    assert distributed.backend_for(torch.device("cpu")) == "gloo"
    assert distributed.backend_for(torch.device("cuda", 3)) == "nccl"
    assert distributed.resolve_device("cpu", 0) == torch.device("cpu")


def _cpu_collectives_use_the_side_group(env):
    import torch.distributed as dist

    assert distributed.cpu_group() is None  # gloo job: the default group is already CPU
    # What init_distributed sets up under nccl, here over gloo: CPU tensors must go through it
    # and never through collective_device() (under nccl: a GPU round trip and a device sync).
    distributed._CPU_GROUP = dist.new_group(backend="gloo")

    def no_device_round_trip():
        raise AssertionError("a CPU collective went through collective_device()")

    distributed.collective_device = no_device_round_trip
    flag = torch.tensor([env.rank + 1], dtype=torch.int32)
    same = distributed.all_reduce_(flag, dist.ReduceOp.MIN)
    total = distributed.all_reduce_(torch.tensor([float(env.rank + 1)], dtype=torch.float64))
    obj = distributed.broadcast_object({"rank": env.rank}, src=1)
    gathered = distributed.all_gather_objects(env.rank * 10)
    distributed.close_distributed()
    return same is flag, int(flag.item()), float(total.item()), obj, gathered, distributed.cpu_group()


def test_cpu_collectives_take_the_gloo_side_group_without_device_copies():
    results = run_workers(_cpu_collectives_use_the_side_group, world_size=2, timeout_s=120)
    for in_place, flag, total, obj, gathered, group_after_close in results:
        assert in_place and flag == 1 and total == 3.0
        assert obj == {"rank": 1} and gathered == [0, 10]
        assert group_after_close is None


def test_more_ranks_than_gpus_is_refused_not_doubled_up(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "set_device", lambda device: None)
    assert distributed.resolve_device("auto", 1) == torch.device("cuda", 1)
    with pytest.raises(ValueError, match=r"local rank 2 but this node has 2 visible GPU\(s\).*at most 2 processes per node"):
        distributed.resolve_device("auto", 2)


@pytest.mark.parametrize("text, expected", [
    ("[gloo/transport/tcp/pair.cc:537] Read error [127.0.0.1]:48313: Connection reset by peer", "lost its connection"),
    ("[../third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:81] Timed out waiting 600000ms", "collective_timeout_s=600"),
    ("Connection closed by peer [127.0.0.1]:1417", "lost its connection"),
    ("CUDA out of memory", None),
])  # fmt: skip
def test_a_failed_collective_is_explained_in_one_line(text, expected, monkeypatch):
    """What rank 0 prints when another rank died or stalled (the e2e kill test can race torchrun's
    SIGTERM, so the explanation is checked here on the errors gloo raises)."""
    monkeypatch.setenv("RANK", "0")
    got = distributed.explain_collective_failure(RuntimeError(text), 600.0)
    if expected is None:
        assert got is None
        return
    assert expected in got and got.startswith("rank 0") and "\n" not in got
    assert distributed.explain_collective_failure(ValueError(text), 600.0) is None  # not a collective's error
