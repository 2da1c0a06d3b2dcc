"""The streaming, resumable conversion of raw rows into the npy layout the trainer reads.

A *source* (data/formats/: criteo.py, tabular.py, movielens.py; the interface: convert/source.py)
parses its inputs into ``ParsedChunk``s; this module does the rest, the same for every source, in up to three passes over the inputs:

1. ``scan`` (only where the split needs it): line counts of the inputs (split ``ordered``, and
   the eval files of split ``files``) or a sample of timestamps for the cut points (``time``);
2. ``count`` (only where a feature uses mode ``vocab``): occurrence counts of every value over
   the *training* rows -> the vocabulary (convert/vocab.py), saved in ``vocab/``;
3. ``encode``: every row is assigned its split, its values encoded with the vocabulary, and
   appended to ``{split}_*.npy`` part files (convert/npy_writer.py).

Memory is one chunk (``chunk_bytes`` of text) plus the vocabulary counts, whatever the size of
the inputs. Everything happens in ``{final}.partial/``; ``meta.json`` is written last and the
directory is renamed to its final name only when complete, so a crash never leaves a directory
that looks finished. ``state.json`` in the partial directory records the pass and the input
position of the last checkpoint (every ``checkpoint_seconds``, and at the end of each pass); a
rerun with the same settings resumes there (the part files are truncated to the checkpoint).

Malformed rows are reported by the source with a reason; ``bad_rows="error"`` raises naming the
file, line and reason, ``"skip"`` drops them and counts them per reason (logged, and kept in
meta.json). Nothing is dropped silently.
"""

from __future__ import annotations

import json
import logging
import math
import os
import shutil
import time
from pathlib import Path
from typing import Any, Dict, List, Optional

import numpy as np

from slipstream_rec.data.convert.empty_columns import empty_columns
from slipstream_rec.data.convert.npy_writer import NpyAppender
from slipstream_rec.data.convert.source import BadRowsError, ParsedChunk, Source
from slipstream_rec.data.convert.vocab import VocabCounter, Vocabulary
from slipstream_rec.data.meta import META_FILE, SPLITS, load_meta

logger = logging.getLogger("slipstream_rec.data")

__all__ = ["convert", "source_digest", "CONVERTER_VERSION"]

# Bump when the converted data changes for the same settings: it is part of the cache hash.
CONVERTER_VERSION = 1
STATE_FILE = "state.json"
CHECKPOINT_SECONDS = 30.0
TIME_SAMPLE = 1_000_000
_SPLIT_IDS = {s: i for i, s in enumerate(SPLITS)}


# -- splits ------------------------------------------------------------------------------------


def _uniform(seed: int, file_index: int, lines: np.ndarray) -> np.ndarray:
    """A deterministic uniform [0, 1) per (seed, file, line), splitmix64-hashed."""
    z = lines.astype(np.uint64) + np.uint64((file_index + 1) * 0x632BE59BD9B4E019 + seed * 0x9E3779B97F4A7C15 & (2**64 - 1))
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    z = z ^ (z >> np.uint64(31))
    return (z >> np.uint64(11)).astype(np.float64) / float(1 << 53)


class _Splitter:
    """Assigns each parsed row its split (0 train, 1 val, 2 test) from the scan pass results."""

    def __init__(self, source: Source, scan: Dict[str, Any]) -> None:
        self.cfg = source.split
        self.num_train_files = source.num_train_files
        self.scan = scan

    def __call__(self, chunk: ParsedChunk) -> np.ndarray:
        m, c = self.cfg.method, self.cfg
        n = chunk.lines.size
        if m == "files":
            if chunk.file_index < self.num_train_files:
                return np.zeros(n, dtype=np.int8)
            half = self.scan["lines"][chunk.file_index] // 2
            return np.where(chunk.lines < half, 1, 2).astype(np.int8)
        if m == "random":
            u = _uniform(c.seed, chunk.file_index, chunk.lines)
            return np.where(u < c.test_fraction, 2, np.where(u < c.test_fraction + c.val_fraction, 1, 0)).astype(np.int8)
        if m == "time":
            t = chunk.time
            return np.where(t >= self.scan["test_cut"], 2, np.where(t >= self.scan["val_cut"], 1, 0)).astype(np.int8)
        # ordered: by global line number over all inputs
        glob = chunk.lines + self.scan["line_offsets"][chunk.file_index]
        return np.where(glob >= self.scan["test_start"], 2, np.where(glob >= self.scan["val_start"], 1, 0)).astype(np.int8)


