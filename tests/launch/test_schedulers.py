"""launch/components.py:train on the schedulers beyond one machine: the real `torchx run --dryrun`
for kubernetes (Volcano job) and slurm (sbatch script), the local_docker request, and the typed
values of every scheduler section of .torchxconfig. Nothing is submitted."""

import configparser
import io
import logging
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Dict, List

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
COMPONENT = "launch/components.py:train"
TORCHXCONFIG = REPO / ".torchxconfig"
TORCHX_BIN = REPO / ".venv" / "bin" / "torchx"
if not TORCHX_BIN.exists():
    TORCHX_BIN = Path(sys.executable).parent / "torchx"
IMAGE = "registry.example.com/ml/slipstream_rec:gpu-abc123"
# passed through unchanged, awkward ones included
OVERRIDES = ["trainer.max_steps=1000", "sharding=row_wise", "+trainer.tag=a b", "optim.embedding.lr=0.05"]
GPU_JOB = ["-j", "2x8", "--gpu", "8", "--cpu", "32", "--memMB", "240000"]


def _torchx(args: List[str], tmp_path: Path, **extra_env: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not (k.startswith("NCCL_") or k in ("LOGLEVEL", "TORCHXCONFIG"))}
    env["HOME"] = str(tmp_path)  # no user-level ~/.torchxconfig
    env["PATH"] = f"{TORCHX_BIN.parent}{os.pathsep}{env.get('PATH', '')}"
    env.update(extra_env)
    proc = subprocess.run(
        [str(TORCHX_BIN), *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, f"torchx {' '.join(args)}\n{proc.stderr[-3000:]}"
    return proc


def _request(stdout: str) -> str:
    assert "=== SCHEDULER REQUEST ===" in stdout, stdout
    return stdout.split("=== SCHEDULER REQUEST ===", 1)[1]


def _opt(argv: List[str], name: str) -> str:
    assert argv.count(name) == 1, (name, argv)
    return argv[argv.index(name) + 1]


def _script_args(argv: List[str]) -> List[str]:
    i = argv.index("-m")
    assert argv[i + 1] == "slipstream_rec.train"
    return argv[i + 2 :]


# --- kubernetes --------------------------------------------------------------------------------


def _k8s(tmp_path: Path, job: List[str], **env: str) -> Dict:
    proc = _torchx(
        ["run", "--workspace", "", "--dryrun", "-s", "kubernetes", "-cfg", "queue=default",
         COMPONENT, *job, "--", *OVERRIDES],
        tmp_path,
        **env,
    )
    return yaml.safe_load(_request(proc.stdout))


def test_kubernetes_gpu_job_spec(tmp_path):
    job = _k8s(tmp_path, [*GPU_JOB, "--image", IMAGE], NCCL_SOCKET_IFNAME="eth0")
    assert job["apiVersion"] == "batch.volcano.sh/v1alpha1" and job["kind"] == "Job"
    assert job["spec"]["queue"] == "default" and job["spec"]["schedulerName"] == "volcano"
    tasks = job["spec"]["tasks"]
    assert [t["name"] for t in tasks] == ["train-0", "train-1"]  # -j 2x8: 2 replicas (pods)
    for i, task in enumerate(tasks):
        assert task["replicas"] == 1
        pod = task["template"]["spec"]
        (container,) = pod["containers"]
        assert container["image"] == IMAGE
        limits = container["resources"]["limits"]
        assert limits == {"cpu": "32000m", "memory": "240000M", "nvidia.com/gpu": "8"}
        assert container["resources"]["requests"]["nvidia.com/gpu"] == "8"
        env = {e["name"]: e["value"] for e in container["env"]}
        assert env["NCCL_DEBUG"] == "WARN" and env["LOGLEVEL"] == "WARNING"
        assert env["NCCL_SOCKET_IFNAME"] == "eth0"  # the launcher's NCCL_* travel with the job
        assert "OMP_NUM_THREADS" not in env
        # the container's command is the whole launch: the image has no ENTRYPOINT to prefix it
        assert container["command"][:2] == ["bash", "-c"]
        argv = shlex.split(container["command"][2])
        assert argv[0] == "torchrun"
        assert (_opt(argv, "--nnodes"), _opt(argv, "--nproc_per_node")) == ("2", "8")
        assert _opt(argv, "--rdzv_backend") == "c10d"
        assert _opt(argv, "--rdzv_id") == job["metadata"]["name"]  # -> runs/<app id>
        host_var = "TORCHX_RANK0_HOST" if i == 0 else "VC_TRAIN_0_HOSTS"  # Volcano's pod-0 DNS name
        assert _opt(argv, "--rdzv_endpoint") == f"${{{host_var}:=localhost}}:29500"
        assert _script_args(argv) == OVERRIDES
        assert {"mountPath": "/dev/shm", "name": "dshm"} in container["volumeMounts"]
        assert container["ports"] == [{"containerPort": 29500, "name": "c10d"}]


def test_kubernetes_cpu_job_uses_the_cpu_image_and_omp_default(tmp_path):
    job = _k8s(tmp_path, ["-j", "3x2", "--cpu", "4", "--memMB", "8192"])
    tasks = job["spec"]["tasks"]
    assert len(tasks) == 3
    (container,) = tasks[0]["template"]["spec"]["containers"]
    assert container["image"] == "slipstream_rec:cpu"  # the component's default for CPU jobs
    assert container["resources"]["limits"] == {"cpu": "4000m", "memory": "8192M"}
    env = {e["name"]: e["value"] for e in container["env"]}
    assert env["OMP_NUM_THREADS"] == "1" and "NCCL_DEBUG" not in env
    argv = shlex.split(container["command"][2])
    assert (_opt(argv, "--nnodes"), _opt(argv, "--nproc_per_node")) == ("3", "2")
    assert _script_args(argv) == OVERRIDES


def test_kubernetes_gpu_job_defaults_to_the_gpu_image(tmp_path):
    job = _k8s(tmp_path, ["-j", "1x4", "--gpu", "4"])
    (container,) = job["spec"]["tasks"][0]["template"]["spec"]["containers"]
    assert container["image"] == "slipstream_rec:gpu"
    argv = shlex.split(container["command"][2])
    assert _opt(argv, "--rdzv_endpoint") == "localhost:0"  # single node: a free local port


# --- slurm -------------------------------------------------------------------------------------


def _slurm(tmp_path: Path, job: List[str], cfg: str = "partition=gpu,time=1:00:00") -> str:
    proc = _torchx(
        ["run", "--workspace", "", "--dryrun", "-s", "slurm", "-cfg", cfg, COMPONENT, *job, "--", *OVERRIDES],
        tmp_path,
    )
    return _request(proc.stdout)


def _srun_groups(script: str) -> List[List[str]]:
    """The het groups of the srun line, each tokenised as the shell would."""
    lines = script.splitlines()
    start = next(i for i, ln in enumerate(lines) if ln.startswith("srun "))
    text = ""
    for ln in lines[start:]:
        text += ln.rstrip("\\").rstrip() + " "
        if not ln.endswith("\\"):
            break
    groups = [shlex.split(g) for g in re.split(r"\s:\s", text[len("srun ") :])]
    return groups


def _torchrun_of(group: List[str]) -> List[str]:
    i = group.index("bash")
    assert group[i + 1] == "-c"
    return shlex.split(group[i + 2])


def test_slurm_gpu_job_script(tmp_path):
    script = _slurm(tmp_path, GPU_JOB)
    sbatch = [ln for ln in script.splitlines() if ln.startswith("#SBATCH")]
    assert sbatch[1] == "#SBATCH hetjob"  # one het group per node (replica)
    groups = [shlex.split(ln[len("#SBATCH ") :]) for ln in sbatch if ln != "#SBATCH hetjob"]
    assert len(groups) == 2
    for i, opts in enumerate(groups):
        assert f"--job-name=train-{i}" in opts
        for want in ("--partition=gpu", "--time=1:00:00", "--ntasks-per-node=1",
                     "--cpus-per-task=32", "--mem=240000", "--gpus-per-task=8"):
            assert want in opts, (want, opts)
    srun = _srun_groups(script)
    assert len(srun) == 2
    for group in srun:
        export = next(a for a in group if a.startswith("--export="))[len("--export=") :]
        assert "ALL" in export.split(",") and "NCCL_DEBUG=WARN" in export and "LOGLEVEL=WARNING" in export
        assert "OMP_NUM_THREADS" not in export
        argv = _torchrun_of(group)
        assert argv[0] == "torchrun"
        assert (_opt(argv, "--nnodes"), _opt(argv, "--nproc_per_node")) == ("2", "8")
        assert _opt(argv, "--rdzv_endpoint") == "${SLURM_JOB_NODELIST_HET_GROUP_0:=localhost}:29500"
        assert _opt(argv, "--rdzv_id") == "$SLURM_JOB_ID"
        assert _script_args(argv) == OVERRIDES


def test_slurm_cpu_job_script(tmp_path):
    script = _slurm(tmp_path, ["-j", "2x4", "--cpu", "8", "--memMB", "16000"], cfg="partition=cpu")
    opts = shlex.split(next(ln for ln in script.splitlines() if ln.startswith("#SBATCH "))[len("#SBATCH ") :])
    assert "--cpus-per-task=8" in opts and "--mem=16000" in opts and "--partition=cpu" in opts
    assert not any(o.startswith("--gpus-per-task") for o in opts)
    for group in _srun_groups(script):
        export = next(a for a in group if a.startswith("--export="))
        assert "OMP_NUM_THREADS=1" in export and "NCCL_DEBUG" not in export
        argv = _torchrun_of(group)
        assert (_opt(argv, "--nnodes"), _opt(argv, "--nproc_per_node")) == ("2", "4")
        assert _script_args(argv) == OVERRIDES


# --- local_docker (runner API: its request holds Python objects) -------------------------------


def test_local_docker_gpu_request():
    from torchx.runner import get_runner

    with get_runner() as runner:
        info = runner.dryrun_component(
            f"{REPO / 'launch' / 'components.py'}:train",
            ["-j", "2x4", "--gpu", "4", "--cpu", "16", "--memMB", "32000", "--", *OVERRIDES],
            "local_docker",
            cfg={},
            workspace=None,
        )
    containers = info.request.containers
    assert len(containers) == 2
    for c in containers:
        assert c.image == "slipstream_rec:gpu"
        assert c.command[:2] == ["bash", "-c"]
        argv = shlex.split(c.command[2])
        assert (_opt(argv, "--nnodes"), _opt(argv, "--nproc_per_node")) == ("2", "4")
        assert _script_args(argv) == OVERRIDES
        (req,) = c.kwargs["device_requests"]
        assert req["Count"] == 4 and ["compute", "utility"] in req["Capabilities"]
        assert c.kwargs["shm_size"] == "32000m" and c.kwargs["nano_cpus"] == 16 * 10**9
        assert c.kwargs["environment"]["NCCL_DEBUG"] == "WARN"


# --- .torchxconfig -----------------------------------------------------------------------------


def test_torchxconfig_scheduler_sections_load_with_valid_types(caplog):
    """Uncomment every `# key = value` example of each scheduler section and load it the way the
    torchx CLI does: every key must be a runopt of that scheduler and every value of its type."""
    from torchx.runner.config import load
    from torchx.schedulers import get_scheduler_factories

    text = TORCHXCONFIG.read_text()
    parser = configparser.ConfigParser()
    parser.read_string(text)
    factories = get_scheduler_factories()
    for scheduler in ("local_cwd", "local_docker", "kubernetes", "slurm"):
        assert parser.has_section(scheduler)
        body = text.split(f"\n[{scheduler}]\n", 1)[1].split("\n[", 1)[0]
        examples = [ln.lstrip("#").strip() for ln in body.splitlines() if re.match(r"^#\s*[\w-]+\s*=", ln)]
        assert examples, scheduler
        ini = f"[{scheduler}]\n" + "\n".join(examples) + "\n"
        cfg: Dict = {}
        with caplog.at_level(logging.WARNING):
            load(scheduler, io.StringIO(ini), cfg)
        assert not [r for r in caplog.records if "not a runopt" in r.getMessage()], scheduler
        resolved = factories[scheduler]("test").run_opts().resolve(cfg)  # raises on a bad type
        assert set(cfg) <= set(resolved)
    # the comments show how to reach the images docker/ builds, and what kubernetes requires
    assert "--workspace" in text and "slipstream_rec:gpu" in text
    assert re.search(r"^#\s*queue\s*=", text, flags=re.M)


def _documented_torchx_commands() -> List[str]:
    # the cluster commands live in docs/cluster.md (linked from the README)
    section = (REPO / "docs" / "cluster.md").read_text()
    joined = re.sub(r"\\\n\s*", " ", section)  # shell line continuations
    cmds = [ln.strip() for ln in joined.splitlines() if ln.strip().startswith("torchx run")]
    cmds += re.findall(r"`(torchx run [^`]+)`", re.sub(r"\s*\n\s*", " ", section))
    return cmds


@pytest.mark.parametrize("scheduler", ["kubernetes", "slurm", "local_docker"])
def test_documented_cluster_commands_dry_run(scheduler, tmp_path):
    """The exact `torchx run` commands of README "Run on a cluster", with --dryrun added."""
    cmds = [c for c in _documented_torchx_commands() if f"-s {scheduler} " in c]
    assert cmds, f"README has no `torchx run -s {scheduler}` command"
    for cmd in cmds:
        argv = shlex.split(cmd.replace("$IMAGE", IMAGE))
        assert argv[:2] == ["torchx", "run"]
        proc = _torchx(["run", "--dryrun", *argv[2:]], tmp_path)
        request = _request(proc.stdout)
        if scheduler == "kubernetes":
            job = yaml.safe_load(request)
            (container,) = job["spec"]["tasks"][0]["template"]["spec"]["containers"]
            assert container["image"] == IMAGE
            claims = [v for v in job["spec"]["tasks"][0]["template"]["spec"]["volumes"] if "persistentVolumeClaim" in v]
            assert claims and {"mountPath": "/app/runs", "name": claims[0]["name"]} in [
                {k: m[k] for k in ("mountPath", "name")} for m in container["volumeMounts"]
            ]
        argv_tail = argv[argv.index("--") + 1 :]
        assert " ".join(argv_tail) in request  # the overrides reach the command unchanged
