"""The comparison table compares runs of one dataset and split only (issue 32): two runs of
different data are not a speedup and a quality cost; the report says so and shows n/a."""

from __future__ import annotations

import re

from slipstream_rec.report.cli import main as report_main
from slipstream_rec.report.compare import comparison_rows
from slipstream_rec.report.runs import assign_labels, load_run

from tests.report.recorded import write_run


def _summary_row(html_text: str, label: str) -> str:
    table = html_text.split('id="summary-table"', 1)[1].split("</table>", 1)[0]
    return next(r for r in table.split("<tr") if f">{label}<" in r)


def test_runs_of_different_datasets_show_na_and_say_why(tmp_path, capsys):
    write_run(tmp_path / "a", ["experiment=smoke"], test_auc=0.70, train_seconds=50.0)
    write_run(tmp_path / "b", ["experiment=smoke", "data.synthetic.zipf_exponent=1.3"], test_auc=0.99,
              train_seconds=10.0)
    write_run(tmp_path / "c", ["experiment=smoke", "trainer.seed=1"], test_auc=0.72, train_seconds=25.0)
    assert report_main([str(tmp_path / r) for r in "abc"] + ["-o", str(tmp_path / "out")]) == 0
    err = capsys.readouterr().err
    notes = [l for l in err.splitlines() if "another dataset" in l]
    assert len(notes) == 1 and "data.synthetic.zipf_exponent=1.3 vs" in notes[0] and "n/a" in notes[0], err

    runs = [load_run(tmp_path / r) for r in "abc"]
    assign_labels(runs)
    rows = comparison_rows(runs)
    assert rows[1]["speedup"] is None and rows[1]["dauc"] is None and rows[1]["efficiency"] is None
    assert rows[1]["test_auc"] == 0.99  # its own figures stay
    # the same dataset (another seed) is still compared
    assert abs(rows[2]["speedup"] - 2.0) < 1e-12 and abs(rows[2]["dauc"] - 0.02) < 1e-12

    page = (tmp_path / "out" / "report.html").read_text()
    row_b = _summary_row(page, runs[1].label)
    assert "another dataset or split" in row_b and "zipf_exponent" in row_b
    assert "5.000" not in row_b and "+0.2900" not in row_b, row_b
    assert re.search(r"2\.000", _summary_row(page, runs[2].label))


def test_the_settings_of_an_unused_data_source_do_not_make_another_dataset(tmp_path, capsys):
    write_run(tmp_path / "a", ["experiment=smoke"], test_auc=0.70, train_seconds=50.0)
    write_run(tmp_path / "b", ["experiment=smoke", "data.clicklog.base_ctr=0.02"], test_auc=0.71, train_seconds=25.0)
    runs = [load_run(tmp_path / r) for r in "ab"]
    assign_labels(runs)
    rows = comparison_rows(runs)
    assert rows[1]["other_dataset"] is None and abs(rows[1]["speedup"] - 2.0) < 1e-12
