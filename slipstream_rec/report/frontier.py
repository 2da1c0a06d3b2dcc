"""The report's answer figures: speedup against quality cost (the frontier) and final metrics.

``frontier``: per dataset, x = speedup over the paired ``off`` run, y = paired test AUC
difference to ``off``; one filled marker per policy and setting (the means; a bar for the 95%
interval of the AUC difference from 3 seeds on), its seeds as small dots, the ideal speedup 1 / (1 - skip) as a hollow marker at the same height, a
control (``random@<policy>``, ``negative_sampling``) in its policy's color with an X, joined to
it; the shaded band is the target (at most 0.001 below ``off``). Upper right is better.

``final_metrics``: test AUC and log loss of every run, grouped by dataset and policy, one point per
run (its seed beside it), for runs that evaluate only at the end and so have no curve.
"""

from __future__ import annotations

import math
from typing import Any, Dict, List, Optional, Sequence, Tuple

from matplotlib.colors import to_rgb
from matplotlib.lines import Line2D
from matplotlib.patches import Patch

from slipstream_rec.report.figures import Png, _color, _new, _png
from slipstream_rec.report.paired import TARGET_DAUC, Paired, Stat
from slipstream_rec.report.pairing import OFF, place, series_order
from slipstream_rec.report.runs import Run

BAND = "#2ca02c"
# Smallest y span of the final-metrics panels: a few times the target, so that a difference far
# below it cannot fill the axis and look like a cliff.
MIN_METRIC_SPAN = 0.004


def series_colors(series: Sequence[Tuple[str, Optional[str]]]) -> Dict[str, Any]:
    """(series, the series it controls or None) -> color: off black, a policy the next palette
    color, a control a lighter shade of its policy's (both figures use this, so colors agree)."""
    colors: Dict[str, Any] = {OFF: "black"}
    for name, controls in series:
        if name not in colors and not controls:
            colors[name] = _color(len(colors) - 1)
    for name, controls in series:
        if controls:
            rgb = to_rgb(colors.get(controls) or _color(len(colors) - 1))
            colors[name] = tuple(c + (1 - c) * 0.45 for c in rgb)
    return colors


def _shows_interval(stat: Stat) -> bool:
    """The 95% interval is drawn from 3 seeds on: from 2 (t = 12.7) it is 9 times their spread and
    would dwarf every point; the two seeds' dots show that spread (the table has the interval)."""
    return stat.lo is not None and len(stat.values) >= 3


def _err(stat: Stat) -> Any:
    if not _shows_interval(stat):
        return None
    return [[stat.mean - stat.lo], [stat.hi - stat.mean]]


def _limits(values: List[float], must: Sequence[float], pad: float) -> Tuple[float, float]:
    lo, hi = min([*values, *must]), max([*values, *must])
    span = hi - lo
    return lo - pad * span, hi + pad * span


