"""Experiment reports: compare finished (or crashed) runs at a glance.

``python -m slipstream_rec.report RUN_DIR [RUN_DIR ...] -o OUT`` (console script
``slipstream-report``) reads each run directory's ``config.yaml``, ``metrics.jsonl`` and
``summary.json`` and writes ``OUT/report.html`` (self-contained, figures embedded as PNG) and the
figures as separate PNG files. The first run is the reference for speedups, AUC differences and
config differences.
"""

from slipstream_rec.report.runs import NotARunError, Run, load_run

__all__ = ["NotARunError", "Run", "load_run"]
