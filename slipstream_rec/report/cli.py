"""``slipstream-report RUN_DIR [RUN_DIR ...] -o OUT``: compare runs at a glance.

Writes ``OUT/report.html`` (self-contained: figures embedded as base64 PNG, open it in any
browser) and the figures as PNG files in ``OUT/``. Where runs share a dataset and seeds with
``off`` runs, the report opens with the frontier (each policy's speedup and test AUC difference
paired with ``off`` of the same seed) and the table of paired results, also written as
``OUT/paired_results.md`` (markdown) and ``OUT/frontier.csv`` (the figure's data). In the
comparison table the first run is the reference: speedups (first run's train seconds / each
run's), test AUC differences and config differences are taken against it, for runs of its
dataset and split only (another one's are n/a, and said so on stderr and in the report).

Exit codes: 0 report written; 2 bad arguments or a path that is not a run directory (nothing is
written). A run without summary.json (crashed or killed) is reported as incomplete; malformed
lines of a metrics.jsonl are skipped and reported with file and line number (on stderr and in the
report).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import List, Optional

from slipstream_rec.report.runs import NotARunError, assign_labels, load_run


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(
        prog="slipstream-report",
        description="Compare slipstream_rec runs: writes OUT/report.html and the figures as PNG files. "
                    "The first run is the reference for speedup, dAUC and config differences.",
    )
    parser.add_argument("runs", nargs="+", type=Path, metavar="RUN_DIR",
                        help="run directories (trainer.run_dir of each run)")
    parser.add_argument("-o", "--out", type=Path, required=True, metavar="OUT",
                        help="output directory (created; report.html and PNGs are overwritten)")
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # argparse exits 2 on errors, 0 on --help
        return int(exc.code or 0)

    runs, errors = [], []
    for path in args.runs:
        try:
            runs.append(load_run(path))
        except NotARunError as err:
            errors.append(str(err))
    if errors:
        for message in errors:
            print(f"slipstream-report: error: {message}", file=sys.stderr)
        print("slipstream-report: nothing written", file=sys.stderr)
        return 2
    assign_labels(runs)
    for run in runs:
        for note in run.notes:
            print(f"slipstream-report: {run.label}: {note}", file=sys.stderr)

    from slipstream_rec.report.compare import other_dataset

    for run in runs[1:]:
        other = other_dataset(runs[0], run)
        if other:
            print(f"slipstream-report: {run.label}: another dataset or split than {runs[0].label} ({other}): "
                  "speedup and dAUC against it are n/a", file=sys.stderr)

    from slipstream_rec.report import html  # matplotlib only once the inputs are known to be good

    path = html.write(runs, args.out)
    incomplete = [r.label for r in runs if not r.complete]
    print(f"report: {path} ({len(runs)} run{'s' if len(runs) != 1 else ''}" + (f", incomplete: {', '.join(incomplete)}" if incomplete else "") + ")")
    if (args.out / "paired_results.md").is_file():
        print(f"paired results: {args.out / 'paired_results.md'} (markdown), {args.out / 'frontier.csv'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