# -- the conversion ----------------------------------------------------------------------------


def _write_json_atomic(path: Path, obj: Any) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(obj, indent=1) + "\n")
    with open(tmp, "rb") as f:
        os.fsync(f.fileno())
    os.replace(tmp, path)


class _Progress:
    def __init__(self, enabled: bool, total: int, unit: str, desc: str) -> None:
        self.bar = None
        self.last = 0
        if enabled:
            from tqdm import tqdm

            self.bar = tqdm(total=total, unit=unit, unit_scale=True, desc=desc, dynamic_ncols=True)

    def update(self, value: int) -> None:
        if self.bar is not None:
            self.bar.update(max(0, value - self.last))
        self.last = value

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None


GENERIC_FIX = (
    "Fix: correct the input, or set data.bad_rows=skip to drop malformed rows (they are counted "
    "and reported)."
)


def _bad_rows(
    source: Source, chunk: ParsedChunk, policy: str, counts: Dict[str, int], hints: Dict[str, str]
) -> None:
    """Raise on the chunk's first malformed row (``error``) or count them (``skip``); ``hints``
    keeps the first hint of each reason, for the message when nothing is left."""
    found = [(int(lines.min()), reason, lines) for reason, lines in chunk.bad.items() if lines.size]
    for _, reason, lines in sorted(found, key=lambda x: x[0]):  # the first bad row of the chunk
        if policy == "error":
            raise BadRowsError(
                f"{source.paths[chunk.file_index]}, line {int(lines.min()) + chunk.line_offset + 1}: {reason} "
                f"({lines.size} such row(s) in this chunk){': ' + chunk.hints[reason] if reason in chunk.hints else '. ' + GENERIC_FIX}"
            )
        counts[reason] = counts.get(reason, 0) + int(lines.size)
        if reason in chunk.hints:
            hints.setdefault(reason, chunk.hints[reason])


def _nothing_left(source: Source, what: str, counts: Dict[str, int], hints: Dict[str, str]) -> ValueError:
    """The error for a conversion that kept no rows (for a split, or at all): how many rows were
    dropped as malformed and why, with the fix of the most common reason."""
    if not counts:
        return ValueError(f"{source.paths}: {what}. Fix: check the inputs and the split settings (fractions, eval_inputs).")
    top = max(counts, key=counts.get)
    return ValueError(
        f"{source.paths}: {what}: data.bad_rows=skip dropped {sum(counts.values())} malformed "
        f"row(s) ({counts}). {hints.get(top, 'Fix: correct the input (the reasons above name what is wrong).')}"
    )


