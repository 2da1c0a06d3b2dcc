"""``trainer.ddp_comm_hook`` on 2 gloo processes: the bytes the program counts for DDP's
all-reduces equal what the all-reduces are given (counted here independently, per bucket), fp16
and bf16 halve them, and the dense gradients stay the unsharded reference's within the
compressed precision."""

from __future__ import annotations

import pytest
import torch

from tests._fixtures import FEATURES, LOCAL_BATCH, ROWS, WORLD, _slice_batch, reference_and_rank_model
from tests.dist_harness import run_workers


def hook_worker(env, hook: str, kind: str):
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
    info = install_ddp_comm_hook(dmp, DDPCommHook(hook), meter)

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
    return {"meter": meter, "given": given, "info": info, "worst": worst}


@pytest.mark.parametrize("kind", ["table_wise", "data_parallel"])
def test_ddp_comm_hooks_halve_the_counted_all_reduce_bytes(kind):
    results = {hook: run_workers(hook_worker, WORLD, hook=hook, kind=kind) for hook in ("none", "fp16")}
    for r in range(WORLD):
        none, fp16 = results["none"][r], results["fp16"][r]
        kinds = ["dense"] + (["data_parallel"] if kind == "data_parallel" else [])
        counted = {h: sum(res["meter"].get(k, 0) for k in kinds) for h, res in (("none", none), ("fp16", fp16))}
        # the program's count = the bytes DDP's buckets gave the all-reduces, one training step
        assert counted["none"] == none["given"]["float32"] > 0
        assert counted["fp16"] == fp16["given"]["float16"] and fp16["given"]["float32"] == 0
        assert 2 * counted["fp16"] == counted["none"]
        assert fp16["info"] == {"hook": "fp16", "bytes_per_step": {k: fp16["meter"].get(k, 0) for k in
                                                                   ("dense", "data_parallel")}}
        if kind == "data_parallel":
            assert none["meter"]["data_parallel"] == sum(ROWS) * 8 * 4  # every table's gradient, fp32
        # gradients: fp32 to float rounding, fp16 within its 11 bits
        assert none["worst"] < 1e-5
        assert 0 < fp16["worst"] < 2e-3


def test_bf16_hook_is_refused_on_gloo_in_one_line():
    with pytest.raises(AssertionError, match=r"ValueError: trainer.ddp_comm_hook=bf16 needs CUDA and NCCL .*gloo.*"
                                             r"Fix: trainer.ddp_comm_hook=fp16"):
        run_workers(hook_worker, WORLD, hook="bf16", kind="table_wise")
