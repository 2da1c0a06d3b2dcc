"""``sharding.qcomms.when=auto``: the quantized comms behind one switch, timed on the run's steps.

The codec's two states against TorchRec's own codecs, the probe's turns and decision on recorded
timings, the keys refused in one line, and a 2-rank training through torchrun whose bytes per
step follow the switch exactly (expected from a run without qcomms and the probe's schedule).
The switched collectives themselves are checked bit for bit against runs without a switch in
test_qcomms.py (codecs) and training/test_comm_hooks.py (the DDP hook).
"""

from __future__ import annotations

import json

import pytest
import torch

from tests._fixtures import _torchrun


def _fp16_codec():
    from torchrec.distributed.fbgemm_qcomm_codec import CommType, QCommsConfig, get_qcomm_codecs_registry
    from torchrec.distributed.types import CommOp

    registry = get_qcomm_codecs_registry(QCommsConfig(forward_precision=CommType.FP16, backward_precision=CommType.FP16))
    return registry, registry[CommOp.POOLED_EMBEDDINGS_ALL_TO_ALL.name].forward


def test_a_switched_codec_is_the_codec_when_on_and_sends_fp32_untouched_when_off():
    from slipstream_rec.sharding.qcomms_switch import CommsSwitch, SwitchedCodec, registry_switch, switch_registry

    registry, inner = _fp16_codec()
    switch = CommsSwitch()
    codec = SwitchedCodec(inner, switch)
    x = torch.randn(64) * 1e-3
    assert codec.encode(x).dtype == torch.float16 and torch.equal(codec.encode(x), inner.encode(x))
    assert codec.calc_quantized_size(64) == inner.calc_quantized_size(64) and codec.quantized_dtype == torch.float16
    switch.on = False
    assert codec.encode(x) is x and codec.decode(x) is x  # the fp32 tensor itself goes on the wire
    assert codec.calc_quantized_size(64) == 64 and codec.quantized_dtype == torch.float32
    assert codec.create_context() is None and codec.padded_size(x.view(8, 8), [8], 0, None) == (8, 0)
    assert codec._comm_precision == inner._comm_precision  # the summary's configured precision
    assert registry_switch(registry) is None
    assert registry_switch(switch_registry(registry, switch)) is switch


def test_the_probe_takes_turns_with_the_switch_and_keeps_the_winner_on():
    from slipstream_rec.sharding.qcomms_switch import CommsProbe, CommsSwitch
    from slipstream_rec.step_probe import PROBE_BLOCK

    switch = CommsSwitch()
    probe = CommsProbe(switch, steps=8, min_gain=0.05, start=36)  # after a 16-step precision probe
    states = []
    for step in range(1, probe.last_step + 2):
        probe.before_step(step)
        states.append(switch.on)
    # quantized (as configured) before the probe, then fp32 first in turns of a block
    assert states[:36] == [True] * 36 and probe.last_step == 52
    assert states[36:52] == ([False] * PROBE_BLOCK + [True] * PROBE_BLOCK) * 2
    for fp32_ms, quantized_ms, picked in [(100, 94, "quantized"), (100, 96, "fp32")]:
        probe.picked = None
        got, why = probe.decide(fp32_ms / 1e3, quantized_ms / 1e3)
        assert got == picked and why.startswith(f"auto: {picked}, timed on this run: quantized {quantized_ms:.1f} ms")
        assert probe.record == {"fp32_ms_per_step": fp32_ms, "quantized_ms_per_step": quantized_ms,
                                "steps_each": 8, "min_gain": 0.05}  # fmt: skip
        probe.before_step(40)  # inside the probe's span: decided, so the decision runs
        assert switch.on is (picked == "quantized")
    # a resumed run keeps the decision: the switch follows the loaded state from its next step
    again = CommsProbe(CommsSwitch(), steps=8, min_gain=0.05, start=36)
    again.load_state_dict(probe.state_dict())
    again.before_step(60)
    assert again.picked == "fp32" and again.switch.on is False


