"""Quantized comms (``sharding.qcomms``) on 2 gloo processes, against exact expectations.

- The bytes the program counts for the pooled embeddings and their gradients equal the bytes of
  the float tensors TorchRec hands to torch.distributed in that step (counted here by wrapping
  its collectives, independently of the program's meter), and those are exactly half of fp32's
  under fp16 and 40/128 of them under int8.
- A sharded forward with fp16 comms equals the unsharded reference within fp16's rounding, and
  differs from it (the codec really ran); the step's table update follows within the same
  tolerance.
- What TorchRec's codecs fail on mid-step is refused up front in one line naming the key.
"""

from __future__ import annotations

import functools
import inspect
from types import SimpleNamespace

import pytest
import torch

from tests._fixtures import (
    FEATURES, LOCAL_BATCH, LR, ROWS, WORLD, _slice_batch, reference_and_rank_model,
)  # fmt: skip
from tests.dist_harness import run_workers

# The input argument of each collective TorchRec's comm ops call (comm_ops.py), by name.
_COLLECTIVES = {
    "all_to_all_single": "input",
    "reduce_scatter": "input_list",
    "reduce_scatter_tensor": "input",
    "all_gather": "tensor",
    "all_gather_into_tensor": "input_tensor",
}


def _wrap_collectives(counted: dict):
    """Count the bytes of every floating (and int8-codec uint8) tensor given to a collective."""
    import torch.distributed as dist

    originals = {}
    for name, arg in _COLLECTIVES.items():
        fn = getattr(dist, name)
        originals[name] = fn
        sig = inspect.signature(fn)

        def wrapped(*args, _fn=fn, _sig=sig, _arg=arg, **kwargs):
            given = _sig.bind(*args, **kwargs).arguments[_arg]
            for t in given if isinstance(given, (list, tuple)) else [given]:
                if t.is_floating_point() or t.dtype == torch.uint8:
                    key = str(t.dtype).replace("torch.", "")
                    counted[key] = counted.get(key, 0) + t.numel() * t.element_size()
            return _fn(*args, **kwargs)

        setattr(dist, name, wrapped)
    return lambda: [setattr(dist, n, f) for n, f in originals.items()]


