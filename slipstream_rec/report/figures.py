"""The report's figures, drawn with matplotlib's Agg canvas (no pyplot, no display, no global
backend switch) and returned as PNG bytes.

Every function returns the figures it could draw and notes for what a run lacks, so that a run
without the data (an ``off`` run has no Slipstream records, a crashed run no summary) gives a
sentence instead of an error.
"""

from __future__ import annotations

import io
import math
import re
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence, Tuple

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.cm import ScalarMappable
from matplotlib.colors import Normalize
from matplotlib.figure import Figure

from slipstream_rec.report.runs import Run

DPI = 100
PALETTE = ["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
           "#bcbd22", "#17becf"]


@dataclass
class Png:
    name: str  # file name in the output directory
    title: str
    data: bytes


def file_safe(label: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", label).strip("_") or "run"


def _color(i: int) -> str:
    return PALETTE[i % len(PALETTE)]


def _new(width: float, height: float) -> Figure:
    fig = Figure(figsize=(width, height), dpi=DPI, layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def _png(fig: Figure, name: str, title: str) -> Png:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=DPI)
    return Png(name=name, title=title, data=buf.getvalue())


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _series(records: Sequence[Dict[str, Any]], x: str, y: str) -> Tuple[List[float], List[float]]:
    pts = [(r[x], r[y]) for r in records if _finite(r.get(x)) and _finite(r.get(y))]
    return [p[0] for p in pts], [p[1] for p in pts]


def _empty(ax: Any, text: str) -> None:
    ax.text(0.5, 0.5, text, ha="center", va="center", transform=ax.transAxes, color="#777777")


# ---- accuracy --------------------------------------------------------------------------------
def accuracy(runs: List[Run]) -> Tuple[List[Png], List[str]]:
    """Validation AUC and log loss vs wall time and vs samples trained, one line per run."""
    notes = [f"{r.label}: no validation evaluation recorded" for r in runs if not r.evals("val")]
    if len(notes) == len(runs):
        return [], notes
    fig = _new(11, 7.5)
    axes = fig.subplots(2, 2)
    for col, (x, xlabel) in enumerate((("time", "wall time since start (s, evaluations included)"),
                                       ("samples_trained", "samples trained"))):
        for row, (y, ylabel) in enumerate((("auc", "validation AUC"), ("logloss", "validation log loss"))):
            ax = axes[row][col]
            for i, run in enumerate(runs):
                xs, ys = _series(run.evals("val"), x, y)
                if xs:
                    ax.plot(xs, ys, marker="o", ms=3, color=_color(i), label=run.label,
                            linestyle="-" if run.complete else "--")
            ax.set_xlabel(xlabel)
            ax.set_ylabel(ylabel)
            ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=8)
    # the dashed-line key only where a dashed line is drawn
    drawn_incomplete = any(not run.complete and run.evals("val") for run in runs)
    fig.suptitle("Validation AUC and log loss" + (" (dashed: incomplete run)" if drawn_incomplete else ""))
    return [_png(fig, "accuracy.png", "Validation AUC and log loss vs wall time and vs samples trained")], notes


# ---- skipping --------------------------------------------------------------------------------
def _finish_snapshot_panel(ax: Any, drawn: bool, ylabel: str) -> None:
    """Legend (or the no-data note), axis labels and grid of a panel drawn from snapshot records."""
    if drawn:
        ax.legend(fontsize=7)
    else:
        _empty(ax, "no Slipstream records")
    ax.set_xlabel("wall time since start (s)")
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)


