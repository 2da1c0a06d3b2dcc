"""tools/image_check.py (``make image-check``) and tools/image_host.py: their parts without a
container engine, and the whole check with one.

The parts: how the host's pip configuration becomes the build's (paths mounted read-only under
/run/pip-host, URLs kept, the GPU build reduced to the network settings), where the Debian mirror
comes from, the exit status 77 when no engine can be had, and the check scripts of docker/checks/
run against this checkout's venv (they pass where they should and fail where they should). The
whole check (slow, ``image``) builds the CPU image (and, for the GPU variant, the GPU image's
install) and is skipped, with the script's reason, where no engine works and none can be installed.
"""

from __future__ import annotations

import configparser
import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "tools" / "image_check.py"
CHECKS = REPO / "docker" / "checks"
VENV_BIN = Path(sys.executable).parent


def _load():
    sys.path.insert(0, str(SCRIPT.parent))  # image_check imports image_host, next to it
    spec = importlib.util.spec_from_file_location("image_check", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules["image_check"] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


ic = _load()
import image_host as host  # noqa: E402 - importable once _load() put tools/ on sys.path


# ---- the host's pip configuration ------------------------------------------------------------


def test_pip_config_list_precedence_env_over_install_over_global():
    text = "\n".join([
        "global.cert='/a.pem'",
        "global.timeout='10'",
        "install.timeout='20'",
        "download.timeout='99'",  # another command's section: not for pip install
        "global.extra-index-url='file:///x/simple https://example.org/simple'",
        ":env:.find-links='/opt/wheels'",
    ])
    assert host.parse_pip_config_list(text) == {
        "cert": "/a.pem",
        "timeout": "20",
        "extra-index-url": "file:///x/simple https://example.org/simple",
        "find-links": "/opt/wheels",
    }
    assert host.parse_pip_config_list(text + "\n:env:.timeout='30'")["timeout"] == "30"
    assert host.parse_pip_config_list("") == {}


def _local_index(tmp: Path) -> dict:
    """A file:// index whose pages link to ../../files (the layout of a local PyPI mirror), a
    find-links directory and a CA bundle."""
    (tmp / "index" / "simple" / "pkg").mkdir(parents=True)
    (tmp / "index" / "files").mkdir()
    (tmp / "index" / "files" / "pkg-1.0-py3-none-any.whl").write_bytes(b"wheel")
    (tmp / "index" / "simple" / "pkg" / "index.html").write_text(
        '<a href="../../files/pkg-1.0-py3-none-any.whl">pkg-1.0-py3-none-any.whl</a>'
    )
    (tmp / "wheels").mkdir()
    (tmp / "certs").mkdir()
    (tmp / "certs" / "ca.pem").write_text("-----BEGIN CERTIFICATE-----\n")
    return {
        "cert": str(tmp / "certs" / "ca.pem"),
        "find-links": str(tmp / "wheels"),
        "extra-index-url": f"file://{tmp}/index/simple https://mirror.example/simple",
        "timeout": "60",
    }


def _conf(text: str) -> dict:
    parser = configparser.ConfigParser()
    parser.read_string(text)
    return dict(parser["global"])


def test_cpu_build_config_mounts_every_local_path_and_keeps_urls(tmp_path):
    tmp = Path(os.path.realpath(tmp_path))
    text, mounts = host.build_pip_config(_local_index(tmp), "cpu")
    conf = _conf(text)
    root = host.MOUNT_ROOT
    assert conf["cert"] == f"{root}{tmp}/certs/ca.pem"
    assert conf["find-links"] == f"{root}{tmp}/wheels"
    assert conf["extra-index-url"].split() == [f"file://{root}{tmp}/index/simple", "https://mirror.example/simple"]
    assert conf["timeout"] == "60"
    # the whole index tree is mounted (its pages link to ../../files), each path once, read-only
    assert sorted(mounts) == sorted([
        (str(tmp / "certs" / "ca.pem"), f"{root}{tmp}/certs/ca.pem"),
        (str(tmp / "wheels"), f"{root}{tmp}/wheels"),
        (str(tmp / "index"), f"{root}{tmp}/index"),
    ])
    # the page's relative link, followed inside the build, lands in a mounted file
    page_dir = Path(conf["extra-index-url"].split()[0][len("file://"):]) / "pkg"
    in_build = os.path.normpath(page_dir / "../../files/pkg-1.0-py3-none-any.whl")
    src, dst = next((s, d) for s, d in mounts if in_build.startswith(d + "/"))
    assert Path(src + in_build[len(dst):]).read_bytes() == b"wheel"


def test_gpu_build_config_keeps_only_the_network_settings(tmp_path):
    tmp = Path(os.path.realpath(tmp_path))
    text, mounts = host.build_pip_config(_local_index(tmp), "gpu")
    conf = _conf(text)
    # no local wheels or extra indexes: they could hold torch's CPU build
    assert set(conf) == {"cert", "timeout"}
    assert mounts == [(str(tmp / "certs" / "ca.pem"), f"{host.MOUNT_ROOT}{tmp}/certs/ca.pem")]


def test_build_config_nests_no_mounts_and_refuses_unmountable_paths(tmp_path):
    tmp = Path(os.path.realpath(tmp_path))
    options = _local_index(tmp)
    options["find-links"] = str(tmp / "index" / "files")  # inside the index tree, mounted already
    _, mounts = host.build_pip_config(options, "cpu")
    assert [s for s, _ in mounts] == [str(tmp / "certs" / "ca.pem"), str(tmp / "index")]
    odd = tmp / "a:b"
    odd.mkdir()
    with pytest.raises(ValueError, match="cannot mount"):
        host.build_pip_config({"find-links": str(odd)}, "cpu")


# ---- the Debian mirror, the Dockerfiles' bases, no engine ------------------------------------


def test_debian_mirror_from_deb822_and_one_line_sources(tmp_path):
    apt = tmp_path / "apt"
    (apt / "sources.list.d").mkdir(parents=True)
    (apt / "sources.list").write_text("# nothing here\n")
    (apt / "sources.list.d" / "a-old.sources.disabled").write_text(
        "Types: deb\nURIs: http://disabled.example/debian\nSuites: bookworm\n"
    )
    (apt / "sources.list.d" / "debian.sources").write_text(
        "Types: deb\nURIs: http://security.example/debian-security\nSuites: bookworm-security\n\n"
        "Types: deb\nURIs: http://off.example/debian\nSuites: bookworm\nEnabled: no\n\n"
        "Types: deb deb-src\n# a comment\nURIs: http://mirror.example/debian\nSuites: bookworm bookworm-updates\n"
    )
    assert host.debian_mirror(apt) == "http://mirror.example/debian"
    (apt / "sources.list").write_text(
        "deb http://security.debian.org/debian-security bookworm-security main\n"
        "deb [arch=amd64] http://one-line.example/debian bookworm main\n"
    )
    assert host.debian_mirror(apt) == "http://one-line.example/debian"
    (apt / "sources.list").write_text("")
    (apt / "sources.list.d" / "debian.sources").write_text("Types: deb-src\nURIs: http://src.example/debian\n")
    assert host.debian_mirror(apt) is None


def test_base_image_defaults_come_from_the_dockerfiles(tmp_path):
    assert ic.dockerfile_default(ic.DOCKERFILES["cpu"], ic.BASE_ARG["cpu"]).startswith("docker.io/library/python:3.11")
    assert ic.dockerfile_default(ic.DOCKERFILES["gpu"], ic.BASE_ARG["gpu"]).startswith("docker.io/nvidia/cuda:")
    broken = tmp_path / "Dockerfile"
    broken.write_text("FROM ${BASE}\n")
    with pytest.raises(ic.StepFailed, match="ARG BASE"):
        ic.dockerfile_default(broken, "BASE")


def test_no_engine_and_no_install_exits_77_with_the_reason(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(ic.shutil, "which", lambda name, *a, **k: None)  # no docker, podman, apt-get
    with pytest.raises(ic.NoEngine):
        ic.find_engine("auto", False, tmp_path / "log")
    monkeypatch.setattr(ic.os, "geteuid", lambda: 1000)  # not root: apt-get may not run
    with pytest.raises(ic.NoEngine, match="needs root"):
        ic.find_engine("auto", True, tmp_path / "log")
    assert ic.main(["--no-install", "--log-dir", str(tmp_path)]) == ic.EXIT_SKIP
    out = capsys.readouterr().out
    assert "SKIP: no container engine" in out and "[1/9] container engine" in out


# ---- the check scripts, run against this venv -------------------------------------------------


def _check(script: str, *args: str, cwd: Path, path_first: Path | None = None, pins: dict | None = None):
    """Run docker/checks/<script> as the image does (bash -euo pipefail), with this venv on PATH."""
    checks = cwd / "checks"
    if not checks.exists():
        shutil.copytree(CHECKS, checks)
    (checks / "pins.json").write_text(json.dumps(pins or {}))
    path = os.pathsep.join([str(p) for p in (path_first, VENV_BIN) if p] + [os.environ["PATH"]])
    env = dict(os.environ, PATH=path, OMP_NUM_THREADS="1")
    return subprocess.run(["bash", "-euo", "pipefail", str(checks / script), *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=300)


def test_self_check_script_passes_for_this_variant_only(tmp_path):
    ok = _check("self-check.sh", "cpu", cwd=tmp_path)
    assert ok.returncode == 0 and "ok: self-check passed (variant cpu)" in ok.stdout, ok.stdout + ok.stderr
    wrong = _check("self-check.sh", "gpu", cwd=tmp_path)
    assert wrong.returncode != 0 and "did not find the gpu variant" in wrong.stdout


def test_gpu_stack_script_rejects_a_cpu_stack(tmp_path):
    pins = ic.pins("gpu")
    proc = _check("gpu-stack.sh", cwd=tmp_path, pins=pins)
    assert proc.returncode != 0
    err = proc.stdout + proc.stderr
    assert "not the pinned CUDA stack" in err and "is not a CUDA build" in err
    assert f"fbgemm-gpu None (pin {pins['fbgemm-gpu']})" in err


def test_train_script_trains_20_steps_and_times_the_start(tmp_path):
    proc = _check("train.sh", cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    startup = float(ic.grab(proc.stdout, "startup_to_first_step_s"))
    assert 0 < startup < 120
    assert ic.result(proc.stdout).startswith("20 steps on 2 ranks, val_auc 0.")
    summary = json.loads((tmp_path / "runs" / "image-check-train" / "summary.json").read_text())
    assert summary["steps"] == 20 and summary["world_size"] == 2


def test_train_and_torchx_scripts_fail_when_the_job_does(tmp_path):
    fake = tmp_path / "fake-bin"
    fake.mkdir()
    for name, status in (("torchrun", 3), ("torchx", 0)):  # torchx "succeeds" but trains nothing
        (fake / name).write_text(f"#!/bin/sh\necho fake {name}\nexit {status}\n")
        (fake / name).chmod(0o755)
    train = _check("train.sh", cwd=tmp_path, path_first=fake)
    assert train.returncode != 0 and "training exited with status 3" in train.stdout
    torchx = _check("torchx.sh", cwd=tmp_path, path_first=fake)
    assert torchx.returncode != 0 and "summary.json" in torchx.stderr


# ---- the whole check ----------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.image
@pytest.mark.parametrize("variant", ["cpu", "gpu"])
def test_image_check(variant, tmp_path):
    """``make image-check`` (cpu: ~5 min from scratch) / ``make image-check-gpu`` (downloads several
    GB of CUDA wheels). Skipped, with the script's reason, where no engine can be had."""
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--variant", variant, "--log-dir", str(tmp_path)],
        cwd=REPO, capture_output=True, text=True, timeout=3600,
    )
    if proc.returncode == ic.EXIT_SKIP:
        pytest.skip(proc.stdout.strip().splitlines()[-1])
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-3000:]
    summary = json.loads((tmp_path / f"summary-{variant}.json").read_text())
    assert summary["ok"]
    for step in summary["steps"]:
        # only starting a container may be skipped (engines that build but cannot run)
        assert step["status"] == "ok" or step["step"].startswith("run --rm"), step
    if variant == "cpu":
        assert summary["image_bytes"] <= ic.CPU_MAX_IMAGE_BYTES
        assert summary["startup_to_first_step_s"] is not None
    else:
        assert summary["cuda_version"] not in (None, "None")
