"""The report's answer: the frontier figure, the paired table, the final-metrics chart, and the
benchmark printing the same table.

Recorded run directories (``tests/report/recorded.py``: the files a finished run writes, with
chosen AUCs and seconds) of 3 seeds x (off, paper_plus, its random control), handed to the report
in shuffled order. Every expected value is computed here from the chosen figures: paired
differences by seed, means, and 95% intervals with t quantiles from closed forms.
"""

from __future__ import annotations

import csv
import html
import io
import json
import math
import re
import statistics
import sys
from pathlib import Path
from typing import Any, Dict, List

import pytest
import yaml
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from slipstream_rec.report.cli import main as report_main
from slipstream_rec.report.paired import paired_results, t975
from slipstream_rec.report.runs import assign_labels, load_run
from tests.report.recorded import control_overrides, write_run

ROOT = Path(__file__).resolve().parents[2]
SEEDS = (0, 1, 2)
# chosen figures per seed: off's test AUC and seconds; paper_plus's and the control's offsets
OFF_AUC = {0: 0.7546, 1: 0.7580, 2: 0.7576}
OFF_SECONDS = {0: 216.8, 1: 302.6, 2: 287.9}
PP = {0: (-0.0014, 194.3, 0.061, 150), 1: (-0.0011, 262.0, 0.074, 200), 2: (-0.0016, 248.1, 0.066, 150)}
CONTROL = {0: (-0.0010, 170.2), 1: (-0.0006, 244.9), 2: (-0.0013, 230.0)}


def _recorded(root: Path) -> Dict[str, Dict[int, Path]]:
    dirs: Dict[str, Dict[int, Path]] = {"off": {}, "paper_plus": {}, "random@paper_plus": {}}
    for seed in SEEDS:
        seed_key = [f"trainer.seed={seed}", "trainer.eval_every_steps=0"]
        dirs["off"][seed] = root / f"off-r{seed}"
        write_run(dirs["off"][seed], ["slipstream=off", *seed_key], OFF_AUC[seed], OFF_SECONDS[seed])
        d, secs, skip, first = PP[seed]
        dirs["paper_plus"][seed] = root / f"paper_plus-r{seed}"
        pp = write_run(dirs["paper_plus"][seed], ["slipstream=paper_plus", *seed_key], OFF_AUC[seed] + d, secs,
                       skip, first, policy="paper_plus")
        dirs["random@paper_plus"][seed] = root / f"random@paper_plus-r{seed}"
        write_run(dirs["random@paper_plus"][seed], [*control_overrides(pp), *seed_key],
                  OFF_AUC[seed] + CONTROL[seed][0], CONTROL[seed][1], pp["skip_fraction"], first, policy="random")
    return dirs


def _auc(path: Path) -> float:
    return json.loads((path / "summary.json").read_text())["test_auc"]


def _seconds(path: Path) -> float:
    return json.loads((path / "summary.json").read_text())["train_seconds"]


def _t975_df2() -> float:
    # Student's t with 2 degrees of freedom has the closed-form quantile (2p - 1) / sqrt(2p(1 - p))
    p = 0.975
    return (2 * p - 1) / math.sqrt(2 * p * (1 - p))


def _interval(values: List[float]) -> tuple:
    mean = sum(values) / len(values)
    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1))
    half = _t975_df2() * sd / math.sqrt(len(values))
    return mean, mean - half, mean + half


