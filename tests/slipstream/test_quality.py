"""The quality check: the target D steered by how well the skip candidates are predicted.

The governor's rule on exact statistics, then the controller on 2 gloo ranks with a real sharded
model: a scorer under which the skip candidates are as hard as the rest drives D to 0, one under
which they are easy raises it back to the maximum, every decision is the same on both ranks, and
the state survives a state_dict round trip. (Resuming a whole run with the check on, bit for bit,
is tests/checkpoint/test_resume.py: paper_plus has it on.)
"""

from __future__ import annotations

import math

import pytest
import torch

from slipstream_rec.slipstream.config import Policy, SlipstreamConfig
from slipstream_rec.slipstream.quality import QualityGovernor, QualityStats, group_stats
from tests._fixtures import LOCAL_BATCH, WORLD
from tests.dist_harness import run_workers


def _stats(cand_losses, other_losses) -> QualityStats:
    losses = torch.tensor([*cand_losses, *other_losses], dtype=torch.float64)
    mask = torch.tensor([True] * len(cand_losses) + [False] * len(other_losses))
    return group_stats(losses, mask)


def test_group_stats_are_sums_per_group():
    s = _stats([1.0, 3.0], [2.0])
    assert (s.n_c, s.sum_c, s.sumsq_c, s.n_o, s.sum_o, s.sumsq_o) == (2, 4, 10, 1, 2, 4)
    assert QualityStats.from_tensor(s.to_tensor()) == s


def test_as_hard_as_the_rest_lowers_to_zero_and_stays():
    gen = torch.Generator().manual_seed(0)
    g = QualityGovernor(max_target=0.3, step=0.1, min_gain=0.1, z=2.0, min_samples=10)
    targets = []
    for step in range(5):
        same = torch.rand(2000, generator=gen).tolist()
        targets.append(g.update(_stats(same[:1000], same[1000:]), step)["target_after"])
    assert targets == [0.2, 0.1, 0.0, 0.0, 0.0]
    assert g.last["better"] is False and "not measurably better" in g.last["reason"]


def test_easy_candidates_raise_back_to_the_maximum_only():
    g = QualityGovernor(max_target=0.3, step=0.1, min_gain=0.1, z=2.0, min_samples=10)
    g.target = 0.0
    easy, hard = [0.1 + 0.01 * (i % 5) for i in range(500)], [0.6 + 0.01 * (i % 5) for i in range(500)]
    targets = [g.update(_stats(easy, hard), s)["target_after"] for s in range(5)]
    assert targets == [0.1, 0.2, 0.3, 0.3, 0.3]
    assert g.last["better"] is True and g.last["gain"] == pytest.approx(1 - 0.12 / 0.62)


def test_the_gain_must_clear_the_margin_and_the_noise():
    # 8% better is below min_gain 0.1: lower, however many samples.
    g = QualityGovernor(max_target=0.3, step=0.1, min_gain=0.1, z=2.0, min_samples=10)
    assert g.update(_stats([0.46] * 5000 + [0.47] * 5000, [0.5] * 5000 + [0.51] * 5000), 0)["better"] is False
    # 30% better on average but on 12 noisy samples per group: not measurable at z = 2.
    g = QualityGovernor(max_target=0.3, step=0.1, min_gain=0.1, z=2.0, min_samples=10)
    noisy_c = [0.05, 1.2] * 6
    noisy_o = [0.2, 1.5] * 6
    assert g.update(_stats(noisy_c, noisy_o), 0)["better"] is False
    # the same means with no noise: measurable.
    g = QualityGovernor(max_target=0.3, step=0.1, min_gain=0.1, z=2.0, min_samples=10)
    assert g.update(_stats([0.625] * 12, [0.85] * 12), 0)["better"] is True


def test_too_few_candidates_is_no_evidence():
    g = QualityGovernor(max_target=0.3, step=0.1, min_gain=0.1, z=2.0, min_samples=100)
    rec = g.update(_stats([0.01] * 99, [0.7] * 1000), 0)
    assert rec["better"] is False and "too few" in rec["reason"] and g.target == pytest.approx(0.2)


def test_state_dict_round_trip():
    g = QualityGovernor(max_target=0.3, step=0.1, min_gain=0.1, z=2.0, min_samples=10)
    g.update(_stats([0.5] * 100, [0.5] * 100), 7)
    h = QualityGovernor(max_target=0.3, step=0.1, min_gain=0.1, z=2.0, min_samples=10)
    h.load_state_dict(g.state_dict())
    assert h.state_dict() == g.state_dict() and h.target == pytest.approx(0.2)


@pytest.mark.parametrize(
    "overrides, key",
    [
        (dict(quality_check=True, policy=Policy.random, random_skip_fraction=0.1), "quality_check"),
        (dict(quality_check=True, policy=Policy.paper, refresh_threshold=False), "quality_check"),
        (dict(quality_min_gain=1.0), "quality_min_gain"),
        (dict(quality_step=0.0), "quality_step"),
        (dict(quality_min_samples=1), "quality_min_samples"),
    ],
)
def test_config_rejects_bad_quality_settings(overrides, key):
    cfg = SlipstreamConfig(**{"policy": Policy.paper_plus, **overrides})
    with pytest.raises(ValueError, match=rf"slipstream\.{key}="):
        cfg.validate()


# ---- the controller on 2 ranks ---------------------------------------------------------------

MAX_D = 0.5


