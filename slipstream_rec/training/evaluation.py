"""Exact evaluation of a split on all ranks."""

from __future__ import annotations

from typing import Any, Dict, Iterable, List

import torch
from torch import nn

from slipstream_rec.training.metrics import evaluate_predictions

__all__ = ["evaluate"]


@torch.no_grad()
def evaluate(
    model: nn.Module, batches: Iterable[Any], device: torch.device, logit_offset: float = 0.0
) -> Dict[str, float]:
    """Exact AUC / log loss over every batch of a split on all ranks. Collective: all ranks enter,
    each with the same number of batches (the loaders guarantee it). ``logit_offset`` is added to
    every logit (a calibration correction: AUC is unchanged, log loss is not)."""
    was_training = model.training
    model.eval()
    logits: List[torch.Tensor] = []
    labels: List[torch.Tensor] = []
    for batch in batches:
        batch = batch.to(device, non_blocking=True)
        _, (_, batch_logits, batch_labels, _) = model(batch)
        logits.append(batch_logits)
        labels.append(batch_labels)
    model.train(was_training)
    return evaluate_predictions(torch.cat(logits) + logit_offset, torch.cat(labels))
