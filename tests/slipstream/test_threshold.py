"""threshold_for_target: T from the upcoming inputs' max changes, exactly at the target."""

from __future__ import annotations

import math

import pytest
import torch

from slipstream_rec.slipstream.rows import RowState
from slipstream_rec.slipstream.threshold import threshold_for_target
from tests.slipstream.reference import stale_mask


def test_threshold_achieves_target_exactly() -> None:
    vals = torch.tensor([0.1 * i for i in range(1, 11)] + [math.inf] * 5)  # 10 hot, 5 not
    for target, want_k in [(0.3, 3), (0.25, 3), (0.31, 4), (1.0, 10), (0.01, 1)]:
        t, info = threshold_for_target(vals, target, math.inf)
        assert info["k"] == want_k and info["reason"] is None and not info["capped"]
        hot32 = vals[:10].to(torch.float32)
        assert int((hot32 < t).sum()) == want_k  # strict: the k-th value itself is below T
        assert int((hot32 <= torch.tensor(t, dtype=torch.float32).nextafter(torch.tensor(-math.inf))).sum()) == want_k
        assert info["achieved_hot_fraction"] == want_k / 10
        assert info["achieved_fraction"] == want_k / 15
        assert info["achieved_hot_fraction"] >= target - 1e-12
        assert info["n_sampled"] == 15 and info["n_hot"] == 10
        # The same decision a RowState makes with this threshold.
        st = RowState(15)
        st.set_changes(torch.arange(10), vals[:10])
        assert int(stale_mask(st, t).sum()) == want_k


def test_threshold_ties_overshoot_not_undershoot() -> None:
    vals = torch.tensor([1.0, 2.0, 2.0, 2.0, 3.0])
    t, info = threshold_for_target(vals, 0.4, math.inf)  # k = 2 -> value 2.0, three tied
    assert 2.0 < t < 2.0001
    assert info["achieved_hot_fraction"] == 0.8


def test_threshold_cap_binds() -> None:
    vals = torch.tensor([1.0, 2.0, 3.0, 4.0])
    t, info = threshold_for_target(vals, 0.75, 2.5)
    assert t == 2.5 and info["capped"] and info["uncapped_threshold"] > 3.0
    assert info["achieved_hot_fraction"] == 0.5 and info["reason"] is None
    t, info = threshold_for_target(vals, 0.75, 0.5)
    assert t == 0.5 and info["achieved_hot_fraction"] == 0.0
    assert "slipstream.max_threshold" in info["reason"]
    t, info = threshold_for_target(vals, 0.25, 100.0)
    assert not info["capped"] and 1.0 < t < 1.001


def test_threshold_nothing_skippable_reasons() -> None:
    t, info = threshold_for_target(torch.full((8,), math.inf), 0.5, 10.0)
    assert t == 0.0 and info["n_hot"] == 0 and "hot" in info["reason"]
    t, info = threshold_for_target(torch.tensor([1.0, 2.0]), 0.0, 10.0)
    assert t == 0.0 and "target_skip_fraction" in info["reason"] and info["achieved_fraction"] == 0.0
    t, info = threshold_for_target(torch.zeros(0), 0.5, 10.0)
    assert t == 0.0 and "sampled" in info["reason"]
    # zero changes are stale only for T > 0: a zero hot value with target 1 gives T = min float
    t, info = threshold_for_target(torch.tensor([0.0, 0.0]), 1.0, 10.0)
    assert t > 0 and info["achieved_hot_fraction"] == 1.0


def test_threshold_validation() -> None:
    for bad in [-0.1, 1.1, math.nan]:
        with pytest.raises(ValueError, match="slipstream.target_skip_fraction"):
            threshold_for_target(torch.ones(3), bad, 1.0)
    for bad in [-1.0, math.nan]:
        with pytest.raises(ValueError, match="slipstream.max_threshold"):
            threshold_for_target(torch.ones(3), 0.5, bad)


def test_threshold_random_against_sorted() -> None:
    gen = torch.Generator().manual_seed(3)
    for _ in range(20):
        n = int(torch.randint(1, 200, (1,), generator=gen))
        vals = torch.randint(0, 30, (n,), generator=gen).float() / 7
        vals[torch.rand(n, generator=gen) < 0.3] = math.inf
        target = float(torch.rand(1, generator=gen))
        t, info = threshold_for_target(vals, target, math.inf)
        hot = sorted(v for v in vals.tolist() if math.isfinite(v))
        if not hot:
            assert info["reason"]
            continue
        below = sum(v < t for v in hot)
        assert below / len(hot) >= target - 1e-9
        # The next smaller useful threshold (the largest hot value below T) misses the target.
        c = max(v for v in hot if v < t)
        assert sum(v < c for v in hot) / len(hot) < target