class _Run:
    """One conversion into ``work`` (the partial directory), resumable from its state.json."""

    def __init__(self, source: Source, work: Path, digest: str, bad_rows: str, progress: bool) -> None:
        self.source, self.work, self.digest, self.policy = source, work, digest, bad_rows
        self.progress = progress
        self.state_path = work / STATE_FILE
        self.state: Dict[str, Any] = {"hash": digest, "stage": "scan", "position": None}
        self.hints: Dict[str, str] = {}  # reason -> the source's fix, for _nothing_left
        self.bars: List[_Progress] = []  # closed before an error is printed (convert)
        if self.state_path.is_file():
            state = json.loads(self.state_path.read_text())
            if state.get("hash") == digest:
                self.state = state
                logger.info("convert: resuming %s at stage %s, position %s", work, state["stage"], state["position"])

    def save(self, **updates: Any) -> None:
        self.state.update(updates)
        _write_json_atomic(self.state_path, self.state)

    def bar(self, desc: str) -> _Progress:
        bar = _Progress(self.progress, self.source.progress_total(), self.source.progress_unit, desc)
        self.bars.append(bar)
        return bar

    # pass 1: where the splits fall
    def scan(self) -> Dict[str, Any]:
        src, cfg = self.source, self.source.split
        if self.state["stage"] != "scan":
            return self.state["scan"]
        out: Dict[str, Any] = {}
        if cfg.method in ("ordered", "files"):
            lines = dict(self.state.get("scan_lines") or {})
            todo = range(len(src.paths)) if cfg.method == "ordered" else range(src.num_train_files, len(src.paths))
            for fi in todo:
                if str(fi) not in lines:
                    t0 = time.perf_counter()
                    lines[str(fi)] = src.count_lines(fi)
                    logger.info("convert: %s has %d lines (%.1fs)", src.paths[fi], lines[str(fi)], time.perf_counter() - t0)
                    self.save(scan_lines=lines)
            out["lines"] = {int(k): v for k, v in lines.items()}
            if cfg.method == "ordered":
                counts = [out["lines"][i] for i in range(len(src.paths))]
                total = sum(counts)
                out["line_offsets"] = [int(x) for x in np.cumsum([0] + counts[:-1])]
                out["test_start"] = total - int(round(total * cfg.test_fraction))
                out["val_start"] = out["test_start"] - int(round(total * cfg.val_fraction))
        elif cfg.method == "time":
            sample, prio = np.empty(0), np.empty(0)
            bad: Dict[str, int] = {}
            bar = self.bar("scan timestamps")
            for chunk in src.chunks(None):
                assert chunk.time is not None
                _bad_rows(src, chunk, self.policy, bad, self.hints)  # the first bad row stops here
                p = _uniform(cfg.seed + 1, chunk.file_index, chunk.lines)
                sample, prio = np.concatenate([sample, chunk.time]), np.concatenate([prio, p])
                if sample.size > 2 * TIME_SAMPLE:
                    keep = np.argpartition(prio, TIME_SAMPLE)[:TIME_SAMPLE]
                    sample, prio = sample[keep], prio[keep]
                bar.update(chunk.progress)
            bar.close()
            if prio.size > TIME_SAMPLE:
                sample = sample[np.argpartition(prio, TIME_SAMPLE)[:TIME_SAMPLE]]
            if sample.size == 0:
                raise _nothing_left(src, "no rows found (an empty dataset cannot be trained)", bad, self.hints)
            sample.sort()
            def cut(fraction_before: float) -> float:  # the 1e-9 keeps 0.7 * 4000 at 2800
                return float(sample[min(sample.size - 1, int(math.ceil(fraction_before * sample.size - 1e-9)))])

            out["test_cut"] = cut(1 - cfg.test_fraction)
            out["val_cut"] = cut(1 - cfg.test_fraction - cfg.val_fraction)
        self.save(stage="count", scan=out, position=None)
        return out

    # pass 2: the vocabulary
    def count(self, splitter: _Splitter) -> Vocabulary:
        src = self.source
        encodings = dict(src.onehot + src.multihot)
        vocab_feats = [f for f, e in encodings.items() if e.mode == "vocab"]
        if self.state["stage"] not in ("scan", "count"):
            return Vocabulary.load(self.work)
        counter: Optional[VocabCounter] = None
        if vocab_feats:
            counts_path = self.work / "counts.npz"
            start = self.state.get("position")
            counter = VocabCounter.load(counts_path, vocab_feats) if start and counts_path.is_file() else VocabCounter(vocab_feats)
            bad: Dict[str, int] = dict(self.state.get("count_bad") or {}) if start else {}
            last = time.monotonic()
            bar = self.bar("count values")
            names1 = [f for f, _ in src.onehot]
            namesm = [f for f, _ in src.multihot]
            for chunk in src.chunks(start):
                _bad_rows(src, chunk, self.policy, bad, self.hints)
                train = splitter(chunk) == 0
                for f, keys in zip(names1, chunk.keys):
                    if encodings[f].mode == "vocab":
                        counter.add(f, keys[train])
                for f, (values, lengths) in zip(namesm, chunk.multi):
                    if encodings[f].mode == "vocab":
                        counter.add(f, values[np.repeat(train, lengths)])
                bar.update(chunk.progress)
                if time.monotonic() - last >= CHECKPOINT_SECONDS:
                    counter.save(counts_path)
                    self.save(position=chunk.end, count_bad=bad)
                    last = time.monotonic()
            bar.close()
            logger.info("convert: value counts of %s done", vocab_feats if len(vocab_feats) < 5 else f"{len(vocab_feats)} features")
        vocab = Vocabulary.from_counts(encodings, counter)
        vocab.save(self.work)
        self.save(stage="encode", position=None, parts=None)
        (self.work / "counts.npz").unlink(missing_ok=True)
        return vocab

    # pass 3: the npy files
    def encode(self, splitter: _Splitter, vocab: Vocabulary) -> Dict[str, Any]:
        src = self.source
        if self.state["stage"] == "finish":
            return self.state["result"]
        names1 = [f for f, _ in src.onehot]
        namesm = [f for f, _ in src.multihot]
        nd, n1 = len(src.dense_names), len(names1)
        sizes = {f: vocab.num_embeddings(f) for f in names1 + namesm}
        start = self.state.get("position")
        parts = self.state.get("parts") if start else None
        stats = self.state.get("stats") if start else None
        stats = stats or {"bad_rows": {}, "positives": {s: 0 for s in SPLITS}}

        def rows_of(split: str, kind: str) -> int:
            return 0 if parts is None else int(parts[f"{split}_{kind}"])

        writers: Dict[str, NpyAppender] = {}
        for s in SPLITS:
            writers[f"{s}_dense"] = NpyAppender(self.work / f"{s}_dense.npy.part", np.float32, (nd,), rows_of(s, "dense"))
            writers[f"{s}_sparse"] = NpyAppender(self.work / f"{s}_sparse.npy.part", np.int32, (n1,), rows_of(s, "sparse"))
            writers[f"{s}_labels"] = NpyAppender(self.work / f"{s}_labels.npy.part", np.int32, (1,), rows_of(s, "labels"))
            for j in range(len(namesm)):
                w = NpyAppender(self.work / f"{s}_mh{j}_offsets.npy.part", np.int64, (), rows_of(s, f"mh{j}_offsets"))
                if w.rows == 0:
                    w.append(np.zeros(1, dtype=np.int64))
                writers[f"{s}_mh{j}_offsets"] = w
                writers[f"{s}_mh{j}_values"] = NpyAppender(self.work / f"{s}_mh{j}_values.npy.part", np.int32, (), rows_of(s, f"mh{j}_values"))
        last_offset = {f"{s}_mh{j}": 0 if parts is None else int(parts.get(f"{s}_mh{j}_last", 0)) for s in SPLITS for j in range(len(namesm))}

        def checkpoint(position: Optional[Dict[str, int]]) -> None:
            for w in writers.values():
                w.sync()
            p = {k: w.rows for k, w in writers.items()}
            p.update({f"{k}_last": v for k, v in last_offset.items()})
            self.save(position=position, parts=p, stats=stats)

        bar = self.bar("encode")
        last = time.monotonic()
        try:
            for chunk in src.chunks(start):
                _bad_rows(src, chunk, self.policy, stats["bad_rows"], self.hints)
                split = splitter(chunk)
                ids1 = [vocab.encode(f, k) for f, k in zip(names1, chunk.keys)]
                idsm = [(vocab.encode(f, v), ln) for f, (v, ln) in zip(namesm, chunk.multi)]
                for f, ids in zip(names1, ids1):
                    _check_ids(ids, sizes[f], f, src, chunk)
                for f, (ids, _) in zip(namesm, idsm):
                    _check_ids(ids, sizes[f], f, src, chunk)
                sparse = np.stack(ids1, axis=1) if n1 else np.empty((split.size, 0), np.int32)
                for si, s in enumerate(SPLITS):
                    sel = split == si
                    if not sel.any():
                        continue
                    writers[f"{s}_dense"].append(chunk.dense[sel])
                    writers[f"{s}_sparse"].append(sparse[sel])
                    labels = chunk.labels[sel]
                    writers[f"{s}_labels"].append(labels.reshape(-1, 1))
                    stats["positives"][s] += int(labels.sum())
                    for j, (ids, lengths) in enumerate(idsm):
                        lengths = lengths.astype(np.int64)
                        writers[f"{s}_mh{j}_values"].append(ids[np.repeat(sel, lengths)])
                        ends = last_offset[f"{s}_mh{j}"] + np.cumsum(lengths[sel])
                        writers[f"{s}_mh{j}_offsets"].append(ends)
                        last_offset[f"{s}_mh{j}"] = int(ends[-1])
                bar.update(chunk.progress)
                _after_chunk(chunk)
                if time.monotonic() - last >= CHECKPOINT_SECONDS:
                    checkpoint(chunk.end)
                    last = time.monotonic()
            bar.close()
            rows = {s: writers[f"{s}_labels"].rows for s in SPLITS}
            empty = [s for s, n in rows.items() if n == 0]
            if empty:
                raise _nothing_left(
                    src, f"split(s) {empty} got no rows (rows per split: {rows}; an empty dataset "
                    "cannot be trained or evaluated)", stats["bad_rows"], self.hints,
                )  # fmt: skip
            for k, w in writers.items():
                s, kind = k.split("_", 1)
                if kind.startswith("mh"):
                    j, what = kind[2:].split("_")
                    final = self.work / f"{s}_{namesm[int(j)]}_{what}.npy"
                else:
                    final = self.work / f"{k}.npy"
                w.finish(final)
        finally:
            for w in writers.values():
                w.close()
        result = {
            "rows": rows,
            "ctr": {s: stats["positives"][s] / rows[s] for s in SPLITS},
            "bad_rows": stats["bad_rows"],
            "num_embeddings": sizes,
        }
        self.save(stage="finish", result=result, position=None)
        return result


