"""The report's levers section: precision, negative downsampling's decisions, calibration."""

from __future__ import annotations

from pathlib import Path

import pytest

from slipstream_rec.report import downsampling
from slipstream_rec.report.html import build
from slipstream_rec.report.runs import Run

RULE = {"step": 0, "decision": "rule", "rate_before": 0.0, "rate_after": 0.5, "click_rate": 0.0192,
        "samples": 16384, "reason": "click rate 0.0192: rate 0.50"}
GUARD = {"kind": "downsampling", "step": 200, "decision": "guard", "rate_before": 0.5, "rate_after": 0.45,
         "negative_share": 0.06, "added_noise": 0.06, "max_noise": 0.05, "observed_ctr": 0.0195,
         "predicted_ctr": 0.0197, "reason": "added noise 0.0600 > max_noise 0.05: backed off"}


def _run(label: str, summary: dict, records: list) -> Run:
    return Run(path=Path(label), label=label, summary=summary, records=records)


def test_rows_per_run_and_every_decision_in_step_order():
    auto = _run("auto", {
        "precision": {"requested": "auto", "chosen": "bf16", "reason": "auto: bf16, CPU has avx512_bf16"},
        "negative_downsampling": {"setting": "auto", "rate": 0.45, "decisions": [RULE, GUARD], "negatives_dropped": 1000},
        "test_ctr": 0.02, "test_predicted_ctr": 0.021,
    }, [{"kind": "train", "step": 100}, GUARD])
    older = _run("older", {"test_auc": 0.7}, [])  # a summary from before these fields: no row
    rows = downsampling.run_rows([auto, older])
    assert rows == [["auto", "bf16", "auto: bf16, CPU has avx512_bf16", "auto", 0.45, 1000, 0.02, 0.021,
                     pytest.approx(1.05)]]
    guard = downsampling.guard_rows([auto, older])
    assert [(r[1], r[2], r[3], r[4]) for r in guard] == [(0, "rule", 0.0, 0.5), (200, "guard", 0.5, 0.45)]
    assert guard[0][8] == 0.0192 and guard[1][8] == 0.0195  # the rule's click rate, the guard's observed CTR


def test_the_html_shows_the_section_only_for_runs_that_record_it():
    auto = _run("auto", {
        "precision": {"requested": "auto", "chosen": "fp32", "reason": "auto: fp32, no flags"},
        "negative_downsampling": {"setting": 0.0, "rate": 0.0, "decisions": [], "negatives_dropped": 0},
        "test_ctr": 0.25, "test_predicted_ctr": None,
    }, [])
    html = build([auto])["html"]
    assert 'id="levers-table"' in html and "auto: fp32, no flags" in html and 'id="guard-table"' not in html
    assert 'id="levers-table"' not in build([_run("older", {"test_auc": 0.7}, [])])["html"]


def test_the_serve_levers_decisions_are_listed_per_run():
    down = {"step": 250, "from": "probe_off", "to": "down", "serving_ms_per_step": 39.4,
            "standing_down_ms_per_step": 31.7, "reason": "serving 39.4 ms per step against 31.7 ms without"}
    auto = _run("serve", {
        "precision": {"requested": "auto", "chosen": "bf16", "reason": "auto: bf16, timed"},
        "serve_lever": {"serve_when": "auto", "state": "down", "decisions": [down]},
    }, [])
    always = _run("always", {"precision": {"chosen": "fp32"}, "serve_lever": {"serve_when": "always", "decisions": []}}, [])
    assert downsampling.serve_rows([auto, always]) == [
        ["serve", 250, "probe_off", "down", 39.4, 31.7, "serving 39.4 ms per step against 31.7 ms without"]]
    html = build([auto, always])["html"]
    assert 'id="serve-lever-table"' in html and "31.70" in html
    assert 'id="serve-lever-table"' not in build([always])["html"]
