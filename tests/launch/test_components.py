"""Tests for the TorchX launcher component (launch/components.py) and .torchxconfig."""

import ast
import configparser
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Dict, List

import pytest

from torchx.schedulers import get_scheduler_factories
from torchx.specs import AppDef
from torchx.specs.builders import materialize_appdef
from torchx.specs.file_linter import get_fn_docstring, validate
from torchx.specs.finder import get_component

REPO = Path(__file__).resolve().parents[2]
COMPONENT_FILE = REPO / "launch" / "components.py"
TORCHXCONFIG = REPO / ".torchxconfig"
TORCHX_BIN = REPO / ".venv" / "bin" / "torchx"
if not TORCHX_BIN.exists():  # e.g. a different venv layout: use the running interpreter's
    TORCHX_BIN = Path(sys.executable).parent / "torchx"

OVERRIDES = ["trainer.max_steps=5", "sharding=row_wise"]


@pytest.fixture(scope="module")
def train():
    # load it exactly as the torchx CLI does (exec + linter); raises on validation errors
    return get_component(f"{COMPONENT_FILE}:train").fn


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch):
    # the component reads LOGLEVEL / NCCL_* from the launcher's env: make tests hermetic
    for key in list(os.environ):
        if key in ("LOGLEVEL", "GLOO_SOCKET_IFNAME", "TP_SOCKET_IFNAME") or key.startswith("NCCL_"):
            monkeypatch.delenv(key)


def _torchrun_argv(app: AppDef) -> List[str]:
    assert len(app.roles) == 1
    role = app.roles[0]
    assert role.entrypoint == "bash"
    assert role.args[0] == "-c" and len(role.args) == 2
    argv = shlex.split(role.args[1])
    assert argv[0] == "torchrun"
    return argv


def _opt(argv: List[str], flag: str) -> str:
    assert argv.count(flag) == 1, f"{flag} not exactly once in {argv}"
    return argv[argv.index(flag) + 1]


def _script_args(argv: List[str]) -> List[str]:
    i = argv.index("-m")
    assert argv[i + 1] == "slipstream_rec.train"
    return argv[i + 2 :]


# --- (a) component validation ------------------------------------------------


def test_component_passes_torchx_linter():
    errors = validate(str(COMPONENT_FILE), "train")
    assert [e.description for e in errors] == []


def test_linter_would_catch_a_broken_component(tmp_path):
    # control: the same validation flags an unannotated arg / missing AppDef return
    broken = COMPONENT_FILE.read_text().replace("max_retries: int = 0", "max_retries=0")
    assert broken != COMPONENT_FILE.read_text()
    (tmp_path / "c.py").write_text(broken)
    errors = validate(str(tmp_path / "c.py"), "train")
    assert any("max_retries" in e.description for e in errors)


def test_every_component_arg_is_documented(train):
    # torchx builds the CLI --help from the docstring's Args: section; undocumented -> " "
    _, arg_docs = get_fn_docstring(train)
    undocumented = [name for name, doc in arg_docs.items() if not doc.strip()]
    assert undocumented == []
    for name in ["script_args", "j", "image", "cpu", "gpu", "memMB", "h", "env",
                 "max_retries", "rdzv_port", "rdzv_backend", "mounts", "name"]:
        assert name in arg_docs


# --- (b) AppDef contents -----------------------------------------------------