class Recorder:
    """What the figures draw: every errorbar and scatter call's points, per panel title."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.calls: List[Dict[str, Any]] = []
        self.suptitles: List[str] = []
        for name in ("errorbar", "scatter"):
            original = getattr(Axes, name)

            def wrapped(ax, x, y, *args, _name=name, _original=original, **kwargs):
                self.calls.append({"kind": _name, "x": list(x), "y": list(y), "kwargs": kwargs, "ax": ax})
                return _original(ax, x, y, *args, **kwargs)

            monkeypatch.setattr(Axes, name, wrapped)
        suptitle = Figure.suptitle

        def record_suptitle(fig, text, *args, **kwargs):
            self.suptitles.append(text)
            return suptitle(fig, text, *args, **kwargs)

        monkeypatch.setattr(Figure, "suptitle", record_suptitle)


@pytest.fixture()
def report(tmp_path, monkeypatch):
    dirs = _recorded(tmp_path / "runs")
    recorder = Recorder(monkeypatch)
    # shuffled: pairing is by seed, not by position
    order = [dirs["random@paper_plus"][2], dirs["paper_plus"][1], dirs["off"][2], dirs["off"][0],
             dirs["paper_plus"][0], dirs["random@paper_plus"][0], dirs["off"][1], dirs["paper_plus"][2],
             dirs["random@paper_plus"][1]]
    out = tmp_path / "out"
    assert report_main([*map(str, order), "-o", str(out)]) == 0
    text = (out / "report.html").read_text()
    return {"dirs": dirs, "out": out, "html": text, "recorder": recorder}


def _expected(dirs) -> Dict[str, Dict[str, Any]]:
    """Per series: per-seed speedups and AUC differences to off and to the control, by seed."""
    exp = {}
    for series in ("paper_plus", "random@paper_plus"):
        exp[series] = {
            "speedup": [_seconds(dirs["off"][s]) / _seconds(dirs[series][s]) for s in SEEDS],
            "dauc": [_auc(dirs[series][s]) - _auc(dirs["off"][s]) for s in SEEDS],
        }
    exp["paper_plus"]["vs_control"] = [_auc(dirs["paper_plus"][s]) - _auc(dirs["random@paper_plus"][s]) for s in SEEDS]
    return exp


def test_frontier_draws_the_paired_differences(report):
    exp = _expected(report["dirs"])
    calls = report["recorder"].calls
    means = [c for c in calls if c["kind"] == "errorbar"]
    seeds = [c for c in calls if c["kind"] == "scatter" and c["ax"] is means[0]["ax"]]
    assert len(means) == 2 and len(seeds) == 2  # one marker per series, the control beside its policy
    for series, mean_call, seed_call in zip(("paper_plus", "random@paper_plus"), means, seeds):
        # one dot per seed at (paired speedup, paired dAUC), in seed order
        assert seed_call["x"] == pytest.approx(exp[series]["speedup"], rel=1e-12)
        assert seed_call["y"] == pytest.approx(exp[series]["dauc"], abs=1e-12)
        # the marker: the means; the AUC difference's 95% t interval as the error bar
        assert mean_call["x"] == pytest.approx([statistics.fmean(exp[series]["speedup"])], abs=1e-12)
        mean, lo, hi = _interval(exp[series]["dauc"])
        assert mean_call["y"] == pytest.approx([mean], abs=1e-12)
        err = mean_call["kwargs"]["yerr"]
        assert [err[0][0], err[1][0]] == pytest.approx([mean - lo, hi - mean], rel=1e-5)
    assert means[1]["kwargs"]["fmt"] == "X" and means[0]["kwargs"]["fmt"] == "o"  # the control is marked
    # the frontier is the report's first section and first figure
    text = report["html"]
    assert text.index('<section id="frontier">') < text.index('<section id="runs">')
    assert re.search(r'<img [^>]*data-file="([^"]+)"', text).group(1) == "frontier.png"


def test_frontier_csv_holds_the_figures_data(report):
    exp = _expected(report["dirs"])
    rows = list(csv.DictReader(io.StringIO((report["out"] / "frontier.csv").read_text())))
    by = {(r["series"], r["row"], r["seed"]): r for r in rows}
    for series in ("paper_plus", "random@paper_plus"):
        mean = by[(series, "mean", "")]
        for key, col in (("speedup", "speedup"), ("dauc", "dauc")):
            m, lo, hi = _interval(exp[series][key])
            assert [float(mean[col]), float(mean[f"{col}_ci_lo"]), float(mean[f"{col}_ci_hi"])] == pytest.approx(
                [m, lo, hi], rel=1e-5)
        skips = [json.loads((report["dirs"][series][s] / "summary.json").read_text())["skip_fraction"] for s in SEEDS]
        assert float(mean["ideal_speedup"]) == pytest.approx(1 / (1 - sum(skips) / 3))
        for s in SEEDS:
            seed_row = by[(series, "seed", str(s))]
            assert float(seed_row["dauc"]) == pytest.approx(exp[series]["dauc"][s], abs=1e-12)
            assert seed_row["off_run"] == f"off-r{s}"
    assert by[("random@paper_plus", "mean", "")]["controls"] == "paper_plus"
    assert by[("paper_plus", "mean", "")]["control"] == "random@paper_plus"
    m, lo, hi = _interval(exp["paper_plus"]["vs_control"])
    pp = by[("paper_plus", "mean", "")]
    assert [float(pp["vs_control"]), float(pp["vs_control_ci_lo"]), float(pp["vs_control_ci_hi"])] == pytest.approx(
        [m, lo, hi], rel=1e-5)


def _table(text: str, table_id: str) -> List[List[str]]:
    table = re.search(rf'<table id="{table_id}">(.*?)</table>', text, re.S).group(1)
    return [[" ".join(html.unescape(re.sub(r"<[^>]+>", " ", c)).split()) for c in re.findall(r"<t[dh][^>]*>(.*?)</t[dh]>",
                                                                                          tr, re.S)]
            for tr in re.findall(r"<tr[^>]*>(.*?)</tr>", table, re.S)]


def test_paired_table_in_the_html_and_the_markdown(report):
    exp = _expected(report["dirs"])
    header, *rows = _table(report["html"], "paired-table")
    cells = {r[1]: dict(zip(header, r)) for r in rows}
    assert [r[1] for r in rows] == ["off", "paper_plus", "random@paper_plus"]  # control right after its policy
    pp = cells["paper_plus"]
    assert pp["dataset"] == "clicklog" and pp["seeds"] == "0, 1, 2"
    m, lo, hi = _interval(exp["paper_plus"]["dauc"])
    assert pp["paired test AUC - off [95% CI]"] == f"{m:+.4f} [{lo:+.4f}, {hi:+.4f}]"
    assert pp["per seed"] == ", ".join(f"{v:+.4f}" for v in exp["paper_plus"]["dauc"])
    m, lo, hi = _interval(exp["paper_plus"]["speedup"])
    assert pp["speedup [95% CI]"] == f"{m:.3f} [{lo:.3f}, {hi:.3f}]"
    m, lo, hi = _interval(exp["paper_plus"]["vs_control"])
    assert pp["vs its control [95% CI]"] == f"{m:+.4f} [{lo:+.4f}, {hi:+.4f}] vs random@paper_plus"
    assert cells["random@paper_plus"]["vs its control [95% CI]"] == "(control of paper_plus)"
    assert cells["off"]["paired test AUC - off [95% CI]"] == (
        f"test AUC {statistics.fmean(OFF_AUC.values()):.4f} (reference)")
    # paired_results.md: the same cells
    md = (report["out"] / "paired_results.md").read_text().splitlines()
    md_rows = [[c.strip() for c in line.strip("|").split("|")] for line in md[2:]]
    assert md_rows == rows and [c.strip() for c in md[0].strip("|").split("|")] == header


def test_final_metrics_replace_dot_only_curves(report):
    text = report["html"]
    section = re.search(r'<section id="accuracy">(.*?)</section>', text, re.S).group(1)
    assert 'data-file="final_metrics.png"' in section and not (report["out"] / "accuracy.png").exists()
    # one point per run at its test AUC (top row) and test log loss (bottom row), grouped by policy
    calls = [c for c in report["recorder"].calls if c["kind"] == "scatter"
             and c["ax"].get_ylabel() in ("test AUC", "test log loss")]
    auc = {round(c["x"][0]): c["y"] for c in calls if c["ax"].get_ylabel() == "test AUC"}
    names = ["off", "paper_plus", "random@paper_plus"]
    for i, series in enumerate(names):
        assert sorted(auc[i]) == sorted(_auc(report["dirs"][series][s]) for s in SEEDS)
    assert not any("dashed" in t for t in report["recorder"].suptitles)


def test_accuracy_curves_say_dashed_only_for_an_incomplete_run(tmp_path, monkeypatch):
    from slipstream_rec.report.figures import accuracy

    recorder = Recorder(monkeypatch)
    runs = []
    for name in ("a", "b"):
        d = tmp_path / name
        write_run(d, ["slipstream=off"], 0.75, 10.0)
        records = [json.dumps({"kind": "eval", "split": "val", "step": s, "time": s / 10, "samples_trained": s * 1024,
                               "auc": 0.7 + s / 1e4, "logloss": 0.5}) for s in (20, 40, 60)]
        (d / "metrics.jsonl").write_text("\n".join(records) + "\n")
        runs.append(load_run(d))
    assign_labels(runs)
    accuracy(runs)
    (tmp_path / "b" / "summary.json").unlink()
    runs[1] = load_run(tmp_path / "b")
    accuracy(runs)
    assert ["dashed" in t for t in recorder.suptitles] == [False, True]


def _t_cdf(t: float, df: int) -> float:
    """Student's t CDF by Simpson integration of its density from 0 to t."""
    import numpy as np

    x = np.linspace(0.0, t, 20001)
    log_c = math.lgamma((df + 1) / 2) - math.lgamma(df / 2) - 0.5 * math.log(df * math.pi)
    pdf = np.exp(log_c - (df + 1) / 2 * np.log1p(x * x / df))
    h = x[1] - x[0]
    return 0.5 + h / 3 * (pdf[0] + pdf[-1] + 4 * pdf[1:-1:2].sum() + 2 * pdf[2:-1:2].sum())