def _after_chunk(chunk: ParsedChunk) -> None:
    """Called after every encoded chunk (a seam for the crash tests)."""


def _check_ids(ids: np.ndarray, size: int, feature: str, src: Source, chunk: ParsedChunk) -> None:
    if ids.size and (int(ids.min()) < 0 or int(ids.max()) >= size):
        raise AssertionError(f"encoded ids of {feature} outside [0, {size}) in {src.paths[chunk.file_index]}")


def source_digest(source: Source, bad_rows: str) -> str:
    import hashlib

    blob = json.dumps(
        {"converter_version": CONVERTER_VERSION, "source": source.describe(), "bad_rows": bad_rows},
        sort_keys=True,
        default=str,
    )
    return hashlib.sha256(blob.encode()).hexdigest()[:12]


EMPTY_COLUMN_FIX = (
    "Fix: check that column of the input (an export that lost it, or the schema naming another "
    "column), or leave it out of the schema"
)


def convert(source: Source, final: Path, *, bad_rows: str = "error", progress: bool = False) -> Path:
    """Convert ``source`` into the dataset directory ``final`` (resuming a partial run)."""
    if bad_rows not in ("error", "skip"):
        raise ValueError(f"data.bad_rows={bad_rows!r} is unknown. Fix: 'error' or 'skip'.")
    final = Path(final)
    digest = source_digest(source, bad_rows)
    if final.is_dir() and not any(final.iterdir()):
        final.rmdir()  # made by hand for the output (what the trainer's error suggests): no dataset yet
    if final.exists():
        meta = load_meta(final)
        if (meta.generator or {}).get("hash") != digest:
            raise ValueError(
                f"{final} exists but was converted with other settings or inputs (hash "
                f"{(meta.generator or {}).get('hash')}, these settings give {digest}). Fix: delete "
                f"{final} or convert into another directory."
            )
        return final
    work = final.with_name(f".{final.name}.partial")
    if work.exists() and (work / STATE_FILE).is_file():
        if json.loads((work / STATE_FILE).read_text()).get("hash") != digest:
            logger.info("convert: discarding %s (other settings)", work)
            shutil.rmtree(work)
    work.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    run = _Run(source, work, digest, bad_rows, progress)
    try:
        splitter = _Splitter(source, run.scan())
        vocab = run.count(splitter)
        result = run.encode(splitter, vocab)
    except ValueError:
        # Bad input (a malformed row, a truncated file, nothing left): the fix changes the input
        # or the settings, hence the hash and the directory, so this partial one could never be
        # resumed. Removed, so that data/ holds no leftovers and the rerun starts cleanly. An
        # interruption (Ctrl-C, a lost machine, a full disk) keeps it: the rerun resumes there.
        shutil.rmtree(work, ignore_errors=True)
        raise
    finally:
        for bar in run.bars:  # an error line then starts on a line of its own
            bar.close()
    names = [f for f, _ in source.onehot] + [f for f, _ in source.multihot]
    multi = [f for f, _ in source.multihot]
    meta = {
        "format_version": 2 if multi else 1,
        "num_dense": len(source.dense_names),
        "num_sparse": len(names),
        "sparse_feature_names": names,
        "dense_feature_names": list(source.dense_names),
        "multi_hot_feature_names": multi,
        "num_embeddings_per_feature": [int(result["num_embeddings"][f]) for f in names],
        "rows": result["rows"],
        "ctr": result["ctr"],
        "generator": {
            "name": source.name,
            "version": CONVERTER_VERSION,
            "hash": digest,
            "config": source.describe(),
            "bad_rows_policy": bad_rows,
            "bad_rows": result["bad_rows"],
            "vocab": "vocab/",
            "seconds": round(time.perf_counter() - t0, 1),
        },
    }
    if result["bad_rows"]:
        logger.warning("convert: skipped malformed rows: %s", result["bad_rows"])
    (work / STATE_FILE).unlink()
    (work / META_FILE).write_text(json.dumps(meta, indent=1) + "\n")
    written = load_meta(work)  # every file present, shapes and row counts consistent
    for line in empty_columns(written, EMPTY_COLUMN_FIX):
        logger.warning("convert: %s", line)
    os.replace(work, final)
    logger.info("convert: %s -> %s, rows %s", source.name, final, result["rows"])
    return final
