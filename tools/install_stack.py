"""Install the pinned torch / fbgemm / torchrec stack from pyproject.toml, then the project.

    python tools/install_stack.py [--variant cpu|gpu] [--editable] [--extras test]
                                  [--torch-index-url URL [--index-only]] [--skip-project] [--dry-run]

torchrec goes in with --no-deps: its metadata asks for the CUDA `fbgemm-gpu`, which would replace
fbgemm-gpu-cpu and make `import torchrec` fail on libtorch_cuda.so.

The project (and its own dependencies) is installed under a constraints file that holds the stack
at the pinned versions, so that no dependency (e.g. tensordict asking for a newer torch) can make
pip swap in a torch from another index. With ``--index-only`` the three stack packages (and
torch's own dependencies) come from ``--torch-index-url`` alone, as the Docker images do: one
wheel index for the whole CUDA matrix, never mixed with another build of torch.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path
from typing import List

ROOT = Path(__file__).resolve().parents[1]


def stack(variant: str, pyproject: Path = ROOT / "pyproject.toml") -> dict[str, str]:
    data = tomllib.loads(pyproject.read_text())
    try:
        return dict(data["tool"]["slipstream_rec"]["stack"][variant])
    except KeyError as e:
        raise SystemExit(f"pyproject.toml has no [tool.slipstream_rec.stack.{variant}] table") from e


def pip_cmd(*args: str) -> List[str]:
    return [sys.executable, "-m", "pip", "install", "--disable-pip-version-check", *args]


def plan(args: argparse.Namespace, constraints_file: str) -> List[List[str]]:
    """The pip commands, in order (the constraints file is written by ``main``)."""
    pins = stack(args.variant)
    if "torchrec" not in pins or not any(n.startswith("fbgemm") for n in pins) or "torch" not in pins:
        raise SystemExit(
            f"[tool.slipstream_rec.stack.{args.variant}] must pin torch, an fbgemm package and torchrec"
        )
    if args.torch_index_url:
        index = ["--index-url" if args.index_only else "--extra-index-url", args.torch_index_url]
    else:
        index = []
    names = [n for n in pins if n != "torchrec"]  # pyproject's order: torch, then fbgemm
    cmds = [
        pip_cmd(*index, *(f"{n}=={pins[n]}" for n in names)),
        # --no-deps: see the module docstring; from the same index as torch and fbgemm
        pip_cmd(*index, "--no-deps", f"torchrec=={pins['torchrec']}"),
    ]
    if not args.skip_project:
        project = f"{ROOT}[{args.extras}]" if args.extras else str(ROOT)
        cmds.append(
            pip_cmd("-c", constraints_file, *(["-e", project] if args.editable else [project]))
        )
    return cmds


def main(argv: List[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--variant", choices=["cpu", "gpu"], default="cpu")
    parser.add_argument("--editable", action="store_true", help="install the project with -e")
    parser.add_argument("--extras", default="", help="project extras, e.g. test")
    parser.add_argument(
        "--torch-index-url",
        default="",
        help="wheel index for torch/fbgemm/torchrec (e.g. PyTorch's cpu or cu128 index); default: pip's",
    )
    parser.add_argument(
        "--index-only",
        action="store_true",
        help="use --torch-index-url as the ONLY index for the stack packages (pip --index-url "
        "instead of --extra-index-url), so that no other build of torch can be picked",
    )
    parser.add_argument(
        "--skip-project",
        action="store_true",
        help="install the stack only (e.g. a cached Docker layer before the source is copied)",
    )
    parser.add_argument("--dry-run", action="store_true", help="print the pip commands only")
    args = parser.parse_args(argv)
    if args.index_only and not args.torch_index_url:
        parser.error("--index-only needs --torch-index-url")

    pins = stack(args.variant)
    with tempfile.TemporaryDirectory() as tmp:
        constraints = os.path.join(tmp, "stack-constraints.txt")
        # `torch==2.13.0` also matches the local builds 2.13.0+cpu / 2.13.0+cu128 that are installed
        Path(constraints).write_text("".join(f"{n}=={v}\n" for n, v in pins.items()))
        for cmd in plan(args, constraints):
            print("+", " ".join(cmd), flush=True)
            if not args.dry_run:
                subprocess.check_call(cmd)


if __name__ == "__main__":
    main()
