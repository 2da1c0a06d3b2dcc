"""Paired results: each policy against ``off`` with the same seed, and against its control.

The one computation behind the report's frontier figure, its table of paired results, its
``frontier.csv`` and ``paired_results.md``, and the table ``benchmarks/slipstream_policies.py``
prints: so all of them show the same numbers.

Per pair (a policy's run and the ``off`` run of the same dataset, seed and occurrence; see
:mod:`slipstream_rec.report.pairing`):

- speedup = off's ``train_seconds`` / the run's (evaluations excluded),
- dAUC = the run's test AUC - off's,
- vs control = the run's test AUC - its control's (same seed and occurrence),

and per series the mean over pairs, the sample standard deviation and the 95% interval of the mean
(Student's t with n - 1 degrees of freedom; none for a single pair), the mean skip fraction and the
ideal speedup 1 / (1 - mean skip fraction), what skipping alone would give.
"""

from __future__ import annotations

import csv
import io
import json
import math
import statistics
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Tuple

from slipstream_rec.report.pairing import OFF, Placed, count_occurrences, place, series_order
from slipstream_rec.report.runs import Run

# The product's quality target: paired test AUC at most this far below off's.
TARGET_DAUC = 0.001

# Two-sided 95% quantiles of Student's t, t(0.975; df) for df = 1..30; beyond, the Cornish-Fisher
# expansion around the normal quantile to 1/df^3 (error below 1e-5 there).
_T975 = (12.70620, 4.30265, 3.18245, 2.77645, 2.57058, 2.44691, 2.36462, 2.30600, 2.26216, 2.22814, 2.20099,
         2.17881, 2.16037, 2.14479, 2.13145, 2.11991, 2.10982, 2.10092, 2.09302, 2.08596, 2.07961, 2.07387,
         2.06866, 2.06390, 2.05954, 2.05553, 2.05183, 2.04841, 2.04523, 2.04227)


def t975(df: int) -> float:
    if df < 1:
        raise ValueError(f"degrees of freedom: {df}; a t interval needs at least 2 values")
    if df <= len(_T975):
        return _T975[df - 1]
    z = 1.959964
    return (z + (z ** 3 + z) / (4 * df) + (5 * z ** 5 + 16 * z ** 3 + 3 * z) / (96 * df ** 2)
            + (3 * z ** 7 + 19 * z ** 5 + 17 * z ** 3 - 15 * z) / (384 * df ** 3))


@dataclass
class Stat:
    """Mean of paired values with their spread; ``lo``/``hi`` is the 95% interval of the mean."""

    values: List[float]
    mean: float
    std: Optional[float]  # sample standard deviation; None for one value
    lo: Optional[float]
    hi: Optional[float]

    @classmethod
    def of(cls, values: Sequence[float]) -> "Stat":
        values = [float(v) for v in values]
        if not values:
            raise ValueError("no paired values")
        mean = statistics.fmean(values)
        if len(values) < 2:
            return cls(values, mean, None, None, None)
        std = statistics.stdev(values)
        half = t975(len(values) - 1) * std / math.sqrt(len(values))
        return cls(values, mean, std, mean - half, mean + half)


@dataclass
class Pair:
    seed: Any
    run: str  # the policy run's label
    off: str  # the paired off run's label
    speedup: float
    dauc: float
    skip_fraction: float
    test_auc: float
    control: Optional[str] = None  # the paired control run's label
    vs_control: Optional[float] = None  # test AUC - the control's


@dataclass
class Paired:
    """One series of one dataset: a marker on the frontier, a row of the table."""

    dataset: str
    series: str
    kind: str
    controls: Optional[str]  # the series this one is the control of
    control: Optional[str]  # this series' control series
    pairs: List[Pair] = field(default_factory=list)

    @property
    def seeds(self) -> List[Any]:
        return [p.seed for p in self.pairs]

    @property
    def is_off(self) -> bool:
        return self.kind == OFF

    @property
    def skip_fraction(self) -> float:
        return statistics.fmean(p.skip_fraction for p in self.pairs)

    @property
    def ideal_speedup(self) -> float:
        skip = self.skip_fraction
        return 1.0 / (1.0 - skip) if skip < 1 else math.inf

    @property
    def test_auc(self) -> Stat:
        return Stat.of([p.test_auc for p in self.pairs])

    @property
    def speedup(self) -> Stat:
        return Stat.of([p.speedup for p in self.pairs])

    @property
    def dauc(self) -> Stat:
        return Stat.of([p.dauc for p in self.pairs])

    @property
    def vs_control(self) -> Optional[Stat]:
        values = [p.vs_control for p in self.pairs if p.vs_control is not None]
        return Stat.of(values) if values else None

    @property
    def meets_target(self) -> bool:
        return self.dauc.mean >= -TARGET_DAUC