def quality_worker(env, modes):
    """Steps with a snapshot every 2 steps; before each threshold refresh the scorer plays
    ``modes[i]`` at the i-th check: "hard" (every input gets logit 0), "easy" (the skip
    candidates, recomputed here independently, get a confident correct logit), or "model" (the
    real sharded forward)."""
    from slipstream_rec.distributed import gather_varlen
    from slipstream_rec.slipstream.classify import per_sample_max_change, skippable_by_threshold
    from slipstream_rec.slipstream.threshold import threshold_for_target
    from slipstream_rec.slipstream.controller import SlipstreamController
    from tests._fixtures import FEATURES, ROWS
    from tests.slipstream._fixtures import _sharded, _source

    dmp, modules = _sharded("row_wise")
    cfg = SlipstreamConfig(
        policy=Policy.paper_plus, count_steps=2, count_fraction=0.5, min_count=1, snapshot_interval=2,
        target_skip_fraction=MAX_D, max_threshold=10.0, keep_probability=0.0,
        threshold_sample_size=1000, quality_sample_size=1000, lookahead_batches=2,
        quality_check=True, quality_step=0.2, quality_min_gain=0.1, quality_z=2.0, quality_min_samples=2,
    )
    cfg.validate()
    ctl = SlipstreamController(cfg, dmp, FEATURES, ROWS, LOCAL_BATCH, seed=0, rank=env.rank)
    checks = iter(modes)
    model_ref = {}

    def scorer(batch):
        mode = next(checks)
        values = gather_varlen(per_sample_max_change(batch.sparse_features, ctl.index, ctl.row_state))
        t_max, _ = threshold_for_target(values, MAX_D, cfg.max_threshold)
        cand = skippable_by_threshold(batch.sparse_features, ctl.index, ctl.row_state, t_max, 1.0)
        if mode == "model":
            dmp.eval()
            with torch.no_grad():
                _, (_, logits, _, _) = dmp(batch)
            dmp.train()
            # the reference decision, from both ranks' per-sample log losses
            losses = torch.nn.functional.binary_cross_entropy_with_logits(
                logits.detach().float().view(-1), batch.labels.view(-1).float(), reduction="none")
            model_ref["losses"] = gather_varlen(losses.double())
            model_ref["cand"] = gather_varlen(cand.to(torch.int64)).bool()
            return logits
        sign = batch.labels.view(-1) * 2 - 1
        if mode == "easy":
            return torch.where(cand, 6.0 * sign, torch.zeros_like(sign))
        return torch.zeros(batch.batch_size)

    ctl.bind(scorer=scorer, clock=lambda: 0.0)
    stream = ctl.wrap(_source(env.rank, batches=80))  # up to D = 0.5 skipped: room to spare
    decisions = []
    for step in range(1, 2 * len(modes) + 3):
        batch = next(stream)
        loss, _ = dmp(batch)
        loss.backward()
        with torch.no_grad():  # hot rows of f0 keep moving a lot, the others barely: a spread
            for m in modules:
                for u in m.units:
                    if u.hot_rows is not None and u.hot_rows.numel():
                        u.weights[u.hot_rows, 0] += 0.5 if u.feature == "f0" else 0.001 * step
        record = dict(ctl.on_step_end(step)).get("slipstream")
        if record is not None and "quality" in record:
            q = record["quality"]
            decisions.append((q["step"], q["better"], q["target_after"], q["n_c"], q["n_o"], q["target_before"]))
            assert record["target_skip_fraction"] == q["target_after"]
    state = ctl.state_dict()
    fresh = SlipstreamController(cfg, _sharded("row_wise")[0], FEATURES, ROWS, LOCAL_BATCH, seed=0, rank=env.rank)
    fresh.load_state_dict(state)
    assert fresh.target_skip_fraction() == ctl.target_skip_fraction()
    assert fresh.quality.state_dict() == ctl.quality.state_dict()
    if "losses" in model_ref:  # the documented rule: candidates' mean loss below (1 - min_gain)
        l, c = model_ref["losses"], model_ref["cand"]  # times the others' by more than z se
        lc, lo = l[c], l[~c]
        se = math.sqrt(float(lc.var()) / lc.numel() + float(lo.var()) / lo.numel())
        better = (1 - cfg.quality_min_gain) * float(lo.mean()) - float(lc.mean()) > cfg.quality_z * se
        decisions.append(("reference", better, int(c.sum()), int((~c).sum())))
    return decisions


def test_controller_steers_d_identically_on_every_rank():
    modes = ["hard", "hard", "hard", "easy", "easy", "easy", "easy", "model"]
    results = run_workers(quality_worker, WORLD, modes=modes)
    assert results[0] == results[1], "ranks took different quality decisions"
    decisions = results[0]
    ref = decisions.pop()  # the reference decision for the last ("model") check
    assert len(decisions) == len(modes)
    targets = [d[2] for d in decisions]
    # hard: 0.5 -> 0.3 -> 0.1 -> 0.0; easy: back up in steps of 0.2 to the ceiling 0.5
    assert targets[:7] == [pytest.approx(v) for v in (0.3, 0.1, 0.0, 0.2, 0.4, 0.5, 0.5)]
    assert [d[1] for d in decisions[:7]] == [False] * 3 + [True] * 4
    assert all(d[3] >= 2 and d[4] >= 2 for d in decisions), "each group must be measured"
    # the real forward decided: as the documented rule decides on the same losses, from D = 0.5
    model = decisions[-1]
    assert ref[0] == "reference" and (model[3], model[4]) == (ref[2], ref[3])
    assert model[1] == ref[1] and model[5] == pytest.approx(MAX_D)
    assert model[2] == pytest.approx(MAX_D if ref[1] else MAX_D - 0.2)
