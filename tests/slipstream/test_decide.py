"""SkipDecider: p-sampling, 1/p weights, per-window ceiling, unbiasedness, tracking-only."""

from __future__ import annotations

import math

import pytest
import torch

from slipstream_rec.data.types import Batch, make_kjt
from slipstream_rec.slipstream.rows import RowIndex, RowState
from slipstream_rec.slipstream.decide import SkipDecider
from slipstream_rec.slipstream.stream import SkippingStream

N_ROWS = 1000


def _setup(skippable_rows: torch.Tensor):
    """One feature; rows in `skippable_rows` are hot with change 0 (stale at T=1), others cold."""
    idx = RowIndex(["a"], [N_ROWS])
    st = RowState(N_ROWS)
    st.set_changes(skippable_rows, torch.zeros(skippable_rows.numel()))
    return idx, st


def _batch(ids: torch.Tensor) -> Batch:
    n = ids.numel()
    dense = torch.zeros(n, 13)
    dense[:, 0] = ids.float()
    return Batch(dense_features=dense, sparse_features=make_kjt(["a"], ids.view(-1, 1)), labels=torch.zeros(n))


def test_p_sampling_frequency_and_weights() -> None:
    idx, st = _setup(torch.arange(0, N_ROWS, 2))  # even ids skippable
    p = 0.3
    dec = SkipDecider(idx, st, threshold=1.0, keep_probability=p, seed=11)
    kept_sk, n_sk = 0, 0
    gen = torch.Generator().manual_seed(0)
    for _ in range(40):
        ids = torch.randint(0, N_ROWS, (1000,), generator=gen)
        keep, w = dec(_batch(ids))
        sk = ids % 2 == 0
        assert keep[~sk].all() and (w[~sk] == 1).all()
        assert torch.allclose(w[sk & keep], torch.tensor(1 / p))
        kept_sk += int((sk & keep).sum())
        n_sk += int(sk.sum())
    freq = kept_sk / n_sk
    sigma = math.sqrt(p * (1 - p) / n_sk)
    assert abs(freq - p) < 4 * sigma, (freq, sigma)
    t = dec.totals
    assert t.samples == 40000 and t.skippable == n_sk and t.kept_sampled == kept_sk
    assert t.skipped == n_sk - kept_sk and t.forced_kept_by_ceiling == 0


def test_pure_skipping_p0() -> None:
    idx, st = _setup(torch.arange(0, N_ROWS, 2))
    dec = SkipDecider(idx, st, threshold=1.0, keep_probability=0.0)
    ids = torch.arange(100)
    keep, w = dec(_batch(ids))
    assert torch.equal(keep, ids % 2 == 1) and (w == 1).all()
    dec.threshold = 0.0  # nothing is stale at T = 0
    keep, _ = dec(_batch(ids))
    assert keep.all()
    dec.threshold = lambda: None  # a getter; None = no threshold yet
    assert dec(_batch(ids))[0].all()


def test_negatives_only_never_skips_a_click() -> None:
    idx, st = _setup(torch.arange(0, N_ROWS, 2))
    dec = SkipDecider(idx, st, threshold=1.0, keep_probability=0.0, negatives_only=True)
    ids = torch.arange(200)
    batch = _batch(ids)
    batch.labels = (ids % 4 == 0).float()  # every other stale sample is a click
    keep, w = dec(batch)
    stale, click = ids % 2 == 0, ids % 4 == 0
    assert torch.equal(keep, ~(stale & ~click))  # exactly the stale non-clicks are skipped
    assert (w == 1).all() and dec.totals.skippable == 50


def test_random_control_ignores_staleness() -> None:
    # No row is stale and there is no threshold: the control still skips a fraction f of all
    # samples, independently of their ids; negatives_only restricts it to non-clicks.
    idx, st = _setup(torch.zeros(0, dtype=torch.int64))
    f, n = 0.3, 40_000
    dec = SkipDecider(idx, st, threshold=None, random_fraction=f, seed=5)
    ids = torch.arange(n) % N_ROWS
    keep, w = dec(_batch(ids))
    assert (w == 1).all()
    skipped = ~keep
    sigma = math.sqrt(f * (1 - f) / n)
    assert abs(float(skipped.float().mean()) - f) < 4 * sigma
    # independent of the ids: both halves of the id range are skipped at the same rate
    low = ids < N_ROWS // 2
    assert abs(float(skipped[low].float().mean()) - float(skipped[~low].float().mean())) < 8 * sigma
    assert dec.totals.skippable == dec.totals.skipped == int(skipped.sum())

    neg = SkipDecider(idx, st, threshold=None, random_fraction=f, seed=5, negatives_only=True)
    batch = _batch(ids)
    batch.labels = (ids % 4 == 0).float()
    keep_neg, _ = neg(batch)
    assert keep_neg[batch.labels == 1].all()
    # the same draws as the plain control, restricted to non-clicks
    assert torch.equal(~keep_neg, skipped & (batch.labels == 0))
    with pytest.raises(ValueError, match="slipstream.random_skip_fraction"):
        SkipDecider(idx, st, random_fraction=1.5)