def _finite(value: Any) -> Optional[float]:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    return float(value) if ok else None


def _measured(run: Run) -> Optional[Tuple[float, float, float]]:
    """(train seconds, test AUC, skip fraction) of a complete run, or None."""
    seconds, auc = _finite(run.get("train_seconds")), _finite(run.get("test_auc"))
    skip = _finite(run.get("skip_fraction"))
    if not run.complete or not seconds or auc is None:
        return None
    return seconds, auc, skip or 0.0


def _seed_key(p: Placed) -> Tuple[str, str, int]:
    return p.dataset, json.dumps(p.seed, default=str), p.occurrence


def _seed_order(seed: Any) -> Tuple[int, Any]:
    number = isinstance(seed, (int, float)) and not isinstance(seed, bool)
    return (0, seed) if number else (1, str(seed))


def paired_results(runs: List[Run]) -> Tuple[List[Paired], List[str]]:
    """The paired results of every series that has at least one off run of its dataset and seed,
    in the order of the runs (off first in each dataset, a control right after its policy), and
    notes for every run that could not be paired and why."""
    placed, notes = place(runs)
    usable = []
    for p in placed:
        if _measured(p.run) is None:
            notes.append(f"{p.run.label}: no train_seconds or test_auc in summary.json (incomplete, or "
                         "trainer.test_at_end=false): not paired")
        else:
            usable.append(p)
    count_occurrences(usable)  # among the runs that can pair: a crashed repeat shifts nothing
    offs = {_seed_key(p): p for p in usable if p.kind == OFF}
    by_series: Dict[Tuple[str, str], List[Placed]] = {}
    for p in usable:
        by_series.setdefault((p.dataset, p.series), []).append(p)
    control_of = {(p.dataset, p.controls): p.series for p in usable if p.controls}
    results: List[Paired] = []
    for (dataset, series), members in by_series.items():
        controls = {_seed_key(c): c for c in by_series.get((dataset, control_of.get((dataset, series), "")), [])}
        result = Paired(dataset=dataset, series=series, kind=members[0].kind, controls=members[0].controls,
                        control=control_of.get((dataset, series)))
        for p in members:
            off = offs.get(_seed_key(p))
            if off is None:
                notes.append(f"{p.run.label}: no off run of dataset {dataset} with seed {p.seed}"
                             + (f" (occurrence {p.occurrence + 1})" if p.occurrence else "") + ": not paired")
                continue
            (secs, auc, skip), (off_secs, off_auc, _) = _measured(p.run), _measured(off.run)  # type: ignore[misc]
            pair = Pair(seed=p.seed, run=p.run.label, off=off.run.label, speedup=off_secs / secs,
                        dauc=auc - off_auc, skip_fraction=skip, test_auc=auc)
            control = controls.get(_seed_key(p))
            if control is not None:
                pair.control = control.run.label
                pair.vs_control = auc - _measured(control.run)[1]  # type: ignore[index]
            result.pairs.append(pair)
        if result.pairs:
            result.pairs.sort(key=lambda pair: _seed_order(pair.seed))  # stable: repeats keep their order
            results.append(result)
    return _ordered(results), notes


def _ordered(results: List[Paired]) -> List[Paired]:
    """Datasets in order of appearance; in each, the order of :func:`pairing.series_order`."""
    out: List[Paired] = []
    for dataset in dict.fromkeys(r.dataset for r in results):
        mine = {r.series: r for r in results if r.dataset == dataset}
        out += [mine[name] for name in series_order([(r.series, r.kind, r.controls) for r in mine.values()])]
    return out


# ---- rendering -----------------------------------------------------------------------------------
def _signed(value: Optional[float]) -> str:
    return "" if value is None else f"{value:+.4f}"


def interval(stat: Optional[Stat], spec: str = "+.4f") -> str:
    """``mean [lo, hi]`` (just the mean for a single pair); empty without a value."""
    if stat is None:
        return ""
    if stat.lo is None or stat.hi is None:
        return format(stat.mean, spec)
    return f"{format(stat.mean, spec)} [{format(stat.lo, spec)}, {format(stat.hi, spec)}]"


def seeds_text(result: Paired) -> str:
    return ", ".join(str(s) for s in result.seeds)


def per_pair(values: Sequence[float]) -> str:
    return ", ".join(f"{v:+.4f}" for v in values)


