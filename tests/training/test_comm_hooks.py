"""``trainer.ddp_comm_hook`` on 2 gloo processes: the bytes the program counts for DDP's
all-reduces equal what the all-reduces are given (counted here independently, per bucket), fp16
and bf16 halve them, and the dense gradients stay the unsharded reference's within the
compressed precision (bf16 on gloo too); behind ``sharding.qcomms.when=auto``'s switch, off is the plain all-reduce
and on the hook."""

from __future__ import annotations

import functools

import pytest
import torch

from tests._fixtures import FEATURES, LOCAL_BATCH, ROWS, WORLD, _slice_batch, reference_and_rank_model
from tests.dist_harness import run_workers


def hook_worker(env, hook: str, kind: str, scale=None, switch=None):
    import torch.distributed as dist
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    from slipstream_rec.model.dlrm import embedding_bag_configs
    from slipstream_rec.optim import EmbeddingOptimConfig, EmbeddingOptimizerKind, OptimConfig, fuse_embedding_optimizer
    from slipstream_rec.sharding.config import ShardingConfig, ShardingKind
    from slipstream_rec.sharding.plan import shard_model
    from slipstream_rec.sharding.state import load_full_state_dict
    from slipstream_rec.training.comm_hooks import ddp_modules, install_ddp_comm_hook
    from slipstream_rec.training.config import DDPCommHook

    cpu = torch.device("cpu")
    cfg, ref, full, model = reference_and_rank_model(env.rank)
    fuse_embedding_optimizer(model, EmbeddingOptimConfig(type=EmbeddingOptimizerKind.sgd, lr=0.1))
    dmp = shard_model(model, ShardingConfig(type=ShardingKind[kind]), embedding_bag_configs(cfg, FEATURES, ROWS), cpu,
                      LOCAL_BATCH)
    load_full_state_dict(dmp, full)
    meter: dict = {}
    from slipstream_rec.sharding.qcomms_switch import CommsSwitch

    flag = None if switch is None else CommsSwitch(on=switch == "on")  # sharding.qcomms.when=auto
    info = install_ddp_comm_hook(dmp, DDPCommHook(hook), meter, scale, flag)

    # Independent count: the bytes of every bucket each DDP hands to its all-reduce.
    given = {"float32": 0, "float16": 0, "bfloat16": 0}
    if hook == "none":  # DDP's own all-reduce, seen through the equivalent Python hook
        def count_fp32(state, bucket):
            given[str(bucket.buffer().dtype).replace("torch.", "")] += bucket.buffer().numel() * 4
            return default_hooks.allreduce_hook(state, bucket)

        for ddp in ddp_modules(dmp):
            ddp.register_comm_hook(None, count_fp32)
    all_reduce = dist.all_reduce

    def counting_all_reduce(tensor, *args, **kwargs):
        key = str(tensor.dtype).replace("torch.", "")
        if key in given and hook != "none":
            given[key] += tensor.numel() * tensor.element_size()
        return all_reduce(tensor, *args, **kwargs)

    dist.all_reduce = counting_all_reduce
    try:
        lo = env.rank * LOCAL_BATCH
        loss, _ = dmp(_slice_batch(lo, lo + LOCAL_BATCH))
        loss.backward()
        with torch.no_grad():  # a scoring forward: no all-reduce follows, nothing counted
            dmp.eval()
            dmp(_slice_batch(lo, lo + LOCAL_BATCH))
            dmp.train()
    finally:
        dist.all_reduce = all_reduce

    ref_loss = sum(ref(_slice_batch(r * LOCAL_BATCH, (r + 1) * LOCAL_BATCH))[0] for r in range(WORLD))
    ref_loss.backward()
    ref_params = dict(ref.named_parameters())
    worst = 0.0
    for name, param in dmp.named_parameters():
        if "embedding_bags" in name:
            continue
        expected = ref_params[next(n for n in ref_params if name.endswith(n))].grad / WORLD
        worst = max(worst, float((param.grad - expected).abs().max() / expected.abs().max().clamp_min(1e-12)))
    grads = {n: p.grad.tolist() for n, p in dmp.named_parameters() if "embedding_bags" not in n}
    return {"meter": meter, "given": given, "info": info, "worst": worst, "grads": grads}


@functools.lru_cache(maxsize=None)  # the same 2-process step serves several tests (read only)
def _hooked(kind: str, hook: str, switch=None):
    return run_workers(hook_worker, WORLD, hook=hook, kind=kind, switch=switch)


@pytest.mark.parametrize("kind", ["table_wise", "data_parallel"])
def test_a_switched_hook_all_reduces_fp32_when_off_and_fp16_when_on(kind):
    # sharding.qcomms.when=auto: the hook behind the comms' switch; off, PyTorch's plain
    # all-reduce (the bytes and gradients of no hook, to float rounding); on, the fp16 hook's,
    # exactly; the meter counts the all-reduce that ran
    none, fp16 = _hooked(kind, "none"), _hooked(kind, "fp16")
    off, on = _hooked(kind, "fp16", switch="off"), _hooked(kind, "fp16", switch="on")
    for r in range(WORLD):
        assert off[r]["meter"] == none[r]["meter"] and off[r]["given"] == none[r]["given"]
        assert off[r]["worst"] < 1e-5 and off[r]["given"]["float16"] == 0
        assert all(torch.allclose(torch.tensor(off[r]["grads"][n]), torch.tensor(g), rtol=1e-6, atol=0)
                   for n, g in none[r]["grads"].items())  # fmt: skip
        assert on[r]["meter"] == fp16[r]["meter"] and on[r]["given"] == fp16[r]["given"]
        assert on[r]["grads"] == fp16[r]["grads"]
        assert on[r]["info"] == off[r]["info"] == fp16[r]["info"]  # what was configured