def test_t975_against_closed_forms_and_the_density():
    assert t975(1) == pytest.approx(math.tan(math.pi * 0.475), abs=1e-4)  # Cauchy
    assert t975(2) == pytest.approx(_t975_df2(), abs=1e-4)
    for df in [*range(1, 41), 60, 120, 1000]:  # the table (1..30) and the expansion beyond
        assert _t_cdf(t975(df), df) == pytest.approx(0.975, abs=2e-6), df
    with pytest.raises(ValueError, match="at least 2 values"):
        t975(0)


def test_pairs_by_dataset_and_occurrence_and_names_settings(tmp_path):
    root = tmp_path / "runs"
    dirs = []
    # two repeats with seed 0 (no --vary-seed): the i-th paper_plus run pairs with the i-th off run
    for r, (off_s, pp_s) in enumerate(((100.0, 90.0), (120.0, 100.0))):
        write_run(root / f"off-r{r}", ["slipstream=off"], 0.75, off_s)
        write_run(root / f"pp-r{r}", ["slipstream=paper_plus"], 0.749, pp_s, 0.1, 60, policy="paper_plus")
        dirs += [root / f"off-r{r}", root / f"pp-r{r}"]
    # a second setting of paper_plus, and a dataset without off: left out with a note
    write_run(root / "pp-d01", ["slipstream=paper_plus", "slipstream.target_skip_fraction=0.1"], 0.7495, 95.0,
              0.05, 60, policy="paper_plus")
    write_run(root / "other", ["slipstream=paper_plus", "trainer.batch_size=512"], 0.74, 50.0, 0.1, 60,
              policy="paper_plus")
    # uniform negative downsampling alone controls the same downsampling beside paper_plus
    write_run(root / "neg", ["slipstream=negative_sampling"], 0.741, 60.0, 0.5, 0, policy="random")
    write_run(root / "ppneg", ["slipstream=paper_plus_negatives"], 0.743, 58.0, 0.54, 0, policy="paper_plus")
    # a crashed repeat first (no summary.json): it shifts no pairing
    write_run(root / "pp-crashed", ["slipstream=paper_plus"], 0.7, 10.0, 0.1, 60, policy="paper_plus")
    (root / "pp-crashed" / "summary.json").unlink()
    # serving stale inputs (conf/slipstream/serve.yaml, policy paper_plus) is a series of its own
    write_run(root / "serve", ["slipstream=serve"], 0.7499, 97.0, 0.2, 60, policy="paper_plus")
    runs = [load_run(d) for d in [root / "pp-crashed", *dirs, root / "pp-d01", root / "other", root / "neg",
                                  root / "ppneg", root / "serve"]]
    assign_labels(runs)
    results, notes = paired_results(runs)
    by = {r.series: r for r in results}
    assert by["serve"].dauc.values == pytest.approx([0.7499 - 0.75])
    pp = by["paper_plus (target_skip_fraction=0.3)"]
    assert pp.speedup.values == pytest.approx([100 / 90, 120 / 100])
    assert [p.off for p in pp.pairs] == ["off-r0", "off-r1"]
    assert by["paper_plus (target_skip_fraction=0.1)"].dauc.values == pytest.approx([0.7495 - 0.75])
    assert by["negative_sampling"].controls == "paper_plus_negatives"
    assert by["paper_plus_negatives"].vs_control.values == pytest.approx([0.743 - 0.741])
    # the run with another batch size is another dataset, told apart by that key, and has no off
    default_batch = yaml.safe_load((root / "off-r0" / "config.yaml").read_text())["trainer"]["batch_size"]
    assert default_batch != 512
    assert {r.dataset for r in results} == {f"clicklog, trainer.batch_size={default_batch}"}
    assert any(n.startswith("other: no off run of dataset") for n in notes), notes
    assert any(n.startswith("pp-crashed: no train_seconds or test_auc") for n in notes), notes


