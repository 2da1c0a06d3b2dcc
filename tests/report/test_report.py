"""Experiment reports (`python -m slipstream_rec.report`) on real runs, and the sweep helper.

Two short real 2-process runs on `experiment=skewed_quick` (off and paper_plus, validation every
40 steps, test at the end, 120 steps) plus a crashed copy of the paper_plus run; one report over
the three. Checks every section, the figures against summary.json, the PNGs, the config diff,
the incomplete run, malformed metrics lines, the error for a non-run directory, and the
commands `launch/sweep.py --dry-run` prints.
"""

from __future__ import annotations

import base64
import html
import io
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Dict, List

import numpy as np
import pytest
import yaml

from slipstream_rec.report.cli import main as report_main
from slipstream_rec.report.runs import flatten

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
SECTIONS = ["frontier", "runs", "summary", "config-diff", "accuracy", "skipping", "rows-per-table", "change-distribution",
            "time-breakdown"]


def _env() -> dict:
    env = dict(os.environ)
    env["PATH"] = f"{BIN}{os.pathsep}{env.get('PATH', '')}"
    env["OMP_NUM_THREADS"] = "1"
    return env


def _train(run_dir: Path, data_root: Path, policy: str) -> None:
    cmd = [
        str(BIN / "torchrun"), "--standalone", "--nproc_per_node", "2", "-m", "slipstream_rec.train",
        "experiment=skewed_quick", f"data.root={data_root}", f"trainer.run_dir={run_dir}", f"slipstream={policy}",
        "trainer.eval_every_steps=40", "trainer.test_at_end=true", "trainer.max_steps=120",
        "trainer.progress_bar=false", "trainer.tensorboard=false",
    ]
    result = subprocess.run(cmd, cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, f"{' '.join(cmd)}\n{result.stderr[-4000:]}"


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> Dict[str, Path]:
    root = tmp_path_factory.mktemp("report_runs")
    dirs = {"off": root / "off", "pp": root / "pp"}
    _train(dirs["off"], root / "data", "off")
    _train(dirs["pp"], root / "data", "paper_plus")
    # a crash after step 100: no summary.json, and the line being written when it died is cut
    crashed = root / "crashed"
    shutil.copytree(dirs["pp"], crashed)
    (crashed / "summary.json").unlink()
    lines = (crashed / "metrics.jsonl").read_text().splitlines(keepends=True)
    keep = next(i for i, line in enumerate(lines) if json.loads(line)["step"] > 100)
    (crashed / "metrics.jsonl").write_text("".join(lines[:keep]) + lines[keep][:50])
    dirs["crashed"] = crashed
    dirs["crashed_bad_line"] = keep + 1  # type: ignore[assignment]
    return dirs


@pytest.fixture(scope="module")
def report(runs, tmp_path_factory):
    out = tmp_path_factory.mktemp("report") / "out"
    rc = report_main([str(runs["off"]), str(runs["pp"]), str(runs["crashed"]), "-o", str(out)])
    assert rc == 0
    text = (out / "report.html").read_text()
    data = json.loads(re.search(r'<script type="application/json" id="report-data">(.*?)</script>', text, re.S)
                      .group(1).replace("<\\/", "</"))
    return {"out": out, "html": text, "data": data}


def _summary(path: Path) -> dict:
    return json.loads((path / "summary.json").read_text())


def _section(text: str, ident: str) -> str:
    match = re.search(rf'<section id="{ident}">(.*?)</section>', text, re.S)
    assert match, f"no section {ident}"
    return match.group(1)


def _table_rows(text: str, table_id: str) -> List[List[str]]:
    table = re.search(rf'<table id="{table_id}">(.*?)</table>', text, re.S).group(1)
    rows = []
    for tr in re.findall(r"<tr[^>]*>(.*?)</tr>", table, re.S)[1:]:
        cells = re.findall(r"<td[^>]*>(.*?)</td>", tr, re.S)
        rows.append([" ".join(html.unescape(re.sub(r"<[^>]+>", " ", c)).split()) for c in cells])
    return rows


# ---- the report ---------------------------------------------------------------------------------
def test_report_has_every_section_and_figure(report):
    text = report["html"]
    for ident in SECTIONS:
        body = _section(text, ident)
        assert "<h2>" in body
    expected = {"frontier.png", "accuracy.png", "skipping.png", "rows_per_table_pp.png", "rows_per_table_crashed.png",
                "change_pp.png", "change_crashed.png", "time_breakdown.png"}
    assert expected == {p.name for p in report["out"].glob("*.png")}
    assert set(report["data"]["figures"]) == expected
    # the figures sit in their sections
    # off and paper_plus share data and seed: the frontier pairs them (the crashed run is left out)
    assert 'data-file="frontier.png"' in _section(text, "frontier")
    assert [r["series"] for r in report["data"]["paired"]] == ["off", "paper_plus"]
    assert "crashed: no train_seconds or test_auc" in _section(text, "frontier")
    assert 'data-file="accuracy.png"' in _section(text, "accuracy")
    assert 'data-file="skipping.png"' in _section(text, "skipping")
    assert 'data-file="rows_per_table_pp.png"' in _section(text, "rows-per-table")
    assert 'data-file="change_pp.png"' in _section(text, "change-distribution")
    assert 'data-file="time_breakdown.png"' in _section(text, "time-breakdown")
    # the off run lacks Slipstream data: said, not failed
    assert "off: no per-table rows" in _section(text, "rows-per-table")
    assert "off: no change histograms" in _section(text, "change-distribution")
    assert "off: no threshold T was ever set" in _section(text, "skipping")


def test_numbers_match_the_summaries(report, runs):
    off, pp = _summary(runs["off"]), _summary(runs["pp"])
    rows = {r[0]: r for r in _table_rows(report["html"], "summary-table")}
    header = ["run", "status", "config", "samples trained", "samples skipped", "skip fraction", "train s", "speedup",
              "val AUC", "test AUC", "dAUC", "ideal", "efficiency"]
    speedup = off["train_seconds"] / pp["train_seconds"]
    ideal = 1 / (1 - pp["skip_fraction"])
    for label, s, expect_speedup, expect_ideal in (("off", off, 1.0, 1.0), ("pp", pp, speedup, ideal)):
        cells = dict(zip(header, rows[label]))
        assert cells["status"] == "complete"
        assert cells["samples trained"] == f"{s['samples_trained']:,}"
        assert cells["samples skipped"] == f"{s['samples_skipped']:,}"
        assert cells["train s"] == f"{s['train_seconds']:.3f}"
        assert cells["test AUC"] == f"{s['test_auc']:.4f}"
        assert cells["val AUC"] == f"{s['val_auc']:.4f}"
        assert cells["speedup"] == f"{expect_speedup:.3f}"
        assert cells["ideal"] == f"{expect_ideal:.3f}"
        assert cells["efficiency"] == f"{expect_speedup / expect_ideal:.3f}"
        assert cells["dAUC"] == f"{s['test_auc'] - off['test_auc']:+.4f}"
    assert pp["samples_skipped"] > 0  # paper_plus really skipped: the columns are not all trivial
    data = {r["label"]: r for r in report["data"]["runs"]}
    assert data["pp"]["speedup"] == pytest.approx(speedup)
    assert data["pp"]["train_seconds"] == pp["train_seconds"]
    assert data["pp"]["samples_trained"] == pp["samples_trained"]
    assert data["pp"]["dauc"] == pytest.approx(pp["test_auc"] - off["test_auc"])
    # time breakdown: summary.json's parts, Slipstream split by slipstream.seconds
    tb = report["data"]["time_breakdown"]["pp"]
    for key in ("data", "input_all_to_all", "forward", "backward", "optimizer", "slipstream", "other", "total"):
        assert tb[key] == pp["time_breakdown_rank0"][key]
    for key in ("count", "classify", "snapshot", "sync"):
        assert tb[key] == pp["slipstream"]["seconds"][f"{key}_seconds"]


def test_figures_are_valid_pngs(report):
    from matplotlib import image

    text = report["html"]
    for path in report["out"].glob("*.png"):
        raw = path.read_bytes()
        assert raw.startswith(PNG_MAGIC), path
        pixels = image.imread(io.BytesIO(raw), format="png")
        assert pixels.ndim == 3 and pixels.shape[0] > 100 and pixels.shape[1] > 100, (path, pixels.shape)
        rgba = (pixels * 255).astype(np.uint32)
        packed = (rgba[..., 0] << 16) | (rgba[..., 1] << 8) | rgba[..., 2]
        assert len(np.unique(packed)) > 10, f"{path}: (nearly) one flat color"
        # the HTML embeds exactly the same image
        match = re.search(rf'<img src="data:image/png;base64,([^"]+)"[^>]*data-file="{re.escape(path.name)}"', text)
        assert match and base64.b64decode(match.group(1)) == raw, path


def test_config_diff_shows_exactly_the_differing_keys(report, runs):
    off_cfg = flatten(yaml.safe_load((runs["off"] / "config.yaml").read_text()))
    # what conf/slipstream/paper_plus.yaml sets differently from what the off run resolved to
    policy_yaml = yaml.safe_load((ROOT / "conf" / "slipstream" / "paper_plus.yaml").read_text())
    expected = {f"slipstream.{k}" for k, v in policy_yaml.items() if off_cfg[f"slipstream.{k}"] != v}
    assert "slipstream.policy" in expected and len(expected) > 1
    rows = _table_rows(report["html"], "config-diff-table")
    assert {r[0] for r in rows} == expected == set(report["data"]["config_diff_keys"])
    by_key = {r[0]: r[1:] for r in rows}
    assert by_key["slipstream.policy"] == ["off", "paper_plus", "paper_plus"]
    # trainer.run_dir differs in every run but is no experiment setting
    assert "trainer.run_dir" not in report["html"].split('id="config-diff-table"')[1].split("</table>")[0]
    # the comparison table lists the same keys for pp, and marks the first run as the reference
    summary_rows = {r[0]: r for r in _table_rows(report["html"], "summary-table")}
    assert summary_rows["off"][2] == "reference"
    assert set(re.findall(r"(slipstream\.\w+)=", summary_rows["pp"][2])) == expected


def test_crashed_run_is_reported_incomplete(report, runs):
    text = report["html"]
    runs_rows = {r[0]: r for r in _table_rows(text, "runs-table")}
    assert runs_rows["crashed"][1] == "incomplete"
    assert runs_rows["pp"][1] == "complete"
    assert "summary.json missing" in runs_rows["crashed"][6]
    # the malformed (cut) line is reported with file and line number
    assert f"{runs['crashed'] / 'metrics.jsonl'}:{runs['crashed_bad_line']}: malformed JSON" in runs_rows["crashed"][6]
    assert "Incomplete" in _section(text, "runs") and "crashed" in _section(text, "runs")
    row = {r[0]: r for r in _table_rows(text, "summary-table")}["crashed"]
    assert row[1] == "incomplete"
    last_train = [json.loads(line) for line in (runs["crashed"] / "metrics.jsonl").read_text().splitlines()[:-1]
                  if '"kind": "train"' in line][-1]
    assert row[3] == f"{last_train['samples_trained']:,} to step {last_train['step']}"
    assert row[6] == "n/a" and row[7] == "n/a"  # no train seconds, no speedup without a summary
    assert "crashed: incomplete, breakdown up to its last train record" in _section(text, "time-breakdown")


def test_malformed_lines_named_on_stderr(runs, tmp_path, capsys):
    run = tmp_path / "damaged"
    shutil.copytree(runs["off"], run)
    lines = (run / "metrics.jsonl").read_text().splitlines(keepends=True)
    lines.insert(2, "{not json\n")
    lines.insert(4, "[1, 2]\n")
    (run / "metrics.jsonl").write_text("".join(lines))
    assert report_main([str(run), "-o", str(tmp_path / "out")]) == 0
    err = capsys.readouterr().err
    assert f"{run / 'metrics.jsonl'}:3: malformed JSON line skipped" in err
    assert f"{run / 'metrics.jsonl'}:5: record skipped" in err
    assert (tmp_path / "out" / "report.html").is_file()


def test_not_a_run_directory_is_a_clear_error(runs, tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "notes.txt").write_text("hello")
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "slipstream_rec.report", str(runs["off"]), str(empty), str(tmp_path / "missing"),
           "-o", str(out)]
    result = subprocess.run(cmd, cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=120)
    assert result.returncode == 2, result
    assert f"{empty}: not a run directory: it has neither config.yaml nor metrics.jsonl" in result.stderr
    assert f"{tmp_path / 'missing'}: no such directory" in result.stderr
    assert not out.exists()  # nothing written


