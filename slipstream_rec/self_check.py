"""``slipstream-train --self-check``: is this the pinned torch / fbgemm / torchrec stack, and does it work?

The most common TorchRec failure is a mismatched FBGEMM build: fbgemm 1.X is built against torch
2.(X+5), and a different torch makes its operator library fail to load (undefined symbols) or
leaves ``torch.ops.fbgemm`` without its operators. The check reports, and fails (exit status 1)
naming the package and the fix, when:

* the installed versions (package metadata, so that it works even when an import fails) differ
  from the pins of the matching variant -- ``cpu`` when ``fbgemm-gpu-cpu`` is installed, ``gpu``
  when the CUDA ``fbgemm-gpu`` is -- or both fbgemm packages are installed at once;
* ``import torch`` / ``import fbgemm_gpu`` / ``import torchrec`` fails, or fbgemm's operators are
  not registered or give a wrong result (``torch.ops.fbgemm.asynchronous_complete_cumsum`` is run
  on the CPU and, where one is visible, on the GPU);
* the GPU variant has a CPU build of torch, or a visible GPU has no nccl.

It also prints the devices and the device / backend ``trainer.device=auto`` would choose
(``slipstream_rec.distributed.resolve_device`` and ``backend_for``, the code the trainer runs).

Where the pins come from (the first that exists):

1. ``$SLIPSTREAM_STACK_PINS``: a TOML file with the same ``[tool.slipstream_rec.stack.<variant>]``
   tables as pyproject.toml (to check against another matrix, or to simulate a mismatch);
2. the repository's ``pyproject.toml`` next to the package (a source checkout / editable install);
3. ``slipstream_rec/_stack_pins.json``, which ``setup.py`` writes into every built wheel from
   pyproject.toml (a non-editable install, e.g. the Docker images): pyproject stays the only
   place the pins are written by hand, and an installed package still knows them;
4. none of these: the versions are checked against the compatibility rule instead (fbgemm 1.X
   with torch 2.(X+5), torchrec with the same major.minor as fbgemm).

Package metadata alone would not do as a fallback: torch, fbgemm and torchrec are deliberately not
dependencies of the project (see pyproject.toml), so its metadata holds no pins.
"""

from __future__ import annotations

import json
import os
import platform
import sys
import tomllib
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, TextIO, Tuple

PINS_ENV = "SLIPSTREAM_STACK_PINS"
PACKAGE_DIR = Path(__file__).resolve().parent
REPO_PYPROJECT = PACKAGE_DIR.parent / "pyproject.toml"
EMBEDDED_PINS = PACKAGE_DIR / "_stack_pins.json"
STACK_DISTS = ("torch", "fbgemm-gpu", "fbgemm-gpu-cpu", "torchrec")
VARIANT_FBGEMM = {"cpu": "fbgemm-gpu-cpu", "gpu": "fbgemm-gpu"}
# PyTorch's wheel indexes; the GPU one is docker/Dockerfile's default TORCH_INDEX_URL
# (tests/docker checks that they agree).
CPU_INDEX_URL = "https://download.pytorch.org/whl/cpu"
DEFAULT_CUDA_INDEX_URL = "https://download.pytorch.org/whl/cu128"


class SelfCheckError(Exception):
    """A pins file that was asked for but cannot be used."""


@dataclass
class Pins:
    stack: Dict[str, Dict[str, str]]  # variant -> {distribution: version}
    source: str  # where they were read, for the report
    repo_root: Optional[Path] = None  # set when they come from a repository's pyproject.toml


@dataclass
class Problem:
    what: str
    fix: str

    def __str__(self) -> str:
        return f"{self.what}\n    fix: {self.fix}"


@dataclass
class Report:
    lines: List[Tuple[str, str]] = field(default_factory=list)
    problems: List[Problem] = field(default_factory=list)
    notes: List[str] = field(default_factory=list)

    def add(self, key: str, value: str) -> None:
        self.lines.append((key, value))


# ---- pins ----------------------------------------------------------------------------------


