"""Exact metrics of a set of predictions: ROC AUC and log loss (no collectives).

On the ground floor so that both ``training/`` (evaluation, gathered across ranks in
``training/metrics.py``) and ``data/`` (a generator's teacher AUC) use the same definition.
"""

from __future__ import annotations

import math

import torch


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
