"""trainer.precision: bf16 autocast around the training forward only, fp32 elsewhere."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from slipstream_rec.data.types import Batch, make_kjt
from slipstream_rec.training.config import PipelineKind, Precision, TrainerConfig
from slipstream_rec.training.trainer import make_pipeline


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