def test_nothing_to_switch_makes_no_switch_and_bad_values_are_refused_by_key():
    from slipstream_rec.sharding.config import CommPrecision, QCommsConfig, QCommsWhen
    from slipstream_rec.sharding.qcomms_switch import make_comms_probe, make_comms_switch

    q = QCommsConfig(forward=CommPrecision.fp16, backward=CommPrecision.fp16)
    assert make_comms_switch(q, hook_quantized=True) is None  # always: every step as configured
    auto = QCommsConfig(forward=CommPrecision.fp16, when=QCommsWhen.auto)
    assert make_comms_switch(auto, hook_quantized=False) is not None
    assert make_comms_switch(QCommsConfig(when=QCommsWhen.auto), hook_quantized=True) is not None  # the hook alone
    assert make_comms_switch(QCommsConfig(when=QCommsWhen.auto), hook_quantized=False) is None  # nothing quantized
    switch = make_comms_switch(auto, hook_quantized=False)
    assert make_comms_probe(auto, switch).steps == 16 and make_comms_probe(auto, None) is None
    assert make_comms_probe(QCommsConfig(forward=CommPrecision.fp16, when=QCommsWhen.auto, probe_steps=0), switch) is None
    for bad, words in [({"probe_steps": -1}, "sharding.qcomms.probe_steps=-1"), ({"min_gain": 1.0}, "sharding.qcomms.min_gain=1.0")]:
        with pytest.raises(ValueError, match=words.replace(".", r"\.")):
            QCommsConfig(when=QCommsWhen.auto, **bad).validate()


def test_both_probes_keep_the_serve_lever_off_their_steps():
    from types import SimpleNamespace

    from slipstream_rec.sharding.qcomms_switch import CommsProbe, CommsSwitch
    from slipstream_rec.step_probe import PROBE_START, start_after
    from slipstream_rec.training.precision import PrecisionProbe
    from slipstream_rec.training.trainer import Trainer

    precision = PrecisionProbe(steps=16, min_gain=0.05)
    assert start_after(precision) == 36 and start_after(None) == PROBE_START  # the trainer's start
    comms = CommsProbe(CommsSwitch(), steps=16, min_gain=0.05, start=start_after(precision))
    trainer = SimpleNamespace(precision_probe=precision, comms_probe=comms)
    assert Trainer.lever_timed_from(trainer) == comms.last_step + 1 == 69  # type: ignore[arg-type]
    comms.picked, comms.times = "fp32", {"fp32": [0.1] * 8, "quantized": [0.1] * 8}  # decided at step 52
    assert Trainer.lever_timed_from(trainer) == 53  # type: ignore[arg-type]
    assert Trainer.lever_timed_from(SimpleNamespace(precision_probe=None, comms_probe=comms)) == 53  # type: ignore[arg-type]


# ---- a 2-rank training through torchrun -----------------------------------------------------
PROBE = 8
Q = ["sharding.qcomms.forward=fp16", "sharding.qcomms.backward=fp16", "trainer.ddp_comm_hook=fp16"]
COMMON = ["trainer.max_steps=40", "trainer.precision=fp32", "trainer.checkpoint.enabled=false",
          "trainer.eval_every_steps=0", "sharding.type=table_wise"]  # fmt: skip


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """A run without qcomms, and three with them under when=auto whose margin forces each decision
    (a step 90% faster is never measured; one 90% slower always passes); the quantized ones'
    guard measures at step 25, within bounds that pass (quantized) or that fp16 cannot meet
    (tripped: an error of 1e-9)."""
    root = tmp_path_factory.mktemp("qcomms_auto")
    out = {"plain": (_torchrun(root / "plain", root / "data", *COMMON), [])}
    guard = ["sharding.qcomms.guard_every_steps=25", "sharding.qcomms.max_lost=1"]
    for picked, gain, bound in (("fp32", 0.9, 1), ("quantized", -0.9, 1), ("tripped", -0.9, 1e-9)):
        summary = _torchrun(root / picked, root / "data", *COMMON, *Q, "sharding.qcomms.when=auto",
                            f"sharding.qcomms.probe_steps={PROBE}", f"sharding.qcomms.min_gain={gain}",
                            *guard, f"sharding.qcomms.max_error={bound}")  # fmt: skip
        records = [json.loads(line) for line in (root / picked / "metrics.jsonl").read_text().splitlines()]
        out[picked] = (summary, records)
    return out