HEADER = ("dataset", "policy", "seeds", "skip", "ideal speedup", "speedup [95% CI]",
          "paired test AUC - off [95% CI]", "per seed", "vs its control [95% CI]")


def table_rows(results: List[Paired]) -> List[List[str]]:
    """The table's cells as text: the HTML table, the markdown and the console print these."""
    rows = []
    for r in results:
        if r.is_off:
            rows.append([r.dataset, r.series, seeds_text(r), f"{r.skip_fraction:.3f}", f"{r.ideal_speedup:.3f}",
                         "1 (reference)", f"test AUC {r.test_auc.mean:.4f} (reference)", "", ""])
            continue
        vs = r.vs_control
        vs_text = (f"{interval(vs)} vs {r.control}" if vs is not None else
                   f"(control of {r.controls})" if r.controls else "")
        rows.append([r.dataset, r.series, seeds_text(r), f"{r.skip_fraction:.3f}", f"{r.ideal_speedup:.3f}",
                     interval(r.speedup, ".3f"), interval(r.dauc), per_pair(r.dauc.values), vs_text])
    return rows


def markdown_table(results: List[Paired]) -> str:
    """The paired results as a GitHub markdown table (what README.md and docs quote)."""
    lines = ["| " + " | ".join(HEADER) + " |", "|" + "---|" * len(HEADER)]
    for row in table_rows(results):
        lines.append("| " + " | ".join(c.replace("|", "\\|") for c in row) + " |")
    return "\n".join(lines) + "\n"


def text_table(results: List[Paired]) -> str:
    """The paired results as aligned plain text (the benchmark's console)."""
    rows = [list(HEADER)] + table_rows(results)
    widths = [max(len(row[i]) for row in rows) for i in range(len(HEADER))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in rows) + "\n"


def as_dict(result: Paired) -> Dict[str, Any]:
    """JSON-ready figures of one series (the report's data block and the benchmark's JSON)."""
    def stat(s: Optional[Stat]) -> Optional[Dict[str, Any]]:
        return None if s is None else {"mean": s.mean, "std": s.std, "ci95": [s.lo, s.hi], "values": s.values}

    return {"dataset": result.dataset, "series": result.series, "policy": result.kind,
            "controls": result.controls, "control": result.control, "seeds": result.seeds,
            "skip_fraction": result.skip_fraction, "ideal_speedup": result.ideal_speedup,
            "speedup": stat(result.speedup), "test_auc": stat(result.test_auc), "dauc": stat(result.dauc),
            "vs_control": stat(result.vs_control), "meets_target": result.meets_target,
            "pairs": [vars(p) for p in result.pairs]}


CSV_COLUMNS = ("dataset", "series", "policy", "controls", "control", "row", "seed", "pairs", "skip_fraction",
               "ideal_speedup", "speedup", "speedup_ci_lo", "speedup_ci_hi", "dauc", "dauc_ci_lo", "dauc_ci_hi",
               "vs_control", "vs_control_ci_lo", "vs_control_ci_hi", "run", "off_run", "control_run")


def frontier_csv(results: List[Paired]) -> str:
    """What the frontier figure draws: per series a ``mean`` row (the marker, its 95% intervals and
    the ideal speedup, the hollow marker) and a ``seed`` row per pair (the small dots)."""
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=CSV_COLUMNS, lineterminator="\n")
    writer.writeheader()
    for r in results:
        base = {"dataset": r.dataset, "series": r.series, "policy": r.kind, "controls": r.controls or "",
                "control": r.control or ""}
        sp, d, vs = r.speedup, r.dauc, r.vs_control
        writer.writerow({**base, "row": "mean", "pairs": len(r.pairs), "skip_fraction": r.skip_fraction,
                         "ideal_speedup": r.ideal_speedup, "speedup": sp.mean, "speedup_ci_lo": sp.lo,
                         "speedup_ci_hi": sp.hi, "dauc": d.mean, "dauc_ci_lo": d.lo, "dauc_ci_hi": d.hi,
                         "vs_control": vs.mean if vs else None, "vs_control_ci_lo": vs.lo if vs else None,
                         "vs_control_ci_hi": vs.hi if vs else None})
        for p in r.pairs:
            writer.writerow({**base, "row": "seed", "seed": p.seed, "pairs": 1, "skip_fraction": p.skip_fraction,
                             "ideal_speedup": 1.0 / (1.0 - p.skip_fraction) if p.skip_fraction < 1 else math.inf,
                             "speedup": p.speedup, "dauc": p.dauc, "vs_control": p.vs_control, "run": p.run,
                             "off_run": p.off, "control_run": p.control or ""})
    return out.getvalue()
