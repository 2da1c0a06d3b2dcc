"""What several test modules share: the 2-rank batch and model of the sharding tests, runs of the
real entry point, small datasets on disk, and the inputs of FBGEMM's VBE metadata.

Test modules import their shared helpers from here (or from another underscore module next to
them), never from another test module: importing a test module runs it and binds its tests to
the importer's (tests/test_imports.py checks). TorchRec and the model are imported inside the
functions that need them, so that the subprocesses and spawned ranks that import this stay cheap.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import List

import numpy as np
import torch

from slipstream_rec.data.config import SyntheticConfig
from slipstream_rec.data.generated.synthetic import generate_dataset

ROOT = Path(__file__).resolve().parents[1]

# ---- the 2-rank case of the sharding tests (tests/sharding/test_equivalence.py) ---------------

WORLD = 2
LOCAL_BATCH = 8
FEATURES = ["f0", "f1", "f2", "f3"]
ROWS = [50, 64, 31, 100]
LR = 0.5


def _global_batch():
    from slipstream_rec.data.types import Batch
    from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

    g = torch.Generator().manual_seed(7)
    B = LOCAL_BATCH * WORLD
    # Multi-hot bags with lengths 0..3 exercise pooling and empty bags on every sharding type.
    lengths = torch.randint(0, 4, (len(FEATURES), B), generator=g)
    values = [torch.randint(0, rows, (int(lengths[f].sum()),), generator=g) for f, rows in enumerate(ROWS)]
    dense = torch.randn(B, 13, generator=g)
    labels = torch.randint(0, 2, (B,), generator=g).float()
    return dense, lengths, values, labels, Batch, KeyedJaggedTensor


def _slice_batch(lo: int, hi: int):
    dense, lengths, values, labels, Batch, KJT = _global_batch()
    vals, lens = [], []
    for f in range(len(FEATURES)):
        offsets = torch.cat([torch.zeros(1, dtype=torch.long), lengths[f].cumsum(0)])
        vals.append(values[f][offsets[lo] : offsets[hi]])
        lens.append(lengths[f][lo:hi])
    kjt = KJT(keys=FEATURES, values=torch.cat(vals), lengths=torch.cat(lens).int(), stride=hi - lo)
    return Batch(dense_features=dense[lo:hi], sparse_features=kjt, labels=labels[lo:hi])


def reference_and_rank_model(rank: int):
    """The small DLRM of these tests: (config, the unsharded reference and its full state dict,
    identical on every rank, and this rank's unsharded model, initialised differently from the
    reference so that every weight of a sharded copy must come from the full state)."""
    from slipstream_rec.model.config import ModelConfig
    from slipstream_rec.model.dlrm import build_model

    cfg = ModelConfig(embedding_dim=8, dense_arch_layer_sizes=[16, 8], over_arch_layer_sizes=[16, 1])
    cpu = torch.device("cpu")
    torch.manual_seed(0)  # same reference on every rank
    ref = build_model(cfg, 13, FEATURES, ROWS, cpu, embedding_device=cpu)
    full = {k: v.detach().clone() for k, v in ref.state_dict().items()}
    torch.manual_seed(100 + rank)  # sharded init differs: every weight must come from `full`
    return cfg, ref, full, build_model(cfg, 13, FEATURES, ROWS, cpu)


# ---- the real entry point: `slipstream-train` as a user runs it (tests/test_train.py) ----------

BIN = Path(sys.executable).parent


def _env() -> dict:
    env = dict(os.environ)
    env["PATH"] = f"{BIN}{os.pathsep}{env.get('PATH', '')}"  # torchrun/torchx of this venv
    env["OMP_NUM_THREADS"] = "1"
    return env


def _run(cmd: List[str], timeout: int = 600) -> subprocess.CompletedProcess:
    result = subprocess.run(cmd, cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=timeout)
    assert result.returncode == 0, f"{' '.join(cmd)}\nstdout:\n{result.stdout[-4000:]}\nstderr:\n{result.stderr[-4000:]}"
    return result


def _torchrun(run_dir: Path, data_root: Path, *overrides: str) -> dict:
    _run(
        [
            str(BIN / "torchrun"), "--standalone", "--nproc_per_node", "2",
            "-m", "slipstream_rec.train",
            "experiment=smoke", f"data.root={data_root}", f"trainer.run_dir={run_dir}",
            "trainer.progress_bar=false", *overrides,
        ]
    )
    return json.loads((run_dir / "summary.json").read_text())


# ---- small datasets on disk --------------------------------------------------------------------

CARDS = [50 + 7 * f for f in range(26)]


def write_dataset(path: Path, rows: dict[str, int]) -> Path:
    """A hand-made dataset whose dense column 0 is the global row index (to track coverage)."""
    path.mkdir(parents=True, exist_ok=True)
    for split, n in rows.items():
        idx = np.arange(n)
        dense = np.zeros((n, 13), dtype=np.float32)
        dense[:, 0] = idx
        dense[:, 1] = np.log1p(idx % 17)
        sparse = ((idx[:, None] * 31 + np.arange(26)[None, :] * 5) % np.asarray(CARDS)).astype(np.int32)
        labels = (idx % 3 == 0).astype(np.int32).reshape(n, 1)
        np.save(path / f"{split}_dense.npy", dense)
        np.save(path / f"{split}_sparse.npy", sparse)
        np.save(path / f"{split}_labels.npy", labels)
    meta = {
        "format_version": 1,
        "num_dense": 13,
        "sparse_feature_names": [f"cat_{i}" for i in range(26)],
        "dense_feature_names": [f"int_{i}" for i in range(13)],
        "num_embeddings_per_feature": CARDS,
        "rows": rows,
    }
    (path / "meta.json").write_text(json.dumps(meta))
    return path


def tiny(**overrides) -> SyntheticConfig:
    """A few thousand rows and tables of at most 2000 rows: generation takes well under 1 s."""
    base = dict(
        num_train=6000, num_val=3000, num_test=1000, cardinality_scale=0.001,
        min_cardinality=8, max_cardinality=2000,
    )  # fmt: skip
    base.update(overrides)
    return SyntheticConfig(**base)


def gen(tmp_path: Path, name: str, cfg: SyntheticConfig) -> Path:
    out = tmp_path / name
    out.mkdir()
    generate_dataset(cfg, out)
    return out


# ---- FBGEMM's VBE metadata (tests/sharding/test_vbe_cpu.py, also in a fresh interpreter) -------


def _inputs(per_rank, dims):
    """The metadata's inputs as FBGEMM's Python side builds them (generate_vbe_metadata in
    split_table_batched_embeddings_ops_training_common.py), for one TBE."""
    bs = torch.tensor(per_rank, dtype=torch.int64)
    totals = bs.sum(1)
    b_offsets = torch.cat([torch.zeros(1, dtype=torch.int64), totals.cumsum(0)]).to(torch.int32)
    sizes = bs.t() * torch.tensor(dims).view(1, -1)  # (R, T): rank-major output
    out_offsets = torch.cat([torch.zeros(1, dtype=torch.int64), sizes.flatten().cumsum(0)])
    per_feature = torch.tensor([[0] + row for row in per_rank], dtype=torch.int32).cumsum(1).to(torch.int32)
    d_offsets = torch.tensor([0] + list(dims), dtype=torch.int32).cumsum(0).to(torch.int32)
    return b_offsets, per_feature, out_offsets, d_offsets, int(totals.sum())
