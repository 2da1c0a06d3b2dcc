"""trainer.precision: bf16 autocast around the training forward only, fp32 elsewhere."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from slipstream_rec.data.types import Batch, make_kjt
from slipstream_rec.training.config import PipelineKind, Precision, TrainerConfig
from slipstream_rec.training.pipeline import make_pipeline


def _batch(n: int) -> Batch:
    return Batch(dense_features=torch.randn(n, 4), sparse_features=make_kjt(["a"], torch.zeros(n, 1, dtype=torch.int64)), labels=torch.ones(n))


class _Task(nn.Module):
    """Records the autocast state its forward ran under; DLRMTask's output shape."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(4, 1)
        self.seen: list = []

    def forward(self, batch):
        x, y = batch.dense_features, batch.labels
        if isinstance(x, torch.Tensor):  # not the pipeline's fx trace of the model
            self.seen.append(torch.is_autocast_enabled("cpu") and torch.get_autocast_dtype("cpu"))
        logits = self.linear(x).squeeze(-1)
        loss = nn.functional.binary_cross_entropy_with_logits(logits.float(), y)
        return loss, (loss.detach(), logits.detach(), y, torch.ones_like(y))


@pytest.mark.parametrize("precision, expected", [(Precision.fp32, False), (Precision.bf16, torch.bfloat16)])
def test_the_training_forward_runs_under_the_configured_precision(precision, expected):
    task = _Task()
    opt = torch.optim.SGD(task.parameters(), lr=0.1)
    pipeline = make_pipeline(PipelineKind.sparse_dist, task, opt, torch.device("cpu"), precision)
    batches = iter([_batch(8) for _ in range(3)])
    _, logits, _, _ = pipeline.progress(batches)
    assert task.seen and all(s == expected for s in task.seen)
    assert logits.dtype == (torch.bfloat16 if expected else torch.float32)
    assert task.linear.weight.dtype == torch.float32  # master weights stay fp32
    # Outside the training forward (evaluation, the quality check's scoring) nothing is autocast.
    task.seen.clear()
    task(_batch(2))
    assert task.seen == [False]


def test_bf16_needs_the_sparse_dist_pipeline():
    with pytest.raises(ValueError, match="trainer.precision"):
        TrainerConfig(precision=Precision.bf16, pipeline=PipelineKind.base).validate()


# ---- trainer.precision=auto: read from the machine -------------------------------------------
CPUINFO = """processor\t: 0
vendor_id\t: GenuineIntel
flags\t\t: fpu vme sse sse2 avx avx2 avx512f {extra}
bogomips\t: 4000

processor\t: 1
flags\t\t: fpu vme sse sse2 avx avx2 avx512f {extra}
"""


def _cpuinfo(tmp_path, extra: str):
    path = tmp_path / "cpuinfo"
    path.write_text(CPUINFO.format(extra=extra))
    return path


@pytest.mark.parametrize("extra, chosen", [("avx512_bf16", Precision.bf16), ("amx_bf16 amx_tile", Precision.bf16),
                                           ("avx512_vnni", Precision.fp32), ("", Precision.fp32)])
def test_auto_reads_the_cpu_flags(tmp_path, extra, chosen):
    from slipstream_rec.training.precision import resolve_precision

    got, why = resolve_precision(Precision.auto, torch.device("cpu"), PipelineKind.sparse_dist, _cpuinfo(tmp_path, extra))
    assert got is chosen
    assert why.startswith(f"auto: {chosen.value}") and str(tmp_path) in why


def test_auto_keeps_fp32_where_the_flags_or_the_pipeline_do_not_allow_bf16(tmp_path):
    from slipstream_rec.training.precision import resolve_precision

    got, why = resolve_precision(Precision.auto, torch.device("cpu"), PipelineKind.sparse_dist, tmp_path / "absent")
    assert got is Precision.fp32 and "unknown" in why
    fast = _cpuinfo(tmp_path, "avx512_bf16")
    got, why = resolve_precision(Precision.auto, torch.device("cpu"), PipelineKind.base, fast)
    assert got is Precision.fp32 and "trainer.pipeline=base" in why
    TrainerConfig(precision=Precision.auto, pipeline=PipelineKind.base).validate()  # auto is allowed there
    # an explicit choice is kept whatever the machine
    assert resolve_precision(Precision.fp32, torch.device("cpu"), PipelineKind.sparse_dist, fast)[0] is Precision.fp32
    slow = _cpuinfo(tmp_path, "")
    assert resolve_precision(Precision.bf16, torch.device("cpu"), PipelineKind.sparse_dist, slow)[0] is Precision.bf16


def _ranks_disagree(env, paths):
    from slipstream_rec.training.precision import resolve_precision

    return resolve_precision(Precision.auto, torch.device("cpu"), PipelineKind.sparse_dist, paths[env.rank])


def test_ranks_on_different_machines_agree_on_the_lowest(tmp_path):
    from tests.dist_harness import run_workers

    fast, slow = tmp_path / "fast", tmp_path / "slow"
    fast.mkdir(), slow.mkdir()
    paths = [_cpuinfo(fast, "avx512_bf16"), _cpuinfo(slow, "")]
    (p0, why0), (p1, why1) = run_workers(_ranks_disagree, 2, paths=paths)
    assert p0 is p1 is Precision.fp32
    assert "another rank" in why0 and "neither" in why1


