"""Which run pairs with which: datasets, policy series, seeds and controls, from ``config.yaml``.

A policy's quality cost is measured against ``off`` trained on the same data with the same seed
(the seed-to-seed spread of AUC, about 0.0005 on this project's data, cancels in each paired
difference). So every run with a config is placed by three things:

- its **dataset**: every config key except the Slipstream policy's and negative downsampling's
  (``slipstream.*``, ``downsampling.*``: the levers compared), the seed and the keys that change
  how a run is operated but not what it learns (``OPERATIONAL_KEYS``). Runs of one dataset differ
  only in the policy and the seed; a run pairs only within its dataset.
- its **series**, one marker on the frontier: the policy as its preset names it (``off``,
  ``paper_plus``, ``serve``, ``random``, ``negative_sampling``, ``paper_plus_negatives``, ...) plus the
  ``slipstream.*`` settings that differ between runs of that policy in the dataset
  (``paper_plus (target_skip_fraction=0.1)``).
- its **seed** (``trainer.seed``) and its occurrence among the series' runs with that seed, in the
  order given (complete runs only, ``count_occurrences``): repeats with one seed pair off's first
  run with the policy's first, and so on.

Controls are recognised from the configs too: a ``random`` run controls the staleness run of the
same dataset and seed that first skipped at the control's ``warmup_steps`` (that is how
``benchmarks/slipstream_policies.py --random-control`` builds it; its ``random_skip_fraction``
and ``warmup_steps`` are matched per run, so they name no setting) and is named
``random@<policy>``; ``negative_sampling`` (uniform negative downsampling) controls a
``<policy>_negatives`` series that downsamples the same fraction of non-clicks beside staleness.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Tuple

from slipstream_rec.report.runs import Run

OFF = "off"
RANDOM = "random"
NEGATIVE_SAMPLING = "negative_sampling"
SERVE = "serve"
STALENESS_POLICIES = ("paper", "paper_plus")
# Keys that change how a run is operated, not what it learns: runs that differ only in these
# still pair with each other.
OPERATIONAL_KEYS = ("trainer.run_dir", "trainer.seed", "trainer.progress_bar", "trainer.tensorboard",
                    "trainer.resume", "trainer.collective_timeout_s", "trainer.device")
OPERATIONAL_PREFIXES = ("slipstream.", "downsampling.", "trainer.checkpoint.")
# A random control's skip fraction and first skipped step are set per run from the run it
# controls: they differ from seed to seed and name no setting of the control.
MATCHED_PER_RUN = ("random_skip_fraction", "warmup_steps")


@dataclass
class Placed:
    """One run with a config, placed for pairing."""

    run: Run
    dataset: str  # label of its dataset (unique within the report)
    kind: str  # the policy as its preset names it
    series: str  # kind + differing settings (+ @<policy> for a random control)
    seed: Any  # trainer.seed
    occurrence: int  # how many paired runs of this dataset, series and seed came before it
    controls: Optional[str] = None  # the series this run's series is the control of, if any


def _slipstream(run: Run) -> Dict[str, Any]:
    """A run's policy settings: ``slipstream.*``, and negative downsampling's ``downsampling.*``
    as ``downsampling.<key>``. Runs written before downsampling was its own group kept its rate
    as ``slipstream.negative_downsampling``: read as ``downsampling.rate``."""
    flat = run.flat_config
    out = {k[len("slipstream."):]: v for k, v in flat.items() if k.startswith("slipstream.")}
    out.update({k: v for k, v in flat.items() if k.startswith("downsampling.")})
    if "negative_downsampling" in out:
        out["downsampling.rate"] = out.pop("negative_downsampling")
    return out


def policy_kind(slipstream: Dict[str, Any]) -> str:
    """The preset name of a resolved ``slipstream`` config: the policy, except the shapes that
    presets give other names (conf/slipstream/serve.yaml, negative_sampling.yaml,
    paper_plus_negatives.yaml)."""
    policy = str(slipstream.get("policy"))
    if slipstream.get("action") == SERVE:  # conf/slipstream/serve.yaml: stale inputs served, not skipped
        return SERVE
    rate = _number(slipstream.get("downsampling.rate")) or 0
    # negative_sampling: uniform downsampling with the policy off (before issue 28, the random
    # control on non-clicks)
    if (policy == OFF and rate > 0) or (policy == RANDOM and slipstream.get("negatives_only")):
        return NEGATIVE_SAMPLING
    if policy in STALENESS_POLICIES and rate > 0:
        return f"{policy}_negatives"
    return policy


def dataset_key(run: Run) -> Tuple[Tuple[str, str], ...]:
    return tuple(sorted((k, json.dumps(v, sort_keys=True, default=str)) for k, v in run.flat_config.items()
                        if k not in OPERATIONAL_KEYS and not k.startswith(OPERATIONAL_PREFIXES)))


def _dataset_labels(keys: List[Tuple[Tuple[str, str], ...]]) -> Dict[Tuple[Tuple[str, str], ...], str]:
    """``data.name`` of each dataset, with the keys that tell datasets of one name apart."""
    labels: Dict[Tuple[Tuple[str, str], ...], str] = {}
    for key in keys:
        mine = dict(key)
        name = json.loads(mine["data.name"]) if "data.name" in mine else "data"
        same_name = [dict(k) for k in keys if k != key and dict(k).get("data.name") == mine.get("data.name")]
        differing = sorted({k for other in same_name for k in set(mine) | set(other)
                            if mine.get(k) != other.get(k)})
        extra = ", ".join(f"{k}={json.loads(mine[k]) if k in mine else '(absent)'}" for k in differing)
        labels[key] = f"{name}, {extra}" if extra else str(name)
    return labels


def place(runs: List[Run]) -> Tuple[List[Placed], List[str]]:
    """Every run with a readable config and a seed, placed; notes for the runs left out."""
    notes: List[str] = []
    usable = []
    for run in runs:
        if run.config is None:
            notes.append(f"{run.label}: no readable config.yaml, so no dataset or seed: not paired")
        elif "trainer.seed" not in run.flat_config or "slipstream.policy" not in run.flat_config:
            notes.append(f"{run.label}: config.yaml has no trainer.seed or slipstream.policy: not paired")
        else:
            usable.append(run)
    keys = [dataset_key(r) for r in usable]
    labels = _dataset_labels(list(dict.fromkeys(keys)))
    placed = [Placed(run=r, dataset=labels[k], kind=policy_kind(_slipstream(r)), series="", seed=r.flat_config[
        "trainer.seed"], occurrence=0) for r, k in zip(usable, keys)]
    for dataset in dict.fromkeys(p.dataset for p in placed):
        members = [p for p in placed if p.dataset == dataset]
        _name_series(members)
        _link_controls(members)
    return placed, notes


def count_occurrences(placed: List[Placed]) -> None:
    """Set ``occurrence``: how many of ``placed`` of the same dataset, series and seed come first."""
    seen: Counter = Counter()
    for p in placed:
        key = (p.dataset, p.series, json.dumps(p.seed, default=str))
        p.occurrence = seen[key]
        seen[key] += 1


def _name_series(members: List[Placed]) -> None:
    """kind, plus the slipstream settings that differ between runs of that kind in the dataset."""
    for kind in dict.fromkeys(p.kind for p in members):
        same = [p for p in members if p.kind == kind]
        configs = [_slipstream(p.run) for p in same]
        keys = sorted({k for c in configs for k in c})
        varying = [k for k in keys if len({json.dumps(c.get(k), default=str) for c in configs}) > 1
                   and not (kind == RANDOM and k in MATCHED_PER_RUN)]
        for p, c in zip(same, configs):
            settings = ", ".join(f"{k}={json.dumps(c.get(k), default=str).strip(chr(34))}" for k in varying)
            p.series = f"{kind} ({settings})" if settings else kind


def _number(value: Any) -> Optional[float]:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    return float(value) if ok else None


def _link_controls(members: List[Placed]) -> None:
    """Set ``controls`` on the control runs (and rename a random control ``random@<policy>``)."""
    for series in dict.fromkeys(p.series for p in members if p.kind == RANDOM):
        runs = [p for p in members if p.series == series]
        matched = {_controlled_by_random(c, members) for c in runs}
        if len(matched) == 1 and None not in matched:
            target = matched.pop()
            name = series.replace(RANDOM, f"{RANDOM}@{target}", 1)
            for c in runs:
                c.series, c.controls = name, target
    for series in dict.fromkeys(p.series for p in members if p.kind == NEGATIVE_SAMPLING):
        runs = [p for p in members if p.series == series]
        settings = _slipstream(runs[0].run)
        fraction = _number(settings.get("downsampling.rate")) or _number(settings.get("random_skip_fraction"))
        targets = [s for s in dict.fromkeys(p.series for p in members if p.kind.endswith("_negatives"))
                   if fraction is not None and all(
                       abs((_number(_slipstream(p.run).get("downsampling.rate")) or 0) - fraction) < 1e-9
                       for p in members if p.series == s)]
        if len(targets) == 1:
            for c in runs:
                c.controls = targets[0]


def _controlled_by_random(control: Placed, members: List[Placed]) -> Optional[str]:
    """The series of the staleness run (same dataset and seed) that first skipped at the
    control's warmup step and skipped the closest fraction to it; None if there is none."""
    warmup = _slipstream(control.run).get("warmup_steps")
    skip = _number(control.run.get("skip_fraction"))
    candidates = [p for p in members if p.kind in STALENESS_POLICIES and p.seed == control.seed
                  and p.run.get("first_skip_step") is not None and p.run.get("first_skip_step") == warmup]
    if not candidates:
        return None
    return min(candidates, key=lambda p: abs((_number(p.run.get("skip_fraction")) or 0) - (skip or 0))).series


def series_order(series: List[Tuple[str, str, Optional[str]]]) -> List[str]:
    """(series, kind, the series it controls) of one dataset, in order of appearance -> the order
    tables and figures use: off first, then each series followed by its controls."""
    names = list(dict.fromkeys(name for name, _, _ in series))
    kinds = {name: kind for name, kind, _ in series}
    controls = {name: target for name, _, target in series if target in names}
    out: List[str] = []
    for name in sorted(names, key=lambda n: kinds[n] != OFF):
        if name not in controls:
            out.append(name)
            out.extend(c for c in names if controls.get(c) == name)
    return out
