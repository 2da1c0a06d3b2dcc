"""``sharding.qcomms.when=auto``'s quality guard: the quantized comms' error read on the run's own
tensors, and fp32 for the rest of the run where it passes ``sharding.qcomms.max_error``.

The codecs' measured error against casts done here (torch's own fp16 rounding), the DDP hooks'
against what PyTorch's hooks deliver on 2 gloo ranks, the rule on summed figures, and a 2-rank
training through torchrun (test_qcomms_switch.py) whose bytes follow the guard's trip exactly.
"""

from __future__ import annotations

import math

import pytest
import torch

from tests.dist_harness import run_workers


def _codec(precision: str, scale=None):
    from slipstream_rec.sharding.config import CommPrecision, QCommsConfig
    from slipstream_rec.sharding.qcomms import codecs_registry

    cfg = QCommsConfig(forward=CommPrecision[precision], backward=CommPrecision[precision], backward_loss_scale=scale)
    registry = codecs_registry(cfg)
    from torchrec.distributed.types import CommOp

    return registry, registry[CommOp.POOLED_EMBEDDINGS_ALL_TO_ALL.name]


def _sums(errors, direction):
    return errors.sums[direction].tolist()


def test_a_measured_step_sends_the_same_bytes_and_counts_the_far_sides_error():
    from slipstream_rec.sharding.qcomms_switch import CommsSwitch, switch_registry

    registry, _ = _codec("fp16")
    inner = registry[next(iter(registry))].forward
    switch = CommsSwitch()
    codecs = switch_registry(registry, switch)[next(iter(registry))]
    x = torch.randn(64, 16, generator=torch.Generator().manual_seed(0))
    plain = codecs.forward.encode(x)
    assert not switch.errors.sums  # not a measured step: nothing counted
    switch.measuring = True
    sent = codecs.forward.encode(x)
    assert torch.equal(sent, plain) and torch.equal(sent, inner.encode(x))  # the wire is unchanged
    exact = x.double()
    want = [float((x.half().double() - exact).square().sum()), float(exact.square().sum()), 0.0, 64 * 16]
    assert _sums(switch.errors, "forward") == pytest.approx(want, rel=1e-12)
    codecs.backward.encode(2 * x)
    codecs.backward.encode(x)  # a direction's encodings in one step add up
    back = _sums(switch.errors, "backward")
    # (2x)'s rounding is 2x's: fp16 scales exactly
    assert back == pytest.approx([want[0] * 5, want[1] * 5, 0.0, 2 * 64 * 16], rel=1e-12)
    switch.on = False  # fp32 on the wire: nothing lost, nothing counted
    switch.errors.sums.clear()
    codecs.forward.encode(x)
    assert not switch.errors.sums


def test_small_gradients_lose_their_bits_in_fp16_unless_scaled_and_huge_ones_are_lost():
    from slipstream_rec.sharding.qcomms_guard import measured
    from slipstream_rec.sharding.qcomms_switch import CommsSwitch, switch_registry

    tiny = torch.randn(4096, generator=torch.Generator().manual_seed(1)) * 1e-6  # a batch mean's gradients
    tiny[0] = 0.0  # not sent: neither counted nor lost
    got = {}
    for scale in (None, 1024.0):
        registry, _ = _codec("fp16", scale)
        switch = CommsSwitch()
        switch.measuring = True
        codecs = switch_registry(registry, switch)[next(iter(registry))]
        codecs.backward.encode(tiny)
        got[scale] = measured(switch.errors.take(torch.device("cpu")).tolist())["backward"]
    lost = {s: float(((tiny != 0) & (tiny.mul(s or 1.0).half() == 0)).sum()) / 4095 for s in got}  # under 3e-8
    # subnormal fp16 (spacing 6e-8 against values of 1e-6): a few percent, and 2.6% of the values
    # lost; scaled by 1024: fp16's 11 bits (2^-11 / sqrt(3) = 2.8e-4 for uniform rounding), and
    # only a draw under 3e-11 lost (one of 4095)
    assert got[None]["error"] > 1e-2 and got[None]["lost"] == pytest.approx(lost[None]) and lost[None] > 0.01, got
    assert 1e-4 < got[1024.0]["error"] < 5e-4 and got[1024.0]["lost"] == pytest.approx(lost[1024.0]), got
    assert 0 < lost[1024.0] < 1e-3
    switch = CommsSwitch()
    switch.errors.add("forward", torch.tensor([1.0, 7e4, -1e5, 0.0]), torch.tensor([1.0, 7e4, -1e5, 0.0]).half())
    assert measured(switch.errors.take(torch.device("cpu")).tolist()) == {"forward": {"error": math.inf, "lost": 2 / 3}}