def _stack_tables(data: Mapping[str, Any], where: str) -> Dict[str, Dict[str, str]]:
    try:
        stack = data["tool"]["slipstream_rec"]["stack"]
    except (KeyError, TypeError):
        raise SelfCheckError(f"{where} has no [tool.slipstream_rec.stack.<variant>] tables") from None
    if not isinstance(stack, dict) or not stack:
        raise SelfCheckError(f"{where} has no [tool.slipstream_rec.stack.<variant>] tables")
    return {str(v): {str(k): str(x) for k, x in dict(t).items()} for v, t in stack.items()}


def load_pins(
    env: Mapping[str, str] = os.environ,
    repo_pyproject: Path = REPO_PYPROJECT,
    embedded: Path = EMBEDDED_PINS,
) -> Optional[Pins]:
    """The pins, from the first source that exists (see the module docstring); None if none."""
    explicit = env.get(PINS_ENV, "")
    if explicit:
        path = Path(explicit)
        if not path.is_file():
            raise SelfCheckError(f"${PINS_ENV}={explicit}: no such file")
        try:
            data = tomllib.loads(path.read_text())
        except (OSError, tomllib.TOMLDecodeError) as e:
            raise SelfCheckError(f"${PINS_ENV}={explicit}: not a readable TOML file ({e})") from e
        return Pins(_stack_tables(data, str(path)), f"{path} (${PINS_ENV})")
    if repo_pyproject.is_file():
        try:
            data = tomllib.loads(repo_pyproject.read_text())
        except (OSError, tomllib.TOMLDecodeError):
            data = {}
        if data.get("project", {}).get("name") == "slipstream_rec":
            return Pins(_stack_tables(data, str(repo_pyproject)), str(repo_pyproject), repo_pyproject.parent)
    if embedded.is_file():
        payload = json.loads(embedded.read_text())
        stack = {str(v): {str(k): str(x) for k, x in t.items()} for v, t in payload["stack"].items()}
        return Pins(stack, f"{embedded} ({payload.get('source', 'embedded at build time')})")
    return None


# ---- versions ------------------------------------------------------------------------------


def installed_versions() -> Dict[str, Optional[str]]:
    """Versions of the stack's distributions from their metadata (None: not installed)."""
    out: Dict[str, Optional[str]] = {}
    for name in STACK_DISTS:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    return out


def public_version(version: str) -> str:
    """``2.13.0+cu128`` -> ``2.13.0`` (a pin ``torch==2.13.0`` matches every local build)."""
    return version.split("+", 1)[0]


def _major_minor(version: str) -> Optional[Tuple[int, int]]:
    parts = public_version(version).split(".")
    try:
        return int(parts[0]), int(parts[1])
    except (IndexError, ValueError):
        return None


def detect_variant(versions: Mapping[str, Optional[str]]) -> Tuple[Optional[str], List[Problem]]:
    """``cpu`` / ``gpu`` from the fbgemm package installed; a problem when it is not exactly one."""
    have = [v for v, dist in VARIANT_FBGEMM.items() if versions.get(dist)]
    if len(have) == 1:
        return have[0], []
    if not have:
        return None, [
            Problem(
                "neither fbgemm-gpu (CUDA) nor fbgemm-gpu-cpu is installed: TorchRec's embedding "
                "kernels are missing",
                "install the pinned stack: python tools/install_stack.py --variant cpu|gpu "
                "(from the repository root), or the Docker image",
            )
        ]
    return None, [
        Problem(
            "both fbgemm-gpu and fbgemm-gpu-cpu are installed: they write the same fbgemm_gpu "
            "package over each other (typically `pip install torchrec` pulled fbgemm-gpu in over "
            "fbgemm-gpu-cpu)",
            "pip uninstall -y fbgemm-gpu fbgemm-gpu-cpu, then reinstall one variant with "
            "python tools/install_stack.py --variant cpu|gpu (it installs torchrec with --no-deps)",
        )
    ]


