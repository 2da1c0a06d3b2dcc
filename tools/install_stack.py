"""Install the pinned torch / fbgemm / torchrec stack from pyproject.toml, then the project.

    python tools/install_stack.py [--variant cpu|gpu] [--editable] [--extras test]

torchrec goes in with --no-deps: its metadata asks for the CUDA `fbgemm-gpu`, which would replace
fbgemm-gpu-cpu and make `import torchrec` fail on libtorch_cuda.so.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def stack(variant: str) -> dict[str, str]:
    data = tomllib.loads((ROOT / "pyproject.toml").read_text())
    try:
        return data["tool"]["slipstream_rec"]["stack"][variant]
    except KeyError as e:
        raise SystemExit(f"pyproject.toml has no [tool.slipstream_rec.stack.{variant}] table") from e


def pip(*args: str) -> None:
    cmd = [sys.executable, "-m", "pip", "install", "--disable-pip-version-check", *args]
    print("+", " ".join(cmd), flush=True)
    subprocess.check_call(cmd)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--variant", choices=["cpu", "gpu"], default="cpu")
    parser.add_argument("--editable", action="store_true", help="install the project with -e")
    parser.add_argument("--extras", default="", help="project extras, e.g. test")
    parser.add_argument(
        "--torch-index-url",
        default="",
        help="wheel index for torch/fbgemm (e.g. PyTorch's cpu or cu12x index); default: pip's",
    )
    args = parser.parse_args()
    pins = stack(args.variant)
    index = ["--extra-index-url", args.torch_index_url] if args.torch_index_url else []
    pip(*index, *(f"{name}=={version}" for name, version in pins.items() if name != "torchrec"))
    pip("--no-deps", f"torchrec=={pins['torchrec']}")
    project = f"{ROOT}[{args.extras}]" if args.extras else str(ROOT)
    pip(*(["-e", project] if args.editable else [project]))


if __name__ == "__main__":
    main()
