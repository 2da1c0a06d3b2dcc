"""Exact AUC and log loss, and their gathering over ranks."""

from __future__ import annotations

import math

import torch

from slipstream_rec.training.metrics import auc, log_loss
from tests.dist_harness import run_workers


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


def gather_worker(env):
    from slipstream_rec.training.metrics import evaluate_predictions

    # Unequal lengths per rank: rank 0 holds 5 predictions, rank 1 holds 3.
    g = torch.Generator().manual_seed(1)
    logits = torch.randn(8, generator=g)
    labels = torch.tensor([1.0, 0, 0, 1, 0, 1, 1, 0])
    part = slice(0, 5) if env.rank == 0 else slice(5, 8)
    return evaluate_predictions(logits[part], labels[part]), auc(logits, labels), log_loss(logits, labels)


def test_evaluation_gathers_every_rank_exactly():
    results = run_workers(gather_worker, 2)
    for gathered, full_auc, full_logloss in results:
        assert gathered["num_samples"] == 8
        assert gathered["auc"] == full_auc
        assert math.isclose(gathered["logloss"], full_logloss, rel_tol=1e-6)
