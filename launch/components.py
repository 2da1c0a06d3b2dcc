"""TorchX component for launching the slipstream_rec DLRM trainer.

A thin layer over ``torchx.components.dist.ddp``: it pins the entry point to
``python -m slipstream_rec.train`` (via torchrun), forwards Hydra overrides
unchanged as script args and fills in a few environment defaults.

Usage (from the repo root, where ``.torchxconfig`` selects this component and
the ``local_cwd`` scheduler)::

    torchx run launch/components.py:train -j 1x2 -- trainer.max_steps=100 sharding=row_wise
    torchx run -s local_cwd --dryrun launch/components.py:train -j 2x1 -- trainer.max_steps=3

Beyond one machine (README "Run on a cluster"): ``-s local_docker`` / ``-s kubernetes`` run the
images docker/ builds (``--image``; default ``slipstream_rec:gpu`` for GPU jobs, else
``slipstream_rec:cpu``), ``-s slurm`` runs in the current directory on the allocated nodes::

    torchx run --workspace "" -s kubernetes -cfg queue=default launch/components.py:train \
        -j 2x8 --gpu 8 --cpu 64 --memMB 480000 --image <registry>/slipstream_rec:gpu -- trainer.max_steps=1000
    torchx run --workspace "" -s slurm -cfg partition=gpu,time=2:00:00 launch/components.py:train \
        -j 2x8 --gpu 8 --cpu 64 --memMB 480000 -- trainer.max_steps=1000

NOTE: torchx loads this file by ``exec``-ing it inside the globals of
``torchx.specs.finder`` (not as a normal module), so ``__file__`` is NOT this
file and module-level names must not shadow finder's (``validate``, ``logger``,
...). Hence the ``_SLIPSTREAM_`` prefix on every module-level helper, and no
``from __future__ import annotations`` (torchx needs real annotation types).
"""

import os
import re
from typing import Dict, List, Optional

import torchx.specs as specs
from torchx.components.dist import ddp as _slipstream_ddp

_SLIPSTREAM_MODULE = "slipstream_rec.train"
# the tags `docker build -f docker/Dockerfile[.cpu]` gives in the README
_SLIPSTREAM_IMAGE_GPU = "slipstream_rec:gpu"
_SLIPSTREAM_IMAGE_CPU = "slipstream_rec:cpu"

# [{min_nnodes}:]{nnodes}x{nproc_per_node}
_SLIPSTREAM_J_RE = re.compile(r"^(?:(\d+):)?(\d+)x(\d+)$")


def _slipstream_check_j(j: str) -> None:
    """Raises ValueError unless ``j`` is ``NxM`` or ``MIN:MAXxM`` with sane values."""
    fix = (
        "Use -j {nnodes}x{nproc_per_node}, e.g. `-j 1x2` (1 node, 2 processes) or "
        "`-j 2x4` (2 nodes x 4 processes); for elastic jobs "
        "-j {min_nnodes}:{max_nnodes}x{nproc_per_node}, e.g. `-j 1:4x8`."
    )
    match = _SLIPSTREAM_J_RE.match(j) if isinstance(j, str) else None
    if match is None:
        raise ValueError(f"invalid value for argument `j`: {j!r}. {fix}")
    min_nodes_s, nnodes_s, nproc_s = match.groups()
    nnodes, nproc = int(nnodes_s), int(nproc_s)
    min_nodes = int(min_nodes_s) if min_nodes_s is not None else nnodes
    if nnodes < 1 or nproc < 1 or min_nodes < 1:
        raise ValueError(
            f"invalid value for argument `j`: {j!r} (node and process counts must be >= 1). {fix}"
        )
    if min_nodes > nnodes:
        raise ValueError(
            f"invalid value for argument `j`: {j!r} (min_nnodes {min_nodes} > max_nnodes {nnodes}). {fix}"
        )


_GLOO_IFNAME_VARS = ("GLOO_SOCKET_IFNAME", "TP_SOCKET_IFNAME")


