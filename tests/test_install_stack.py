"""tools/install_stack.py: the pip commands it runs (dry run), for `make test` and the images."""

from __future__ import annotations

import shlex
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import List

REPO = Path(__file__).resolve().parents[1]
PINS = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["slipstream_rec"]["stack"]


def _plan(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "tools/install_stack.py", *args, "--dry-run"],
        cwd=REPO, capture_output=True, text=True, timeout=60,
    )


def _cmds(proc: subprocess.CompletedProcess) -> List[List[str]]:
    assert proc.returncode == 0, proc.stderr
    return [shlex.split(ln[2:]) for ln in proc.stdout.splitlines() if ln.startswith("+ ")]


def test_makefile_install_cpu_editable_with_test_extras():
    stack, torchrec, project = _cmds(_plan("--variant", "cpu", "--editable", "--extras", "test"))
    assert stack[1:4] == ["-m", "pip", "install"]
    assert [a for a in stack if "==" in a] == [f"{n}=={v}" for n, v in PINS["cpu"].items() if n != "torchrec"]
    assert not any(a.endswith("index-url") for a in stack + torchrec)  # pip's own index, as before
    assert torchrec[-2:] == ["--no-deps", f"torchrec=={PINS['cpu']['torchrec']}"]
    # the project and its dependencies cannot move the stack: installed under its pins
    assert project[-2:] == ["-e", f"{REPO}[test]"] and "-c" in project


def test_gpu_index_only_takes_every_stack_package_from_the_one_index():
    url = "https://download.pytorch.org/whl/cu128"
    stack, torchrec, project = _cmds(_plan("--variant", "gpu", "--torch-index-url", url, "--index-only"))
    for cmd in (stack, torchrec):
        assert cmd[cmd.index("--index-url") + 1] == url and "--extra-index-url" not in cmd
    assert "fbgemm-gpu==" + PINS["gpu"]["fbgemm-gpu"] in stack
    assert "--index-url" not in project and project[-1] == str(REPO)


def test_skip_project_and_option_errors():
    cmds = _cmds(_plan("--variant", "cpu", "--skip-project"))
    assert len(cmds) == 2 and all("torchrec" in " ".join(c) or "torch==" in " ".join(c) for c in cmds)
    proc = _plan("--index-only")
    assert proc.returncode == 2 and "--index-only needs --torch-index-url" in proc.stderr
