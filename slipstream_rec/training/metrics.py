"""Exact evaluation metrics over a whole split, gathered across ranks."""

from __future__ import annotations

import math
from typing import Dict

import torch

from slipstream_rec.distributed import gather_varlen


def auc(scores: torch.Tensor, labels: torch.Tensor) -> float:
    """Exact ROC AUC (Mann-Whitney U) with tied scores given their average rank.

    Returns NaN when only one class is present, where AUC is undefined.
    """
    scores = scores.detach().double().flatten().cpu()
    labels = labels.detach().flatten().cpu() > 0.5
    positives = int(labels.sum())
    negatives = labels.numel() - positives
    if positives == 0 or negatives == 0:
        return math.nan
    sorted_scores, order = torch.sort(scores)
    _, counts = torch.unique_consecutive(sorted_scores, return_counts=True)
    ends = torch.cumsum(counts, 0).double()  # 1-based rank of each tie group's last member
    avg_rank = ends - (counts.double() - 1) / 2
    ranks = torch.repeat_interleave(avg_rank, counts)
    pos_rank_sum = ranks[labels[order]].sum().item()
    return (pos_rank_sum - positives * (positives + 1) / 2) / (positives * negatives)


def log_loss(logits: torch.Tensor, labels: torch.Tensor) -> float:
    """Mean binary cross-entropy of the logits."""
    return torch.nn.functional.binary_cross_entropy_with_logits(
        logits.double().flatten(), labels.double().flatten()
    ).item()


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
