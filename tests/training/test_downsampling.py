"""Negative downsampling beside any policy: the rule, the draws, the guard, their state.

Expected values are computed here from the definitions in the module's docstring (a brute-force
search over the 0.05 grid, the variance shares summed by hand), not by the module's helpers; the
2-rank gloo test checks that the rule and the guard pool every rank's samples and decide alike.
"""

from __future__ import annotations

import math

import pytest
import torch

from slipstream_rec.training.downsampling import NegativeDownsampler, rate_for_click_rate
from tests.dist_harness import run_workers

GRID = [round(0.05 * i, 2) for i in range(20)]  # 0 .. 0.95


def _rule_reference(c: float, m: float) -> float:
    ok = [f for f in GRID if c > 0 and (1 - f) * (1 - c) / c >= m - 1e-12]
    return max(ok) if ok else 0.0


def _guard_reference(share: float, max_noise: float) -> float:
    return max(f for f in GRID if f / (1 - f) * share <= max_noise + 1e-12)


@pytest.mark.parametrize("c", [0.001, 0.016, 0.02, 0.037, 0.1, 0.25, 0.6])
def test_the_rule_keeps_at_least_m_non_clicks_per_click(c):
    assert rate_for_click_rate(c, 20.0) == pytest.approx(_rule_reference(c, 20.0))
    assert rate_for_click_rate(c, 5.0) == pytest.approx(_rule_reference(c, 5.0))
    assert rate_for_click_rate(0.0, 20.0) == 0.0  # no click seen: no evidence, no downsampling


def test_the_rule_on_the_matrix_click_rates():
    # clicklog_raw (0.02): 0.55 at m = 20, 0.45 at the default m = 25; clicklog (0.25) and movielens
    # (about 0.57 positives): none
    assert rate_for_click_rate(0.02, 20.0) == pytest.approx(0.55)
    assert rate_for_click_rate(0.25, 20.0) == 0.0 and rate_for_click_rate(0.57, 20.0) == 0.0


def test_drops_only_non_clicks_at_the_rate_from_its_own_stream():
    d = NegativeDownsampler(0.4, seed=3)
    gen = torch.Generator().manual_seed(0)
    dropped = negatives = 0
    for _ in range(20):
        labels = (torch.rand(1000, generator=gen) < 0.2).float()
        mask = d.drop_mask(labels)
        assert not mask[labels == 1].any()  # a click is never dropped
        dropped += int(mask.sum())
        negatives += int((labels == 0).sum())
    sigma = math.sqrt(0.4 * 0.6 / negatives)
    assert abs(dropped / negatives - 0.4) < 4 * sigma
    assert d.dropped == dropped
    # the same seed drops the same samples; state_dict continues the stream
    labels = torch.zeros(500)
    state = d.state_dict()
    first = d.drop_mask(labels)
    d.load_state_dict(state)
    assert torch.equal(d.drop_mask(labels), first)
    assert NegativeDownsampler(0.0, seed=3).drop_mask(labels) is None
    assert d.logit_offset() == pytest.approx(math.log(0.6))


def _guard_batch(p_pos: torch.Tensor, p_neg: torch.Tensor, rate: float):
    """Logits that the guard calibrates back to these probabilities at ``rate``."""
    p = torch.cat([p_pos, p_neg])
    logits = torch.logit(p.double()) - (math.log(1 - rate) if rate else 0.0)
    labels = torch.cat([torch.ones(len(p_pos)), torch.zeros(len(p_neg))])
    return logits.float(), labels


def test_the_guard_measures_the_noise_and_backs_off_to_the_largest_rate_within_it():
    d = NegativeDownsampler("auto", seed=0, guard_steps=10, max_noise=0.05)
    d.rate, d.decided = 0.6, True
    p_pos = torch.full((100,), 0.3)
    p_neg = torch.linspace(0.01, 0.2, 1000)  # the trained non-clicks (40% of the log's)
    logits, labels = _guard_batch(p_pos, p_neg, 0.6)
    d.observe(logits, labels)
    first = d.guard(10)
    assert first["rate_after"] == 0.6 and "first window" in first["reason"]
    d.observe(logits, labels)
    rec = d.guard(20)
    # by hand: each trained non-click stands for 1 / 0.4 of the log's
    pos_var = float(((1 - p_pos.double()) ** 2).sum())
    neg_var = float((p_neg.double() ** 2).sum()) / 0.4
    share = neg_var / (pos_var + neg_var)
    assert rec["negative_share"] == pytest.approx(share, rel=1e-4)
    assert rec["added_noise"] == pytest.approx(0.6 / 0.4 * share, rel=1e-4)
    assert rec["added_noise"] > 0.05 and rec["rate_after"] == pytest.approx(_guard_reference(share, 0.05))
    assert d.rate == rec["rate_after"] and d.decisions[-1] is not None and "backed off" in rec["reason"]
    # calibration on the log: predicted clicks = Sum p_pos + Sum p_neg / 0.4 over 100 + 1000 / 0.4
    log_n = 100 + 1000 / 0.4
    assert rec["predicted_ctr"] == pytest.approx((float(p_pos.sum()) + float(p_neg.sum()) / 0.4) / log_n, rel=1e-4)
    assert rec["observed_ctr"] == pytest.approx(100 / log_n)