def test_benchmark_prints_the_reports_table(tmp_path, monkeypatch, capsys):
    """benchmarks/slipstream_policies.py with recorded runs in place of trainings: its paired table
    is the report's, cell for cell."""
    from benchmarks import slipstream_policies as bench
    from benchmarks._runner import FIELDS

    auc = {"off": (0.7550, 0.7581, 0.7566), "paper_plus": (0.7538, 0.7570, 0.7549), "random": (0.7541, 0.7575, 0.7551)}
    seconds = {"off": 100.0, "paper_plus": 93.0, "random": 92.0}

    def fake_run(choice, nproc, overrides, run_dir):
        policy = choice[0].split("=")[1]
        seed = int(next(o.split("=")[1] for o in overrides if o.startswith("trainer.seed=")))
        skip = 0.0 if policy == "off" else 0.06 + 0.01 * seed
        summary = write_run(run_dir, [*choice, *overrides], auc[policy][seed], seconds[policy] + seed, skip,
                            None if policy == "off" else 60, policy=policy)
        return {k: summary.get(k) for k in FIELDS}

    reports = []
    monkeypatch.setattr(bench, "ROOT", tmp_path)
    monkeypatch.setattr(bench, "run_policy", fake_run)
    monkeypatch.setattr(bench, "write_report", lambda dirs, out: reports.append(report_main(
        [*map(str, dirs), "-o", str(out)])))
    monkeypatch.setattr(sys, "argv", ["slipstream_policies.py", "--repeats", "3", "--vary-seed", "--name", "t",
                                      "--policies", "off,paper_plus", "--random-control", "paper_plus"])
    bench.main()
    printed = capsys.readouterr().out
    assert reports == [0]
    md = (tmp_path / "benchmarks" / "results" / "report_t" / "paired_results.md").read_text().splitlines()
    md_rows = [[c.strip() for c in line.strip("|").split("|")] for line in md[2:]]
    assert [r[1] for r in md_rows] == ["off", "paper_plus", "random@paper_plus"]
    lines = printed.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("dataset"))
    for row, line in zip(md_rows, lines[start + 1:start + 4]):
        assert [c for c in row if c] == re.split(r"\s{2,}", line.strip())
    saved = json.loads((tmp_path / "benchmarks" / "results" / "slipstream_t.json").read_text())
    assert [p["series"] for p in saved["paired"]] == ["off", "paper_plus", "random@paper_plus"]
    expected = [a - b for a, b in zip(auc["paper_plus"], auc["off"])]  # paired by seed
    assert saved["paired"][1]["dauc"]["values"] == pytest.approx(expected, abs=1e-12)
    assert md_rows[1][7] == ", ".join(f"{v:+.4f}" for v in expected)