def _frontier_panel(ax: Any, results: List[Paired], colors: Dict[str, str]) -> None:
    xs: List[float] = [1.0]
    ys: List[float] = [0.0]
    for r in results:
        xs += r.speedup.values
        ys += r.dauc.values + [v for v in (r.dauc.lo, r.dauc.hi) if v is not None and _shows_interval(r.dauc)]
        if math.isfinite(r.ideal_speedup):
            xs.append(r.ideal_speedup)
    x0, x1 = _limits(xs, (0.98, 1.02), 0.12)
    y0, y1 = _limits(ys, (-2 * TARGET_DAUC, TARGET_DAUC), 0.12)
    ax.axhspan(-TARGET_DAUC, y1, color=BAND, alpha=0.12, linewidth=0)
    ax.axhline(-TARGET_DAUC, color=BAND, linewidth=1, linestyle="--")
    ax.axhline(0, color="#555555", linewidth=0.8)
    ax.axvline(1, color="#555555", linewidth=0.8)
    ax.plot([1], [0], marker="*", ms=15, color="black", linestyle="none", zorder=5)
    ax.annotate("off", (1, 0), xytext=(-8, 8), textcoords="offset points", ha="right", fontsize=9)
    means = {}
    for r in results:
        if r.is_off:
            continue
        color, marker = colors[r.series], ("X" if r.controls else "o")
        sp, d = r.speedup, r.dauc
        ax.scatter(sp.values, d.values, s=30, color=color, alpha=0.55, marker=marker, linewidths=0, zorder=3)
        if math.isfinite(r.ideal_speedup):
            ax.plot([sp.mean, r.ideal_speedup], [d.mean, d.mean], color=color, linestyle=":", linewidth=1)
            ax.plot([r.ideal_speedup], [d.mean], marker=marker, ms=9, mfc="white", mec=color, mew=1.6,
                    linestyle="none", zorder=5)
        # the speedup's spread shows in the seeds' dots: on a shared machine it is wide (seconds are
        # noisy, AUC is not), and its interval would cross the whole panel
        ax.errorbar([sp.mean], [d.mean], yerr=_err(d), fmt=marker, ms=9, color=color,
                    ecolor=color, elinewidth=1.2, capsize=3, zorder=5)
        means[r.series] = (sp.mean, d.mean)
    for r in results:  # each control joined to its policy; labels under the markers, over the lines
        if r.controls and r.controls in means and r.series in means:
            (xa, ya), (xb, yb) = means[r.controls], means[r.series]
            ax.plot([xa, xb], [ya, yb], color=colors[r.series], linewidth=0.8, linestyle="--", alpha=0.7)
    for r in results:
        if r.series in means:
            below = bool(r.controls)
            ax.annotate(r.series, means[r.series], xytext=(9, -13 if below else 7), textcoords="offset points",
                        fontsize=9, color=colors[r.series], fontweight="bold", zorder=3.5,
                        bbox={"boxstyle": "round,pad=0.15", "fc": "white", "ec": "none", "alpha": 0.75})
    ax.set_xlim(x0, x1)
    ax.set_ylim(y0, y1)
    n = sorted({len(r.pairs) for r in results if not r.is_off})
    ax.set_title(f"{results[0].dataset} ({'/'.join(map(str, n))} seed(s) per policy)", fontsize=10)
    ax.set_xlabel("speedup over the paired off run (off's train seconds / the policy's)  \u2192 faster")
    ax.set_ylabel("paired test AUC \u2212 off's  \u2192 better")
    ax.grid(alpha=0.3)