# ---- the sweep helper ---------------------------------------------------------------------------
def _sweep(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(ROOT / "launch" / "sweep.py"), *args], cwd=ROOT, env=_env(),
                          capture_output=True, text=True, timeout=120)


def test_sweep_dry_run_prints_one_torchrun_command_per_point(tmp_path):
    sweep_dir = tmp_path / "sweep"
    # --no-validate: composing the configs takes seconds; test_sweep_rejects_a_bad_point covers it
    result = _sweep("--dry-run", "--no-validate", "--grid", "slipstream=off,paper_plus",
                    "--grid", "slipstream.target_skip_fraction=0.3,0.5",
                    "--fixed", "experiment=skewed_quick", "--sweep-dir", str(sweep_dir))
    assert result.returncode == 0, result.stderr
    commands = [shlex.split(line) for line in result.stdout.splitlines() if not line.startswith("#")]
    assert len(commands) == 4
    points = set()
    run_dirs = set()
    for cmd in commands:
        assert Path(cmd[0]).name == "torchrun"
        assert cmd[1:7] == ["--standalone", "--nproc_per_node", "2", "-m", "slipstream_rec.train",
                            "experiment=skewed_quick"]
        policy, target, run_dir = cmd[7:]
        points.add((policy, target))
        assert run_dir.startswith(f"trainer.run_dir={sweep_dir}/")
        run_dirs.add(run_dir)
    assert points == {(f"slipstream={p}", f"slipstream.target_skip_fraction={t}")
                      for p in ("off", "paper_plus") for t in ("0.3", "0.5")}
    assert len(run_dirs) == 4
    assert "slipstream_rec.report" in result.stdout and not sweep_dir.exists()  # dry run: nothing made


