"""The network results the docs quote equal their results files: the wire over the training steps
beside the program's count (docs/performance.md) and the step-time model's check (docs/scale.md)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Dict, List, Tuple

import pytest

from tests._markdown import table_rows

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"


def _rows(doc: str, header_start: str) -> List[List[str]]:
    rows = table_rows(doc, header_start)
    assert rows, f"{doc}: no rows under {header_start!r}"
    return rows


def _job(cell: str) -> str:
    return cell.split("(")[0].strip().strip("`").strip()


def test_the_wire_table_quotes_its_runs():
    rows = _rows("docs/performance.md", "| results | nodes | dim | job | wire B / trained sample, training steps")
    current = None
    for cells in rows:
        link = re.search(r"\(\.\./benchmarks/results/([^)]+\.json)\)", cells[0])
        current = link.group(1) if link else current
        assert current, cells
        table = json.loads((RESULTS / current).read_text())["table"]
        rate = "none" if any(r["rate"] == "none" for r in table) else table[0]["rate"]
        (row,) = [r for r in table if r["job"] == _job(cells[3]) and r["rate"] == rate]
        assert int(cells[1]) == len(json.loads((RESULTS / current).read_text())["nodes"])
        assert float(cells[4]) == round(row["wire_train_bytes_per_sample"]), cells
        assert float(cells[5]) == round(row["program_off_rank_bytes_per_sample"]["total"]), cells
        assert float(cells[6]) == round(row["wire_train_over_program"], 3), cells
        assert float(cells[7]) == round(row["wire_train_minus_dense_bytes_per_sample"]), cells
        # the claim of the paragraph below the table: within 0.3-3.1%
        assert 1.0 <= row["wire_train_over_program"] <= 1.031


def _check_rows() -> Dict[Tuple[int, str, str, str], dict]:
    doc = json.loads((RESULTS / "step_model_check.json").read_text())
    out = {}
    for r in doc["rows"]:
        dim = re.search(r"dim(\d+)", Path(r["file"]).name).group(1)
        out[(r["nodes"], dim, r["rate"], r["job"])] = r
    return out


def test_the_step_model_check_quotes_its_results():
    rows = _rows("docs/scale.md", "| nodes | dim | link | job | unshaped ms / step")
    mine = _check_rows()
    assert len(rows) == len(mine)
    for cells in rows:
        r = mine[(int(cells[0]), cells[1], cells[2], _job(cells[3]))]
        assert [float(c) for c in cells[4:7]] == [round(r[k], 1) for k in ("unshaped_ms", "measured_ms", "predicted_ms")]
        assert cells[7] == f"{r['error']:+.1%}"
    errors = [abs(r["error"]) for r in mine.values()]
    text = (ROOT / "docs/scale.md").read_text()
    assert f"|error| {sum(errors) / len(errors):.1%} over {len(errors)} runs" in text
    assert f"within 10% on {sum(e <= 0.10 for e in errors)}" in text


@pytest.mark.parametrize("name", ["step_model_check.json"])
def test_the_model_s_results_hold_their_command(name):
    assert "step_model.py check" in json.loads((RESULTS / name).read_text())["command"]


def test_the_step_model_predictions_quote_their_results():
    rows = _rows("docs/scale.md", "| fabric | job | exposed communication ms / step")
    doc = json.loads((RESULTS / "step_model_predictions.json").read_text())
    mine = {(r["fabric"], r["job"]): r for r in doc["rows"]}
    assert len(rows) == len(mine)
    for cells in rows:
        r = mine[(cells[0], cells[1].strip("`"))]
        assert [float(c) for c in cells[2:5]] == [round(r[k], 3) for k in ("comm_ms", "compute_ms", "step_ms")]
        assert cells[5] == f"{r['speedup_vs_off']:.2f}x"
        # the compute was set so that off's exposed communication is the published share
        if r["job"] == "off":
            assert r["comm_ms"] / r["step_ms"] == pytest.approx(r["published_share"], abs=1e-3)


_JOBS = {"slipstream=off": "off", "slipstream=serve slipstream.serve_when=always": "serve_always", "defaults": "defaults"}


def _job_rows(header: str, name: str, seconds: int, ratio: int, job_of=lambda cell: _JOBS[_job(cell)]):
    """Each row of the docs' table under ``header`` beside its job's table row and run of
    results file ``name`` (the job named by ``job_of`` of the row's first cell; by default off,
    serve-always and the defaults as ``_JOBS`` names them), its train seconds (column
    ``seconds``, then the speed against off's) and its embedding side on the wire against off's
    (column ``ratio``) checked; the rows, runs and off's row for the table's other columns."""
    rows = _rows("docs/slipstream.md", header)
    doc = json.loads((RESULTS / name).read_text())
    by_job = {r["job"]: r for r in doc["table"]}
    runs = {r["job"]: r for r in doc["runs"]}
    off = by_job["off"]
    out = []
    for cells in rows:
        job = job_of(cells[0])
        row, run = by_job[job], runs[job]
        assert float(cells[seconds]) == round(row["train_seconds"], 1), cells
        if job != "off":
            assert cells[seconds + 1] == f"{off['train_seconds'] / row['train_seconds']:.3f}x", cells
            wire = row["wire_train_minus_dense_bytes_per_sample"] / off["wire_train_minus_dense_bytes_per_sample"]
            assert float(cells[ratio]) == round(wire, 3), cells
        out.append((cells, job, row, run))
    return out, runs, off


def test_the_per_feature_table_quotes_its_run():
    header = "| job | train s | vs `off` | lookups served | slots | wire over the training steps"
    rows, _, _ = _job_rows(header, "network_per_feature_clicklog_dim128.json", seconds=1, ratio=7)
    assert len(rows) == 3
    for cells, _, row, run in rows:
        assert float(cells[3]) == round(run["served_fraction"], 3) and float(cells[4]) == round(run["slots_fraction"], 3), cells
        assert float(cells[5]) == round(row["wire_train_bytes_per_sample"]), cells
        assert float(cells[6]) == round(row["wire_train_minus_dense_bytes_per_sample"]), cells
        assert float(cells[8]) == round(row["wire_train_over_program"], 3), cells
        assert float(cells[9]) == round(row["test_auc"], 4), cells


@pytest.mark.parametrize(
    "header, name",
    [
        ("| job | train s | vs `off` | slots | its embedding side on the wire", "network_host_memory_clicklog_dim128.json"),
        ("| job | train s | vs `off` | slots | the embedding side on the wire", "network_two_layouts_clicklog_dim128.json"),
    ],
)
def test_the_host_memory_and_two_layout_tables_quote_their_runs(header, name):
    rows, runs, off = _job_rows(header, name, seconds=1, ratio=5)
    assert len(rows) == 3
    for cells, job, row, run in rows:
        assert float(cells[3]) == round(run["slots_fraction"], 3), cells
        assert float(cells[4]) == round(row["wire_train_minus_dense_bytes_per_sample"]), cells
        if job != "off":
            assert float(cells[6]) == round(row["test_auc"] - off["test_auc"], 4), cells
    # every job trained in the same precision, so the ratios compare the policy alone
    assert {run["precision"]["chosen"] for run in runs.values()} == {"bf16"}


def test_the_unserved_layout_comparison_quotes_its_run():
    doc = json.loads((RESULTS / "network_unserved_layout_dim128.json").read_text())
    by_job = {r["job"]: r for r in doc["table"]}
    runs = {r["job"]: r for r in doc["runs"]}
    assert runs["nostale"]["served_fraction"] == 0.0 and runs["nostale"]["slots_fraction"] == 1.0
    text = " ".join((ROOT / "docs/slipstream.md").read_text().split())
    off, nostale = by_job["off"], by_job["nostale"]
    assert (
        f"`off` {off['train_seconds']:.1f} s, nothing served {nostale['train_seconds']:.1f} s, "
        f"{off['wire_bytes_per_sample']:,.0f} and {nostale['wire_bytes_per_sample']:,.0f} wire bytes per sample"
    ) in text


def test_the_warm_up_and_sync_table_quotes_its_run():
    """The table of the hot set counted over 20 steps instead of 100, with pushes and syncs every
    25 steps or a replica bound, against off and serve-always of the same run."""
    name = "network_warmup_clicklog_dim128.json"
    header = "| job | its overrides | train s | vs `off` | slots | push + replica"
    rows, runs, off = _job_rows(header, name, seconds=2, ratio=7, job_of=_job)
    jobs = json.loads((RESULTS / name).read_text())["jobs"]
    assert [job for _, job, _, _ in rows] == list(runs)
    for cells, job, row, run in rows:
        assert cells[1] == f"`{' '.join(jobs[job])}`", cells
        assert float(cells[4]) == round(run["slots_fraction"], 3), cells
        program = run["program_off_rank_bytes_per_sample"]
        assert float(cells[5]) == round(program["push"] + program["replica"]), cells
        assert float(cells[6]) == round(row["wire_train_minus_dense_bytes_per_sample"]), cells
        if job != "off":
            assert float(cells[8]) == round(row["test_auc"] - off["test_auc"], 4), cells
    assert {run["precision"]["chosen"] for run in runs.values()} == {"bf16"}


def test_the_half_width_sync_table_quotes_its_run():
    """The table of sync_precision=bf16 beside fp32 syncs, both counted over 20 steps, and off."""
    name = "network_sync_bf16_clicklog_dim128.json"
    header = "| job | its overrides | train s | vs `off` | push, B / sample | replica, B / sample"
    rows, runs, off = _job_rows(header, name, seconds=2, ratio=7, job_of=_job)
    jobs = json.loads((RESULTS / name).read_text())["jobs"]
    assert [job for _, job, _, _ in rows] == list(runs) == ["off", "early", "early_bf16"]
    for cells, job, row, run in rows:
        assert cells[1] == f"`{' '.join(jobs[job])}`", cells
        program = run["program_off_rank_bytes_per_sample"]
        assert float(cells[4]) == round(program["push"]) and float(cells[5]) == round(program["replica"]), cells
        assert float(cells[6]) == round(row["wire_train_minus_dense_bytes_per_sample"]), cells
        assert float(cells[8]) == round(row["wire_train_over_program"], 3), cells
        if job != "off":
            assert float(cells[9]) == round(row["test_auc"] - off["test_auc"], 4), cells
    assert {run["precision"]["chosen"] for run in runs.values()} == {"bf16"}


def test_the_preset_defaults_table_quotes_its_run():
    """The main job's defaults with the 20-step count and bf16 syncs against off, one run."""
    name = "network_preset_defaults_clicklog_dim128.json"
    header = "| job | the preset | train s | vs `off` | slots | served | the embedding side on the wire"
    rows, runs, off = _job_rows(header, name, seconds=2, ratio=7)
    assert [job for _, job, _, _ in rows] == list(runs) == ["off", "defaults"]
    for cells, job, row, run in rows:
        assert float(cells[4]) == round(run["slots_fraction"], 3) and float(cells[5]) == round(run["served_fraction"], 3), cells
        assert float(cells[6]) == round(row["wire_train_minus_dense_bytes_per_sample"]), cells
        if job != "off":
            assert float(cells[8]) == round(row["test_auc"] - off["test_auc"], 4), cells
            assert run["serve_lever"]["serve_when"] == "auto", run["serve_lever"]
    assert {run["precision"]["chosen"] for run in runs.values()} == {"bf16"}