@pytest.mark.parametrize("kind", ["table_wise", "data_parallel"])
def test_ddp_comm_hooks_halve_the_counted_all_reduce_bytes(kind):
    results = {hook: _hooked(kind, hook) for hook in ("none", "fp16")}
    results["scaled"] = run_workers(hook_worker, WORLD, hook="fp16", kind=kind, scale=1024.0)
    for r in range(WORLD):
        none, fp16, scaled = results["none"][r], results["fp16"][r], results["scaled"][r]
        # scaled: the same bytes as fp16, its gradients within fp16's bits of the reference
        assert scaled["meter"] == fp16["meter"] and scaled["given"] == fp16["given"]
        assert scaled["info"] == {**fp16["info"], "scale": 1024.0}
        assert 0 < scaled["worst"] < 2e-3
        kinds = ["dense"] + (["data_parallel"] if kind == "data_parallel" else [])
        counted = {h: sum(res["meter"].get(k, 0) for k in kinds) for h, res in (("none", none), ("fp16", fp16))}
        # the program's count = the bytes DDP's buckets gave the all-reduces, one training step
        assert counted["none"] == none["given"]["float32"] > 0
        assert counted["fp16"] == fp16["given"]["float16"] and fp16["given"]["float32"] == 0
        assert 2 * counted["fp16"] == counted["none"]
        assert fp16["info"] == {"hook": "fp16", "scale": None,
                                "bytes_per_step": {k: fp16["meter"].get(k, 0) for k in ("dense", "data_parallel")}}
        if kind == "data_parallel":
            assert none["meter"]["data_parallel"] == sum(ROWS) * 8 * 4  # every table's gradient, fp32
        # gradients: fp32 to float rounding, fp16 within its 11 bits
        assert none["worst"] < 1e-5
        assert 0 < fp16["worst"] < 2e-3


def test_the_bf16_hook_sends_bf16_on_gloo_as_on_nccl():
    # PyTorch's bf16 hook under another name (DDP refuses the name without NCCL): the counted
    # bucket bytes went to the all-reduce as bfloat16, half of fp32's, and the gradients carry
    # bf16's 8 bits, coarser than fp16's 11 (the worst error relative to a tensor's largest,
    # measured: fp16 6.0e-4, bf16 4.7e-3)
    none, fp16, bf16 = _hooked("table_wise", "none"), _hooked("table_wise", "fp16"), _hooked("table_wise", "bf16")
    for r in range(WORLD):
        assert bf16[r]["given"]["bfloat16"] == bf16[r]["meter"]["dense"] > 0
        assert bf16[r]["given"]["float32"] == bf16[r]["given"]["float16"] == 0
        assert 2 * bf16[r]["meter"]["dense"] == none[r]["meter"]["dense"]
        assert bf16[r]["info"] == {**fp16[r]["info"], "hook": "bf16"}
        assert 4 * fp16[r]["worst"] < bf16[r]["worst"] < 1e-2, (fp16[r]["worst"], bf16[r]["worst"])


def small_gradients_worker(env):
    from types import SimpleNamespace

    import torch.distributed as dist
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    from slipstream_rec.training.comm_hooks import scaled_fp16_hook

    def through(hook, values):
        buf = values.clone()
        return hook(None, SimpleNamespace(buffer=lambda: buf)).wait().clone()

    # a batch mean's gradients: about 1e-6, below fp16's normal range (6.1e-5)
    tiny = torch.randn(4096, generator=torch.Generator().manual_seed(env.rank)) * 1e-6
    exact = tiny.clone()
    dist.all_reduce(exact)  # the fp32 mean over the ranks: the reference
    exact /= WORLD
    err = lambda got: float((got - exact).abs().max() / exact.abs().max())  # noqa: E731
    huge = torch.full((8,), 100.0)  # x 1024 / 2 ranks: past fp16's largest (65504 / 2 per rank)
    return {"plain": err(through(default_hooks.fp16_compress_hook, tiny)),
            "scaled": err(through(scaled_fp16_hook(1024.0), tiny)),
            "huge": through(scaled_fp16_hook(1024.0), huge).tolist()}  # fmt: skip


def test_the_scaled_fp16_hook_keeps_small_gradients_bits_and_clips_what_would_overflow():
    for r in run_workers(small_gradients_worker, WORLD):
        # PyTorch's hook: subnormals with few bits (measured 2.6e-2 of the largest); scaled (3.3e-4):
        # fp16's 11 bits (2^-11 = 4.9e-4 of a value)
        assert r["plain"] > 1e-2 and r["scaled"] < 1e-3, r
        # clipped at 65504 / 2 on each rank, summed and unscaled: finite, not inf
        assert r["huge"] == [2 * (65504 / 2) / 1024] * 8


def test_the_hook_scale_is_refused_without_the_fp16_hook_in_one_line():
    from torch import nn

    from slipstream_rec.training.comm_hooks import install_ddp_comm_hook
    from slipstream_rec.training.config import DDPCommHook

    for hook, scale in [(DDPCommHook.none, 1024.0), (DDPCommHook.fp16, 0.0), (DDPCommHook.fp16, float("inf"))]:
        with pytest.raises(ValueError, match=r"^trainer.ddp_comm_hook_scale=.* Fix: trainer.ddp_comm_hook=fp16 with a positive"):
            install_ddp_comm_hook(nn.Linear(1, 1), hook, None, scale)