def reinstall_command(variant: str, pins: Optional[Pins], cuda: Optional[str] = None) -> str:
    """How to put the pinned stack back, for the fix text.

    GPU: torch, fbgemm-gpu and torchrec from one CUDA index, nothing else (``--index-only``).
    CPU: torch's CPU build from PyTorch's cpu index, fbgemm-gpu-cpu and torchrec from PyPI (the
    cpu index publishes the CPU fbgemm under the name fbgemm-gpu, not fbgemm-gpu-cpu).
    """
    index = CPU_INDEX_URL if variant == "cpu" else _cuda_index(cuda)
    if pins is not None and pins.repo_root is not None:
        only = "" if variant == "cpu" else " --index-only"
        return (
            f"cd {pins.repo_root} && python tools/install_stack.py --variant {variant} "
            f"--torch-index-url {index}{only} (reinstalls torch, fbgemm and torchrec together)"
        )
    stack = (pins.stack.get(variant) if pins else None) or {}
    fbgemm = VARIANT_FBGEMM[variant]
    reqs = " ".join(f"{n}=={v}" for n, v in stack.items() if n != "torchrec") or f"torch==<pin> {fbgemm}==<pin>"
    torchrec = f"torchrec=={stack.get('torchrec', '<pin>')}"
    flag = "--extra-index-url" if variant == "cpu" else "--index-url"
    return (
        f"pip install {flag} {index} {reqs} && pip install {flag} {index} --no-deps {torchrec} "
        "(the three together; torchrec without its dependencies)"
    )


def _cuda_index(cuda: Optional[str]) -> str:
    if cuda:
        mm = cuda.split(".")
        if len(mm) >= 2 and mm[0].isdigit() and mm[1].isdigit():
            return f"https://download.pytorch.org/whl/cu{mm[0]}{mm[1]}"
    return DEFAULT_CUDA_INDEX_URL


def check_versions(
    versions: Mapping[str, Optional[str]],
    variant: str,
    pins: Optional[Pins],
    cuda: Optional[str] = None,
) -> List[Problem]:
    """Installed versions against the variant's pins (or the compatibility rule without pins)."""
    fix = reinstall_command(variant, pins, cuda)
    problems: List[Problem] = []
    if pins is not None:
        table = pins.stack.get(variant)
        if not table:
            return [
                Problem(
                    f"the pins ({pins.source}) have no [tool.slipstream_rec.stack.{variant}] table",
                    "add it next to the other variants' tables, or install the variant that is pinned",
                )
            ]
        for dist, pin in table.items():
            have = versions.get(dist)
            if have is None:
                problems.append(
                    Problem(f"{dist} is not installed; [tool.slipstream_rec.stack.{variant}] pins {pin}", fix)
                )
            elif public_version(have) != pin:
                problems.append(
                    Problem(
                        f"{dist} {have} is installed but [tool.slipstream_rec.stack.{variant}] pins "
                        f"{pin} ({pins.source})",
                        fix,
                    )
                )
        return problems
    # No pins anywhere: the documented compatibility rule.
    fbgemm_dist = VARIANT_FBGEMM[variant]
    fb, torch_v, rec = versions.get(fbgemm_dist), versions.get("torch"), versions.get("torchrec")
    fb_mm = _major_minor(fb) if fb else None
    if fb_mm is not None and fb_mm[0] == 1 and torch_v:
        want = (2, fb_mm[1] + 5)
        if _major_minor(torch_v) != want:
            problems.append(
                Problem(
                    f"{fbgemm_dist} {fb} is built for torch {want[0]}.{want[1]}.x, but torch {torch_v} is "
                    "installed (fbgemm 1.X pairs with torch 2.(X+5))",
                    fix,
                )
            )
    if fb_mm is not None and rec and _major_minor(rec) != fb_mm:
        problems.append(
            Problem(
                f"torchrec {rec} does not pair with {fbgemm_dist} {fb} (torchrec and fbgemm are released "
                "with the same major.minor)",
                fix,
            )
        )
    for dist, have in (("torch", torch_v), ("torchrec", rec)):
        if have is None:
            problems.append(Problem(f"{dist} is not installed", fix))
    return problems


