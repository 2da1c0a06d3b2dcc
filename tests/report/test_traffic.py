"""The report's embedding-traffic section: the bytes, served fraction and hot-set turnover that
the runs' summaries hold, in the HTML table and its data (values written by the test)."""

from __future__ import annotations

import json
import re

from slipstream_rec.report import html
from slipstream_rec.report.runs import load_run
from tests.report.recorded import write_run


def _with(run_dir, **fields):
    path = run_dir / "summary.json"
    summary = json.loads(path.read_text())
    summary.update(fields)
    path.write_text(json.dumps(summary))


def test_traffic_table_shows_each_runs_bytes_and_the_hot_set_turnover(tmp_path):
    write_run(tmp_path / "off", ["slipstream=off"], 0.76, 100.0)
    write_run(tmp_path / "serve", ["slipstream=serve"], 0.7598, 95.0, policy="paper_plus")
    _with(tmp_path / "off", a2a_bytes_per_sample={"input": 176.0, "output": 1408.0, "gradient": 704.0, "total": 2288.0},
          served_fraction=0.0, rows_updated_per_step=14000.0, replica=None)
    _with(tmp_path / "serve", a2a_bytes_per_sample={"input": 96.0, "output": 770.0, "gradient": 400.0, "push": 30.0,
                                                    "replica": 23.5, "control": 0.5, "tracking": 12.0, "dense": 100.0,
                                                    "data_parallel": 0.0, "embedding": 1266.0, "total": 1432.0},
          qcomms={"forward_on_wire": "fp16", "backward_on_wire": "fp16"}, ddp_comm_hook={"hook": "bf16"},
          served_fraction=0.5, rows_updated_per_step=10000.0, replica={"rows": 70000, "sync_bytes_per_sample": 23.5},
          off_rank_bytes_per_sample={"total": 760.0}, wire={"bytes_per_sample": 775.2, "wire_over_program": 1.02},
          slipstream={"hot_turnover": [{"step": 300, "hot_rows": 72000, "joined": 34000, "left": 8000}]})
    runs = [load_run(tmp_path / "off"), load_run(tmp_path / "serve")]
    for run, label in zip(runs, ("off", "serve")):
        run.label = label
    out = html.build(runs)
    table = out["html"][out["html"].index('id="traffic-table"'):]
    cells = [re.sub(r"<[^>]+>", "", c) for c in re.findall(r"<td[^>]*>(.*?)</td>", table.split("</table>")[0])]
    # off: an older summary (no push ... data_parallel, no comms); serve: every kind
    # (off has no off-rank count and no wire: n/a; serve's wire was read beside its program's count)
    assert cells[:20] == ["off", "0.000", "176.0", "1408.0", "704.0", "n/a", "n/a", "n/a", "n/a", "n/a", "n/a",
                          "2288.0", "1.000", "n/a", "n/a", "n/a", "n/a", "n/a", "14000.0", "serve"]
    assert cells[20:38] == ["0.500", "96.0", "770.0", "400.0", "30.0", "23.5", "0.5", "12.0", "100.0", "0.0", "1432.0",
                            f"{1432 / 2288:.3f}", "760.0", "775.2", "1.020", "embeddings fp16/fp16, DDP hook bf16",
                            "70,000", "10000.0"]
    turnover = out["html"][out["html"].index('id="turnover-table"'):].split("</table>")[0]
    assert [re.sub(r"<[^>]+>", "", c) for c in re.findall(r"<td[^>]*>(.*?)</td>", turnover)] == [
        "serve", "300", "72,000", "34,000", "8,000"]


def test_runs_without_byte_counts_have_no_traffic_section(tmp_path):
    write_run(tmp_path / "off", ["slipstream=off"], 0.76, 100.0)
    assert 'id="traffic"' not in html.build([load_run(tmp_path / "off")])["html"]


def test_the_comms_cell_says_what_the_auto_probe_kept():
    from slipstream_rec.report.traffic import comms

    q = {"forward_on_wire": "fp16", "backward_on_wire": "fp16", "when": "auto", "chosen": "fp32",
         "reason": "auto: fp32, timed on this run: quantized 30.0 ms per step against fp32 30.5 ms (+1.6% faster)",
         "probe": {"fp32_ms_per_step": 30.5, "quantized_ms_per_step": 30.04, "steps_each": 8, "min_gain": 0.05}}
    hook = {"hook": "fp16"}
    assert comms({"qcomms": q, "ddp_comm_hook": hook}) == (
        "embeddings fp16/fp16, DDP hook fp16 (auto: fp32 kept; fp32 30.5 / quantized 30.0 ms per step, 8 steps each)")
    assert comms({"qcomms": {**q, "when": "always"}, "ddp_comm_hook": hook}) == "embeddings fp16/fp16, DDP hook fp16"
    assert comms({"qcomms": {**q, "probe": {}}, "ddp_comm_hook": hook}).endswith("(auto: fp32 kept; the probe did not finish)")
    guard = {"checks": 3, "tripped_at": 300, "worst": {"forward": {"error": 2.1e-4, "lost": 0.0},
                                                       "backward": {"error": 5.4e-4, "lost": 0.0041}}}  # fmt: skip
    assert comms({"qcomms": {**q, "guard": guard}, "ddp_comm_hook": hook}).endswith(
        "8 steps each; guard: 3 checks, error up to 0.00054, lost up to 0.0041, fp32 from step 301)")
    one = {**guard, "checks": 1}
    assert "; guard: 1 check, error" in comms({"qcomms": {**q, "guard": one}, "ddp_comm_hook": hook})
    kept = {**guard, "tripped_at": None}
    assert comms({"qcomms": {**q, "chosen": "quantized", "guard": kept}, "ddp_comm_hook": hook}).endswith(
        "(auto: quantized kept; fp32 30.5 / quantized 30.0 ms per step, 8 steps each; guard: 3 checks, error up to "
        "0.00054, lost up to 0.0041)")
