"""`slipstream-train --self-check` (slipstream_rec/self_check.py) and where its pins come from."""

from __future__ import annotations

import io
import json
import os
import re
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

from slipstream_rec import self_check as sc
from slipstream_rec.train import parse_args

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
PINS = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["slipstream_rec"]["stack"]


def _run_cli(tmp_path: Path, **env: str) -> subprocess.CompletedProcess:
    full = {k: v for k, v in os.environ.items() if k != sc.PINS_ENV}
    full.update(env)
    return subprocess.run(
        [str(BIN / "slipstream-train"), "--self-check"],
        cwd=tmp_path,  # not the repo: the pins must be found from the package, not the cwd
        env=full, capture_output=True, text=True, timeout=120,
    )


def test_self_check_passes_here(tmp_path):
    proc = _run_cli(tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout
    assert "self-check: OK" in out
    assert re.search(rf"pins +\[tool\.slipstream_rec\.stack\.cpu\] of {re.escape(str(REPO / 'pyproject.toml'))}", out)
    for dist in ("torch", "fbgemm-gpu-cpu", "torchrec"):
        line = next(ln for ln in out.splitlines() if ln.strip().startswith(dist + " "))
        assert "(pin ok)" in line, line
    assert "torch.ops.fbgemm.asynchronous_complete_cumsum ran on cpu" in out
    import torch

    if not torch.cuda.is_available():
        assert "cpu with backend gloo" in out and re.search(r"cuda +not available", out)


def test_self_check_fails_clearly_on_a_mismatched_fbgemm_pin(tmp_path):
    """Simulated mismatch: $SLIPSTREAM_STACK_PINS points at pins one fbgemm release away."""
    installed = sc.installed_versions()
    variant, _ = sc.detect_variant(installed)
    fbgemm = sc.VARIANT_FBGEMM[variant]
    major, minor, *_ = PINS[variant][fbgemm].split(".")
    other = f"{major}.{int(minor) - 1}.0"
    table = "\n".join(f'{n} = "{other if n == fbgemm else v}"' for n, v in PINS[variant].items())
    pins = tmp_path / "pins.toml"
    pins.write_text(f"[tool.slipstream_rec.stack.{variant}]\n{table}\n")

    proc = _run_cli(tmp_path, **{sc.PINS_ENV: str(pins)})
    assert proc.returncode == 1
    assert "self-check: FAILED (1 problem(s))" in proc.stderr
    assert f"{fbgemm} {installed[fbgemm]} is installed but [tool.slipstream_rec.stack.{variant}] pins {other}" in proc.stderr
    assert f"{fbgemm}=={other}" in proc.stderr  # the fix names the package and the version to install
    assert "--no-deps torchrec==" in proc.stderr
    assert f"(pin {other}: MISMATCH)" in proc.stdout


def test_missing_pins_file_is_a_clear_failure(tmp_path):
    with pytest.raises(sc.SelfCheckError, match=r"SLIPSTREAM_STACK_PINS=.*no such file"):
        sc.load_pins({sc.PINS_ENV: str(tmp_path / "nope.toml")})
    bad = tmp_path / "bad.toml"
    bad.write_text("[tool.other]\nx = 1\n")
    with pytest.raises(sc.SelfCheckError, match=r"no \[tool.slipstream_rec.stack.<variant>\] tables"):
        sc.load_pins({sc.PINS_ENV: str(bad)})


def test_in_process_mismatch_of_torch_names_the_package_and_the_fix(monkeypatch):
    fake = dict(sc.installed_versions())
    variant, _ = sc.detect_variant(fake)
    fake["torch"] = "2.12.1+cpu"
    monkeypatch.setattr(sc, "installed_versions", lambda: fake)
    out, err = io.StringIO(), io.StringIO()
    assert sc.main(out, err) == 1
    text = err.getvalue()
    assert f"torch 2.12.1+cpu is installed but [tool.slipstream_rec.stack.{variant}] pins {PINS[variant]['torch']}" in text
    assert f"python tools/install_stack.py --variant {variant}" in text and str(REPO) in text


def test_gpu_stack_without_driver_reports_no_gpu_instead_of_a_broken_install(monkeypatch):
    """The GPU image where no NVIDIA driver is (a `docker build`, a machine without a GPU):
    fbgemm's CUDA build cannot load without libnvidia-ml.so.1; that is reported as "no GPU", not
    as a broken install. With the driver present, the same failure stays a problem."""
    monkeypatch.setitem(sys.modules, "fbgemm_gpu", None)  # `import fbgemm_gpu` now fails
    monkeypatch.setitem(sys.modules, "torchrec", None)
    monkeypatch.setattr(sc, "no_nvidia_driver", lambda: "OSError: libnvidia-ml.so.1: cannot open shared object file")
    report = sc.Report()
    sc.probe_runtime(report, "gpu", None)
    lines = dict(report.lines)
    assert lines["fbgemm ops"].startswith("not loaded: fbgemm's CUDA build needs the NVIDIA driver")
    assert lines["torchrec import"].startswith("not possible")
    assert not [p for p in report.problems if "fbgemm's operators" in p.what or "import torchrec" in p.what]
    assert len(report.notes) == 1 and "no GPU and no NVIDIA driver here" in report.notes[0]
    # the CPU variant never needs the driver: the same failure is a problem there
    report = sc.Report()
    sc.probe_runtime(report, "cpu", None)
    assert [p for p in report.problems if "fbgemm's operators do not load" in p.what]
    assert [p for p in report.problems if "import torchrec failed" in p.what]
    # driver present: a load failure is a real problem
    monkeypatch.setattr(sc, "no_nvidia_driver", lambda: None)
    report = sc.Report()
    sc.probe_runtime(report, "gpu", None)
    assert [p for p in report.problems if "fbgemm's operators do not load" in p.what] and not report.notes


# --- pure checks ---------------------------------------------------------------------------------


def _pins(variant_table: dict, variant: str = "cpu", repo_root=None) -> sc.Pins:
    return sc.Pins({variant: variant_table}, "test pins", repo_root)


def test_versions_against_pins():
    pins = _pins(dict(PINS["cpu"]), repo_root=REPO)
    ok = {"torch": f"{PINS['cpu']['torch']}+cpu", "fbgemm-gpu-cpu": PINS["cpu"]["fbgemm-gpu-cpu"],
          "torchrec": PINS["cpu"]["torchrec"], "fbgemm-gpu": None}
    assert sc.check_versions(ok, "cpu", pins) == []
    bad = {**ok, "torchrec": "1.7.0"}
    (p,) = sc.check_versions(bad, "cpu", pins)
    assert "torchrec 1.7.0 is installed" in p.what and "install_stack.py --variant cpu" in p.fix
    (p,) = sc.check_versions({**ok, "torchrec": None}, "cpu", pins)
    assert "torchrec is not installed" in p.what
    (p,) = sc.check_versions(ok, "gpu", pins)
    assert "no [tool.slipstream_rec.stack.gpu] table" in p.what


def test_gpu_fix_uses_one_cuda_index_and_cpu_fix_the_cpu_index():
    gpu = sc.reinstall_command("gpu", _pins(dict(PINS["gpu"]), "gpu"), cuda="12.8")
    assert gpu.startswith("pip install --index-url https://download.pytorch.org/whl/cu128 ")
    assert f"fbgemm-gpu=={PINS['gpu']['fbgemm-gpu']}" in gpu and "--no-deps torchrec==" in gpu
    assert "--index-only" in sc.reinstall_command("gpu", _pins(dict(PINS["gpu"]), "gpu", REPO))
    cpu = sc.reinstall_command("cpu", _pins(dict(PINS["cpu"])))
    assert "--extra-index-url https://download.pytorch.org/whl/cpu" in cpu and "fbgemm-gpu-cpu==" in cpu
    assert "--index-only" not in sc.reinstall_command("cpu", _pins(dict(PINS["cpu"]), repo_root=REPO))


def test_variant_detection():
    assert sc.detect_variant({"fbgemm-gpu-cpu": "1.8.0", "fbgemm-gpu": None}) == ("cpu", [])
    assert sc.detect_variant({"fbgemm-gpu-cpu": None, "fbgemm-gpu": "1.8.0"}) == ("gpu", [])
    variant, (p,) = sc.detect_variant({"fbgemm-gpu-cpu": "1.8.0", "fbgemm-gpu": "1.8.0"})
    assert variant is None and "both fbgemm-gpu and fbgemm-gpu-cpu" in p.what and "uninstall" in p.fix
    variant, (p,) = sc.detect_variant({"fbgemm-gpu-cpu": None, "fbgemm-gpu": None})
    assert variant is None and "neither" in p.what


def test_compatibility_rule_without_pins():
    good = {"torch": "2.13.0+cu128", "fbgemm-gpu": "1.8.0", "torchrec": "1.8.0"}
    assert sc.check_versions(good, "gpu", None) == []
    (p,) = sc.check_versions({**good, "torch": "2.12.0"}, "gpu", None)
    assert "built for torch 2.13.x" in p.what and "fbgemm-gpu 1.8.0" in p.what
    (p,) = sc.check_versions({**good, "torchrec": "1.7.1"}, "gpu", None)
    assert "torchrec 1.7.1 does not pair with fbgemm-gpu 1.8.0" in p.what


def test_pyproject_pins_obey_the_compatibility_rule():
    for variant, table in PINS.items():
        assert sc.check_versions(table, variant, None) == [], variant


# --- where the pins come from --------------------------------------------------------------------


def test_pins_precedence(tmp_path):
    env_file = tmp_path / "env.toml"
    env_file.write_text('[tool.slipstream_rec.stack.cpu]\ntorch = "9.9.9"\n')
    other_project = tmp_path / "other" / "pyproject.toml"
    other_project.parent.mkdir()
    other_project.write_text('[project]\nname = "something_else"\n[tool.slipstream_rec.stack.cpu]\ntorch = "0"\n')
    embedded = tmp_path / "_stack_pins.json"
    embedded.write_text(json.dumps({"source": "built", "stack": {"cpu": {"torch": "1.2.3"}}}))

    p = sc.load_pins({sc.PINS_ENV: str(env_file)}, REPO / "pyproject.toml", embedded)
    assert p.stack["cpu"]["torch"] == "9.9.9" and sc.PINS_ENV in p.source
    p = sc.load_pins({}, REPO / "pyproject.toml", embedded)
    assert p.stack == PINS and p.repo_root == REPO
    p = sc.load_pins({}, other_project, embedded)  # another project's pyproject is not ours
    assert p.stack["cpu"]["torch"] == "1.2.3" and "built" in p.source and p.repo_root is None
    assert sc.load_pins({}, tmp_path / "missing.toml", tmp_path / "missing.json") is None


def test_built_wheel_embeds_the_pyproject_pins(tmp_path):
    """setup.py copies [tool.slipstream_rec.stack] into the wheel; self_check reads that copy."""
    src = tmp_path / "src"
    src.mkdir()
    for name in ("pyproject.toml", "setup.py", "README.md"):
        shutil.copy(REPO / name, src / name)
    shutil.copytree(REPO / "slipstream_rec", src / "slipstream_rec",
                    ignore=shutil.ignore_patterns("__pycache__", "*.egg-info", "_stack_pins.json"))
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index",
         "-q", "-w", str(tmp_path / "dist"), str(src)],
        capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    (wheel,) = (tmp_path / "dist").glob("slipstream_rec-*.whl")
    with zipfile.ZipFile(wheel) as zf:
        payload = json.loads(zf.read("slipstream_rec/_stack_pins.json"))
        assert "slipstream_rec/self_check.py" in zf.namelist()
    assert payload["stack"] == PINS
    embedded = tmp_path / "_stack_pins.json"
    embedded.write_text(json.dumps(payload))
    p = sc.load_pins({}, tmp_path / "no-repo" / "pyproject.toml", embedded)
    assert p is not None and p.stack == PINS and "embedded at build time" in p.source


def test_self_check_flag_takes_no_overrides(capsys):
    assert parse_args(["--self-check"]).self_check
    with pytest.raises(SystemExit) as e:
        parse_args(["--self-check", "sharding=row_wise"])
    assert e.value.code == 2
    assert "--self-check takes no overrides" in capsys.readouterr().err