@pytest.mark.parametrize("p", [0.0, 0.4])
def test_ceiling_per_window(p: float) -> None:
    idx, st = _setup(torch.arange(0, 800))  # 80% of ids skippable
    window, frac = 100, 0.25
    dec = SkipDecider(idx, st, threshold=1.0, keep_probability=p, max_skip_fraction=frac, window_samples=window, seed=3)
    gen = torch.Generator().manual_seed(1)
    keeps, sks, weights = [], [], []
    for n in [37, 0, 250, 13, 100, 1, 99]:  # batches straddle windows; 500 samples = 5 windows
        ids = torch.randint(0, N_ROWS, (n,), generator=gen)
        keep, w = dec(_batch(ids))
        keeps.append(keep), sks.append(ids < 800), weights.append(w)
    keep, sk, weight = torch.cat(keeps), torch.cat(sks), torch.cat(weights)
    if p == 0:  # no sampling: a naive walk in sample order skips the first 25 skippable samples
        budget = int(frac * window)  # of each window and keeps every later one with weight 1
        want_keep, spent = [], 0
        for i, skippable in enumerate(sk.tolist()):
            spent = 0 if i % window == 0 else spent
            skip = skippable and spent < budget
            spent += skip
            want_keep.append(not skip)
        assert keep.tolist() == want_keep
        assert (weight[keep] == 1).all()
    wins = dec.pop_completed_windows()
    assert [w.index for w in wins] == [0, 1, 2, 3, 4] and dec.pop_completed_windows() == []
    assert dec.current_window.samples == 0
    for i, ws in enumerate(wins):
        k, s = keep[i * window:(i + 1) * window], sk[i * window:(i + 1) * window]
        assert ws.samples == window
        assert ws.skipped == int((~k).sum()) <= frac * window
        assert ws.skippable == int(s.sum())
        assert ws.skipped + ws.kept_sampled + ws.forced_kept_by_ceiling == ws.skippable
        if ws.skippable - ws.kept_sampled >= 25:  # enough candidates: the budget is used up
            assert ws.skipped == 25
        assert ws.forced_kept_by_ceiling > 0


@pytest.mark.parametrize("p, ceiling", [(0.5, 1.0), (0.25, 0.2), (0.7, 0.05)])
def test_unbiased_weights_monte_carlo(p: float, ceiling: float) -> None:
    """E[sum of weights of the kept skippable rows] == number of skippable rows."""
    idx, st = _setup(torch.arange(0, 600))
    gen = torch.Generator().manual_seed(2)
    ids = torch.randint(0, N_ROWS, (256,), generator=gen)
    sk = ids < 600
    dec = SkipDecider(idx, st, threshold=1.0, keep_probability=p, max_skip_fraction=ceiling, window_samples=128, seed=5)
    reps, total = 400, 0.0
    for _ in range(reps):
        keep, w = dec(_batch(ids))
        total += float((w * keep)[sk].sum())
    ratio = total / (reps * int(sk.sum()))
    assert abs(ratio - 1.0) < 0.02, ratio
    if ceiling < 1.0:
        assert dec.totals.forced_kept_by_ceiling > 0


def test_deterministic_and_tracking_only() -> None:
    idx, st = _setup(torch.arange(0, 500))
    kw = dict(threshold=1.0, keep_probability=0.3, max_skip_fraction=0.5, window_samples=64, seed=17)
    a, b = SkipDecider(idx, st, **kw), SkipDecider(idx, st, **kw)
    off = SkipDecider(idx, st, enabled=False, **kw)
    gen = torch.Generator().manual_seed(4)
    for _ in range(5):
        batch = _batch(torch.randint(0, N_ROWS, (100,), generator=gen))
        ka, wa = a(batch)
        kb, wb = b(batch)
        ko, wo = off(batch)
        assert torch.equal(ka, kb) and torch.equal(wa, wb)
        assert ko.all() and (wo == 1).all()
    assert off.totals == a.totals and off.totals.skipped > 0  # would-be skips still counted
    stream = SkippingStream(iter([_batch(torch.arange(50))] * 4), 50, off)
    assert sum(o.batch_size for o in stream) == 200 and stream.samples_skipped == 0