def skipping(runs: List[Run]) -> Tuple[List[Png], List[str]]:
    """Skip fraction, threshold T, hot/stale rows and the target D over time, one color per run
    (lines: train records, markers: Slipstream snapshot records; on the D panel, the quality
    check's decisions: up triangles raised D, down triangles lowered it)."""
    notes: List[str] = []
    for run in runs:
        if not run.of_kind("train") and not run.of_kind("slipstream"):
            notes.append(f"{run.label}: no train or Slipstream records")
        elif not any(_finite(r.get("threshold")) for r in run.of_kind("train") + run.of_kind("slipstream")):
            notes.append(f"{run.label}: no threshold T was ever set (policy {run.policy}: nothing stale)")
        if not run.of_kind("slipstream"):
            notes.append(f"{run.label}: no Slipstream snapshot records (policy {run.policy} does not track rows)")
    if not any(r.of_kind("train") or r.of_kind("slipstream") for r in runs):
        return [], notes
    fig = _new(18, 4.2)
    axes = fig.subplots(1, 4)
    panels = (("skip_fraction", "skip fraction (rank 0, cumulative)"), ("threshold", "threshold T"))
    for ax, (key, ylabel) in zip(axes, panels):
        for i, run in enumerate(runs):
            xs, ys = _series(run.of_kind("train"), "time", key)
            if xs:
                ax.plot(xs, ys, color=_color(i), label=run.label, linestyle="-" if run.complete else "--")
            xs, ys = _series(run.of_kind("slipstream"), "time", key)
            if xs:
                ax.plot(xs, ys, color=_color(i), marker="o", ms=4, linestyle="none")
        ax.set_xlabel("wall time since start (s)")
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
    if not any(_finite(r.get("threshold")) for run in runs for r in run.of_kind("train") + run.of_kind("slipstream")):
        _empty(axes[1], "no run set a threshold")
    ax = axes[2]
    drawn = False
    for i, run in enumerate(runs):
        for key, style in (("hot_rows", "-"), ("stale_rows", ":")):
            xs, ys = _series(run.of_kind("slipstream"), "time", key)
            if xs:
                ax.plot(xs, ys, color=_color(i), linestyle=style, marker=".",
                        label=f"{run.label} {key.split('_')[0]}")
                drawn = True
    _finish_snapshot_panel(ax, drawn, "rows, all tables (solid: hot, dotted: stale)")
    ax = axes[3]
    drawn = False
    for i, run in enumerate(runs):
        xs, ys = _series(run.of_kind("slipstream"), "time", "target_skip_fraction")
        if xs:
            ax.step(xs, ys, where="post", color=_color(i), label=run.label)
            drawn = True
        for r in run.of_kind("slipstream"):
            q = r.get("quality")
            if isinstance(q, dict) and _finite(r.get("time")) and _finite(q.get("target_after")):
                ax.plot(r["time"], q["target_after"], color=_color(i), linestyle="none",
                        marker="^" if q.get("better") else "v", ms=6)
    _finish_snapshot_panel(ax, drawn, "target D (quality check: ^ raised, v lowered)")
    axes[0].legend(fontsize=8)
    fig.suptitle("Skipping over time (lines: train records, dots: snapshots)")
    return [_png(fig, "skipping.png", "Skip fraction, threshold T, hot/stale rows and target D over time")], notes


