"""Assemble report.html (self-contained: CSS inline, figures as base64 PNG) and the PNG files.

Section ids (stable, for links and tests): ``frontier`` (first, where runs share a dataset and
seeds with ``off``: the frontier figure and the table of paired results), ``runs``, ``summary``,
``config-diff``, ``accuracy`` (curves, or the final metrics where no run has a curve),
``skipping``, ``rows-per-table``, ``change-distribution``, ``time-breakdown``. The comparison
figures and the paired results are also embedded as JSON in
``<script type="application/json" id="report-data">``; the frontier's data is written as
``frontier.csv`` and the paired table as ``paired_results.md`` beside the PNGs.
"""

from __future__ import annotations

import base64
import datetime as _dt
import html
import json
import math
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

from slipstream_rec.report import downsampling, figures, frontier, paired, traffic
from slipstream_rec.report.compare import comparison_rows, config_diff, show
from slipstream_rec.report.runs import Run

CSS = """
body { font-family: -apple-system, 'Segoe UI', Helvetica, Arial, sans-serif; margin: 2em; color: #222; }
h1 { margin-bottom: 0.2em; } h2 { margin-top: 1.8em; border-bottom: 1px solid #ddd; }
table { border-collapse: collapse; margin: 0.8em 0; font-size: 0.9em; }
th, td { border: 1px solid #ccc; padding: 0.25em 0.6em; text-align: right; vertical-align: top; }
th { background: #f2f2f2; } td.l, th.l { text-align: left; }
.incomplete { background: #fff3e0; } .note { color: #8a5a00; } .muted { color: #777; }
img { max-width: 100%; border: 1px solid #eee; margin: 0.5em 0; }
code { background: #f5f5f5; padding: 0 0.2em; }
"""


FRONTIER_INTRO = (
    "Each policy's runs paired with the <code>off</code> run of the same dataset and seed (same config apart "
    "from <code>slipstream.*</code>, the seed and operational keys). x: speedup = off's train seconds / the "
    "run's (evaluations excluded); y: the run's test AUC minus off's. Filled marker: the means over the seeds "
    "(bar: the 95% interval of the AUC difference, Student's t, drawn from 3 seeds on; the table has both "
    "intervals), small dots: the seeds, hollow marker: the ideal speedup 1 / (1 - skip fraction), which a "
    "measured speedup exceeds only through timing noise (other jobs on the machine); X, in a lighter shade of "
    "its policy's color: a control (<code>random@POLICY</code> skips as many samples at random from the same "
    "step; <code>negative_sampling</code> is the downsampling of a <code>*_negatives</code> policy alone). "
    "Shaded: the target, paired test AUC at most 0.001 below off. The table holds the same "
    "numbers (<code>frontier.csv</code> the figure's data, <code>paired_results.md</code> the table); "
    "<code>benchmarks/slipstream_policies.py</code> prints them from the same code "
    "(<code>slipstream_rec.report.paired</code>).")


def _e(value: Any) -> str:
    return html.escape(str(value))


def fmt(value: Any, spec: str = "") -> str:
    """A number for the tables; ``n/a`` where it is missing."""
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "n/a"
    if spec == "int":
        return f"{int(value):,}"
    if spec == "signed":
        return f"{value:+.4f}"
    return format(value, spec) if spec else str(value)


def _text(value: Any) -> str:
    """A text cell, ``n/a`` where it is missing."""
    return "n/a" if value is None else _e(str(value))


def _cells(rows: Sequence[Sequence[Any]], spec: Sequence[str]) -> List[List[str]]:
    """Table rows as HTML cells: the first column (the run's label) escaped, each other value
    formatted by its ``spec`` entry ("" for text, else a ``fmt`` format)."""
    return [[_e(r[0])] + [_text(v) if f == "" else fmt(v, f) for v, f in zip(r[1:], spec[1:])] for r in rows]