def test_validation_names_config_keys() -> None:
    idx, st = _setup(torch.arange(3))
    cases = [
        (dict(alpha=0.0), "slipstream.alpha"),
        (dict(keep_probability=1.5), "slipstream.keep_probability"),
        (dict(max_skip_fraction=-0.1), "slipstream.max_skip_fraction"),
        (dict(window_samples=0), "slipstream.window_samples"),
        (dict(seed=1.5), "slipstream.seed"),
    ]
    for kw, key in cases:
        with pytest.raises(ValueError, match=key):
            SkipDecider(idx, st, **kw)


def test_eval_logit_offset_only_for_uniform_negative_downsampling() -> None:
    from torch import nn

    from slipstream_rec.slipstream.config import Policy, SlipstreamConfig
    from slipstream_rec.slipstream.controller import SlipstreamController

    def offset(**kw) -> float:
        cfg = SlipstreamConfig(**kw)
        return SlipstreamController(cfg, nn.Linear(1, 1), ["a"], [10], 4, seed=0, rank=0).eval_logit_offset()

    assert offset(policy=Policy.random, random_skip_fraction=0.6, negatives_only=True) == pytest.approx(math.log(0.4))
    assert offset(policy=Policy.random, random_skip_fraction=0.6) == 0.0  # clicks skipped alike: calibrated
    # p > 0: the 1/p weights keep the loss unbiased already
    assert offset(policy=Policy.random, random_skip_fraction=0.6, negatives_only=True, keep_probability=0.5) == 0.0
    assert offset(policy=Policy.off) == 0.0


def test_negative_downsampling_beside_staleness() -> None:
    from slipstream_rec.training.downsampling import NegativeDownsampler

    idx, st = _setup(torch.arange(0, N_ROWS, 2))  # even ids stale
    f = 0.5
    dec = SkipDecider(idx, st, threshold=1.0, keep_probability=0.0, seed=3)
    down = NegativeDownsampler(f, seed=3)
    gen = torch.Generator().manual_seed(1)
    dropped_neg = n_neg_odd = 0
    for _ in range(20):
        ids = torch.randint(0, N_ROWS, (1000,), generator=gen)
        batch = _batch(ids)
        batch.labels = (torch.rand(1000, generator=gen) < 0.25).float()
        keep, w = dec(batch, down.drop_mask(batch.labels))
        stale, click = ids % 2 == 0, batch.labels == 1
        assert not keep[stale].any()  # the policy still skips every stale sample (p = 0)
        assert keep[click & ~stale].all()  # a click is never downsampled
        odd_neg = ~stale & ~click  # only the downsampling decides these
        dropped_neg += int((odd_neg & ~keep).sum())
        n_neg_odd += int(odd_neg.sum())
        assert (w == 1).all()
    sigma = math.sqrt(f * (1 - f) / n_neg_odd)
    assert abs(dropped_neg / n_neg_odd - f) < 4 * sigma
    # the stale samples are counted by the policy only where the downsampling left them
    assert dec.totals.skipped < dec.totals.samples // 2


def test_negative_downsampling_is_calibrated_beside_any_policy() -> None:
    from types import SimpleNamespace

    from torch import nn

    from slipstream_rec.slipstream.config import Policy, SlipstreamConfig
    from slipstream_rec.slipstream.controller import SlipstreamController
    from slipstream_rec.training.downsampling import NegativeDownsampler
    from slipstream_rec.training.trainer import Trainer

    def offset(rate, **kw) -> float:  # what the trainer's evaluation adds, both parts
        ctl = SlipstreamController(SlipstreamConfig(**kw), nn.Linear(1, 1), ["a"], [10], 4, seed=0, rank=0)
        parts = SimpleNamespace(downsampling=NegativeDownsampler(rate, seed=0), slipstream=ctl)
        return Trainer.eval_logit_offset(parts)  # type: ignore[arg-type]

    assert offset(0.5, policy=Policy.off) == pytest.approx(math.log(0.5))
    # downsampled, then the control's uniform non-click skipping on what remains: both undone
    assert offset(0.5, policy=Policy.random, random_skip_fraction=0.6, negatives_only=True) == pytest.approx(
        math.log(0.5) + math.log(0.4)
    )
    assert offset("auto", policy=Policy.off) == 0.0  # nothing decided yet