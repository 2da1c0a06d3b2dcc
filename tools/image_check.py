#!/usr/bin/env python3
"""``make image-check``: build the CPU image (or the GPU image's install) and try it, step by step.

    python3 tools/image_check.py [--variant cpu|gpu] [--engine auto|docker|podman] [--base IMAGE]
                                 [--torch-index-url URL] [--log-dir DIR] [--no-install]

CPU (default): docker/Dockerfile.cpu is built with docker or podman, whichever works here (podman
and debootstrap are installed with apt-get where neither is and we are root), on the Dockerfile's
base image or, when no registry answers, on a local Debian bookworm root made by debootstrap from
the mirror of this machine's apt sources. Then, in the image: nothing of the host's pip
configuration is left, ``slipstream-train --self-check``, a 2-process 20-step training with
``slipstream=paper_plus`` (startup to the first training step is timed) and ``torchx run -s
local_cwd`` of the component.

GPU (``--variant gpu``; slow, several GB of CUDA wheels): docker/Dockerfile is built against a CUDA
build of the pinned stack from an index this machine reaches (PyPI by default: its Linux x86_64
torch and fbgemm-gpu wheels are CUDA builds), then: the versions are the pins, torch is a CUDA
build, and the self-check passes with no GPU and says so.

The checks run as build steps of a throwaway image FROM the built one: some machines can build
but not start containers. Where the engine can start them, the image's default command (the
self-check) is run with ``run --rm`` too. Each step is reported; the first failure ends the check
with exit status 1 (the log's tail is printed, the whole log is under --log-dir). Exit status 77:
no container engine works here and none can be installed; the test suite skips on it.

pip inside a podman build (tools/image_host.py): the host's effective pip configuration (``pip config list``: files and
PIP_* variables) is written to one temporary file mounted read-only at /etc/pip.conf, and every
local path it names (CA bundle, find-links, file:// indexes, constraints) is mounted read-only
under /run/pip-host/. Mounts are not part of the image; the first check proves it.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import tomllib
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Dict, List, Mapping, Optional, Sequence, Tuple

from image_host import build_pip_config, debian_mirror, host_pip_config  # tools/, next to this script

ROOT = Path(__file__).resolve().parents[1]
DOCKERFILES = {"cpu": ROOT / "docker" / "Dockerfile.cpu", "gpu": ROOT / "docker" / "Dockerfile"}
CHECKS = ROOT / "docker" / "checks"  # the scripts run inside the image
BASE_ARG = {"cpu": "BASE", "gpu": "CUDA_IMAGE"}  # the build argument naming each file's base image
TAGS = {"cpu": "slipstream_rec:cpu", "gpu": "slipstream_rec:gpu-install-check"}
LOCAL_BASE = "slipstream-debian-base:bookworm"
DEBIAN_SUITE = "bookworm"  # Python 3.11, the version pyproject requires
DEFAULT_INDEX = "https://pypi.org/simple"
EXIT_SKIP = 77
CPU_MAX_IMAGE_BYTES = 2 * 1000**3  # the target: the CPU image is at most 2 GB


class StepFailed(Exception):
    """A step failed: ``str(e)`` says what, ``tail`` is the end of its log."""

    def __init__(self, message: str, tail: str = "") -> None:
        super().__init__(message)
        self.tail = tail


class NoEngine(Exception):
    """No container engine works here and none can be installed (exit status 77)."""


def dockerfile_default(dockerfile: Path, name: str) -> str:
    m = re.search(rf"(?m)^ARG {name}=(\S+)\s*$", dockerfile.read_text())
    if not m:
        raise StepFailed(f"{dockerfile} has no `ARG {name}=<default>`")
    return m.group(1)


# ---- running things ------------------------------------------------------------------------


def tail(text: str, lines: int = 40) -> str:
    return "\n".join(text.rstrip().splitlines()[-lines:])


def run_logged(cmd: Sequence[str], log: Path, timeout: float, stdin: Optional[int] = None, env=None) -> str:
    """Run ``cmd`` with its output appended to ``log``; the output, or StepFailed with its tail."""
    with open(log, "a") as f:
        f.write(f"\n$ {' '.join(cmd)}\n")
        f.flush()
        start = f.tell()
        try:
            proc = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, stdin=stdin, timeout=timeout, env=env)
        except subprocess.TimeoutExpired:
            raise StepFailed(f"timed out after {timeout:.0f} s: {' '.join(cmd)} (log: {log})") from None
    with open(log) as f:
        f.seek(start)
        out = f.read()
    if proc.returncode != 0:
        raise StepFailed(f"exit status {proc.returncode}: {' '.join(cmd[:3])} ... (log: {log})", tail(out))
    return out


def quiet(cmd: Sequence[str], timeout: float = 60) -> subprocess.CompletedProcess:
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired) as e:
        return subprocess.CompletedProcess(cmd, 127, "", str(e))


def apt_install(packages: List[str], log: Path) -> None:
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        raise NoEngine(f"cannot install {' '.join(packages)}: needs root and apt-get")
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    # with recommends: podman needs its recommended OCI runtime (crun) and network plugins
    cmd = ["apt-get", "install", "-y", "-q", *packages]
    try:
        run_logged(cmd, log, 900, env=env)
    except StepFailed:  # stale or missing package lists on a fresh machine
        run_logged(["apt-get", "update", "-q"], log, 600, env=env)
        run_logged(cmd, log, 900, env=env)


@dataclass
class Engine:
    name: str  # docker | podman
    isolation: str = "chroot"  # podman only: chroot builds where crun cannot start containers

    def build(self, dockerfile: Path, context: Path, log: Path, build_args: Mapping[str, str] = {},
              tag: str = "", volumes: Sequence[Tuple[str, str]] = (), throwaway: bool = False,
              iidfile: Optional[Path] = None, timeout: float = 3600) -> str:
        """``build``; ``volumes`` (podman only) are mounted read-only into every RUN; a
        ``throwaway`` build uses no cache (its RUN must really run) and keeps no intermediate image."""
        cmd = [self.name, "build", "-f", str(dockerfile)]
        env = None
        if self.name == "podman":
            # docker format keeps HEALTHCHECK (OCI drops it); chroot isolation needs no OCI runtime
            cmd += ["--format", "docker", "--isolation", self.isolation]
            cmd += [a for src, dst in volumes for a in ("--volume", f"{src}:{dst}:ro")]
            # a throwaway (check) build: its RUN must run, so no cache; the host's UTS namespace
            # gives it a hostname its /etc/hosts resolves (chroot isolation names the build
            # container after its id and does not list it, and torchrun's store is reached by
            # hostname)
            cmd += ["--layers=false", "--uts", "host"] if throwaway else []
        else:
            if volumes:
                raise StepFailed("docker build cannot mount the host's pip configuration: use --engine podman")
            cmd += ["--progress=plain"] + (["--no-cache"] if throwaway else [])
            env = dict(os.environ, DOCKER_BUILDKIT="1")
        cmd += [a for k, v in build_args.items() for a in ("--build-arg", f"{k}={v}")]
        cmd += (["-t", tag] if tag else []) + (["--iidfile", str(iidfile)] if iidfile else [])
        return run_logged(cmd + [str(context)], log, timeout, env=env)

    def has_image(self, image: str) -> bool:
        sub = ["image", "exists", image] if self.name == "podman" else ["image", "inspect", image]
        return quiet([self.name, *sub]).returncode == 0

    def size(self, image: str) -> int:
        proc = quiet([self.name, "image", "inspect", "--format", "{{.Size}}", image])
        if proc.returncode != 0:
            raise StepFailed(f"cannot inspect {image}: {proc.stderr.strip()}")
        return int(proc.stdout.strip())


def find_engine(choice: str, may_install: bool, log: Path) -> Tuple[Engine, str]:
    """docker if its daemon answers, else podman; podman installed with apt-get if need be."""
    if choice in ("auto", "docker") and shutil.which("docker") and quiet(["docker", "info"], 30).returncode == 0:
        return Engine("docker"), quiet(["docker", "--version"]).stdout.strip()
    if choice == "docker":
        raise NoEngine("--engine docker: `docker info` fails (no daemon answering)")
    how = ""
    if shutil.which("podman") is None:
        if not may_install:
            raise NoEngine("neither a docker daemon nor podman is available (and --no-install)")
        apt_install(["podman"], log)
        how = " (installed with apt-get)"
    return Engine("podman"), quiet(["podman", "--version"]).stdout.strip() + how


# ---- the base image ------------------------------------------------------------------------


def debootstrap_base(engine: Engine, log: Path, may_install: bool, mirror: Optional[str]) -> str:
    """A Debian bookworm root with Python 3.11, imported as LOCAL_BASE."""
    mirror = mirror or debian_mirror()
    if mirror is None:
        raise StepFailed("no registry answers and /etc/apt/sources.list* name no Debian mirror: pass --mirror URL")
    if shutil.which("debootstrap") is None:
        if not may_install:
            raise StepFailed("no registry answers and debootstrap is not installed (and --no-install)")
        apt_install(["debootstrap"], log)
    with tempfile.TemporaryDirectory(prefix="slipstream-base-", dir="/var/tmp") as tmp:
        root = Path(tmp) / "root"
        run_logged(["debootstrap", "--variant=minbase", "--include=python3,python3-venv,ca-certificates",
                    DEBIAN_SUITE, str(root), mirror], log, 1200)
        # apt's downloaded packages and lists: 90 MB the image does not need (apt-get update refills)
        for sub in ("var/cache/apt/archives", "var/lib/apt/lists"):
            for p in (root / sub).glob("*"):
                if p.is_file():
                    p.unlink()
        tar = subprocess.Popen(["tar", "-C", str(root), "-c", "."], stdout=subprocess.PIPE)
        try:
            # an imported root has no environment: give it Debian's PATH, which `ENV PATH=...:$PATH` extends
            run_logged([engine.name, "import", "--change",
                        "ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
                        "-", LOCAL_BASE], log, 600, stdin=tar.stdout)
        finally:
            tar.stdout.close()
            tar.wait()
    return f"made with debootstrap ({DEBIAN_SUITE} from {mirror})"


def choose_base(engine: Engine, variant: str, explicit: str, log: Path, may_install: bool,
                mirror: Optional[str]) -> Tuple[str, str]:
    """(image, how it was found): the given one; else the Dockerfile's default (local or pulled);
    else the local Debian base (reused, or made now)."""
    if explicit:
        if not engine.has_image(explicit):
            run_logged([engine.name, "pull", explicit], log, 900)
        return explicit, "given with --base"
    default = dockerfile_default(DOCKERFILES[variant], BASE_ARG[variant])
    if engine.has_image(default):
        return default, "the Dockerfile's default, present"
    try:
        run_logged([engine.name, "pull", default], log, 900)
        return default, "the Dockerfile's default, pulled"
    except StepFailed as e:
        reason = "..." + (tail(e.tail, 1) or str(e))[-100:]
    if engine.has_image(LOCAL_BASE):
        return LOCAL_BASE, f"the local Debian base, reused (pulling {default} failed: {reason})"
    return LOCAL_BASE, debootstrap_base(engine, log, may_install, mirror) + f" (pulling {default} failed: {reason})"


def index_reachable(url: str, cafile: Optional[str]) -> bool:
    try:
        import ssl

        ctx = ssl.create_default_context(cafile=cafile if cafile and os.path.isfile(cafile) else None)
        with urllib.request.urlopen(url.rstrip("/") + "/", timeout=15, context=ctx) as r:
            return r.status < 400
    except Exception:  # noqa: BLE001 - any failure means "not reachable from here"
        return False


# ---- the checks: docker/checks/*.sh, run as build steps inside the image ----------------------


def check_in_image(engine: Engine, image: str, script: str, log: Path, *args: str) -> str:
    """Run docker/checks/``script`` (bash, with ``args``) as a build step of a throwaway image FROM
    ``image``, as the image's USER in its WORKDIR; its output. The variant's pins go along as
    pins.json."""
    with tempfile.TemporaryDirectory(prefix="image-check-") as tmp:
        ctx = Path(tmp)
        shutil.copytree(CHECKS, ctx / "checks")
        (ctx / "checks" / "pins.json").write_text(json.dumps(pins(args[0]) if args else {}))
        run = json.dumps(["bash", "-euo", "pipefail", f"/tmp/image-check/{script}", *args])
        (ctx / "Containerfile").write_text(f"FROM {image}\nCOPY checks /tmp/image-check\nRUN {run}\n")
        iid = ctx / "iid"
        try:
            return engine.build(ctx / "Containerfile", ctx, log, throwaway=True, iidfile=iid, timeout=900)
        finally:
            if iid.is_file():
                quiet([engine.name, "rmi", "-f", iid.read_text().strip()])


def run_container(engine: Engine, image: str, log: Path) -> str:
    """The image's default command (the self-check) with ``run --rm``, where containers start."""
    probe = quiet([engine.name, "run", "--rm", image, "true"], 120)
    if probe.returncode != 0:
        why = (probe.stderr.strip().splitlines() or ["no output"])[-1]
        return f"skipped: {engine.name} cannot start containers here ({why[:200]})"
    out = run_logged([engine.name, "run", "--rm", image], log, 600)
    return "the default command (self-check) passed: " + tail(out, 1)