# ---- runtime -------------------------------------------------------------------------------


def _first_line(e: BaseException) -> str:
    text = f"{type(e).__name__}: {e}".strip()
    return text.splitlines()[0][:400] if text else type(e).__name__


def no_nvidia_driver() -> Optional[str]:
    """Why the NVIDIA driver's NVML library does not load here, None when it does.

    fbgemm-gpu's CUDA build links libnvidia-ml.so.1, which comes with the driver (the NVIDIA
    container toolkit mounts it at ``docker run --gpus``), not with any pip package: without a
    driver, as in a ``docker build``, fbgemm_gpu and torchrec cannot be imported at all.
    """
    import ctypes

    try:
        ctypes.CDLL("libnvidia-ml.so.1")
    except OSError as e:
        return _first_line(e)
    return None


def _note_no_driver(report: Report, why: str) -> None:
    note = (
        f"no GPU and no NVIDIA driver here ({why}): the GPU stack's fbgemm and torchrec load only "
        "where the driver is (e.g. docker run --gpus all); the versions above are checked, the "
        "operators on a GPU host. Without a GPU, use the CPU image / the cpu variant to train."
    )
    if note not in report.notes:
        report.notes.append(note)


def probe_runtime(report: Report, variant: Optional[str], pins: Optional[Pins]) -> Optional[str]:
    """Import the stack, run an fbgemm op, report devices and the backend; returns torch's CUDA
    version (None for a CPU build or when torch does not import)."""
    try:
        import torch
    except Exception as e:  # noqa: BLE001 - every failure becomes a reported problem
        report.problems.append(
            Problem(f"import torch failed: {_first_line(e)}", reinstall_command(variant or "cpu", pins))
        )
        return None
    cuda = torch.version.cuda
    report.add("torch build", f"CUDA {cuda}" if cuda else "CPU")
    if variant == "gpu" and not cuda:
        report.problems.append(
            Problem(
                f"the CUDA fbgemm-gpu is installed with a CPU build of torch ({torch.__version__})",
                reinstall_command("gpu", pins),
            )
        )
    elif variant == "cpu" and cuda:
        report.problems.append(
            Problem(
                f"torch {torch.__version__} is a CUDA build but fbgemm-gpu-cpu is installed: the CPU "
                "stack is torch's CPU build with fbgemm-gpu-cpu, the GPU stack torch's CUDA build "
                "with fbgemm-gpu",
                reinstall_command("cpu", pins),
            )
        )

    fix = reinstall_command(variant or ("gpu" if cuda else "cpu"), pins, cuda)
    cuda_ok = False
    try:
        cuda_ok = bool(torch.cuda.is_available())
    except Exception as e:  # noqa: BLE001
        report.notes.append(f"torch.cuda.is_available() raised {_first_line(e)}")
    try:
        import fbgemm_gpu  # noqa: F401 - loads the operator library into torch.ops.fbgemm

        op = torch.ops.fbgemm.asynchronous_complete_cumsum
        ran_on = []
        devices = ["cpu"] + (["cuda"] if cuda_ok and variant == "gpu" else [])
        for dev in devices:
            got = op(torch.tensor([1, 2, 3], dtype=torch.int64, device=dev)).cpu().tolist()
            if got != [0, 1, 3, 6]:
                raise RuntimeError(f"asynchronous_complete_cumsum on {dev} returned {got}, expected [0, 1, 3, 6]")
            ran_on.append(dev)
        report.add("fbgemm ops", f"loaded; torch.ops.fbgemm.asynchronous_complete_cumsum ran on {', '.join(ran_on)}")
    except Exception as e:  # noqa: BLE001
        # Without a GPU, a missing driver is the expected reason (not a broken install): say so.
        driver = no_nvidia_driver() if variant == "gpu" and not cuda_ok else None
        if driver is not None:
            report.add("fbgemm ops", "not loaded: fbgemm's CUDA build needs the NVIDIA driver, absent here")
            _note_no_driver(report, driver)
        else:
            hint = ""
            if "undefined symbol" in str(e) or "No such operator" in str(e) or isinstance(e, (AttributeError, OSError)):
                hint = " (the fbgemm build does not match this torch)"
            elif "no kernel image" in str(e):
                hint = " (this GPU's architecture is not in the fbgemm / torch build: check the CUDA index)"
            report.add("fbgemm ops", "NOT loaded")
            report.problems.append(Problem(f"fbgemm's operators do not load or run{hint}: {_first_line(e)}", fix))
    try:
        import torchrec  # noqa: F401
        from torchrec.sparse.jagged_tensor import KeyedJaggedTensor  # noqa: F401

        report.add("torchrec import", "ok")
    except Exception as e:  # noqa: BLE001
        driver = no_nvidia_driver() if variant == "gpu" and not cuda_ok else None
        if driver is not None:
            report.add("torchrec import", "not possible: it loads fbgemm's CUDA build, which needs the NVIDIA driver")
            _note_no_driver(report, driver)
        else:
            report.add("torchrec import", "FAILED")
            report.problems.append(Problem(f"import torchrec failed: {_first_line(e)}", fix))

    # Devices and the choice trainer.device=auto makes on this process's local rank.
    if cuda_ok:
        n = torch.cuda.device_count()
        names = ", ".join(f"{i}: {torch.cuda.get_device_name(i)}" for i in range(n))
        report.add("cuda", f"available, {n} device(s): {names}")
        import torch.distributed as dist

        if not dist.is_nccl_available():
            report.problems.append(
                Problem("a GPU is visible but this torch has no nccl backend", reinstall_command("gpu", pins, cuda))
            )
    else:
        report.add("cuda", "not available (torch.cuda.is_available() is False)")
    try:
        from slipstream_rec.distributed import backend_for, resolve_device

        local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        device = resolve_device("auto", local_rank)
        report.add("trainer.device=auto", f"{device} with backend {backend_for(device)} (local rank {local_rank})")
    except Exception as e:  # noqa: BLE001
        report.problems.append(
            Problem(f"choosing the device failed: {_first_line(e)}", "see slipstream_rec/distributed.py")
        )
    return cuda