def _table(header: Sequence[str], rows: Sequence[Sequence[str]], left: int = 1,
           row_classes: Optional[Sequence[str]] = None, table_id: str = "") -> str:
    """``rows`` hold already-escaped HTML; the first ``left`` columns are left-aligned."""
    ident = f' id="{table_id}"' if table_id else ""
    out = [f"<table{ident}><tr>" + "".join(
        f'<th class="l">{_e(h)}</th>' if i < left else f"<th>{_e(h)}</th>" for i, h in enumerate(header)) + "</tr>"]
    for n, row in enumerate(rows):
        cls = f' class="{row_classes[n]}"' if row_classes and row_classes[n] else ""
        out.append(f"<tr{cls}>" + "".join(
            f'<td class="l">{c}</td>' if i < left else f"<td>{c}</td>" for i, c in enumerate(row)) + "</tr>")
    out.append("</table>")
    return "\n".join(out)


def _notes(notes: List[str]) -> str:
    if not notes:
        return ""
    return '<ul class="note">' + "".join(f"<li>{_e(n)}</li>" for n in notes) + "</ul>"


def _figures(pngs: List[figures.Png]) -> str:
    out = []
    for png in pngs:
        data = base64.b64encode(png.data).decode("ascii")
        out.append(f'<figure><img src="data:image/png;base64,{data}" alt="{_e(png.title)}" '
                   f'data-file="{_e(png.name)}"><figcaption class="muted">{_e(png.title)} '
                   f"({_e(png.name)})</figcaption></figure>")
    return "\n".join(out)


def _section(ident: str, title: str, intro: str, body: str) -> str:
    return f'<section id="{ident}">\n<h2>{_e(title)}</h2>\n<p class="muted">{intro}</p>\n{body}\n</section>'


