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
