"""capture_rng / restore_rng (checkpoint/rng.py): after a restore, torch, numpy and Python draw
what they drew right after the capture."""

from __future__ import annotations

import random

import numpy as np
import torch

from slipstream_rec.checkpoint.rng import capture_rng, restore_rng


def _draws():
    return torch.rand(5).tolist(), np.random.rand(5).tolist(), np.random.randn(3).tolist(), [random.random() for _ in range(5)]


def test_restore_replays_every_generator_from_the_capture():
    torch.manual_seed(1), np.random.seed(2), random.seed(3)
    np.random.randn(1)  # leave numpy with a cached Gaussian, which the state must carry
    state = capture_rng()
    want = _draws()
    _draws()  # move every generator on
    restore_rng(state)
    assert _draws() == want