def hook_worker(env, scale):
    """Rank 0 all-reduces gradients and rank 1 zeros through PyTorch's fp16 hook (or ours, scaled):
    the mean then carries rank 0's contribution as the far side received it, times 1 / world."""
    from types import SimpleNamespace

    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    from slipstream_rec.sharding.qcomms_switch import CommsSwitch
    from slipstream_rec.training.comm_hooks import hook_round_trip, scaled_fp16_hook, switched_hook
    from slipstream_rec.training.config import DDPCommHook

    values = torch.randn(4096, generator=torch.Generator().manual_seed(2)) * 1e-6
    values[:8] = torch.tensor([1e-9, 3e-8, 5e-5, 1e-3, 0.5, 7.0, -3e-7, 0.0])
    buf = values.clone() if env.rank == 0 else torch.zeros_like(values)
    inner = scaled_fp16_hook(scale) if scale is not None else default_hooks.fp16_compress_hook
    switch = CommsSwitch()
    switch.measuring = True
    hook = switched_hook(inner, switch, hook_round_trip(DDPCommHook.fp16, scale))
    mean = hook(None, SimpleNamespace(buffer=lambda: buf)).wait().clone()
    received = mean.double() * env.world_size
    exact = values.double()
    sent = exact != 0
    want = [float((received - exact).square().sum()), float(exact.square().sum()),
            float((sent & (received == 0)).sum()), float(sent.sum())]  # fmt: skip
    want = want if env.rank == 0 else [0.0, 0.0, 0.0, 0.0]
    return {"got": switch.errors.take(torch.device("cpu")).tolist(), "want": want}


@pytest.mark.parametrize("scale", [None, 1024.0])
def test_the_hooks_measured_error_is_what_the_all_reduce_delivers(scale):
    zero, one = run_workers(hook_worker, 2, scale=scale)
    assert (scale is None) == (zero["got"][10] > 0)  # unscaled, 1e-9 and the smallest draws are lost
    for r in (zero, one):
        got = r["got"]
        assert got[:8] == [0.0] * 8  # the hook measures the all-reduce only
        assert got[8:] == pytest.approx(r["want"], rel=1e-9, abs=1e-30)


