"""TorchRec's train pipeline as the trainer runs it: timed stages, the serve hook, in-flight batches.

``TrainPipelineSparseDist`` overlaps the input all-to-all of batch i+1 with the forward and
backward of batch i. Ours adds host timers around its stages, runs the training forward under
``torch.autocast`` where the precision says so (through TorchRec's ``custom_model_fwd``), and
calls one hook between a step's backward and its optimizer step (Slipstream's ``on_backward``:
serve pushes the served lookups' gradients there).
"""

from __future__ import annotations

from collections import deque
from typing import Any, Callable, Deque, Dict, Iterator, Optional

import torch
from torch import nn
from torchrec.distributed.train_pipeline import TrainPipelineBase, TrainPipelineSparseDist

from slipstream_rec.timing import timed
from slipstream_rec.training.config import PipelineKind, Precision

__all__ = ["InFlight", "PIPELINE_STAGES", "TimedTrainPipelineSparseDist", "make_pipeline", "timed_batches"]

PIPELINE_STAGES = ("input_all_to_all", "forward", "backward", "optimizer")


class TimedTrainPipelineSparseDist(TrainPipelineSparseDist):
    """TorchRec's TrainPipelineSparseDist with host timers around its stages.

    ``input_all_to_all``: starting and waiting for the input distribution (the KJT all-to-all of
    the next batch); ``forward`` / ``backward`` include the embedding lookups and the output
    all-to-all (and its backward, with the fused embedding update), which the pipeline runs
    inside the model call; ``optimizer``: the dense optimizer step. On CUDA these are launch
    times on the host, not kernel times.
    """

    def __init__(
        self, model: nn.Module, optimizer: Any, device: torch.device,
        autocast_dtype: Optional[torch.dtype] = None, **kwargs: Any,
    ) -> None:  # fmt: skip
        self.seconds: Dict[str, float] = {stage: 0.0 for stage in PIPELINE_STAGES}
        # Read at every training forward: trainer.precision=auto's probe switches it (precision.py).
        self.autocast_dtype = autocast_dtype
        # Called after each training step's backward, before its optimizer step.
        self.on_backward: Optional[Callable[[], None]] = None
        self._device_type = device.type
        super().__init__(model, optimizer, device, custom_model_fwd=self._timed_forward, **kwargs)

    def _timed_forward(self, batch: Any) -> Any:
        with timed(self.seconds, "forward"):
            if self.autocast_dtype is None:
                return self._model(batch)
            with torch.autocast(self._device_type, dtype=self.autocast_dtype):
                return self._model(batch)

    def start_sparse_data_dist(self, batch: Any, context: Any) -> None:
        with timed(self.seconds, "input_all_to_all"):
            super().start_sparse_data_dist(batch, context)

    def wait_sparse_data_dist(self, context: Any) -> None:
        with timed(self.seconds, "input_all_to_all"):
            super().wait_sparse_data_dist(context)

    def _backward(self, losses: torch.Tensor) -> None:
        with timed(self.seconds, "backward"):
            super()._backward(losses)

    def _optimizer_step(self) -> None:
        if self.on_backward is not None:
            self.on_backward()
        with timed(self.seconds, "optimizer"):
            super()._optimizer_step()


def make_pipeline(
    kind: PipelineKind,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    device: torch.device,
    precision: Precision = Precision.fp32,
) -> Any:
    if kind is PipelineKind.base:
        assert precision is Precision.fp32, "TrainerConfig.validate refuses bf16 with the base pipeline"
        return TrainPipelineBase(model, optimizer, device)
    dtype = torch.bfloat16 if precision is Precision.bf16 else None
    # enqueue_batch_after_forward: the data side (loading, Slipstream's classify / annotate /
    # split, the lock-step flag) runs after the current batch's forward is launched, so on a GPU
    # it overlaps the forward's kernels instead of delaying their launch. The order of every
    # collective is the same on every rank either way.
    return TimedTrainPipelineSparseDist(
        model, optimizer, device, execute_all_batches=True, autocast_dtype=dtype,
        enqueue_batch_after_forward=True,
    )  # fmt: skip


def timed_batches(batches: Iterator[Any], state: Any, pin: bool) -> Iterator[Any]:
    """``batches`` with the time of each ``next`` added to ``state.data_seconds``. ``pin``
    (CUDA): the Slipstream stream rebuilds most batches (select, concat, slice) into pageable
    memory, whatever the loader pinned; pinned again, the pipeline's host-to-device copy
    (non_blocking) overlaps with compute. The copy into page-locked memory is on the host,
    counted in data_seconds."""
    while True:
        with timed(state, "data_seconds"):
            batch = next(batches, None)
            if batch is not None and pin:
                batch = batch.pin_memory()
        if batch is None:
            return
        yield batch


class InFlight:
    """The training iterator as the pipeline sees it, remembering the batches it handed out that
    are not trained yet. TorchRec's pipelines prefetch (TrainPipelineSparseDist holds the next
    two batches, their input all-to-all already started); a checkpoint saves those batches so a
    resumed run trains exactly them next, without pulling or classifying them again."""

    def __init__(self, batches: Iterator[Any]) -> None:
        self._batches = batches
        self.pending: Deque[Any] = deque()

    def __iter__(self) -> "InFlight":
        return self

    def __next__(self) -> Any:
        batch = next(self._batches)
        self.pending.append(batch)
        return batch

    def trained_one(self) -> None:
        """A pipeline step finished: the oldest batch handed out was the one trained."""
        self.pending.popleft()