def result(out: str) -> str:
    """The last ``ok: ...`` line a check script printed."""
    lines = [ln[4:] for ln in out.splitlines() if ln.startswith("ok: ")]
    return lines[-1] if lines else "(no result line)"


def grab(out: str, key: str) -> Optional[str]:
    m = re.search(rf"(?m)^{key}=(\S+)$", out)
    return m.group(1) if m else None


# ---- the run -------------------------------------------------------------------------------


class Steps:
    """Numbered step reports; the first failure re-raises after printing its tail."""

    def __init__(self, total: int) -> None:
        self.total, self.n, self.records = total, 0, []

    def run(self, title: str, fn: Callable[[], Tuple[object, str]]) -> object:
        self.n += 1
        prefix = f"image-check [{self.n}/{self.total}] {title}"
        print(f"{prefix} ...", flush=True)
        start = time.monotonic()
        try:
            value, detail = fn()
        except (StepFailed, NoEngine) as e:
            seconds = time.monotonic() - start
            self.records.append({"step": title, "status": "failed", "seconds": round(seconds, 1), "detail": str(e)})
            print(f"{prefix}: FAILED after {seconds:.1f} s: {e}", flush=True)
            for line in getattr(e, "tail", "").splitlines():
                print(f"    | {line}")
            raise
        seconds = time.monotonic() - start
        status = "skipped" if detail.startswith("skipped: ") else "ok"
        detail = detail[len("skipped: "):] if status == "skipped" else detail
        self.records.append({"step": title, "status": status, "seconds": round(seconds, 1), "detail": detail})
        print(f"{prefix}: {status} ({seconds:.1f} s){': ' + detail if detail else ''}", flush=True)
        return value