# ---- trainer.precision=auto with fast bf16: timed on the run's own steps ---------------------
def test_the_probe_takes_turns_after_its_start_and_ends_at_its_last_step():
    from slipstream_rec.training.precision import PROBE_BLOCK, PROBE_START, PrecisionProbe

    probe = PrecisionProbe(steps=8, min_gain=0.05)
    turns = [probe.candidate(step) for step in range(1, probe.last_step + 3)]
    assert probe.last_step == PROBE_START + 16
    assert turns[:PROBE_START] == [None] * PROBE_START and turns[-2:] == [None, None]
    timed = turns[PROBE_START:probe.last_step]
    assert timed.count("fp32") == timed.count("bf16") == 8
    assert timed[:2 * PROBE_BLOCK] == ["fp32"] * PROBE_BLOCK + ["bf16"] * PROBE_BLOCK  # turns of a block
    # before and after the probe the machine's choice (bf16) runs; while probing, the turn's
    assert probe.dtype(1) is torch.bfloat16 and probe.dtype(PROBE_START + 1) is None
    assert probe.dtype(PROBE_START + PROBE_BLOCK + 1) is torch.bfloat16


@pytest.mark.parametrize("fp32_ms, bf16_ms, chosen", [(100, 80, "bf16"), (100, 95, "bf16"), (100, 96, "fp32"), (100, 130, "fp32")])
def test_bf16_stays_only_where_its_median_step_is_faster_by_the_margin(fp32_ms, bf16_ms, chosen):
    from slipstream_rec.training.precision import PrecisionProbe

    probe = PrecisionProbe(steps=4, min_gain=0.05)
    got, why = probe.decide(fp32_ms / 1e3, bf16_ms / 1e3)
    assert got is Precision(chosen) and probe.chosen is got
    assert why.startswith(f"auto: {chosen}, timed on this run") and f"fp32 {fp32_ms:.1f} ms" in why
    assert probe.record["fp32_ms_per_step"] == fp32_ms and probe.record["bf16_ms_per_step"] == bf16_ms
    # once chosen, every later step runs in it and the probe times nothing more
    assert probe.candidate(6) is None and probe.dtype(6) is (torch.bfloat16 if chosen == "bf16" else None)


def _walk(probe, fp32_ms, bf16_ms):
    """Every step of the probe timed as the given candidate's (fp32_ms or bf16_ms), until it
    decides; returns (the step it decided at, the decision)."""
    import time

    from slipstream_rec.training.precision import PROBE_START

    for step in range(PROBE_START + 1, probe.last_step + 1):
        ms = {"fp32": fp32_ms, "bf16": bf16_ms}[probe.candidate(step)]
        decided = probe.time_step(step, time.perf_counter() - ms / 1e3, torch.device("cpu"))
        if decided is not None:
            return step, decided
    raise AssertionError("the probe never decided")


@pytest.mark.parametrize("fp32_ms, bf16_ms, step, chosen", [
    (100, 50, 20, "bf16"),  # far past the line: decided after two turns (8 steps each)
    (100, 75, 20, "bf16"),  # over 20% under fp32's step less the 5% margin
    (100, 82, 36, "bf16"),  # faster, but within 20% of the line: the whole probe decides
    (100, 110, 36, "fp32"),  # slower, within 20% of the line
    (100, 120, 20, "fp32"),  # slower by over 20% past the line: decided early
    (100, 200, 20, "fp32"),
])  # fmt: skip
def test_the_probe_decides_early_only_far_from_its_line(fp32_ms, bf16_ms, step, chosen):
    from slipstream_rec.training.precision import PrecisionProbe

    probe = PrecisionProbe(steps=16, min_gain=0.05)
    assert [s for s in range(1, 40) if probe.checks(s)] == [20, 28]  # turns' ends, not the last step
    at, (got, why) = _walk(probe, fp32_ms, bf16_ms)
    assert (at, got) == (step, Precision(chosen)) and probe.ended == at and probe.chosen is got
    each = 8 if step == 20 else 16
    assert probe.record["steps_each"] == each and f"median of {each} steps each" in why
    assert ("decided before the probe's 16" in why) is (step == 20)
    # the decision's step was the probe's (a host wait on a GPU), the next one is not; nothing
    # is checked or timed once it is decided
    assert probe.probed(at) and not probe.probed(at + 1) and not probe.checks(28)
    assert probe.candidate(at + 1) is None


def test_the_early_rule_at_its_edges():
    from slipstream_rec.training.precision import PROBE_EARLY, PrecisionProbe

    line = 0.100 * (1 - 0.05)  # bf16 pays at fp32's step less the margin
    for bf16_s, chosen in [
        (line / (1 + PROBE_EARLY) * (1 - 1e-9), Precision.bf16), (line / (1 + PROBE_EARLY) * (1 + 1e-9), None),
        (line * (1 + PROBE_EARLY) * (1 + 1e-9), Precision.fp32), (line * (1 + PROBE_EARLY) * (1 - 1e-9), None),
    ]:  # fmt: skip
        probe = PrecisionProbe(steps=16, min_gain=0.05)
        got = probe.early(0.100, bf16_s)
        assert (got and got[0]) == chosen and probe.chosen == chosen, bf16_s