def _slipstream_default_env(
    env: Optional[Dict[str, str]], uses_gpu: bool
) -> Dict[str, str]:
    """Job env = defaults overlaid by the user's ``env`` (user always wins)."""
    merged: Dict[str, str] = {
        # torchelastic agent log level (INFO dumps the worker spec and rendezvous details);
        # honour the launcher's $LOGLEVEL like dist.ddp does
        "LOGLEVEL": os.environ.get("LOGLEVEL", "WARNING"),
    }
    # Every job has gloo collectives (a GPU job's side group for host tensors too): forward the
    # launcher's choice of their network interface (on a multi-homed node the default one may
    # be unreachable from the other nodes).
    merged.update({k: v for k, v in os.environ.items() if k in _GLOO_IFNAME_VARS})
    if uses_gpu:
        # forward the launcher's NCCL_* knobs (e.g. NCCL_SOCKET_IFNAME, NCCL_IB_DISABLE)
        merged.update({k: v for k, v in os.environ.items() if k.startswith("NCCL_")})
        merged.setdefault("NCCL_DEBUG", "WARN")
    else:
        # N CPU ranks per host each spawning #cores OpenMP threads oversubscribe the host
        merged["OMP_NUM_THREADS"] = "1"
    # A fresh rendezvous store per restart attempt: torchrun's shared store keeps the dead
    # attempt's keys, which a restarted attempt would read (pytorch/pytorch#135712)
    merged["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] = "1"
    merged.update(env or {})
    return merged


def train(
    *script_args: str,
    j: str = "1x2",
    image: str = "",
    cpu: int = 4,
    gpu: int = 0,
    memMB: int = 8192,
    h: Optional[str] = None,
    env: Optional[Dict[str, str]] = None,
    max_retries: int = 0,
    rdzv_port: int = 29500,
    rdzv_backend: str = "c10d",
    mounts: Optional[List[str]] = None,
    name: str = "slipstream",
    debug: bool = False,
) -> specs.AppDef:
    """
    Launches the slipstream_rec DLRM trainer (``torchrun ... -m slipstream_rec.train <overrides>``).

    Every process reads RANK/WORLD_SIZE/LOCAL_RANK/TORCHELASTIC_RUN_ID from torchrun and all ranks
    write into ``trainer.run_dir`` (default ``runs/<TORCHELASTIC_RUN_ID>``, which torchx sets to the app id).
    Pass Hydra overrides after ``--``, e.g.
    ``torchx run launch/components.py:train -j 2x4 -- trainer.max_steps=100 sharding=row_wise slipstream=off``.

    Args:
        script_args: Hydra overrides passed unchanged to slipstream_rec.train (e.g. trainer.max_steps=100 sharding=row_wise)
        j: {nnodes}x{nproc_per_node} (e.g. 1x2, 2x4), or {min_nnodes}:{max_nnodes}x{nproc_per_node} for elastic jobs
        image: container image for local_docker/kubernetes (default: slipstream_rec:gpu for GPU jobs, else slipstream_rec:cpu,
            the tags docker/ builds); ignored by local_cwd and slurm, which run in the current directory
        cpu: number of cpus per node (replica); ignored if h is set
        gpu: number of gpus per node (replica); ignored if h is set. gpu > 0 switches the env defaults to NCCL ones
        memMB: cpu memory in MB per node (replica); ignored if h is set
        h: a registered named resource (e.g. aws_p4d.24xlarge); takes precedence over cpu, gpu and memMB
        env: environment variables for the job (e.g. LOGLEVEL=DEBUG,NCCL_DEBUG=INFO); these override the defaults
            (LOGLEVEL=$LOGLEVEL or WARNING; the launcher's GLOO_SOCKET_IFNAME / TP_SOCKET_IFNAME; CPU jobs OMP_NUM_THREADS=1; GPU jobs the launcher's NCCL_* vars and NCCL_DEBUG=WARN)
        max_retries: restarts after a failure: torchrun restarts the worker group in place (--max_restarts), and
            schedulers that retry whole jobs (Kubernetes, Slurm) get the same count; the restarted workers
            resume from the run's newest checkpoint
        rdzv_port: port on rank0's host for the c10d rendezvous store; only used for multi-node jobs
            (single-node jobs use localhost:0, i.e. a random free port)
        rdzv_backend: torchrun rendezvous backend (c10d, static, etcd, ...); only used for multi-node jobs
        mounts: mounts for docker/kubernetes runs (e.g. type=bind,src=/host/data,dst=/data[,readonly])
        name: job name as {experimentname}/{runname}, {experimentname}/, /{runname} or {runname}
        debug: whether to run with torchx's preset PyTorch debug env flags enabled
    """
    _slipstream_check_j(j)
    uses_gpu = specs.resource(cpu=cpu, gpu=gpu, memMB=memMB, h=h).gpu > 0
    if not image:
        image = _SLIPSTREAM_IMAGE_GPU if uses_gpu else _SLIPSTREAM_IMAGE_CPU
    app = _slipstream_ddp(
        *script_args,
        m=_SLIPSTREAM_MODULE,
        image=image,
        name=name,
        h=h,
        cpu=cpu,
        gpu=gpu,
        memMB=memMB,
        j=j,
        env=_slipstream_default_env(env, uses_gpu),
        max_retries=max_retries,
        rdzv_port=rdzv_port,
        rdzv_backend=rdzv_backend,
        mounts=mounts,
        debug=debug,
    )
    if max_retries > 0:
        # torchrun restarts the worker group in place (every scheduler, local_cwd included); the
        # restarted workers resume from the run's newest checkpoint (trainer.resume=auto).
        role = app.roles[0]
        role.args = [a.replace("torchrun ", f"torchrun --max_restarts {max_retries} ", 1) for a in role.args]
    return app