def qcomms_worker(env, kind: str, forward: str, backward: str, scale=None, switch=None):
    from slipstream_rec.model.dlrm import embedding_bag_configs
    from slipstream_rec.optim import (
        EmbeddingOptimConfig,
        EmbeddingOptimizerKind,
        OptimConfig,
        build_optimizer,
        fuse_embedding_optimizer,
    )
    from slipstream_rec.sharding.config import CommPrecision, QCommsConfig, ShardingConfig, ShardingKind
    from slipstream_rec.sharding.plan import describe_plan, shard_model
    from slipstream_rec.sharding.state import load_full_state_dict
    from slipstream_rec.training.embedding_traffic import local_a2a_bytes

    cpu = torch.device("cpu")
    cfg, ref, full, model = reference_and_rank_model(env.rank)
    optim_cfg = OptimConfig(embedding=EmbeddingOptimConfig(type=EmbeddingOptimizerKind.sgd, lr=LR))
    fuse_embedding_optimizer(model, optim_cfg.embedding)
    qcomms = QCommsConfig(forward=CommPrecision(forward), backward=CommPrecision(backward), backward_loss_scale=scale)
    sharding = ShardingConfig(type=ShardingKind[kind], qcomms=qcomms)
    from slipstream_rec.sharding.qcomms_switch import CommsSwitch

    # sharding.qcomms.when=auto: the codecs behind a switch, on or off for this step
    flag = None if switch is None else CommsSwitch(on=switch == "on")
    dmp = shard_model(model, sharding, embedding_bag_configs(cfg, FEATURES, ROWS), cpu, LOCAL_BATCH, switch=flag)
    assert set(describe_plan(dmp).values()) == {kind}
    load_full_state_dict(dmp, full)
    optimizer, _ = build_optimizer(dmp, optim_cfg)

    from slipstream_rec.sharding.qcomms import RescaledCodec

    rescaled = []  # the sizes the scaled codec encoded and decoded (the backward's collectives)
    encode, decode = RescaledCodec.encode, RescaledCodec.decode
    RescaledCodec.encode = lambda self, t, ctx=None: rescaled.append(("encode", t.numel())) or encode(self, t, ctx)
    RescaledCodec.decode = lambda self, t, ctx=None: rescaled.append(("decode", t.numel())) or decode(self, t, ctx)
    counted: dict = {}
    restore = _wrap_collectives(counted)
    try:
        lo = env.rank * LOCAL_BATCH
        loss, (_, logits, _, _) = dmp(_slice_batch(lo, lo + LOCAL_BATCH))
        loss.backward()
        optimizer.step()
    finally:
        restore()
        RescaledCodec.encode, RescaledCodec.decode = encode, decode

    ref_logits = []
    ref_loss = torch.zeros(())
    for r in range(WORLD):
        r_loss, (_, r_logits, _, _) = ref(_slice_batch(r * LOCAL_BATCH, (r + 1) * LOCAL_BATCH))
        ref_loss = ref_loss + r_loss
        ref_logits.append(r_logits)
    ref_loss.backward()
    diff = float((logits - ref_logits[env.rank]).abs().max())
    # fp16 keeps 11 significant bits: the pooled embeddings (|x| < 1 here) within ~5e-4
    torch.testing.assert_close(logits, ref_logits[env.rank].detach(), rtol=2e-3, atol=2e-3)

    ref_params = dict(ref.named_parameters())
    row_err = 0.0
    for key, value in dmp.state_dict().items():
        if "embedding_bags" not in key or not hasattr(value, "local_shards"):
            continue
        expected = full[key] - LR * ref_params[key].grad / WORLD
        for shard in value.local_shards():
            sl = tuple(slice(o, o + s) for o, s in zip(shard.metadata.shard_offsets, shard.metadata.shard_sizes))
            torch.testing.assert_close(shard.tensor, expected[sl], rtol=2e-3, atol=2e-4)
            row_err = max(row_err, float((shard.tensor - expected[sl]).abs().max()))
    meter = local_a2a_bytes(dmp)
    rows = {k: [s.tensor.tolist() for s in v.local_shards()] for k, v in dmp.state_dict().items()
            if "embedding_bags" in k and hasattr(v, "local_shards")}  # fmt: skip
    raw = {k: v for m in dmp.modules() if hasattr(m, "a2a_bytes") for k, v in m.a2a_bytes.items()}
    return {"meter": meter, "counted": counted, "logit_diff": diff, "row_err": row_err, "rescaled": rescaled,
            "logits": logits.detach().tolist(), "rows": rows, "raw": raw}  # fmt: skip


@functools.lru_cache(maxsize=None)  # the same 2-process step serves several tests (read only)
def _run(kind, forward, backward, scale=None, switch=None):
    return run_workers(qcomms_worker, WORLD, kind=kind, forward=forward, backward=backward, scale=scale, switch=switch)


@pytest.mark.parametrize("kind", ["table_wise", "row_wise"])
def test_switched_codecs_send_fp32_when_off_and_the_codecs_when_on(kind):
    # sharding.qcomms.when=auto: off, a step sends and computes exactly what it does without
    # codecs; on, exactly what it does with them unswitched; the meter counts the fp32 bytes
    # sent while off apart, so the wire's count (local_a2a_bytes) is fp32's
    plain, fp16 = _run(kind, "fp32", "fp32"), _run(kind, "fp16", "fp16")
    off, on = _run(kind, "fp16", "fp16", switch="off"), _run(kind, "fp16", "fp16", switch="on")
    for r in range(WORLD):
        for got, want in ((off[r], plain[r]), (on[r], fp16[r])):
            assert got["meter"] == want["meter"] and got["counted"] == want["counted"]
            assert got["logits"] == want["logits"] and got["rows"] == want["rows"]  # bit for bit
        assert "float16" not in off[r]["counted"] and "float32" not in on[r]["counted"]
        sent = {k: v for k, v in off[r]["raw"].items() if k in ("output", "gradient")}
        assert {k[len("plain:"):]: v for k, v in off[r]["raw"].items() if k in ("plain:output", "plain:gradient")} == sent
        assert not any(k.startswith("plain:") for k in on[r]["raw"])