def run_checks() -> Report:
    report = Report()
    report.add("python", f"{platform.python_version()} ({sys.executable})")
    versions = installed_versions()
    variant, problems = detect_variant(versions)
    report.problems.extend(problems)
    try:
        pins = load_pins()
    except SelfCheckError as e:
        pins = None
        report.problems.append(Problem(str(e), f"point ${PINS_ENV} at a pyproject.toml-like file, or unset it"))
    table = (pins.stack.get(variant, {}) if pins and variant else {})
    for dist in STACK_DISTS:
        have = versions.get(dist)
        if have is None and dist not in table:
            continue
        pin = table.get(dist)
        status = "" if pin is None else ("  (pin ok)" if have and public_version(have) == pin else f"  (pin {pin}: MISMATCH)")
        report.add(dist, f"{have or 'not installed'}{status}")
    report.add("variant", variant or "unknown")
    if pins is not None:
        report.add("pins", f"[tool.slipstream_rec.stack.{variant or '?'}] of {pins.source}")
    else:
        report.add("pins", "none found: checked the fbgemm/torch/torchrec compatibility rule instead")
    cuda = probe_runtime(report, variant, pins)
    if variant is not None:
        report.problems.extend(check_versions(versions, variant, pins, cuda))
    return report


def main(out: TextIO = sys.stdout, err: TextIO = sys.stderr) -> int:
    """Print the report; 0 when everything matches and works, 1 otherwise."""
    report = run_checks()
    print("slipstream_rec self-check", file=out)
    width = max(len(k) for k, _ in report.lines)
    for key, value in report.lines:
        print(f"  {key:<{width}}  {value}", file=out)
    for note in report.notes:
        print(f"  note: {note}", file=out)
    if report.problems:
        print(f"self-check: FAILED ({len(report.problems)} problem(s))", file=err)
        for p in report.problems:
            print(f"  - {p}", file=err)
        out.flush()
        err.flush()
        return 1
    print("self-check: OK", file=out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