@pytest.mark.parametrize("picked", ["fp32", "quantized"])
def test_a_run_decides_once_and_its_bytes_follow_the_switch_step_by_step(runs, picked):
    from slipstream_rec.step_probe import PROBE_START

    plain, (auto, records) = runs["plain"][0], runs[picked]
    q = auto["qcomms"]
    decided = [r for r in records if r["kind"] == "qcomms"]
    last = PROBE_START + 2 * PROBE  # no precision probe (fp32): the comms probe's turns from step 5
    assert len(decided) == 1 and decided[0]["step"] == last and decided[0]["chosen"] == q["chosen"] == picked
    assert q["when"] == "auto" and q["probe"]["steps_each"] == PROBE
    assert q["reason"].startswith(f"auto: {picked}, timed on this run")
    # steps at fp32: the probe's fp32 turns (PROBE of them) and, where it chose fp32, every step after it
    steps = auto["steps"]  # the smoke log's epoch ends before max_steps
    assert steps == plain["steps"] > last + 10
    fp32_steps = PROBE + (steps - last if picked == "fp32" else 0)
    share = (fp32_steps + 0.5 * (steps - fp32_steps)) / steps  # fp16: half of fp32's bytes a step
    for kind in ("output", "gradient", "dense"):
        want = plain["a2a_bytes_per_sample"][kind] * share
        assert auto["a2a_bytes_per_sample"][kind] == pytest.approx(want, rel=1e-4), kind
    assert auto["a2a_bytes_per_sample"]["input"] == plain["a2a_bytes_per_sample"]["input"]  # ids: never quantized
    assert plain["qcomms"]["when"] == "always" and "chosen" not in plain["qcomms"]
    # the guard measured the quantized comms once (fp16's 11 bits: about 2e-4 of the pooled
    # embeddings), and nothing where fp32 ran
    checks = [r for r in records if r["kind"] == "qcomms_guard"]
    assert q["guard"]["checks"] == len(checks) == (picked == "quantized") and q["guard"]["tripped_at"] is None
    if checks:
        assert checks[0]["step"] == 25 and 1e-5 < checks[0]["forward"]["error"] < 1e-3 and not checks[0]["tripped"]
        assert set(checks[0]) - {"kind", "step", "time", "tripped"} == {"forward", "backward", "all_reduce"}


def test_a_tripped_guard_sends_fp32_from_the_next_step_to_the_end(runs):
    from slipstream_rec.step_probe import PROBE_START

    plain, (auto, records) = runs["plain"][0], runs["tripped"]
    q = auto["qcomms"]
    assert [r["chosen"] for r in records if r["kind"] == "qcomms"] == ["quantized"]  # the probe's decision
    checks = [r for r in records if r["kind"] == "qcomms_guard"]
    assert [(r["step"], r["tripped"]) for r in checks] == [(25, True)] and q["guard"]["tripped_at"] == 25
    assert q["chosen"] == "fp32" and "guard: fp32 from step 26" in q["reason"] and q["reason"].startswith("auto: quantized")
    steps = auto["steps"]
    assert PROBE_START + 2 * PROBE < 25 < steps == plain["steps"]
    fp32_steps = PROBE + (steps - 25)  # the probe's fp32 turns, then every step after the trip
    share = (fp32_steps + 0.5 * (steps - fp32_steps)) / steps
    for kind in ("output", "gradient", "dense"):
        assert auto["a2a_bytes_per_sample"][kind] == pytest.approx(plain["a2a_bytes_per_sample"][kind] * share, rel=1e-4), kind