@pytest.mark.parametrize("kind", ["table_wise", "row_wise"])  # the all-to-all; the reduce-scatter
def test_fp16_comms_halve_the_counted_bytes_and_match_the_reference(kind):
    off = _run(kind, "fp32", "fp32")
    fp16 = _run(kind, "fp16", "fp16")
    for r in range(WORLD):
        o, q = off[r], fp16[r]
        # the program's meter = what went to torch.distributed, in both precisions
        assert o["meter"]["output"] + o["meter"]["gradient"] == o["counted"]["float32"] > 0
        assert q["meter"]["output"] + q["meter"]["gradient"] == q["counted"]["float16"] > 0
        assert "float32" not in q["counted"], "fp16 comms sent fp32 pooled embeddings"
        # exactly half, both ways; the ids are not quantized
        assert 2 * q["meter"]["output"] == o["meter"]["output"]
        assert 2 * q["meter"]["gradient"] == o["meter"]["gradient"]
        assert q["meter"]["input"] == o["meter"]["input"] > 0
        # the codec ran: fp32 comms are exact to float rounding, fp16 ones are not
        # (measured: table_wise logits 0 vs 2.1e-6 off the reference, rows 0 vs 3.8e-7)
        assert q["logit_diff"] > 10 * o["logit_diff"] and q["logit_diff"] > 0
        assert q["row_err"] > 10 * o["row_err"] and q["row_err"] > 0


@pytest.mark.parametrize("kind", ["table_wise", "row_wise"])
def test_a_scaled_backward_sends_the_same_bytes_and_steps_as_the_reference(kind):
    fp16, scaled = _run(kind, "fp16", "fp16"), _run(kind, "fp16", "fp16", scale=1024.0)
    for r in range(WORLD):
        assert scaled[r]["meter"] == fp16[r]["meter"] and scaled[r]["counted"] == fp16[r]["counted"]
        assert scaled[r]["logit_diff"] == fp16[r]["logit_diff"]  # the forward is not scaled
        # the backward's gradients went through the scaled codec, once each way, and the step's
        # rows are within fp16's rounding of the reference (asserted in the worker)
        assert [k for k, _ in scaled[r]["rescaled"]] == ["encode", "decode"] and not fp16[r]["rescaled"]
        assert scaled[r]["rescaled"][0][1] * 2 == fp16[r]["meter"]["gradient"]  # its fp16 values: 2 bytes each
        assert 0 < scaled[r]["row_err"]


@pytest.mark.parametrize("kind", ["table_wise", "row_wise"])  # the all-to-all; the reduce-scatter
def test_bf16_gradients_go_on_the_wire_in_bf16_on_gloo(kind):
    # forward fp16, backward bf16 (the pair): TorchRec's registry would send the bf16 as
    # fp16 on a CPU; built per collective, the gradients go to torch.distributed as bfloat16,
    # half of fp32's bytes, and the step's rows carry bf16's coarser rounding
    off, fp16, bf16 = _run(kind, "fp32", "fp32"), _run(kind, "fp16", "fp16"), _run(kind, "fp16", "bf16")
    for r in range(WORLD):
        q = bf16[r]
        assert q["counted"]["bfloat16"] == q["meter"]["gradient"] > 0
        assert q["counted"]["float16"] == q["meter"]["output"] > 0 and "float32" not in q["counted"]
        assert 2 * q["meter"]["gradient"] == off[r]["meter"]["gradient"]
        assert q["logits"] == fp16[r]["logits"]  # the same fp16 forward
        assert q["row_err"] > 2 * fp16[r]["row_err"] > 0, (q["row_err"], fp16[r]["row_err"])
        # bf16 both ways: the pooled embeddings too (measured: logits 2-3e-5 off the reference,
        # fp16's 2e-6 to 1e-5)
        both = _run(kind, "bf16", "bf16")[r]
        assert both["counted"] == {"bfloat16": both["meter"]["output"] + both["meter"]["gradient"]}
        assert both["logit_diff"] > 2 * fp16[r]["logit_diff"] > 0


def test_int8_comms_count_their_rows_scale_and_bias():
    off, q = _run("table_wise", "fp32", "fp32"), _run("table_wise", "int8", "fp16")
    for r in range(WORLD):
        m, base = q[r]["meter"], off[r]["meter"]
        assert m["output"] == q[r]["counted"]["uint8"] == base["output"] * 40 // 128  # 32 B + scale + bias per 32
        assert m["gradient"] == q[r]["counted"]["float16"] == base["gradient"] // 2


