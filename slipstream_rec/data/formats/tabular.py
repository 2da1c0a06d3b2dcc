"""Any CSV / TSV / Parquet CTR file with a declared schema (``data.tabular``) as a Source.

The schema (a YAML file or overrides, see ``TabularConfig``) names the label column and its
rule, the dense columns, the categorical columns and the multi-valued categorical columns (one
text field split by ``multi_hot_separator``, or a Parquet list column). Columns are found by
name: a schema naming a column the file does not have is an error before anything is written,
listing the columns it has.

Values, per kind:

* label: ``binary`` (0 or 1), ``threshold`` (number >= label_threshold) or ``positive_values``
  (the text is one of them); anything else is a malformed row (``bad label``);
* dense: a number (empty = 0), then ``dense_transform``; text that is not a finite number is a
  malformed row (``non-numeric dense value``);
* categorical: any text; the key is a 63-bit BLAKE2b hash of its UTF-8 bytes (``text_key``), an
  empty field is missing (id 0). A multi-valued field's empty items are dropped.

CSV/TSV are read in chunks of whole lines (rawfiles.py): quoted fields may hold the delimiter
but not a newline, and may be of any length (Python's csv module stops at 128 KiB by default). A
UTF-8 byte-order mark (Excel's "CSV UTF-8") is not part of the first column's name; the
delimiter is ``delimiter``, or found in the header line. Parquet needs the optional ``pyarrow`` (``pip install 'slipstream_rec[parquet]'``).
"""

from __future__ import annotations

import csv
import hashlib
import re
from dataclasses import asdict
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple

import numpy as np

from slipstream_rec.data.config import TabularConfig
from slipstream_rec.data.convert.source import ParsedChunk, Source, check_split, encodings_for
from slipstream_rec.data.formats.rawfiles import DEFAULT_CHUNK_BYTES, count_lines, file_sizes, iter_text_chunks, open_raw

__all__ = ["TabularSource", "text_key", "text_keys"]

PARQUET_ROWS = 262_144
BOM = "\ufeff"
# Delimiters a header line is searched for when data.tabular.delimiter is null.
_DELIMITERS = (",", ";", "\t", "|")
# A long text field (a description, a JSON blob) is still one field: no limit below a chunk.
csv.field_size_limit(2**31 - 1)
# Label texts that usually mean a click: the example a bad-label message proposes as positive.
_POSITIVE_WORDS = {"yes", "y", "true", "t", "click", "clicked", "positive", "pos"}
_NAME = re.compile(r"^[A-Za-z0-9_.\-]+$")


def text_key(text: str) -> int:
    """The int64 key (>= 0) of a categorical value's text; -1 for the empty (missing) text."""
    if text == "":
        return -1
    return int.from_bytes(hashlib.blake2b(text.encode("utf-8"), digest_size=8).digest(), "little") >> 1


def text_keys(values: np.ndarray) -> np.ndarray:
    """``text_key`` of each element of an array of str, hashing each distinct text once."""
    if values.size == 0:
        return np.empty(0, dtype=np.int64)
    u, inv = np.unique(values.astype(str), return_inverse=True)
    return np.array([text_key(t) for t in u], dtype=np.int64)[inv.reshape(-1)]


def _parquet():
    try:
        import pyarrow  # noqa: F401
        import pyarrow.compute as pc
        import pyarrow.parquet as pq
    except ImportError as e:
        raise ValueError(
            "reading Parquet needs pyarrow, which is not installed. Fix: pip install "
            "'slipstream_rec[parquet]' (or pip install pyarrow), or convert the file to CSV."
        ) from e
    return pyarrow, pc, pq


# Fields longer than this are replaced by a digest of their text before they become numpy
# strings (fixed width: a 1 MiB field would make its whole column 4 MiB per row); the digest is
# distinct per text (so a categorical value keeps its own id) and never a number.
LONG_FIELD = 256


def _field(text: str) -> str:
    if len(text) <= LONG_FIELD:
        return text
    return "long-text:" + hashlib.blake2b(text.encode("utf-8"), digest_size=16).hexdigest()