def test_2x3_builds_torchrun_with_overrides_unchanged(train):
    app = train(*OVERRIDES, j="2x3", max_retries=2)
    argv = _torchrun_argv(app)
    role = app.roles[0]

    assert _opt(argv, "--nnodes") == "2"
    assert _opt(argv, "--nproc_per_node") == "3"
    assert _opt(argv, "--rdzv_backend") == "c10d"
    # multi-node: rank0 host from the scheduler-provided env var, our rdzv_port
    assert _opt(argv, "--rdzv_endpoint") == "$${${rank0_env}:=localhost}:29500"
    assert _opt(argv, "--rdzv_id") == "${app_id}"  # -> TORCHELASTIC_RUN_ID == app id
    assert _script_args(argv) == OVERRIDES
    assert role.num_replicas == 2 and role.min_replicas == 2
    assert role.max_retries == 2
    assert _opt(argv, "--max_restarts") == "2"  # torchrun restarts the workers in place
    assert role.env["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] == "1"  # a fresh store per attempt
    assert role.env["OMP_NUM_THREADS"] == "1"
    assert role.env["LOGLEVEL"] == "WARNING"
    assert "NCCL_DEBUG" not in role.env  # cpu job
    assert app.name == "slipstream"


def test_single_node_uses_random_local_port_and_elastic_j(train):
    argv = _torchrun_argv(train(j="1x2"))
    assert _opt(argv, "--rdzv_endpoint") == "localhost:0"
    assert _script_args(argv) == []

    app = train(j="1:4x8", rdzv_port=29600)
    argv = _torchrun_argv(app)
    assert _opt(argv, "--nnodes") == "1:4"
    assert _opt(argv, "--nproc_per_node") == "8"
    assert _opt(argv, "--rdzv_endpoint").endswith(":29600")
    assert (app.roles[0].min_replicas, app.roles[0].num_replicas) == (1, 4)


def test_awkward_hydra_overrides_survive_shell_quoting(train):
    overrides = ["+trainer.tag=a b", "~model.dropout", "paths.data='/tmp/x y'",
                 "lr=1e-3", "tables=[a,b]", "--multirun"]
    assert _script_args(_torchrun_argv(train(*overrides))) == overrides


def test_user_env_overrides_defaults_and_is_not_mutated(train, monkeypatch):
    monkeypatch.setenv("LOGLEVEL", "ERROR")
    user_env = {"OMP_NUM_THREADS": "8", "FOO": "bar"}
    role = train(*OVERRIDES, env=user_env).roles[0]
    assert role.env["OMP_NUM_THREADS"] == "8"
    assert role.env["FOO"] == "bar"
    assert role.env["LOGLEVEL"] == "ERROR"  # launcher's $LOGLEVEL beats the built-in default
    role = train(env={"LOGLEVEL": "DEBUG"}).roles[0]
    assert role.env["LOGLEVEL"] == "DEBUG"  # explicit env beats both
    assert user_env == {"OMP_NUM_THREADS": "8", "FOO": "bar"}


def test_gpu_job_gets_nccl_defaults_not_omp(train, monkeypatch):
    monkeypatch.setenv("NCCL_SOCKET_IFNAME", "eth0")
    role = train(j="1x4", gpu=4).roles[0]
    assert role.env["NCCL_DEBUG"] == "WARN"
    assert role.env["NCCL_SOCKET_IFNAME"] == "eth0"  # launcher's NCCL_* passed through
    assert "OMP_NUM_THREADS" not in role.env
    assert role.resource.gpu == 4

    role = train(j="1x1", h="gpu.small", env={"NCCL_DEBUG": "INFO"}).roles[0]
    assert role.env["NCCL_DEBUG"] == "INFO"  # user wins; gpu detected from named resource
    assert "OMP_NUM_THREADS" not in role.env


def test_cli_arg_parsing_strips_separator_and_keeps_overrides(train):
    # the same argparse path `torchx run ... train <args>` uses
    app = materialize_appdef(
        train, ["-j", "2x3", "--max_retries", "1", "--env", "A=1,B=2", "--", *OVERRIDES]
    )
    argv = _torchrun_argv(app)
    assert _script_args(argv) == OVERRIDES
    assert (_opt(argv, "--nnodes"), _opt(argv, "--nproc_per_node")) == ("2", "3")
    assert app.roles[0].max_retries == 1
    assert app.roles[0].env["A"] == "1" and app.roles[0].env["B"] == "2"


# --- (d) bad -j --------------------------------------------------------------


@pytest.mark.parametrize("bad", ["2by3", "2X3", "2", "x2", "2x", "0x2", "2x0", "3:2x1", " 1x2", ""])
def test_bad_j_raises_clear_value_error(train, bad):
    with pytest.raises(ValueError, match=r"argument `j`.*-j 1x2"):
        train(*OVERRIDES, j=bad)


# --- (c) real torchx CLI dryrun ----------------------------------------------


def _torchx_dryrun(args: List[str], tmp_path: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    env["HOME"] = str(tmp_path)  # no user-level ~/.torchxconfig
    for key in ("TORCHXCONFIG", "LOGLEVEL"):
        env.pop(key, None)
    return subprocess.run(
        [str(TORCHX_BIN), *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=120
    )


def _scheduler_request(stdout: str) -> Dict:
    assert "=== SCHEDULER REQUEST ===" in stdout, stdout
    return ast.literal_eval(stdout.split("=== SCHEDULER REQUEST ===", 1)[1].strip())


def test_torchx_cli_dryrun_local_cwd_1x2(tmp_path):
    proc = _torchx_dryrun(
        ["run", "--dryrun", "-s", "local_cwd", "launch/components.py:train",
         "-j", "1x2", "--", "trainer.max_steps=3"],
        tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    req = _scheduler_request(proc.stdout)
    app_id = req["app_id"]
    assert re.fullmatch(r"slipstream-\w+", app_id)
    (replica,) = req["role_params"]["train"]
    assert replica["args"][:2] == ["bash", "-c"]
    assert shlex.split(replica["args"][2]) == [
        "torchrun", "--rdzv_backend", "c10d", "--rdzv_endpoint", "localhost:0",
        "--rdzv_id", app_id, "--nnodes", "1", "--nproc_per_node", "2",
        "--tee", "3", "--role", "", "-m", "slipstream_rec.train", "trainer.max_steps=3",
    ]
    assert replica["cwd"] == str(REPO)
    assert replica["env"]["OMP_NUM_THREADS"] == "1"
    assert replica["env"]["LOGLEVEL"] == "WARNING"


def test_torchx_cli_default_component_from_torchxconfig_2x1(tmp_path):
    # no component and no -s: both must come from .torchxconfig [cli:run]
    proc = _torchx_dryrun(
        ["run", "--dryrun", "--", "-j", "2x1", "--", "trainer.max_steps=3", "sharding=row_wise"],
        tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    req = _scheduler_request(proc.stdout)
    replicas = req["role_params"]["train"]
    assert len(replicas) == 2
    for replica in replicas:
        assert replica["env"]["TORCHX_JOB_ID"].startswith("local_cwd://")
        argv = shlex.split(replica["args"][2])
        assert _opt(argv, "--nnodes") == "2" and _opt(argv, "--nproc_per_node") == "1"
        # local_cwd resolves the rank0 macro to TORCHX_RANK0_HOST=localhost
        assert _opt(argv, "--rdzv_endpoint") == "${TORCHX_RANK0_HOST:=localhost}:29500"
        assert replica["env"]["TORCHX_RANK0_HOST"] == "localhost"
        assert _script_args(argv) == ["trainer.max_steps=3", "sharding=row_wise"]


def test_torchx_cli_bad_j_fails_with_message(tmp_path):
    proc = _torchx_dryrun(
        ["run", "--dryrun", "-s", "local_cwd", "launch/components.py:train", "-j", "2by3"],
        tmp_path,
    )
    assert proc.returncode != 0
    assert "ValueError: invalid value for argument `j`: '2by3'" in proc.stderr


# --- .torchxconfig -----------------------------------------------------------


def test_torchxconfig_cli_run_defaults_and_valid_runopts():
    parser = configparser.ConfigParser()
    parser.read(TORCHXCONFIG)
    assert parser.get("cli:run", "component") == "launch/components.py:train"
    assert parser.get("cli:run", "scheduler") == "local_cwd"
    component_file, fn_name = parser.get("cli:run", "component").split(":")
    assert (REPO / component_file).is_file() and fn_name == "train"

    # every scheduler section, including its commented-out `# key = value` examples,
    # must only use real runopts of that scheduler in torchx 0.7
    factories = get_scheduler_factories()
    sections = ["local_cwd", "local_docker", "kubernetes", "slurm"]
    assert all(parser.has_section(s) for s in sections)
    text = TORCHXCONFIG.read_text()
    for section in sections:
        body = text.split(f"[{section}]", 1)[1].split("\n[", 1)[0]
        keys = re.findall(r"^#?\s*([\w-]+)\s*=", body, flags=re.M)
        assert keys, section
        valid = {name for name, _ in factories[section]("test").run_opts()}
        assert set(keys) <= valid, (section, set(keys) - valid)
    assert re.search(r"^#\s*queue\s*=", text, flags=re.M)
    assert re.search(r"^#\s*partition\s*=", text, flags=re.M)
    assert re.search(r"^#\s*time\s*=", text, flags=re.M)


def test_every_job_gets_the_launchers_gloo_interface(train, monkeypatch):
    # a GPU job's gloo side group and a CPU job's gloo both bind to this interface
    monkeypatch.setenv("GLOO_SOCKET_IFNAME", "ib0")
    monkeypatch.setenv("TP_SOCKET_IFNAME", "ib0")
    for kwargs in ({"j": "2x2"}, {"j": "2x1", "gpu": 8}):
        role = train(**kwargs).roles[0]
        assert role.env["GLOO_SOCKET_IFNAME"] == "ib0" and role.env["TP_SOCKET_IFNAME"] == "ib0", kwargs
