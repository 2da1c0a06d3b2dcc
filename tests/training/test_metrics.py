"""Exact AUC and log loss gathered over ranks (slipstream_rec.training.metrics)."""

from __future__ import annotations

import math

import torch

from slipstream_rec.metrics import auc, log_loss
from tests.dist_harness import run_workers


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