def test_sweep_dry_run_torchx_and_bracketed_values(tmp_path):
    result = _sweep("--dry-run", "--no-validate", "--launcher", "torchx", "--nproc", "3",
                    "--grid", "model.dense_arch_layer_sizes=[64,16],[128,16]", "--fixed", "experiment=smoke",
                    "--sweep-dir", str(tmp_path / "s"))
    assert result.returncode == 0, result.stderr
    commands = [shlex.split(line) for line in result.stdout.splitlines() if not line.startswith("#")]
    torchx = ["run", "-s", "local_cwd", "launch/components.py:train", "-j", "1x3", "--"]
    assert [Path(c[0]).name for c in commands] == ["torchx", "torchx"]
    assert [c[1:8] for c in commands] == [torchx, torchx]
    assert [c[8:10] for c in commands] == [["experiment=smoke", "model.dense_arch_layer_sizes=[64,16]"],
                                           ["experiment=smoke", "model.dense_arch_layer_sizes=[128,16]"]]


def test_sweep_rejects_a_bad_point_before_running_anything(tmp_path):
    result = _sweep("--grid", "slipstream.target_skip_fraction=0.3,lots", "--fixed", "experiment=smoke",
                    "--sweep-dir", str(tmp_path / "s"))
    assert result.returncode == 2
    assert "point 1 (slipstream.target_skip_fraction=lots)" in result.stderr
    assert not (tmp_path / "s").exists()