def frontier(results: List[Paired]) -> Tuple[List[Png], List[str]]:
    """One panel per dataset that has a policy paired with off; nothing (and a note) without."""
    datasets = list(dict.fromkeys(r.dataset for r in results if not r.is_off))
    if not datasets:
        return [], ["no policy run has an off run of the same dataset and seed: no frontier (it needs runs "
                    "that share a dataset and seeds, off among them)"]
    colors = series_colors([(r.series, r.controls) for r in results])
    cols = min(len(datasets), 2)
    rows = math.ceil(len(datasets) / cols)
    fig = _new(9.5 if cols == 1 else 7.5 * cols, 5.6 * rows + 1.1)
    axes = fig.subplots(rows, cols, squeeze=False)
    for i, dataset in enumerate(datasets):
        _frontier_panel(axes[i // cols][i % cols], [r for r in results if r.dataset == dataset], colors)
    for j in range(len(datasets), rows * cols):
        axes[j // cols][j % cols].set_visible(False)
    handles = [
        Line2D([], [], marker="o", color="#444444", ms=8, linestyle="none", label="policy: mean over seeds (bar: 95% CI of the AUC difference)"),
        Line2D([], [], marker="o", color="#444444", ms=4, alpha=0.45, linestyle="none", label="one seed (pair)"),
        Line2D([], [], marker="o", mfc="white", mec="#444444", ms=8, linestyle="none",
               label="ideal speedup 1/(1 \u2212 skip) at the same AUC"),
        Line2D([], [], marker="X", color="#444444", ms=8, linestyle="none",
               label="a control, lighter: same skip at random / uniform negatives"),
        Line2D([], [], marker="*", color="black", ms=11, linestyle="none", label="off (the reference)"),
        Patch(color=BAND, alpha=0.25, label=f"target: at most {TARGET_DAUC} below off"),
    ]
    fig.legend(handles=handles, loc="outside lower center", ncol=2 if cols == 1 else 3, fontsize=8, frameon=False)
    fig.suptitle("Faster at the same quality? Policies paired with off on the same seed: upper right is better")
    return [_png(fig, "frontier.png", "Speedup over off against the paired test AUC difference (frontier)")], []


# ---- final metrics ---------------------------------------------------------------------------------
def _final_points(runs: List[Run]) -> Tuple[Dict[str, Dict[str, List[Tuple[Any, float, float]]]],
                                            Dict[str, Optional[str]], List[str]]:
    """dataset -> series -> [(seed, test AUC, test log loss)], in run order (off first); which
    series each control series controls; notes for runs without test metrics."""
    placed, _ = place(runs)
    where = {id(p.run): (p.dataset, p.series, p.seed) for p in placed}
    controls = {p.series: p.controls for p in placed}
    kinds = {p.series: p.kind for p in placed}
    points: Dict[str, Dict[str, List[Tuple[Any, float, float]]]] = {}
    notes = []
    for run in runs:
        auc, loss = run.get("test_auc"), run.get("test_logloss")
        if not all(isinstance(v, (int, float)) and math.isfinite(v) for v in (auc, loss)):
            notes.append(f"{run.label}: no test AUC and log loss in summary.json"
                         + ("" if run.complete else " (incomplete)"))
            continue
        dataset, series, seed = where.get(id(run), ("(no config)", run.policy or run.label, "?"))
        points.setdefault(dataset, {}).setdefault(series, []).append((seed, float(auc), float(loss)))
    for dataset, series in points.items():
        order = series_order([(name, kinds.get(name, name), controls.get(name)) for name in series])
        points[dataset] = {name: series[name] for name in order}
    return points, controls, notes


def final_metrics(runs: List[Run]) -> Tuple[List[Png], List[str]]:
    """Test AUC and log loss per run, grouped by dataset and policy, each run a point labelled with
    its seed; the mean of a policy as a bar."""
    points, controls, notes = _final_points(runs)
    if not points:
        return [], notes
    colors = series_colors([(name, controls.get(name)) for series in points.values() for name in series])
    fig = _new(max(9.0, 1.6 + 1.5 * sum(len(s) for s in points.values())), 7.0)
    widths = [max(1, len(s)) for s in points.values()]
    axes = fig.subplots(2, len(points), squeeze=False, gridspec_kw={"width_ratios": widths})
    for col, (dataset, series) in enumerate(points.items()):
        for row, (index, ylabel) in enumerate(((1, "test AUC"), (2, "test log loss"))):
            ax = axes[row][col]
            values: List[float] = []
            for i, (name, pts) in enumerate(series.items()):
                ys = [p[index] for p in pts]
                offsets = [0.0] if len(ys) == 1 else [-0.18 + 0.36 * k / (len(ys) - 1) for k in range(len(ys))]
                ax.scatter([i + o for o in offsets], ys, s=30, color=colors[name], zorder=3)
                for o, y, p in zip(offsets, ys, pts):
                    ax.annotate(str(p[0]), (i + o, y), xytext=(4, 0), textcoords="offset points", fontsize=7,
                                va="center", color="#555555")
                mean = sum(ys) / len(ys)
                ax.plot([i - 0.3, i + 0.3], [mean, mean], color=colors[name], linewidth=2)
                values += ys
            mid, span = (min(values) + max(values)) / 2, max(max(values) - min(values), MIN_METRIC_SPAN)
            ax.set_ylim(mid - 0.6 * span, mid + 0.6 * span)
            ax.set_xlim(-0.6, len(series) - 0.4)
            ax.set_xticks(range(len(series)), list(series), rotation=15, ha="right", fontsize=8)
            ax.set_ylabel(ylabel)
            ax.grid(alpha=0.3, axis="y")
            if row == 0:
                ax.set_title(dataset, fontsize=10)
    fig.suptitle("Final test AUC and log loss (points: runs, labelled with their seed; bars: means)")
    return [_png(fig, "final_metrics.png", "Final test AUC and log loss per run, grouped by policy")], notes
