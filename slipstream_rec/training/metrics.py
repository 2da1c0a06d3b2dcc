"""Exact evaluation metrics over a whole split, gathered across ranks (the metrics themselves:
slipstream_rec/metrics.py)."""

from __future__ import annotations

from typing import Dict

import torch

from slipstream_rec.distributed import gather_varlen
from slipstream_rec.metrics import auc, log_loss


def evaluate_predictions(logits: torch.Tensor, labels: torch.Tensor) -> Dict[str, float]:
    """AUC, log loss, CTR and mean prediction over all ranks' predictions. Collective: all ranks enter."""
    all_logits = gather_varlen(logits.float())
    all_labels = gather_varlen(labels.float())
    return {
        "auc": auc(all_logits, all_labels),
        "logloss": log_loss(all_logits, all_labels),
        "ctr": all_labels.mean().item(),
        # calibration: the mean predicted click rate, to set against the observed ``ctr``
        "predicted_ctr": torch.sigmoid(all_logits.double()).mean().item(),
        "num_samples": int(all_labels.numel()),
    }