def test_figures_plot_the_records_of_each_run(runs, monkeypatch):
    """What the accuracy and skipping figures draw is each run's records, read here straight
    from metrics.jsonl: every validation evaluation (AUC and log loss, vs time and samples) and
    every train record's skip fraction and threshold, in order, one line per run."""
    from slipstream_rec.report import figures
    from slipstream_rec.report.runs import load_run

    drawn = {}
    monkeypatch.setattr(figures, "_png", lambda fig, name, title: drawn.__setitem__(name, fig))
    labels = ["off", "pp"]
    loaded = [load_run(runs[k]) for k in labels]
    records = {k: [json.loads(line) for line in (runs[k] / "metrics.jsonl").read_text().splitlines()] for k in labels}
    figures.accuracy(loaded)
    axes = drawn["accuracy.png"].axes  # row-major: (auc, logloss) x (time, samples_trained)
    for ax, (x, y) in zip(axes, [("time", "auc"), ("samples_trained", "auc"), ("time", "logloss"), ("samples_trained", "logloss")]):
        lines = ax.get_lines()
        assert len(lines) == len(labels)
        for line, k in zip(lines, labels):
            val = [r for r in records[k] if r["kind"] == "eval" and r["split"] == "val"]
            assert len(val) >= 3, k  # evaluations every 40 of 120 steps
            assert list(line.get_xdata()) == [r[x] for r in val] and list(line.get_ydata()) == [r[y] for r in val], (k, x, y)
    figures.skipping(loaded)
    skip_ax, thr_ax = drawn["skipping.png"].axes[:2]
    for ax, key in ((skip_ax, "skip_fraction"), (thr_ax, "threshold")):
        train_lines = [line for line in ax.get_lines() if line.get_linestyle() != "None"]
        for k in labels:
            want = [(r["time"], r[key]) for r in records[k] if r["kind"] == "train" and isinstance(r.get(key), (int, float))]
            if want:
                line = train_lines.pop(0)
                assert list(zip(line.get_xdata(), line.get_ydata())) == want, (k, key)
    pp_skips = [r["skip_fraction"] for r in records["pp"] if r["kind"] == "train"]
    assert max(pp_skips) > 0  # paper_plus skipped, so the skip panel's second line is not flat


def test_the_accuracy_figure_keys_the_dashed_line_only_when_a_run_is_incomplete(runs, monkeypatch, capsys):
    from slipstream_rec.report import figures
    from slipstream_rec.report.runs import load_run

    titles = []
    monkeypatch.setattr(figures, "_png", lambda fig, *a: titles.append(fig._suptitle.get_text()) or None)
    complete = [load_run(runs["off"]), load_run(runs["pp"])]
    figures.accuracy(complete)
    figures.accuracy(complete + [load_run(runs["crashed"])])
    assert titles == ["Validation AUC and log loss", "Validation AUC and log loss (dashed: incomplete run)"]
