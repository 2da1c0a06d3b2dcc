"""Exact AUC and log loss (slipstream_rec.metrics)."""

from __future__ import annotations

import math

import torch

from slipstream_rec.metrics import auc, log_loss


def naive_auc(scores, labels) -> float:
    """P(score of a random positive > score of a random negative), ties counting one half."""
    pos = [s for s, y in zip(scores, labels) if y]
    neg = [s for s, y in zip(scores, labels) if not y]
    wins = sum(1.0 if p > n else 0.5 if p == n else 0.0 for p in pos for n in neg)
    return wins / (len(pos) * len(neg))


def test_auc_matches_pairwise_definition_with_ties():
    g = torch.Generator().manual_seed(0)
    for _ in range(5):
        scores = torch.randint(0, 6, (300,), generator=g).float()  # many ties
        labels = (torch.rand(300, generator=g) < 0.3).float()
        assert math.isclose(auc(scores, labels), naive_auc(scores.tolist(), labels.tolist()), abs_tol=1e-12)


def test_auc_edge_cases():
    assert auc(torch.tensor([0.1, 0.9]), torch.tensor([0.0, 1.0])) == 1.0
    assert auc(torch.tensor([0.9, 0.1]), torch.tensor([0.0, 1.0])) == 0.0
    assert auc(torch.tensor([0.5, 0.5]), torch.tensor([0.0, 1.0])) == 0.5
    assert math.isnan(auc(torch.tensor([0.1, 0.2]), torch.tensor([1.0, 1.0])))


def test_log_loss():
    logits = torch.tensor([0.0, 2.0, -1.0])
    labels = torch.tensor([1.0, 0.0, 0.0])
    expected = (math.log(2) + math.log(1 + math.e**2) + math.log(1 + math.e**-1)) / 3
    assert math.isclose(log_loss(logits, labels), expected, rel_tol=1e-12)
