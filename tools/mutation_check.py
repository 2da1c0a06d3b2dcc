"""Deliberate one-line breaks of the core, each run against the tests that should catch it.

``make mutation-check`` (this file): for every mutant in ``tests/mutations/mutants.toml`` the
runner copies the working tree (the files git tracks or would track) into a temporary directory,
replaces the one line of ``slipstream_rec/<file>`` that contains ``find`` (it must occur exactly
once in that file, so nearby edits do not move it), and runs ``pytest -x`` on the mutant's tests
in the copy (PYTHONPATH and the working directory point there, so subprocesses such as torchrun
import the mutated package too). A mutant is caught when its tests fail; the check fails when any
mutant survives, when a ``find`` no longer matches exactly one line, or when the tests fail
without any mutant (the baseline run, first). Needs only the test environment (no extra tool).

    python tools/mutation_check.py               # all mutants (about 6-8 minutes on 2 cores)
    python tools/mutation_check.py --list        # names and files
    python tools/mutation_check.py --only NAME   # one mutant (repeatable); --no-baseline skips it
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
import tomllib
from pathlib import Path
from typing import Dict, List, Optional

ROOT = Path(__file__).resolve().parents[1]
MUTANTS = ROOT / "tests" / "mutations" / "mutants.toml"
PACKAGE = "slipstream_rec"
KEYS = {"name", "file", "find", "replace", "tests", "why"}


def load(path: Path = MUTANTS) -> List[Dict]:
    entries = tomllib.loads(path.read_text())["mutant"]
    names = set()
    for i, m in enumerate(entries):
        if set(m) != KEYS:
            raise SystemExit(f"{path}: mutant #{i + 1} has keys {sorted(m)}; each needs exactly {sorted(KEYS)}")
        if m["name"] in names:
            raise SystemExit(f"{path}: mutant name {m['name']!r} appears twice")
        names.add(m["name"])
    return entries


def tracked_files(root: Path) -> List[str]:
    try:
        out = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=root,
                             capture_output=True, check=True).stdout
        return [p for p in out.decode().split("\0") if p and (root / p).is_file()]
    except (OSError, subprocess.CalledProcessError):  # not a git checkout: the parts tests need
        keep = ("slipstream_rec/", "tests/", "conf/", "launch/", "tools/", "docs/", "benchmarks/")
        return [str(p.relative_to(root)) for p in root.rglob("*") if p.is_file()
                and (str(p.relative_to(root)).startswith(keep) or p.parent == root)
                and "__pycache__" not in p.parts]


def copy_tree(root: Path, dest: Path) -> None:
    for rel in tracked_files(root):
        target = dest / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(root / rel, target)


def mutate(text: str, m: Dict, source: str) -> str:
    lines = text.splitlines(keepends=True)
    hits = [i for i, line in enumerate(lines) if m["find"] in line]
    if len(hits) != 1:
        raise LookupError(f"mutant {m['name']}: {m['find']!r} is on {len(hits)} lines of {source}, "
                          f"not exactly one. Fix: update tests/mutations/mutants.toml")
    i = hits[0]
    new = lines[i].replace(m["find"], m["replace"])
    assert new != lines[i], m["name"]
    lines[i] = new
    return "".join(lines)


def run_tests(copy: Path, tests: List[str], timeout: float) -> tuple[int, str, float]:
    env = dict(os.environ, PYTHONPATH=str(copy), OMP_NUM_THREADS="1", PYTHONDONTWRITEBYTECODE="1")
    cmd = [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", *tests]
    t0 = time.perf_counter()
    try:
        r = subprocess.run(cmd, cwd=copy, env=env, capture_output=True, text=True, timeout=timeout)
        return r.returncode, r.stdout + r.stderr, time.perf_counter() - t0
    except subprocess.TimeoutExpired as e:
        out = (e.stdout or b"").decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
        return -1, out, time.perf_counter() - t0


def first_failure(output: str) -> str:
    for line in output.splitlines():
        if line.startswith(("FAILED ", "ERROR ")):
            return line.split(" - ")[0]
    return (output.strip().splitlines() or ["(no output)"])[-1]


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--list", action="store_true", help="print the mutants and exit")
    ap.add_argument("--only", action="append", default=[], help="run only this mutant (repeatable)")
    ap.add_argument("--no-baseline", action="store_true", help="skip the unmutated run of the tests")
    ap.add_argument("--timeout", type=float, default=300.0, help="seconds per mutant's tests")
    args = ap.parse_args(argv)
    mutants = load()
    if args.list:
        for m in mutants:
            print(f"{m['name']:<34} {m['file']:<28} {m['why']}")
        return 0
    if args.only:
        unknown = sorted(set(args.only) - {m["name"] for m in mutants})
        if unknown:
            print(f"mutation-check: unknown mutant(s) {unknown}; see --list", file=sys.stderr)
            return 2
        mutants = [m for m in mutants if m["name"] in args.only]
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="mutation-check-") as tmp:
        copy = Path(tmp) / "tree"
        copy_tree(ROOT, copy)
        originals = {}
        for m in mutants:  # every pattern is checked before anything runs
            path = copy / PACKAGE / m["file"]
            originals.setdefault(m["file"], path.read_text())
            try:
                mutate(originals[m["file"]], m, f"{PACKAGE}/{m['file']}")
            except LookupError as e:
                print(f"mutation-check: {e}", file=sys.stderr)
                return 2
        if not args.no_baseline:
            union = list(dict.fromkeys(t for m in mutants for t in m["tests"]))
            rc, out, secs = run_tests(copy, union, args.timeout * 2)
            if rc != 0:
                print(out[-4000:])
                print(f"mutation-check: the tests fail WITHOUT any mutant ({first_failure(out)}): "
                      f"fix them first", file=sys.stderr)
                return 1
            print(f"baseline: {len(union)} test selections pass unmutated ({secs:.0f} s)", flush=True)
        survived, results = [], []
        for m in mutants:
            path = copy / PACKAGE / m["file"]
            path.write_text(mutate(originals[m["file"]], m, f"{PACKAGE}/{m['file']}"))
            try:
                rc, out, secs = run_tests(copy, m["tests"], args.timeout)
            finally:
                path.write_text(originals[m["file"]])
            if rc == 0:
                verdict = "SURVIVED"
                survived.append(m["name"])
            elif rc in (4, 5):  # usage error / no tests collected: the list names wrong tests
                verdict = "LIST ERROR"
                survived.append(m["name"])
            else:
                verdict = "timeout (caught)" if rc == -1 else "caught"
            results.append((m, verdict, secs))
            detail = first_failure(out) if verdict != "SURVIVED" else "all of " + " ".join(m["tests"]) + " passed"
            print(f"{verdict:<16} {m['name']:<34} {secs:5.1f} s  {detail}", flush=True)
    total = time.perf_counter() - start
    if survived:
        print(f"mutation-check: FAILED: {len(survived)} of {len(results)} mutants not caught: "
              f"{', '.join(survived)} ({total:.0f} s)", file=sys.stderr)
        return 1
    print(f"mutation-check: all {len(results)} mutants caught ({total:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