def build(runs: List[Run]) -> Dict[str, Any]:
    """Everything the report shows: HTML text, the PNGs and the comparison data."""
    rows = comparison_rows(runs)
    keys, diffs = config_diff(runs)
    first = runs[0]
    sections = []
    pngs: List[figures.Png] = []
    results, pairing_notes = paired.paired_results(runs)

    # -- the answer first: speedup against quality cost, paired with off
    frontier_pngs, frontier_notes = frontier.frontier(results)
    if frontier_pngs:
        pngs += frontier_pngs
        table = _table(paired.HEADER, [[_e(c) for c in row] for row in paired.table_rows(results)], left=3,
                       table_id="paired-table")
        sections.append(_section("frontier", "Speedup against quality cost, paired with off", FRONTIER_INTRO,
                                 _figures(frontier_pngs) + table + _notes(frontier_notes + pairing_notes)))

    # -- runs
    run_rows, classes = [], []
    for run in runs:
        kinds = ", ".join(f"{k}: {v}" for k, v in sorted(run.kind_counts().items())) or "none"
        run_rows.append([_e(run.label), _e(run.status), _e(run.policy or "n/a"), _e(", ".join(run.files)),
                         _e(kinds), f"<code>{_e(run.path)}</code>", _notes(run.notes)])
        classes.append("" if run.complete else "incomplete")
    incomplete = [r.label for r in runs if not r.complete]
    intro = (f"{len(runs)} run(s); the first, <b>{_e(first.label)}</b>, is the reference for speedups, "
             "AUC differences and config differences.")
    if incomplete:
        intro += (" <b>Incomplete</b> (no summary.json: crashed or killed; shown with what they have): "
                  + _e(", ".join(incomplete)) + ".")
    sections.append(_section("runs", "Runs", intro, _table(
        ["run", "status", "policy", "files", "metrics records", "path", "notes"], run_rows, left=7,
        row_classes=classes, table_id="runs-table")))

    # -- comparison
    table_rows = []
    for row in rows:
        diff = row["config_diff"]
        diff_html = ("<span class='muted'>reference</span>" if row is rows[0] else
                     "n/a (no config)" if diff is None else
                     "<span class='muted'>none</span>" if not diff else
                     "<br>".join(f"<code>{_e(k)}={_e(show(v))}</code>" for k, v in diff.items()))
        if row["other_dataset"]:
            diff_html = (f"<b>another dataset or split</b> ({_e(row['other_dataset'])}): not compared<br>"
                         + diff_html)
        table_rows.append([
            _e(row["label"]), _e(row["status"]), diff_html,
            fmt(row["samples_trained"], "int") + ("" if row["status"] == "complete" or row["last_step"] is None
                                                  else f'<br><span class="muted">to step {row["last_step"]}</span>'),
            fmt(row["samples_skipped"], "int"), fmt(row["skip_fraction"], ".4f"), fmt(row["train_seconds"], ".3f"),
            fmt(row["speedup"], ".3f"), fmt(row["val_auc"], ".4f"), fmt(row["test_auc"], ".4f"),
            fmt(row["dauc"], "signed"), fmt(row["ideal_speedup"], ".3f"), fmt(row["efficiency"], ".3f"),
        ])
    intro = ("Speedup = first run's train seconds / this run's (evaluations excluded); dAUC = test AUC minus the "
             "first run's; ideal speedup = 1 / (1 - skip fraction); efficiency = speedup / ideal. An incomplete "
             "run shows the samples trained up to its last train record and n/a where the summary is needed. A run "
             "of another dataset or split than the first run's shows n/a for speedup, dAUC and efficiency.")
    sections.append(_section("summary", "Comparison", intro, _table(
        ["run", "status", "config vs first run", "samples trained", "samples skipped", "skip fraction",
         "train s", "speedup", "val AUC", "test AUC", "dAUC (test)", "ideal speedup", "efficiency"],
        table_rows, left=3, row_classes=["" if r["status"] == "complete" else "incomplete" for r in rows],
        table_id="summary-table")))

    # -- serving and embedding traffic
    rows_t = traffic.traffic_rows(runs)
    if rows_t:
        spec = ["", ".3f"] + [".1f"] * len(traffic.KINDS) + [".3f", ".1f", ".1f", ".3f", "", "int", ".1f"]
        body = _table(traffic.HEADER, _cells(rows_t, spec), table_id="traffic-table")
        turnover = traffic.turnover_rows(runs)
        if turnover:
            body += "<p>The hot set chosen again (<code>slipstream.hot_refresh_steps</code>):</p>" + _table(
                traffic.TURNOVER_HEADER, [[_e(t[0])] + [fmt(v, "int") for v in t[1:]] for t in turnover],
                table_id="turnover-table")
        sections.append(_section(
            "traffic", "Embedding traffic and serving",
            "Bytes per trained sample given to each kind of collective (summary.json a2a_bytes_per_sample, "
            "counted from the tensors, every rank's sends): the embedding all-to-alls (ids and lengths, pooled "
            "embeddings, their gradients, as the quantized comms' codec sends them), serve's gradient pushes and "
            "replica rebuilds, the lock-step agreements (control), DDP's all-reduces of the dense arch and of "
            "data-parallel tables; total = all of them (runs of older versions lack some kinds: n/a, not in "
            "their total). Off-rank: the same less what each rank sends itself, at each collective's rate (what a "
            "network between the ranks carries); wire: the bytes the nodes' interfaces sent over the training "
            "steps (summary.json wire, trainer.wire_interface; n/a on one node), and its ratio to the off-rank "
            "count. Served fraction = lookups answered from the replica of stale rows.", body))

    # -- precision, negative downsampling, calibration
    rows_d = downsampling.run_rows(runs)
    if rows_d:
        spec = ["", "", "", "", ".2f", "int", ".4f", ".4f", ".3f"]
        body = _table(downsampling.RUN_HEADER, _cells(rows_d, spec), left=4, table_id="levers-table")
        served = downsampling.serve_rows(runs)
        if served:
            sspec = ["", "int", "", "", ".2f", ".2f", ""]
            body += "<p>Whether serving paid (slipstream.serve_when=auto), every decision:</p>" + _table(
                downsampling.SERVE_HEADER, _cells(served, sspec), left=4, table_id="serve-lever-table")
        guard = downsampling.guard_rows(runs)
        if guard:
            gspec = ["", "int", "", ".2f", ".2f", ".4f", ".4f", ".4f", ".4f", ".4f", ""]
            body += "<p>Every decision of the rule and every check of the guard:</p>" + _table(
                downsampling.GUARD_HEADER, _cells(guard, gspec), left=3, table_id="guard-table")
        sections.append(_section(
            "levers", "Precision, serving, negative downsampling and calibration",
            "trainer.precision as chosen (auto reads the machine, then times fp32 against bf16 on the run's first "
            "steps); serving's decisions (a window timed with serving against one without, Slipstream's own work "
            "included); slipstream.negative_downsampling: the rule's rate "
            "from the click rate of the first look-ahead, then the guard's checks on held-out samples (added noise = "
            "rate / (1 - rate) x the non-clicks' share of the logit-gradient variance; above max noise it backs off). "
            "Predicted / observed: the mean predicted click rate on test over the observed one (1 = calibrated).", body))

    # -- config diff
    if first.config is None:
        body = '<p class="note">The first run has no readable config.yaml: no config differences.</p>'
    elif not keys:
        body = "<p>All runs have the same configuration (apart from <code>trainer.run_dir</code>).</p>"
    else:
        first_flat = first.flat_config
        body_rows = []
        for key in keys:
            cells = [f"<code>{_e(key)}</code>", _e(show(first_flat.get(key, "(absent)")))]
            for diff in diffs[1:]:
                if diff is None:
                    cells.append("n/a")
                elif key in diff:
                    cells.append(f"<b>{_e(show(diff[key]))}</b>")
                else:
                    cells.append('<span class="muted">=</span>')
            body_rows.append(cells)
        body = _table(["key"] + [r.label for r in runs], body_rows, left=len(runs) + 1, table_id="config-diff-table")
    sections.append(_section(
        "config-diff", "Config differences from the first run",
        "Flattened dotted keys of config.yaml whose value differs from the first run's in at least one run "
        "(<code>trainer.run_dir</code> is left out); <b>bold</b>: differs, =: same as the first run.", body))

    # -- figures
    def add(ident: str, title: str, intro: str, result: Any) -> None:
        got, notes = result[0], result[1]
        for png in got:  # two labels can map to one file-safe name
            stem, n = png.name[: -len(".png")], 2
            while png.name in {p.name for p in pngs}:
                png.name, n = f"{stem}_{n}.png", n + 1
            pngs.append(png)
        body = _figures(got) if got else '<p class="note">No run has data for this section.</p>'
        sections.append(_section(ident, title, intro, body + _notes(notes)))

    if any(len(run.evals("val")) >= 2 for run in runs):
        add("accuracy", "Accuracy vs wall time and samples trained",
            "Validation AUC and log loss at every evaluation (eval records of metrics.jsonl); time counts from the "
            "start of training, evaluations included, so curves show time-to-accuracy.", figures.accuracy(runs))
    else:
        add("accuracy", "Final test AUC and log loss",
            "No run evaluated more than once (<code>trainer.eval_every_steps=0</code>), so there are no curves: "
            "each run's test AUC and log loss from summary.json, grouped by dataset and policy, each point "
            "labelled with its seed. The AUC axis spans at least 0.004, four times the 0.001 target, so that a "
            "difference well inside the target does not fill it.", frontier.final_metrics(runs))
    add("skipping", "Skip fraction, threshold T, hot and stale rows over time",
        "From train records (lines) and Slipstream snapshot records (dots); rank 0's skip fraction.",
        figures.skipping(runs))
    add("rows-per-table", "Hot and stale rows per table",
        "Per run with Slipstream tracking, from the snapshot records (symlog scale).", figures.rows_per_table(runs))
    add("change-distribution", "Per-row change of hot rows at each snapshot",
        "Log-binned histogram of each hot row's change since the previous snapshot, one line per snapshot; "
        "dashed vertical line: the threshold T chosen at that snapshot (a hot row with change below T is stale).",
        figures.change_distribution(runs))
    tb_pngs, tb_notes, parts = figures.time_breakdown(runs)
    tb_rows = []
    cols = [k for k, _, _ in figures.BREAKDOWN_PARTS]
    for run in runs:
        p = parts[run.label]
        tb_rows.append([_e(run.label)] + [fmt(p.get(k) if p else None, ".3f") for k in cols]
                       + [fmt(p.get("total") if p else None, ".3f")])
    add("time-breakdown", "Time breakdown",
        "Rank 0's training seconds (summary.json time_breakdown_rank0; Slipstream split by slipstream.seconds): "
        "data = loading and refilling batches; input all-to-all = starting and waiting for the next batch's "
        "input distribution; forward and backward include the embedding lookups and the output all-to-all "
        "(the pipeline runs them inside the model call); other = logging and bookkeeping. Host timers.",
        (tb_pngs, tb_notes))
    sections[-1] = sections[-1].replace("</section>", _table(
        ["run"] + [name + (" (total)" if key == "slipstream" else "") for key, name, _ in figures.BREAKDOWN_PARTS]
        + ["total"], tb_rows,
        table_id="time-breakdown-table") + "\n</section>")

    data = {"runs": rows, "config_diff_keys": keys, "time_breakdown": parts,
            "paired": [paired.as_dict(r) for r in results], "figures": [p.name for p in pngs]}
    payload = json.dumps(data, default=str).replace("</", "<\\/")
    now = _dt.datetime.now().isoformat(timespec="seconds")
    text = "\n".join([
        "<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
        f"<title>slipstream_rec report: {_e(', '.join(r.label for r in runs))}</title>",
        f"<style>{CSS}</style></head><body>",
        "<h1>slipstream_rec experiment report</h1>",
        f'<p class="muted">Generated {now} by <code>python -m slipstream_rec.report</code> '
        f"from {len(runs)} run(s).</p>",
        '<nav>' + ('<a href="#frontier">frontier</a> · ' if frontier_pngs else "")
        + '<a href="#runs">runs</a> · <a href="#summary">comparison</a> · <a href="#config-diff">config</a> · '
        '<a href="#accuracy">accuracy</a> · <a href="#skipping">skipping</a> · '
        '<a href="#rows-per-table">rows per table</a> · <a href="#change-distribution">change distribution</a> · '
        '<a href="#time-breakdown">time breakdown</a>' + (' · <a href="#traffic">traffic</a>' if rows_t else "")
        + (' · <a href="#levers">precision and downsampling</a>' if rows_d else "")
        + '</nav>',
        *sections,
        f'<script type="application/json" id="report-data">{payload}</script>',
        "</body></html>",
    ])
    return {"html": text, "pngs": pngs, "data": data,
            "frontier_csv": paired.frontier_csv(results) if frontier_pngs else None,
            "paired_markdown": paired.markdown_table(results) if frontier_pngs else None}


def write(runs: List[Run], out_dir: Path) -> Path:
    """Write OUT/report.html and OUT/<figure>.png; returns the HTML path."""
    report = build(runs)  # everything is drawn before anything is written
    out_dir.mkdir(parents=True, exist_ok=True)
    for png in report["pngs"]:
        (out_dir / png.name).write_bytes(png.data)
    for name, key in (("frontier.csv", "frontier_csv"), ("paired_results.md", "paired_markdown")):
        if report[key] is not None:
            (out_dir / name).write_text(report[key], encoding="utf-8")
        elif (out_dir / name).is_file():  # an earlier report's, for other runs
            (out_dir / name).unlink()
    path = out_dir / "report.html"
    tmp = out_dir / ".report.html.tmp"
    tmp.write_text(report["html"], encoding="utf-8")
    tmp.replace(path)
    return path