def test_the_guard_measures_after_the_probe_and_turns_the_comms_off_for_good():
    from slipstream_rec.sharding.qcomms_guard import CommsGuard
    from slipstream_rec.sharding.qcomms_switch import CommsProbe, CommsSwitch

    switch = CommsSwitch()
    probe = CommsProbe(switch, steps=8, min_gain=0.05, start=4)  # its last step: 20
    guard = CommsGuard(switch, every=10, max_error=2**-7, max_lost=0.25, probe=probe)
    measured = []
    for step in range(1, 41):
        probe.before_step(step)
        guard.before_step(step)
        measured.append(switch.measuring)
        switch.measuring = False
    assert [s for s, m in enumerate(measured, 1) if m] == [30, 40]  # not 10 nor 20: inside the probe's span
    probe.picked = "quantized"
    rows = {"forward": (4e-8, 1.0, 1.0, 4.0), "backward": (2**-14, 1.0, 0.0, 8.0), "all_reduce": (0.0,) * 4}  # exact roots
    sums = [v for d in ("forward", "backward", "all_reduce") for v in rows[d]]

    class Fixed:  # the ranks' summed figures (the all-reduce is the identity without a process group)
        def take(self, device):
            return torch.tensor(sums, dtype=torch.float64)

    switch.errors = Fixed()
    probe.before_step(50)
    guard.before_step(50)
    record = guard.after_step(50, torch.device("cpu"))
    assert record == {"forward": {"error": pytest.approx(2e-4), "lost": 0.25}, "backward": {"error": 2**-7, "lost": 0.0},
                      "tripped": False}  # fmt: skip
    assert switch.on and guard.tripped_at is None  # at the bounds: kept (past them trips)
    sums[5] = 0.5  # backward: sqrt(2^-14 / 0.5) = 0.0110
    probe.before_step(60)
    guard.before_step(60)
    record = guard.after_step(60, torch.device("cpu"))
    assert record["tripped"] and guard.tripped_at == 60 and not switch.on
    assert guard.reason.startswith("guard: fp32 from step 61: what the quantized comms lost at step 60 passed "
                                   "sharding.qcomms.max_error / max_lost (backward error 0.011 > 0.0078125; ")
    assert guard.worst == {"forward": {"error": pytest.approx(2e-4), "lost": 0.25},
                           "backward": {"error": pytest.approx(2**-6.5), "lost": 0.0}}  # fmt: skip
    sums[5], sums[2] = 1.0, 2.0  # a share lost past its bound trips too
    lost = CommsGuard(CommsSwitch(errors=Fixed()), every=10, max_error=2**-7, max_lost=0.25, probe=probe)
    lost.before_step(70)
    assert lost.after_step(70, torch.device("cpu"))["tripped"] and "forward lost 0.5 > 0.25" in lost.reason
    for step in (61, 70, 80):  # the probe's decision would set it on: the guard holds it off, unmeasured
        probe.before_step(step)
        guard.before_step(step)
        assert not switch.on and not switch.measuring and guard.after_step(step, torch.device("cpu")) is None
    again = CommsGuard(CommsSwitch(), every=10, max_error=2**-7, max_lost=0.25, probe=probe)
    again.load_state_dict(guard.state_dict())  # a resumed run stays at fp32
    again.before_step(90)
    assert not again.switch.on and again.summary()["tripped_at"] == 60 and again.summary()["checks"] == 2


def test_no_guard_without_a_switch_or_a_cadence_and_bad_values_are_refused_by_key():
    from slipstream_rec.sharding.config import CommPrecision, QCommsConfig, QCommsWhen
    from slipstream_rec.sharding.qcomms_guard import make_comms_guard
    from slipstream_rec.sharding.qcomms_switch import CommsSwitch

    auto = QCommsConfig(forward=CommPrecision.fp16, when=QCommsWhen.auto)
    assert make_comms_guard(auto, None, None) is None
    assert make_comms_guard(QCommsConfig(forward=CommPrecision.fp16, when=QCommsWhen.auto, guard_every_steps=0),
                            CommsSwitch(), None) is None  # fmt: skip
    guard = make_comms_guard(auto, CommsSwitch(), None)
    assert (guard.every, guard.max_error, guard.max_lost) == (auto.guard_every_steps, auto.max_error, auto.max_lost)
    for bad, words in [({"guard_every_steps": -1}, "sharding.qcomms.guard_every_steps=-1"),
                       ({"max_error": 0.0}, "sharding.qcomms.max_error=0.0"),
                       ({"max_lost": 1.5}, "sharding.qcomms.max_lost=1.5")]:  # fmt: skip
        with pytest.raises(ValueError, match=words.replace(".", r"\.")):
            QCommsConfig(when=QCommsWhen.auto, **bad).validate()