def _plan(types, width=16):
    """A plan of one table per type, each on rank 0 and ``width`` wide."""
    shard = SimpleNamespace(placement=SimpleNamespace(rank=lambda: 0), shard_sizes=[10, width])
    ps = {f"t{i}": SimpleNamespace(sharding_type=t, sharding_spec=SimpleNamespace(shards=[shard]))
          for i, t in enumerate(types)}
    return SimpleNamespace(plan={"sparse.ebc": ps})


def test_what_torchrec_refuses_is_refused_in_one_line():
    from slipstream_rec.sharding.config import CommPrecision, QCommsConfig, ShardingConfig
    from slipstream_rec.sharding.qcomms import check_qcomms

    int8 = ShardingConfig(qcomms=QCommsConfig(forward=CommPrecision.int8))
    with pytest.raises(ValueError, match=r"^sharding.qcomms.forward=int8: .*row_wise .*\(t1 here\)\. Fix: sharding.qcomms.forward=fp16"):
        check_qcomms(int8, _plan(["table_wise", "row_wise"]), 2048)
    with pytest.raises(ValueError, match=r"it is 100 x 4 on rank 0 \(table_wise\)\. Fix: trainer.batch_size=128 "):
        check_qcomms(int8, _plan(["table_wise"], width=4), 100)
    check_qcomms(int8, _plan(["table_wise"], width=8), 100)  # 800 values: 25 rows of 32
    check_qcomms(int8, _plan(["table_wise", "column_wise", "data_parallel"]), 2048)  # runs
    fp16 = ShardingConfig(qcomms=QCommsConfig(forward=CommPrecision.fp16, backward=CommPrecision.bf16))
    check_qcomms(fp16, _plan(["row_wise"]), 100)  # fp16 has no row grouping


def test_qcomms_options_compose_and_reach_the_summary_fields():
    from slipstream_rec.config import ConfigError, load_config
    from slipstream_rec.sharding.qcomms import codecs_registry, qcomms_summary

    job = load_config(["sharding.qcomms.forward=fp16", "sharding.qcomms.backward=bf16", "slipstream=off"])
    got = qcomms_summary(job.sharding.qcomms, codecs_registry(job.sharding.qcomms))
    # bf16 goes on the wire as bf16 on gloo too (TorchRec's registry would send fp16 on a CPU)
    assert got == {"forward": "fp16", "backward": "bf16", "forward_on_wire": "fp16", "backward_on_wire": "bf16",
                   "forward_wire_factor": 0.5, "backward_wire_factor": 0.5, "backward_loss_scale": None,
                   "plan_as": "fp32", "when": "always"}
    auto = load_config(["sharding.qcomms.forward=fp16", "sharding.qcomms.when=auto", "slipstream=off"]).sharding.qcomms
    assert qcomms_summary(auto, codecs_registry(auto))["when"] == "auto"
    with pytest.raises(ConfigError, match="sharding.qcomms.when.*sometimes"):
        load_config(["sharding.qcomms.when=sometimes"])
    off = load_config(["slipstream=off"]).sharding.qcomms
    assert codecs_registry(off) is None
    with pytest.raises(ConfigError, match="sharding.qcomms.forward.*fp8"):
        load_config(["sharding.qcomms.forward=fp8"])
    with pytest.raises(ConfigError, match="sharding.qcomms.plan_as.*int8"):
        load_config(["sharding.qcomms.plan_as=int8"])
    with pytest.raises(ConfigError, match="sharding.qcomms.backward=int8 .*slipstream.action=serve"):
        load_config(["sharding.qcomms.backward=int8", "slipstream=serve"])