def test_the_last_probed_step_is_where_the_probe_decided():
    # what the serve lever's timing starts after (the trainer's bind): the planned end while
    # probing, the decision's step once decided, early or not
    from slipstream_rec.training.precision import PrecisionProbe

    from types import SimpleNamespace

    from slipstream_rec.training.trainer import Trainer

    probe = PrecisionProbe(steps=16, min_gain=0.05)
    trainer = SimpleNamespace(precision_probe=probe, comms_probe=None)
    assert probe.last_probed == probe.last_step == 36 and Trainer.lever_timed_from(trainer) == 37  # type: ignore[arg-type]
    assert _walk(probe, 100, 50)[0] == 20 == probe.last_probed
    assert probe.probed(20) and not probe.probed(21) and Trainer.lever_timed_from(trainer) == 21  # type: ignore[arg-type]
    assert Trainer.lever_timed_from(SimpleNamespace(precision_probe=None, comms_probe=None)) == 1  # type: ignore[arg-type]
    probe = PrecisionProbe(steps=16, min_gain=0.05)
    assert _walk(probe, 100, 90)[0] == 36 == probe.last_probed


def test_an_early_decision_round_trips_and_an_older_state_resumes():
    from slipstream_rec.training.precision import PrecisionProbe

    probe = PrecisionProbe(steps=16, min_gain=0.05)
    _walk(probe, 100, 50)
    again = PrecisionProbe(steps=16, min_gain=0.05)
    again.load_state_dict(probe.state_dict())
    assert (again.chosen, again.ended, again.record) == (probe.chosen, 20, probe.record)
    # a checkpoint from before early decisions: its probe ran every step, and ended at its last
    older = PrecisionProbe(steps=16, min_gain=0.05)
    _walk(older, 100, 82)
    again = PrecisionProbe(steps=16, min_gain=0.05)
    again.load_state_dict(older.state_dict())
    assert again.ended == again.last_step  # decided then at its last step


def _probe_agrees(env, times):
    from slipstream_rec.training.precision import PrecisionProbe

    probe = PrecisionProbe(steps=3, min_gain=0.05)
    probe.times = times[env.rank]
    return probe.agree_and_decide()


def test_the_ranks_decide_on_the_slowest_ranks_medians():
    from tests.dist_harness import run_workers

    # rank 0 finds bf16 20% faster, rank 1 (the slower step) only 2%: the slowest rank's step
    # sets the pace, and both ranks take its figures
    times = [{"fp32": [0.10, 0.10, 0.50], "bf16": [0.08, 0.08, 0.01]},
             {"fp32": [0.20, 0.21, 0.19], "bf16": [0.196, 0.195, 0.197]}]
    (p0, why0), (p1, why1) = run_workers(_probe_agrees, 2, times=times)
    assert p0 is p1 is Precision.fp32 and why0 == why1
    assert "bf16 196.0 ms" in why0 and "fp32 200.0 ms" in why0


def _probe_checks(env, times):
    from slipstream_rec.training.precision import PrecisionProbe

    probe = PrecisionProbe(steps=16, min_gain=0.05)
    probe.times = times[env.rank]
    return probe.agree_and_decide(early=True), probe.chosen


def test_an_early_decision_is_the_ranks_agreement_too():
    from tests.dist_harness import run_workers

    # rank 0 finds bf16 twice as fast, rank 1 (the slower step) 16% faster: within 20% of the
    # line on the slowest rank's figures, so neither rank decides early
    times = [{"fp32": [0.10] * 8, "bf16": [0.05] * 8}, {"fp32": [0.20] * 8, "bf16": [0.168] * 8}]
    assert run_workers(_probe_checks, 2, times=times) == [(None, None), (None, None)]
    # both far past it: both decide, on the same figures
    times[1]["bf16"] = [0.12] * 8
    (d0, c0), (d1, c1) = run_workers(_probe_checks, 2, times=times)
    assert c0 is c1 is Precision.bf16 and d0 == d1 and "bf16 120.0 ms" in d0[1] and "median of 8 steps" in d0[1]


def test_the_pipeline_switches_precision_between_steps():
    """The probe sets ``autocast_dtype`` before each step; the next training forward follows."""
    task = _Task()
    opt = torch.optim.SGD(task.parameters(), lr=0.1)
    pipeline = make_pipeline(PipelineKind.sparse_dist, task, opt, torch.device("cpu"), Precision.bf16)
    batches = iter([_batch(8) for _ in range(6)])
    seen = []
    for dtype in (None, torch.bfloat16, None):
        pipeline.autocast_dtype = dtype
        task.seen.clear()
        _, logits, _, _ = pipeline.progress(batches)
        seen.append(logits.dtype)
    assert seen == [torch.float32, torch.bfloat16, torch.float32]
