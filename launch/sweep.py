"""Sweep helper: one training job per point of a grid of Hydra overrides, then one report.

Each point of the grid (the cartesian product of the ``--grid`` values) runs as a separate job,
one after another, with its own ``trainer.run_dir=<sweep dir>/<NNN>-<point>``; Hydra's multirun
is never used (it cannot run inside torchrun). When all jobs are done, the report of every run
(``python -m slipstream_rec.report``; the first point is the reference) goes to
``<sweep dir>/report/report.html``, and ``<sweep dir>/sweep.json`` lists the points, their
commands and exit codes.

    # 4 jobs: 2 policies x 2 target skip fractions, each `torchrun --standalone --nproc_per_node 2`
    python launch/sweep.py --grid slipstream=off,paper_plus \\
        --grid slipstream.target_skip_fraction=0.3,0.5 --fixed experiment=skewed_quick

    # the same jobs through TorchX (torchx run -s local_cwd launch/components.py:train -j 1x2 -- ...)
    python launch/sweep.py --launcher torchx --grid slipstream=off,paper_plus --fixed experiment=smoke

    # print the commands only
    python launch/sweep.py --dry-run --grid slipstream=off,paper_plus --fixed experiment=smoke

``--grid KEY=V1,V2,...`` splits the values on commas outside brackets, braces and quotes (so
``model.dense_arch_layer_sizes=[64,16],[128,16]`` gives two values); every value is passed to the
job unchanged as ``KEY=V``. ``--fixed OVERRIDE`` (repeatable) is passed to every job as is.

Before anything runs (also with ``--dry-run``) every point's configuration is composed exactly as
its job will compose it, so a mistyped key or value fails at once, naming the point, with exit
code 2 (``--no-validate`` skips this; it takes a few seconds). The sweep directory must not
already hold the points' run directories (the trainer would append to their metrics). Jobs run
from the repository root with this Python's ``torchrun`` / ``torchx`` first on PATH and
``OMP_NUM_THREADS=1`` unless set; each job's output goes to ``<sweep dir>/logs/<point>.log``. A
failed job does not stop the sweep unless ``--stop-on-failure``: the report shows it as
incomplete (or leaves it out if it wrote no run files) and the exit code is 1.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import itertools
import json
import os
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


def split_values(text: str) -> List[str]:
    """Split on commas at depth 0, outside quotes: ``a,[1,2],'x,y'`` -> ``a``, ``[1,2]``, ``'x,y'``."""
    values, current, depth, quote = [], [], 0, ""
    for ch in text:
        if quote:
            quote = "" if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch in "[{(":
            depth += 1
        elif ch in "]})":
            depth -= 1
        elif ch == "," and depth == 0:
            values.append("".join(current))
            current = []
            continue
        current.append(ch)
    values.append("".join(current))
    return values


def parse_grid(specs: Sequence[str]) -> List[Tuple[str, List[str]]]:
    grid = []
    for spec in specs:
        key, sep, rest = spec.partition("=")
        if not sep or not key or not rest:
            raise ValueError(f"--grid {spec!r}: use KEY=V1,V2,... (e.g. --grid slipstream=off,paper_plus)")
        values = split_values(rest)
        if any(v == "" for v in values):
            raise ValueError(f"--grid {spec!r}: empty value")
        grid.append((key, values))
    keys = [k for k, _ in grid]
    if len(set(keys)) != len(keys):
        raise ValueError(f"--grid: a key is given twice ({keys})")
    return grid


def grid_points(grid: Sequence[Tuple[str, List[str]]]) -> List[List[str]]:
    """The cartesian product, first --grid varying slowest: lists of ``KEY=V`` overrides."""
    if not grid:
        return [[]]
    return [[f"{k}={v}" for k, v in zip([k for k, _ in grid], combo)]
            for combo in itertools.product(*[values for _, values in grid])]


def point_name(index: int, overrides: Sequence[str]) -> str:
    """``003-slipstream-paper_plus_slipstream.target_skip_fraction-0.5``: file-safe and free of
    the characters Hydra would parse in an unquoted override value (``=``, ``,``, brackets)."""
    parts = [re.sub(r"[^A-Za-z0-9._-]+", "_", o.replace("=", "-", 1)).strip("_") for o in overrides]
    return f"{index:03d}-{'_'.join(parts)[:120] or 'base'}"


def hydra_value(text: str) -> str:
    """``text`` as an override value: bare where Hydra reads it back unchanged, else in single
    quotes (the sweep refuses directories with quotes or backslashes, which would need escapes)."""
    if re.fullmatch(r"[A-Za-z0-9_./+-]+", text):
        return text
    return f"'{text}'"


def job_command(launcher: str, nproc: int, overrides: Sequence[str]) -> List[str]:
    if launcher == "torchrun":
        exe = BIN / "torchrun"
        return [str(exe) if exe.exists() else "torchrun", "--standalone", "--nproc_per_node", str(nproc),
                "-m", "slipstream_rec.train", *overrides]
    exe = BIN / "torchx"
    return [str(exe) if exe.exists() else "torchx", "run", "-s", "local_cwd", "launch/components.py:train",
            "-j", f"1x{nproc}", "--", *overrides]


def report_command(run_dirs: Sequence[Path], out: Path) -> List[str]:
    return [sys.executable, "-m", "slipstream_rec.report", *map(str, run_dirs), "-o", str(out)]


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(
        prog="launch/sweep.py", description=__doc__.split("\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="See the module docstring (python launch/sweep.py --help shows this).",
    )
    parser.add_argument("--grid", action="append", default=[], metavar="KEY=V1,V2",
                        help="a swept Hydra override; repeat for more dimensions")
    parser.add_argument("--fixed", action="append", default=[], metavar="OVERRIDE",
                        help="a Hydra override passed to every job unchanged; repeatable")
    parser.add_argument("--nproc", type=int, default=2, help="processes per job (default 2)")
    parser.add_argument("--launcher", choices=("torchrun", "torchx"), default="torchrun")
    parser.add_argument("--sweep-dir", type=Path, default=None,
                        help="where the runs and the report go (default runs/sweep-<timestamp>)")
    parser.add_argument("--dry-run", action="store_true", help="print the commands, run nothing")
    parser.add_argument("--no-validate", action="store_true",
                        help="do not compose each point's config before starting (it takes a few seconds)")
    parser.add_argument("--stop-on-failure", action="store_true", help="stop at the first failed job")
    args = parser.parse_args(argv)

    try:
        grid = parse_grid(args.grid)
    except ValueError as err:
        parser.error(str(err))
    if args.nproc < 1:
        parser.error("--nproc must be at least 1")
    for override in args.fixed + [k for k, _ in grid]:
        key = override.partition("=")[0].lstrip("+~")
        if key == "trainer.run_dir":
            parser.error("trainer.run_dir is set per job by the sweep; use --sweep-dir")
        if override.startswith("-"):
            parser.error(f"{override!r}: only Hydra overrides (no --multirun / -m: each point is its own job)")

    stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    sweep_dir = (args.sweep_dir or ROOT / "runs" / f"sweep-{stamp}").resolve()
    if re.search(r"['\"\\\\]", str(sweep_dir)):
        parser.error(f"--sweep-dir {str(sweep_dir)!r}: quotes and backslashes are not supported in the path")
    jobs = []
    for i, point in enumerate(grid_points(grid)):
        run_dir = sweep_dir / point_name(i, point)
        overrides = [*args.fixed, *point, f"trainer.run_dir={hydra_value(str(run_dir))}"]
        jobs.append({"index": i, "point": point, "run_dir": str(run_dir), "overrides": overrides,
                     "command": job_command(args.launcher, args.nproc, overrides)})
    report_out = sweep_dir / "report"
    report_cmd = report_command([Path(j["run_dir"]) for j in jobs], report_out)
    if not args.no_validate:
        # compose every point's config now, so that a typo fails before the first job, not after
        # hours of sweep (the same composition each job's ranks do)
        from slipstream_rec.config import ConfigError, load_config

        for job in jobs:
            try:
                load_config(job["overrides"])
            except ConfigError as err:
                print(f"launch/sweep.py: point {job['index']} ({' '.join(job['point']) or 'base'}): {err}",
                      file=sys.stderr)
                return 2

    if args.dry_run:
        for job in jobs:
            print(shlex.join(job["command"]))
        print(f"# then: {shlex.join(report_cmd)}")
        return 0

    taken = [j["run_dir"] for j in jobs if Path(j["run_dir"]).exists()]
    if taken:
        # the trainer appends to an existing metrics.jsonl: never mix two runs in one directory
        parser.error(f"run directories already exist under {sweep_dir} ({', '.join(taken)}): "
                     "choose another --sweep-dir or remove them")
    logs = sweep_dir / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ)
    env["PATH"] = f"{BIN}{os.pathsep}{env.get('PATH', '')}"
    env.setdefault("OMP_NUM_THREADS", "1")
    failed = 0
    ran = []
    for job in jobs:
        print(f"[sweep {job['index'] + 1}/{len(jobs)}] {shlex.join(job['command'])}", flush=True)
        log_path = logs / f"{Path(job['run_dir']).name}.log"
        start = time.time()
        with open(log_path, "w") as log:
            rc = subprocess.run(job["command"], cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT).returncode
        job.update(returncode=rc, seconds=round(time.time() - start, 1), log=str(log_path))
        ran.append(job)
        print(f"[sweep {job['index'] + 1}/{len(jobs)}] exit {rc} in {job['seconds']}s (log: {log_path})", flush=True)
        if rc != 0:
            failed += 1
            if args.stop_on_failure:
                break
        _write_manifest(sweep_dir, args, grid, jobs)

    _write_manifest(sweep_dir, args, grid, jobs)
    # a job that failed before its rank 0 wrote config.yaml left no run directory to report on
    reportable = [Path(j["run_dir"]) for j in ran if _is_run_dir(Path(j["run_dir"]))]
    for job in ran:
        if not _is_run_dir(Path(job["run_dir"])):
            print(f"[sweep] {job['run_dir']}: the job wrote no run files (exit {job['returncode']}; "
                  f"log: {job['log']}); left out of the report", file=sys.stderr)
    if not reportable:
        print("[sweep] no run to report on", file=sys.stderr)
        return 1
    report_cmd = report_command(reportable, report_out)
    print(f"[sweep] report: {shlex.join(report_cmd)}", flush=True)
    rc = subprocess.run(report_cmd, cwd=ROOT, env=env).returncode
    if rc != 0:
        print(f"[sweep] the report failed (exit {rc})", file=sys.stderr)
        return 1
    if failed:
        print(f"[sweep] {failed} of {len(ran)} job(s) failed; see their launcher.log", file=sys.stderr)
        return 1
    return 0


def _is_run_dir(path: Path) -> bool:
    return (path / "config.yaml").is_file() or (path / "metrics.jsonl").is_file()


def _write_manifest(sweep_dir: Path, args: argparse.Namespace, grid: Sequence[Tuple[str, List[str]]],
                    jobs: List[Dict]) -> None:
    manifest = {"launcher": args.launcher, "nproc": args.nproc, "fixed": args.fixed,
                "grid": {k: v for k, v in grid}, "jobs": jobs}
    (sweep_dir / "sweep.json").write_text(json.dumps(manifest, indent=2) + "\n")


if __name__ == "__main__":
    raise SystemExit(main())