def pins(variant: str) -> Dict[str, str]:
    return dict(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["slipstream_rec"]["stack"][variant])


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--variant", choices=["cpu", "gpu"], default="cpu")
    parser.add_argument("--engine", choices=["auto", "docker", "podman"], default="auto")
    parser.add_argument("--base", default="", help="base image (default: the Dockerfile's, else a local Debian base)")
    parser.add_argument("--mirror", default="", help="Debian mirror for debootstrap (default: from /etc/apt/sources.list*)")
    parser.add_argument("--torch-index-url", default=None,
                        help="TORCH_INDEX_URL build argument. cpu default: the Dockerfile's when it answers, "
                        "else empty (pip's own configuration); gpu default: pip's index-url, else PyPI")
    parser.add_argument("--isolation", default="chroot", help="podman build --isolation (default chroot)")
    parser.add_argument("--log-dir", default=str(ROOT / "runs" / "image-check"))
    parser.add_argument("--no-install", action="store_true", help="never install podman/debootstrap with apt-get")
    args = parser.parse_args(argv)

    variant, tag = args.variant, TAGS[args.variant]
    log_dir = Path(args.log_dir)
    log_dir.mkdir(parents=True, exist_ok=True)
    log = log_dir / f"{variant}.log"
    log.write_text("")
    summary: Dict[str, object] = {"variant": variant, "image": tag, "log": str(log)}
    steps = Steps(9 if variant == "cpu" else 6)
    began = time.monotonic()
    print(f"image-check: {variant} image from {DOCKERFILES[variant].relative_to(ROOT)}; full log: {log}", flush=True)
    try:
        def engine_step():
            engine, version = find_engine(args.engine, not args.no_install, log)
            engine.isolation = args.isolation
            return engine, version
        try:
            engine = steps.run("container engine", engine_step)
        except NoEngine as e:
            print(f"image-check: SKIP: no container engine: {e}", flush=True)
            return EXIT_SKIP
        summary["engine"] = engine.name

        def base_step():
            image, how = choose_base(engine, variant, args.base, log, not args.no_install, args.mirror or None)
            return image, f"{image}: {how}"
        base = summary["base"] = steps.run("base image", base_step)

        def build_step():
            options = host_pip_config() if engine.name == "podman" else {}
            build_args = {BASE_ARG[variant]: base}
            index = args.torch_index_url
            # the Dockerfile's own index where it answers; else, for the CPU image, pip's own
            # configuration (it must offer torch's CPU build), for the GPU image pip's index (PyPI's
            # pinned torch and fbgemm-gpu are CUDA builds)
            if index is None and not index_reachable(
                dockerfile_default(DOCKERFILES[variant], "TORCH_INDEX_URL"), options.get("cert")
            ):
                index = "" if variant == "cpu" else options.get("index-url", DEFAULT_INDEX)
            if index is not None:
                build_args["TORCH_INDEX_URL"] = index
            volumes: List[Tuple[str, str]] = []
            with tempfile.TemporaryDirectory(prefix="image-check-pip-") as tmp:
                if options:
                    try:
                        text, volumes = build_pip_config(options, variant)
                    except ValueError as e:
                        raise StepFailed(str(e)) from None
                    conf = Path(tmp) / "pip.conf"
                    conf.write_text(text)
                    (log_dir / f"{variant}-pip.conf").write_text(text)  # what the build saw, for the log
                    volumes = [(str(conf), "/etc/pip.conf")] + volumes
                start = time.monotonic()
                engine.build(DOCKERFILES[variant], ROOT, log, build_args, tag=tag, volumes=volumes)
            summary["build_seconds"] = round(time.monotonic() - start, 1)
            size = engine.size(tag)
            summary["image_bytes"] = size
            shown = ", ".join(f"{k}={v or '(empty: pip configuration)'}" for k, v in build_args.items())
            return None, f"{tag}, {size / 1e6:.0f} MB ({shown}; {len(volumes)} read-only pip mounts)"
        steps.run("build", build_step)

        steps.run("no host pip configuration in the image",
                  lambda: (None, result(check_in_image(engine, tag, "no-host-pip.sh", log))))
        if variant == "cpu":
            def size_step():
                size = int(summary["image_bytes"])
                if size > CPU_MAX_IMAGE_BYTES:
                    raise StepFailed(f"{size / 1e9:.2f} GB > {CPU_MAX_IMAGE_BYTES / 1e9:.0f} GB")
                return None, f"{size / 1e9:.2f} GB <= {CPU_MAX_IMAGE_BYTES / 1e9:.0f} GB"
            steps.run("image size", size_step)
            steps.run("slipstream-train --self-check",
                      lambda: (None, result(check_in_image(engine, tag, "self-check.sh", log, "cpu"))))

            def train_step():
                out = check_in_image(engine, tag, "train.sh", log)
                startup = grab(out, "startup_to_first_step_s")
                summary["startup_to_first_step_s"] = float(startup) if startup else None
                return None, f"{result(out)}, startup to the first step {startup} s"
            steps.run("2-process training, slipstream=paper_plus", train_step)
            steps.run("torchx run -s local_cwd",
                      lambda: (None, result(check_in_image(engine, tag, "torchx.sh", log))))
        else:
            def gpu_step():
                out = check_in_image(engine, tag, "gpu-stack.sh", log, "gpu")
                summary["cuda_version"] = grab(out, "cuda_version")
                return None, result(out)
            steps.run("pinned CUDA stack; self-check reports no GPU", gpu_step)
        steps.run("run --rm (the image's default command)", lambda: (None, run_container(engine, tag, log)))
    except (StepFailed, NoEngine):
        summary.update(ok=False, steps=steps.records, total_seconds=round(time.monotonic() - began, 1))
        (log_dir / f"summary-{variant}.json").write_text(json.dumps(summary, indent=2) + "\n")
        print(f"image-check: FAILED at step {steps.n}/{steps.total}; full log: {log}", flush=True)
        return 1
    summary.update(ok=True, steps=steps.records, total_seconds=round(time.monotonic() - began, 1))
    (log_dir / f"summary-{variant}.json").write_text(json.dumps(summary, indent=2) + "\n")
    skipped = sum(r["status"] == "skipped" for r in steps.records)
    print(f"image-check: all {steps.total} steps passed ({skipped} skipped) in {summary['total_seconds']:.0f} s",
          flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