def rows_per_table(runs: List[Run]) -> Tuple[List[Png], List[str]]:
    """Per tracking run: hot rows and stale rows of each table at each snapshot."""
    pngs: List[Png] = []
    notes: List[str] = []
    for run in runs:
        records = [r for r in run.of_kind("slipstream") if isinstance(r.get("hot_rows_per_table"), dict)]
        if not records:
            notes.append(f"{run.label}: no per-table rows (no Slipstream snapshot records; policy {run.policy})")
            continue
        tables = sorted({t for r in records for t in r["hot_rows_per_table"]}, key=_table_order)
        fig = _new(13, 4.6)
        axes = fig.subplots(1, 2, sharex=True)
        cmap = _table_colors(len(tables))
        for key, ax, title in (("hot_rows_per_table", axes[0], "hot rows per table"),
                               ("stale_rows_per_table", axes[1], "stale rows per table (no T yet: 0)")):
            for j, table in enumerate(tables):
                xs = [r["time"] for r in records]
                ys = [(r.get(key) or {}).get(table, 0) for r in records]
                ax.plot(xs, ys, color=cmap[j], linestyle=("-", "--", ":")[j // 10 % 3], marker=".", ms=3,
                        label=table)
            ax.set_title(title)
            ax.set_xlabel("wall time since start (s)")
            ax.set_ylabel("rows")
            ax.set_yscale("symlog", linthresh=10)
            ax.grid(alpha=0.3)
        axes[1].legend(fontsize=6, ncol=2, loc="center left", bbox_to_anchor=(1.01, 0.5))
        fig.suptitle(f"{run.label}: hot and stale rows per table at each snapshot")
        pngs.append(_png(fig, f"rows_per_table_{file_safe(run.label)}.png", f"{run.label}: rows per table"))
    return pngs, notes


def _table_order(name: str) -> Tuple[str, int]:
    m = re.match(r"^(.*?)(\d+)$", name)
    return (m.group(1), int(m.group(2))) if m else (name, -1)


def _table_colors(n: int) -> List[Any]:
    from matplotlib import colormaps

    cmap = colormaps["tab10"]
    return [cmap(j % 10) for j in range(n)]


def change_distribution(runs: List[Run]) -> Tuple[List[Png], List[str]]:
    """Per tracking run: the histogram of the hot rows' change since the previous snapshot, one
    line per snapshot (colored by step), with that snapshot's threshold T as a dashed line."""
    pngs: List[Png] = []
    notes: List[str] = []
    for run in runs:
        records = [r for r in run.of_kind("slipstream") if _valid_hist(r.get("change_histogram"))]
        if not records:
            notes.append(f"{run.label}: no change histograms (no Slipstream snapshot records; policy {run.policy})")
            continue
        measured = [r for r in records if sum(r["change_histogram"]["counts"]) > 0]
        if not measured:
            notes.append(f"{run.label}: no snapshot measured a change yet (a change needs two snapshots)")
            continue
        fig = _new(9, 4.8)
        ax = fig.subplots()
        steps = [r["step"] for r in measured]
        norm = Normalize(vmin=min(steps), vmax=max(steps) if max(steps) > min(steps) else min(steps) + 1)
        from matplotlib import colormaps

        cmap = colormaps["viridis"]
        for r in measured:
            hist = r["change_histogram"]
            color = cmap(norm(r["step"]))
            ax.stairs(hist["counts"], hist["edges"], color=color, linewidth=1.4)
            if _finite(r.get("threshold")) and r["threshold"] > 0:
                ax.axvline(r["threshold"], color=color, linestyle="--", linewidth=1)
        ax.set_xscale("log")
        ax.set_xlabel("change of a hot row since the previous snapshot (values outside the edges in the end bins)")
        ax.set_ylabel("hot rows")
        ax.grid(alpha=0.3, which="both")
        fig.colorbar(ScalarMappable(norm=norm, cmap=cmap), ax=ax, label="snapshot step")
        fig.suptitle(f"{run.label}: per-row change of hot rows at each snapshot (dashed: threshold T)")
        pngs.append(_png(fig, f"change_{file_safe(run.label)}.png", f"{run.label}: change distribution"))
        skipped = len(records) - len(measured)
        if skipped:
            notes.append(f"{run.label}: {skipped} snapshot(s) without a measured change left out (the first one "
                         "has no previous snapshot)")
    return pngs, notes


def _valid_hist(hist: Any) -> bool:
    return (isinstance(hist, dict) and isinstance(hist.get("edges"), list) and isinstance(hist.get("counts"), list)
            and len(hist["edges"]) == len(hist["counts"]) + 1 and len(hist["counts"]) > 0)


# ---- time breakdown --------------------------------------------------------------------------
BREAKDOWN_PARTS = [  # (key, name, color); slipstream's parts replace its total where known
    ("data", "data", "#9e9e9e"),
    ("input_all_to_all", "input all-to-all", "#17becf"),
    ("forward", "forward (+ lookups, output all-to-all)", "#1f77b4"),
    ("backward", "backward (+ fused embedding update)", "#2ca02c"),
    ("optimizer", "dense optimizer", "#bcbd22"),
    ("slipstream", "slipstream", "#ff9896"),
    ("count", "slipstream: count", "#ffbb78"),
    ("classify", "slipstream: classify", "#ff7f0e"),
    ("snapshot", "slipstream: snapshot", "#d62728"),
    ("sync", "slipstream: sync", "#e377c2"),
    ("other", "other", "#7f7f7f"),
]
SLIPSTREAM_PARTS = ("count", "classify", "snapshot", "sync")


def time_breakdown(runs: List[Run]) -> Tuple[List[Png], List[str], Dict[str, Optional[Dict[str, float]]]]:
    """Stacked horizontal bar per run of rank 0's training seconds."""
    notes: List[str] = []
    parts = {run.label: run.time_breakdown() for run in runs}
    for run in runs:
        if parts[run.label] is None:
            notes.append(f"{run.label}: no time breakdown (no summary.json and no train record with times)")
        elif not run.complete:
            notes.append(f"{run.label}: incomplete, breakdown up to its last train record")
    drawn = [run for run in runs if parts[run.label] is not None]
    if not drawn:
        return [], notes, parts
    fig = _new(11, 1.6 + 0.55 * len(drawn))
    ax = fig.subplots()
    ylabels = [run.label + ("" if run.complete else " (incomplete)") for run in drawn]
    handles: Dict[str, Any] = {}
    for y, run in enumerate(drawn):
        p = parts[run.label]
        assert p is not None
        split = all(k in p for k in SLIPSTREAM_PARTS)
        left = 0.0
        for key, name, color in BREAKDOWN_PARTS:
            if (key == "slipstream" and split) or key not in p:
                continue
            bar = ax.barh(y, p[key], left=left, color=color, edgecolor="white", linewidth=0.5)
            handles.setdefault(name, bar)
            left += p[key]
    ax.set_yticks(range(len(drawn)), ylabels)
    ax.invert_yaxis()
    ax.set_xlabel("seconds of training (rank 0, evaluations excluded)")
    ax.grid(alpha=0.3, axis="x")
    order = [name for _, name, _ in BREAKDOWN_PARTS if name in handles]
    fig.legend([handles[n] for n in order], order, fontsize=8, loc="outside right upper")
    fig.suptitle("Where the training time went")
    return [_png(fig, "time_breakdown.png", "Time breakdown per run")], notes, parts