def _numbers(col: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
    """Text -> float64 (empty = 0) and a bool 'ok' per row (finite number or empty)."""
    col = np.char.strip(col.astype(str))
    empty = col == ""
    filled = np.where(empty, "0", col)
    try:
        out = filled.astype(np.float64)
        ok = np.isfinite(out)
    except ValueError:  # some text is not a number: find which, row by row
        out = np.zeros(col.size, dtype=np.float64)
        ok = np.zeros(col.size, dtype=bool)
        for i, t in enumerate(filled):
            try:
                out[i] = float(t)
                ok[i] = np.isfinite(out[i])
            except ValueError:
                pass
    out[~ok] = 0.0
    return out, ok


class TabularSource(Source):
    name = "tabular"

    def __init__(self, cfg: TabularConfig, key: str = "data.tabular", chunk_bytes: int = DEFAULT_CHUNK_BYTES) -> None:
        super().__init__()
        self.cfg, self.key, self.chunk_bytes = cfg, key, chunk_bytes
        self._found: Dict[str, str] = {}  # path -> the delimiter found in its header line
        if not cfg.inputs:
            raise ValueError(f"{key}.inputs is empty. Fix: {key}.inputs=[/path/clicks.csv] (CSV, TSV, .gz or Parquet).")
        check_split(cfg.split, f"{key}.split", has_eval_inputs=bool(cfg.eval_inputs), time_column=bool(cfg.time_column))
        self.paths = [str(p) for p in list(cfg.inputs) + list(cfg.eval_inputs)]
        self.sizes = file_sizes(self.paths)
        self.num_train_files = len(cfg.inputs)
        self.format = self._format()
        self.progress_unit = "rows" if self.format == "parquet" else "B"
        if cfg.label_rule not in ("binary", "threshold", "positive_values"):
            raise ValueError(f"{key}.label_rule={cfg.label_rule!r} is unknown. Fix: 'binary', 'threshold' or 'positive_values'.")
        if cfg.label_rule == "positive_values" and not cfg.label_positive_values:
            raise ValueError(f"{key}.label_positive_values is empty but {key}.label_rule=positive_values. Fix: list the values that mean a click.")
        if cfg.dense_transform not in ("log", "none"):
            raise ValueError(f"{key}.dense_transform={cfg.dense_transform!r} is unknown. Fix: 'log' or 'none'.")
        if not cfg.categorical_columns and not cfg.multi_hot_columns:
            raise ValueError(f"{key}: no categorical_columns and no multi_hot_columns. Fix: declare at least one (DLRM needs an embedding).")
        if not cfg.multi_hot_separator:
            raise ValueError(f"{key}.multi_hot_separator is empty. Fix: e.g. '|'.")
        used = [cfg.label_column, *cfg.dense_columns, *cfg.categorical_columns, *cfg.multi_hot_columns]
        dup = sorted({c for c in used if used.count(c) > 1})
        if dup:
            raise ValueError(f"{key}: column(s) {dup} are declared more than once (label, dense, categorical, multi-hot). Fix: give each column one role.")
        for c in [*cfg.dense_columns, *cfg.categorical_columns, *cfg.multi_hot_columns]:
            if not _NAME.match(str(c)):
                raise ValueError(f"{key}: column name {c!r} cannot be a feature name (file names use it). Fix: rename the column to letters, digits, '_', '.', '-'.")
        self._used = set(used + ([cfg.time_column] if cfg.time_column else []))
        self._multi = set(cfg.multi_hot_columns)
        self.columns = self._check_columns(used + ([cfg.time_column] if cfg.time_column else []))
        self.dense_names = list(cfg.dense_columns)
        self.onehot = encodings_for(list(cfg.categorical_columns), cfg.encoding, {k: v for k, v in cfg.feature_encoding.items() if k in cfg.categorical_columns}, key)
        self.multihot = encodings_for(list(cfg.multi_hot_columns), cfg.encoding, {k: v for k, v in cfg.feature_encoding.items() if k in cfg.multi_hot_columns}, key)
        unknown = sorted(set(cfg.feature_encoding) - set(cfg.categorical_columns) - set(cfg.multi_hot_columns))
        if unknown:
            raise ValueError(f"{key}.feature_encoding names column(s) {unknown} that are not categorical or multi-hot. Fix: use some of {list(cfg.categorical_columns) + list(cfg.multi_hot_columns)}.")
        self.split = cfg.split
        self._positive = set(str(v) for v in cfg.label_positive_values)

    # -- schema --------------------------------------------------------------------------------

    def _format(self) -> str:
        f = self.cfg.format
        if f == "auto":
            name = self.paths[0].lower().removesuffix(".gz")
            f = "parquet" if name.endswith((".parquet", ".pq")) else "tsv" if name.endswith((".tsv", ".tab")) else "csv"
        if f not in ("csv", "tsv", "parquet"):
            raise ValueError(f"{self.key}.format={f!r} is unknown. Fix: 'csv', 'tsv', 'parquet' or 'auto'.")
        if f == "parquet":
            _parquet()
        return f

    def _header(self, path: str) -> List[str]:
        if self.format == "parquet":
            _, _, pq = _parquet()
            return list(pq.ParquetFile(path).schema_arrow.names)
        if not self.cfg.header:
            if not self.cfg.column_names:
                raise ValueError(f"{self.key}.header=false needs {self.key}.column_names (the columns in file order).")
            return [str(c) for c in self.cfg.column_names]
        first = self._first_line(path)
        if not first:
            raise ValueError(f"{path} is empty: no header line. Fix: check the file, or set {self.key}.header=false with column_names.")
        return next(csv.reader([first], delimiter=self._delim(path)))

    def _first_line(self, path: str) -> str:
        with open_raw(path) as f:
            return f.readline().decode("utf-8", errors="replace").rstrip("\r\n").removeprefix(BOM)

    def _delim(self, path: str) -> str:
        d = self.cfg.delimiter
        if d is not None:
            d = "\t" if d in ("tab", "\\t") else d
            if len(d) != 1:
                raise ValueError(f"{self.key}.delimiter={self.cfg.delimiter!r} is not one character. Fix: e.g. ',', ';', tab or '|'.")
            return d
        if self.format == "tsv":
            return "\t"
        if not self.cfg.header:
            return ","
        if path not in self._found:  # once per file: every chunk splits its lines the same way
            line = self._first_line(path)
            counts = {c: line.count(c) for c in _DELIMITERS}
            best = max(_DELIMITERS, key=lambda c: counts[c])  # ties: the earlier (comma first)
            self._found[path] = best if counts[best] else ","
        return self._found[path]

    def _check_columns(self, needed: Sequence[str]) -> List[List[str]]:
        out = []
        for p in self.paths:
            cols = self._header(p)
            missing = [c for c in needed if c not in cols]
            if missing and self.cfg.delimiter is None and len(cols) == 1 and self.format != "parquet":
                raise ValueError(
                    f"{p}: its header line reads as one column {cols}, so its delimiter is none of "
                    f"{list(_DELIMITERS)}. Fix: set {self.key}.delimiter (delimiter: in the schema) to the "
                    "character between its fields."
                )
            if missing:
                raise ValueError(
                    f"{p} has no column(s) {missing} named by the schema ({self.key}); it has "
                    f"{cols}. Fix: correct the column names in the schema (or the file's header)."
                )
            out.append(cols)
        return out

    # -- reading -------------------------------------------------------------------------------

    def chunks(self, start: Optional[Dict[str, int]]) -> Iterator[ParsedChunk]:
        if self.format == "parquet":
            yield from self._parquet_chunks(start)
            return
        for c in iter_text_chunks(self.paths, start, self.chunk_bytes):
            lines = c.data.decode("utf-8", errors="replace").split("\n")[:-1]
            line0 = c.first_line
            if c.first_line == 0 and lines:
                lines[0] = lines[0].removeprefix(BOM)
            if self.cfg.header and c.first_line == 0:
                lines, line0 = lines[1:], 1
            rows = self._rows(lines, self.paths[c.file_index], line0)
            names = self.columns[c.file_index]
            width = len(names)
            n = len(rows)
            header = int(self.cfg.header)  # rows are numbered from 0 after the header line
            line_no = line0 - header + np.arange(n, dtype=np.int64)
            ok_width = np.array([len(r) == width for r in rows], dtype=bool)
            good = [r for r, ok in zip(rows, ok_width) if ok]
            # Only the schema's columns, each as wide as its longest field (bounded by _field):
            # one array over all columns would be as wide as the file's longest field.
            # Multi-hot fields stay whole (Python strings: split into items below, any length).
            cols = {
                name: np.array([r[i] for r in good], dtype=object) if name in self._multi
                else np.array([_field(r[i]) for r in good], dtype=str)
                for i, name in enumerate(names) if name in self._used
            }  # fmt: skip
            chunk = self._parse(cols, c.file_index, line_no[ok_width], {"wrong column count": line_no[~ok_width]}, c.end, c.progress)
            chunk.line_offset = header
            yield chunk

    def _rows(self, lines: List[str], path: str, line0: int) -> List[List[str]]:
        """The lines split into fields; a line the csv module cannot read is a bad input naming
        the file and line (not a traceback that leaves the partial conversion behind)."""
        reader = csv.reader(lines, delimiter=self._delim(path))
        rows: List[List[str]] = []
        while True:
            try:
                row = next(reader)
            except StopIteration:
                return rows
            except csv.Error as e:
                raise ValueError(  # line0 + line_num: the 1-based line (the header is line 1)
                    f"{path}, line {line0 + reader.line_num}: cannot be read as {self.format.upper()} "
                    f"({e}). Fix: correct that line (quote a field that holds a line break) or remove it"
                ) from None
            rows.append(row)

    def _parquet_chunks(self, start: Optional[Dict[str, int]]) -> Iterator[ParsedChunk]:
        pa, pc, pq = _parquet()
        start = start or {"file": 0, "offset": 0, "line": 0}
        cfg = self.cfg
        needed = [cfg.label_column, *cfg.dense_columns, *cfg.categorical_columns, *cfg.multi_hot_columns]
        needed += [cfg.time_column] if cfg.time_column else []
        done = sum(pq.ParquetFile(p).metadata.num_rows for p in self.paths[: start["file"]])
        for fi in range(start["file"], len(self.paths)):
            row = start["line"] if fi == start["file"] else 0
            pf = pq.ParquetFile(self.paths[fi])
            for bi, batch in enumerate(pf.iter_batches(batch_size=PARQUET_ROWS, columns=needed)):
                n = batch.num_rows
                if bi * PARQUET_ROWS < row:
                    continue
                cols = {}
                for name in needed:
                    col = batch.column(name)
                    if pa.types.is_list(col.type) or pa.types.is_large_list(col.type):
                        col = pc.binary_join(pc.cast(col, pa.list_(pa.string())), cfg.multi_hot_separator)
                    elif not pa.types.is_string(col.type):
                        col = pc.cast(col, pa.string())
                    cols[name] = np.asarray(pc.fill_null(col, "").to_numpy(zero_copy_only=False), dtype=str)
                lines = row + np.arange(n, dtype=np.int64)
                row += n
                yield self._parse(cols, fi, lines, {}, {"file": fi, "offset": 0, "line": row}, done + row)
            done += pf.metadata.num_rows

    def _parse(self, cols: Dict[str, np.ndarray], fi: int, lines: np.ndarray, bad: Dict[str, np.ndarray],
               end: Dict[str, int], progress: int) -> ParsedChunk:
        cfg = self.cfg
        n = lines.size
        raw = cols[cfg.label_column]
        if cfg.label_rule == "positive_values":
            labels = np.isin(np.char.strip(raw.astype(str)), list(self._positive))
            ok = np.ones(n, dtype=bool)
        else:
            num, ok = _numbers(raw)
            ok &= np.char.strip(raw.astype(str)) != ""
            if cfg.label_rule == "binary":
                ok &= (num == 0) | (num == 1)
                labels = num == 1
            else:
                labels = num >= cfg.label_threshold
        keep = ok.copy()
        bad = dict(bad)
        bad["bad label"] = lines[~ok]
        hints = {"bad label": self._label_hint(raw[~ok])} if not ok.all() else {}
        dense = np.zeros((n, len(cfg.dense_columns)), dtype=np.float64)
        ok_dense = np.ones(n, dtype=bool)
        for j, c in enumerate(cfg.dense_columns):
            dense[:, j], okc = _numbers(cols[c])
            ok_dense &= okc
        bad["non-numeric dense value"] = lines[keep & ~ok_dense]
        keep &= ok_dense
        t = None
        if cfg.time_column:
            t, ok_t = _numbers(cols[cfg.time_column])
            ok_t &= np.char.strip(cols[cfg.time_column].astype(str)) != ""
            bad["non-numeric time value"] = lines[keep & ~ok_t]
            keep &= ok_t
            t = t[keep]
        if cfg.dense_transform == "log":
            dense = np.log1p(np.maximum(dense, 0.0))
        keys = [text_keys(np.char.strip(cols[c][keep].astype(str))) for c in cfg.categorical_columns]
        multi = []
        for c in cfg.multi_hot_columns:
            items = [[v for v in (s.strip() for s in field.split(cfg.multi_hot_separator)) if v] for field in cols[c][keep]]
            lengths = np.array([len(x) for x in items], dtype=np.int64)
            flat = np.array([v for x in items for v in x], dtype=str)
            multi.append((text_keys(flat), lengths))
        return ParsedChunk(
            file_index=fi,
            lines=lines[keep],
            labels=labels[keep].astype(np.int32),
            dense=dense[keep].astype(np.float32),
            keys=keys,
            multi=multi,
            end=end,
            progress=progress,
            bad=bad,
            time=t,
            hints={k: v for k, v in hints.items() if v},
        )

    def _label_hint(self, values: np.ndarray) -> Optional[str]:
        """What the label column holds that label_rule does not read, and the rule that reads
        it (a yes/no column needs positive_values; a rating needs threshold); None for empty
        labels only (a data problem, not a schema one)."""
        cfg = self.cfg
        seen = sorted({v for v in np.char.strip(values.astype(str)).tolist() if v})
        if not seen:
            return None
        shown = seen[:6] + (["..."] if len(seen) > 6 else [])
        expects = "0 or 1" if cfg.label_rule == "binary" else "a number"
        if _numbers(np.array(seen))[1].all():
            fix = "label_rule: threshold and label_threshold: <the smallest value that means a click>"
        else:
            example = next((v for v in seen if v.lower() in _POSITIVE_WORDS), seen[0])
            fix = f'label_rule: positive_values and label_positive_values: ["{example}"] (the values that mean a click, quoted)'
        return (
            f"label column {cfg.label_column!r} holds {shown}, which label_rule={cfg.label_rule} does "
            f"not read (it expects {expects}). Fix: in the schema, {fix}."
        )

    def count_lines(self, file_index: int) -> int:
        if self.format == "parquet":
            _, _, pq = _parquet()
            return int(pq.ParquetFile(self.paths[file_index]).metadata.num_rows)
        return count_lines(self.paths[file_index]) - int(self.cfg.header)

    def progress_total(self) -> int:
        if self.format == "parquet":
            _, _, pq = _parquet()
            return sum(int(pq.ParquetFile(p).metadata.num_rows) for p in self.paths)
        return sum(self.sizes)

    def describe(self) -> Dict[str, Any]:
        d = asdict(self.cfg)
        if d["delimiter"] is None:  # the default: datasets converted before the key keep their hash
            del d["delimiter"]
        d["input_sizes"] = self.sizes
        return d
