"""Reading run directories: ``config.yaml``, ``metrics.jsonl`` and ``summary.json``.

A run directory is one that holds ``config.yaml`` or ``metrics.jsonl`` (rank 0 writes both when
a run starts). ``summary.json`` is written at the very end, so a run without it crashed or was
killed: it is loaded as *incomplete*, with what it has. Nothing here raises on bad content: an
unreadable file or a malformed JSONL line becomes a note (file and line number) on the run, so
one damaged run never hides the others. Only a path that is not a run directory at all raises
:class:`NotARunError`.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Tuple, Type

import yaml

CONFIG = "config.yaml"
METRICS = "metrics.jsonl"
SUMMARY = "summary.json"


class NotARunError(ValueError):
    """The path is not a run directory (missing, not a directory, or none of the run files)."""

    def __init__(self, path: Path, reason: str) -> None:
        super().__init__(f"{path}: {reason}")
        self.path = path
        self.reason = reason


@dataclass
class Run:
    path: Path
    label: str = ""
    config: Optional[Dict[str, Any]] = None  # the resolved config as nested dicts
    records: List[Dict[str, Any]] = field(default_factory=list)  # valid metrics.jsonl records
    summary: Optional[Dict[str, Any]] = None
    files: List[str] = field(default_factory=list)  # which of the three run files exist
    notes: List[str] = field(default_factory=list)  # what was missing, unreadable or malformed

    # ---- status ------------------------------------------------------------------------------
    @property
    def complete(self) -> bool:
        """The run reached its end (summary.json written and readable)."""
        return self.summary is not None

    @property
    def status(self) -> str:
        return "complete" if self.complete else "incomplete"

    # ---- records -----------------------------------------------------------------------------
    def of_kind(self, kind: str) -> List[Dict[str, Any]]:
        return [r for r in self.records if r.get("kind") == kind]

    def evals(self, split: str) -> List[Dict[str, Any]]:
        return [r for r in self.of_kind("eval") if r.get("split") == split]

    def kind_counts(self) -> Dict[str, int]:
        counts: Dict[str, int] = {}
        for r in self.records:
            counts[str(r.get("kind"))] = counts.get(str(r.get("kind")), 0) + 1
        return counts

    # ---- config ------------------------------------------------------------------------------
    @property
    def flat_config(self) -> Dict[str, Any]:
        return flatten(self.config) if self.config is not None else {}

    @property
    def policy(self) -> Optional[str]:
        if self.summary and self.summary.get("policy") is not None:
            return str(self.summary["policy"])
        value = self.flat_config.get("slipstream.policy")
        return None if value is None else str(value)

    # ---- figures, from the summary or (incomplete runs) the last train record ------------------
    def last_train(self) -> Optional[Dict[str, Any]]:
        train = self.of_kind("train")
        return train[-1] if train else None

    def get(self, key: str) -> Any:
        """A summary figure; None if the run has no summary or no such figure."""
        return self.summary.get(key) if self.summary else None

    def samples_trained(self) -> Optional[int]:
        if self.complete:
            return self.get("samples_trained")
        last = self.last_train()
        return last.get("samples_trained") if last else None

    def time_breakdown(self) -> Optional[Dict[str, float]]:
        """Seconds of rank 0's training time: data, input_all_to_all, forward, backward,
        optimizer, slipstream, other, total, and where
        known slipstream's parts count / classify / snapshot / sync. From summary.json; for an
        incomplete run, from its last train record (cumulative up to that step)."""
        parts = ("data", "input_all_to_all", "forward", "backward", "optimizer", "slipstream", "other", "total")
        if self.complete:
            tb = self.get("time_breakdown_rank0")
            seconds = (self.get("slipstream") or {}).get("seconds") or {}
            if not isinstance(tb, dict):
                return None
            base = {k: tb.get(k) for k in parts}
        else:
            last = self.last_train()
            if last is None or last.get("time_total") is None:
                return None
            base = {k: last.get(f"time_{k}") for k in parts}
            seconds = {f"{k}_seconds": last.get(f"{k}_seconds") for k in ("count", "classify", "snapshot", "sync")}
        if any(not _is_number(base[k]) for k in parts):
            return None
        out = {k: float(base[k]) for k in parts}
        sub = {k: seconds.get(f"{k}_seconds") for k in ("count", "classify", "snapshot", "sync")}
        if all(_is_number(v) for v in sub.values()):
            out.update({k: float(v) for k, v in sub.items()})  # type: ignore[arg-type]
        return out


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def flatten(tree: Any, prefix: str = "") -> Dict[str, Any]:
    """Nested dicts -> dotted keys (lists and scalars are leaves; an empty dict is a leaf)."""
    if not isinstance(tree, dict) or (not tree and prefix):
        return {prefix: tree}
    out: Dict[str, Any] = {}
    for key, value in tree.items():
        out.update(flatten(value, f"{prefix}.{key}" if prefix else str(key)))
    return out


def read_jsonl(path: Path, notes: List[str]) -> List[Dict[str, Any]]:
    """Valid records of a metrics file; each malformed line is noted as ``path:line: why``."""
    records: List[Dict[str, Any]] = []
    with open(path, encoding="utf-8", errors="replace") as fh:
        for lineno, line in enumerate(fh, start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as err:
                notes.append(f"{path}:{lineno}: malformed JSON line skipped ({err.msg} at column {err.colno})")
                continue
            if not isinstance(record, dict) or "kind" not in record:
                notes.append(f"{path}:{lineno}: record skipped (not a JSON object with a 'kind')")
                continue
            records.append(record)
    return records


def _read_mapping(
    path: Path,
    parse: Callable[[str], Any],
    errors: Tuple[Type[BaseException], ...],
    notes: List[str],
    not_mapping: str,
    unreadable: Callable[[BaseException], str],
) -> Optional[Dict[str, Any]]:
    """``path`` parsed into a dict, or None with a note saying why not (the report goes on)."""
    try:
        value = parse(path.read_text(encoding="utf-8"))
    except errors as err:
        notes.append(f"{path}: {unreadable(err)}")
        return None
    if isinstance(value, dict):
        return value
    notes.append(f"{path}: {not_mapping}")
    return None


def load_run(path: Path) -> Run:
    """Load one run directory. Raises :class:`NotARunError` if ``path`` is not one."""
    path = Path(path)
    if not path.exists():
        raise NotARunError(path, "no such directory")
    if not path.is_dir():
        raise NotARunError(path, "not a directory")
    present = [name for name in (CONFIG, METRICS, SUMMARY) if (path / name).is_file()]
    if CONFIG not in present and METRICS not in present:
        raise NotARunError(
            path, f"not a run directory: it has neither {CONFIG} nor {METRICS} (a run writes both when it starts)"
        )
    run = Run(path=path, files=present)
    if CONFIG in present:
        run.config = _read_mapping(
            path / CONFIG, yaml.safe_load, (OSError, yaml.YAMLError), run.notes,
            not_mapping="not a mapping; config differences unavailable",
            unreadable=lambda err: f"unreadable ({err.__class__.__name__}); config differences unavailable",
        )  # fmt: skip
    else:
        run.notes.append(f"{CONFIG} missing; config differences unavailable")
    if METRICS in present:
        try:
            run.records = read_jsonl(path / METRICS, run.notes)
        except OSError as err:
            run.notes.append(f"{path / METRICS}: unreadable ({err})")
    else:
        run.notes.append(f"{METRICS} missing: no curves")
    if SUMMARY in present:
        run.summary = _read_mapping(
            path / SUMMARY, json.loads, (OSError, json.JSONDecodeError), run.notes,
            not_mapping="not a JSON object; run treated as incomplete",
            unreadable=lambda err: f"unreadable ({err}); run treated as incomplete",
        )  # fmt: skip
    else:
        last = run.last_train()
        where = f"last train record at step {last.get('step')}" if last else "no train record"
        run.notes.append(f"{SUMMARY} missing: the run did not finish (crashed or killed; {where})")
    return run


def assign_labels(runs: List[Run]) -> None:
    """Short unique labels: the directory name, with parents added where names collide."""
    depth = 1
    while True:
        labels = ["/".join(r.path.resolve().parts[-depth:]) for r in runs]
        if len(set(labels)) == len(labels) or depth >= max(len(r.path.resolve().parts) for r in runs):
            break
        depth += 1
    seen: Dict[str, int] = {}
    for run, label in zip(runs, labels):
        seen[label] = seen.get(label, 0) + 1
        run.label = label if seen[label] == 1 else f"{label} ({seen[label]})"