def test_the_backward_loss_scale_keeps_small_gradients_bits_through_the_codec():
    from slipstream_rec.config import load_config
    from slipstream_rec.sharding.qcomms import codecs_registry, qcomms_summary

    def codecs(scale):
        job = load_config(["sharding.qcomms.forward=fp16", "sharding.qcomms.backward=fp16", "slipstream=off",
                           f"sharding.qcomms.backward_loss_scale={scale}"])  # fmt: skip
        return job.sharding.qcomms, codecs_registry(job.sharding.qcomms)

    # gradients of a batch mean: about 1e-6, below fp16's normal range (6.1e-5)
    grad = torch.randn(4096, generator=torch.Generator().manual_seed(0)) * 1e-6
    err = {}
    for scale in ("null", "1024"):
        cfg, registry = codecs(scale)
        for op in ("POOLED_EMBEDDINGS_ALL_TO_ALL", "POOLED_EMBEDDINGS_REDUCE_SCATTER"):
            codec = registry[op].backward  # every collective's backward carries the scale
            back = codec.decode(codec.encode(grad))
            err[scale, op] = float((back - grad).abs().max() / grad.abs().max())
            assert registry[op].forward._loss_scale is None  # the forward's values are not scaled
    assert qcomms_summary(cfg, registry)["backward_loss_scale"] == 1024.0
    assert qcomms_summary(cfg, registry)["backward_on_wire"] == "fp16"
    for op in ("POOLED_EMBEDDINGS_ALL_TO_ALL", "POOLED_EMBEDDINGS_REDUCE_SCATTER"):
        # unscaled: subnormals with few bits (measured 7.3e-3 of the largest off); scaled: fp16's
        # 11 bits (2.3e-4)
        assert err["null", op] > 5e-3 and err["1024", op] < 1e-3, err


def test_the_backward_loss_scale_is_refused_where_torchrec_would_drop_it():
    from slipstream_rec.config import load_config
    from slipstream_rec.sharding.qcomms import codecs_registry

    for overrides, match in [
        (["sharding.qcomms.forward=fp16", "sharding.qcomms.backward_loss_scale=1024"],
         r"^sharding.qcomms.backward_loss_scale=1024.0 with sharding.qcomms.backward=fp32: .* Fix: sharding.qcomms.backward=fp16"),
        (["sharding.qcomms.backward=fp16", "sharding.qcomms.backward_loss_scale=-1"],
         r"^sharding.qcomms.backward_loss_scale=-1.0: .* Fix: a positive number"),
    ]:  # fmt: skip
        cfg = load_config([*overrides, "slipstream=off"]).sharding.qcomms
        with pytest.raises(ValueError, match=match):
            codecs_registry(cfg)


def planned_worker(env):
    """Shard the clicklog-sized model with and without qcomms: the plan each DMP runs, and the
    codec precision its table-wise output dist sends in."""
    from slipstream_rec.sharding.config import CommPrecision, QCommsConfig, QCommsPlanning, ShardingConfig
    from slipstream_rec.sharding.plan import describe_plan, shard_model
    from tests.sharding._clicklog_plan import CLICKLOG_ROWS, meta_model

    fp16 = dict(forward=CommPrecision.fp16, backward=CommPrecision.bf16)
    out = {}
    for name, qcomms in [("none", QCommsConfig()), ("fp32", QCommsConfig(**fp16)),
                         ("quantized", QCommsConfig(**fp16, plan_as=QCommsPlanning.quantized))]:  # fmt: skip
        model, tables = meta_model(CLICKLOG_ROWS, device="cpu")
        dmp = shard_model(model, ShardingConfig(qcomms=qcomms), tables, torch.device("cpu"), 2048)
        sharded = dmp.module.model.sparse_arch.embedding_bag_collection
        codecs = {  # TorchRec's table-wise output dist keeps its codecs (built on first use)
            type(dist).__name__: str(dist._codecs.forward._comm_precision.name)
            for dist in sharded._output_dists
            if getattr(dist, "_codecs", None) is not None
        }
        out[name] = (describe_plan(dmp), codecs)
    return out


def test_qcomms_send_through_the_codecs_on_the_plan_without_them():
    """sharding.qcomms.plan_as=fp32 (the default): shard_model plans as without qcomms and DMP's
    output dists still encode; quantized: the planner sees the codecs and moves tables."""
    for got in run_workers(planned_worker, WORLD):
        (none, no_codecs), (fp32, fp32_codecs), (quantized, _) = got["none"], got["fp32"], got["quantized"]
        assert not no_codecs
        assert fp32 == none and set(fp32_codecs.values()) == {"FP16"}
        assert quantized != none  # the test's premise: told the sizes, the planner moves tables