def test_the_guard_keeps_a_rate_within_the_noise_and_never_raises_it():
    d = NegativeDownsampler("auto", seed=0, guard_steps=10, max_noise=0.05)
    d.rate, d.decided = 0.2, True
    logits, labels = _guard_batch(torch.full((100,), 0.5), torch.full((1000,), 0.001), 0.2)
    for step in (10, 20, 30):
        d.observe(logits, labels)
        rec = d.guard(step)
    assert rec["added_noise"] < 0.05 and "kept" in rec["reason"]
    assert d.rate == 0.2  # within the noise, a higher rate would pass too: the guard only lowers


def test_a_fixed_rate_is_measured_never_moved():
    d = NegativeDownsampler(0.9, seed=0, guard_steps=10, max_noise=0.01)
    logits, labels = _guard_batch(torch.full((10,), 0.3), torch.full((100,), 0.3), 0.9)
    for step in (10, 20):
        d.observe(logits, labels)
        rec = d.guard(step)
    assert rec["added_noise"] > 0.01 and d.rate == 0.9 and rec["reason"] == "fixed rate: measured only"
    assert d.decisions == []


def test_config_accepts_auto_or_a_fraction_for_every_policy():
    from slipstream_rec.config import load_config
    from slipstream_rec.training.config import DownsamplingConfig

    for preset in ("off", "random", "paper_plus", "serve"):
        for rate in ("auto", "0.5"):
            job = load_config([f"slipstream={preset}", f"downsampling.rate={rate}"])
            assert job.downsampling.rate == (rate if rate == "auto" else 0.5)
    for bad in ("aut", 1.0, -0.1):
        with pytest.raises(ValueError, match=r"downsampling\.rate="):
            DownsamplingConfig(rate=bad).validate()


def _two_ranks(env, click_rates):
    from slipstream_rec.training.downsampling import NegativeDownsampler

    d = NegativeDownsampler("auto", seed=env.rank, guard_steps=5, max_noise=0.05)
    n = 4000
    labels = torch.zeros(n)
    labels[: int(click_rates[env.rank] * n)] = 1
    rule = d.choose_from_labels(labels, 0)
    assert d.choose_from_labels(labels, 0) is None  # decided once: later calls do nothing
    # the guard: rank 0's non-clicks well predicted, rank 1's not; the decision pools both
    p_neg = 0.001 if env.rank == 0 else 0.3
    z = torch.logit(torch.tensor([0.5] * 50 + [p_neg] * 500).double()) - math.log(1 - d.rate)
    y = torch.tensor([1.0] * 50 + [0.0] * 500)
    guards = []
    for step in (5, 10):
        d.observe(z.float(), y)
        guards.append(d.guard(step))
    return rule, guards, d.rate


def test_two_ranks_pool_their_samples_and_decide_alike():
    out = run_workers(_two_ranks, 2, click_rates=[0.01, 0.03])
    (rule0, guards0, rate0), (rule1, guards1, rate1) = out
    assert rule0["click_rate"] == pytest.approx(0.02) and rule0["samples"] == 8000  # both ranks' labels
    assert rule0["rate_after"] == rule1["rate_after"] == pytest.approx(_rule_reference(0.02, 25.0))
    assert guards0 == guards1 and rate0 == rate1
    keep = 1 - rule0["rate_after"]
    pos_var = 2 * 50 * 0.25
    neg_var = 500 * (0.001**2 + 0.3**2) / keep
    share = neg_var / (pos_var + neg_var)
    assert guards0[1]["negative_share"] == pytest.approx(share, rel=1e-3)
    assert rate0 == pytest.approx(_guard_reference(share, 0.05))
