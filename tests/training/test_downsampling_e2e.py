"""The main job's levers end to end: 2 ranks under torchrun, the serve preset with
``downsampling=auto`` and ``trainer.precision=auto`` on a raw-CTR log (click rate 0.02).

Expected values come from the data files and the definitions (the rule's formula, a binomial
bound on the non-clicks dropped, /proc/cpuinfo read here), not from the code under test.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from tests._fixtures import _torchrun


@pytest.fixture(scope="module")
def raw_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("raw")
    run_dir = root / "run"
    summary = _torchrun(
        run_dir, root / "data", "slipstream=serve", "data.synthetic.base_ctr=0.02",
        "downsampling.guard_steps=5", "trainer.checkpoint.enabled=false",
    )
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return summary, records


def test_the_rule_downsamples_a_raw_log_at_the_rate_its_click_rate_allows(raw_run):
    summary, _ = raw_run
    down = summary["negative_downsampling"]
    rule = down["decisions"][0]
    assert down["setting"] == "auto" and rule["decision"] == "rule" and rule["step"] == 0
    # the look-ahead: 4 batches of 512 on each of the 2 ranks
    assert rule["samples"] == 4 * 512 * 2
    labels = np.load(Path(summary["dataset"]) / "train_labels.npy")
    ctr = float(labels.mean())
    assert abs(rule["click_rate"] - ctr) < 4 * math.sqrt(ctr * (1 - ctr) / rule["samples"])
    c, m = rule["click_rate"], 25.0
    expected = max(f for f in [0.05 * i for i in range(20)] if f == 0 or (1 - f) * (1 - c) / c >= m)
    assert rule["rate_after"] == pytest.approx(expected) and expected > 0


def test_only_non_clicks_are_dropped_and_evaluation_is_offset_by_the_rate(raw_run):
    summary, _ = raw_run
    down = summary["negative_downsampling"]
    rate = down["rate"]
    # serve drops nothing else: every skipped sample is a downsampled non-click
    assert summary["samples_skipped"] == down["negatives_dropped"] > 0
    labels = np.load(Path(summary["dataset"]) / "train_labels.npy")
    negatives_seen = summary["samples_seen"] * (1 - float(labels.mean()))
    sd = math.sqrt(negatives_seen * rate * (1 - rate))
    assert abs(down["negatives_dropped"] - rate * negatives_seen) < 5 * sd + 0.01 * negatives_seen
    assert summary["eval_logit_offset"] == pytest.approx(math.log(1 - rate))
    assert summary["test_ctr"] == pytest.approx(float(np.load(Path(summary["dataset"]) / "test_labels.npy").mean()), rel=1e-5)


def test_the_guard_checks_every_window_on_held_out_samples(raw_run):
    summary, records = raw_run
    guards = [r for r in records if r["kind"] == "downsampling"]
    assert [g["step"] for g in guards] == list(range(5, summary["steps"] + 1, 5))
    assert "first window" in guards[0]["reason"] and guards[0]["rate_after"] == guards[0]["rate_before"]
    for g in guards:
        # each window: 5 steps x 512 x 2 trained samples, scored before their update
        assert g["trained_samples"] == 5 * 512 * 2
        assert 0 < g["negative_share"] < 1
        assert g["added_noise"] == pytest.approx(g["rate_before"] / (1 - g["rate_before"]) * g["negative_share"])
        assert (g["rate_after"] < g["rate_before"]) == (g["added_noise"] > g["max_noise"] and g is not guards[0])


def test_auto_precision_follows_this_machine(raw_run):
    summary, _ = raw_run
    flags = next((line.split(":", 1)[1].split() for line in Path("/proc/cpuinfo").read_text().splitlines()
                  if line.startswith("flags")), [])
    native = "avx512_bf16" in flags or "amx_bf16" in flags
    assert summary["precision"]["requested"] == "auto"
    assert summary["precision"]["chosen"] == ("bf16" if native else "fp32"), summary["precision"]
