"""Slipstream's per-rank state with tables of tens of millions of rows (issue 12's target: at most
3x the hot rows' bytes plus 16 MB per rank, whatever the total rows).

2 ranks under torchrun (gloo, CPU): a DLRM with ``--big-tables`` tables of ``--rows`` rows each
(row_wise: half of each table per rank) beside ``--small-tables`` small ones, trained on
power-law ids generated on the fly (no dataset: the tables are larger than any table the built-in
datasets have) with policy ``track_only``: counting, hot selection, snapshots, thresholds,
classification, nothing skipped. Every rank reports its peak Slipstream state
(``slipstream/stats.py`` ``peak_state_bytes``: counts, hot keys and rows, snapshots, published
changes with their lookup view, snapshot copies and gathers), the hot rows' bytes and the
samples/s; rank 0 writes them to ``--out``.

    .venv/bin/python benchmarks/slipstream_state_scale.py [--rows 32000000] [--steps 100]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


def _ids(gen, rows: int, n: int):
    """Power-law ids: P(id < x) = log(x + 1) / log(rows + 1) (Zipf-like, exponent about 1)."""
    import torch

    u = torch.rand(n, generator=gen, dtype=torch.float64)
    return (torch.exp(u * torch.log(torch.tensor(rows + 1.0, dtype=torch.float64))) - 1).long().clamp_(0, rows - 1)


def worker(args: argparse.Namespace) -> None:
    import warnings

    import torch

    warnings.filterwarnings("ignore")
    from slipstream_rec.data.types import Batch, make_kjt
    from slipstream_rec.distributed import all_gather_objects, close_distributed, init_distributed
    from slipstream_rec.model.config import ModelConfig
    from slipstream_rec.model.dlrm import build_model, embedding_bag_configs
    from slipstream_rec.optim import EmbeddingOptimConfig, fuse_embedding_optimizer
    from slipstream_rec.sharding.config import ShardingConfig, ShardingKind
    from slipstream_rec.sharding.plan import shard_model
    from slipstream_rec.slipstream.config import Policy, SlipstreamConfig
    from slipstream_rec.slipstream import stats
    from slipstream_rec.slipstream.controller import SlipstreamController

    env = init_distributed("cpu", timeout_s=600)
    torch.manual_seed(env.rank)
    feats = [f"big{i}" for i in range(args.big_tables)] + [f"small{i}" for i in range(args.small_tables)]
    rows = [args.rows] * args.big_tables + [1000] * args.small_tables
    model_cfg = ModelConfig(embedding_dim=16, dense_arch_layer_sizes=[64, 16], over_arch_layer_sizes=[64, 1])
    t0 = time.perf_counter()
    model = build_model(model_cfg, 13, feats, rows, torch.device("cpu"))
    fuse_embedding_optimizer(model, EmbeddingOptimConfig())
    dmp = shard_model(model, ShardingConfig(type=ShardingKind.row_wise), embedding_bag_configs(model_cfg, feats, rows), torch.device("cpu"), args.batch)
    build_s = time.perf_counter() - t0
    cfg = SlipstreamConfig(
        policy=Policy.track_only, count_steps=args.count_steps, count_fraction=args.count_fraction,
        snapshot_interval=args.snapshot_interval, hot_budget_mb=args.hot_budget_mb, min_count=args.min_count,
    )  # fmt: skip
    ctl = SlipstreamController(cfg, dmp, feats, rows, args.batch, seed=0, rank=env.rank)
    gen = torch.Generator().manual_seed(100 + env.rank)

    def source():
        for _ in range(args.steps + cfg.lookahead_batches + 2):
            ids = torch.stack([_ids(gen, n, args.batch) for n in rows], 1)
            yield Batch(dense_features=torch.rand(args.batch, 13, generator=gen), sparse_features=make_kjt(feats, ids), labels=(torch.rand(args.batch, generator=gen) < 0.25).float())

    stream = ctl.wrap(source(), lockstep_every=args.lockstep_every)
    records = []
    t0 = time.perf_counter()
    for step in range(1, args.steps + 1):
        loss, _ = dmp(next(stream))
        loss.backward()
        record = dict(ctl.on_step_end(step)).get("slipstream")
        if record is not None:
            records.append({k: record.get(k) for k in ("hot_rows", "stale_rows", "threshold", "state_bytes", "peak_state_bytes")} | {"step": step})
    train_s = time.perf_counter() - t0
    local_hot_rows = sum(int(u.hot_rows.numel()) for u in ctl.tracker.units if u.hot_rows is not None)
    mine = {
        "rank": env.rank,
        "peak_state_bytes": stats.peak_state_bytes(ctl),
        "state_bytes_at_end": stats.state_bytes(ctl),
        "local_hot_rows": local_hot_rows,
        "local_rows": sum(u.rows for u in ctl.tracker.units),
        "samples_per_second": args.steps * args.batch / train_s,
        "build_seconds": build_s,
    }
    everyone = all_gather_objects(mine)
    if env.rank == 0:
        sel = ctl.tracker.selection or {}
        peak = max(r["peak_state_bytes"] for r in everyone)
        out = {
            "tables": {"big": args.big_tables, "rows_each": args.rows, "small": args.small_tables, "total_rows": sum(rows)},
            "steps": args.steps, "batch_per_rank": args.batch, "world_size": env.world_size,
            "lockstep_every": args.lockstep_every,
            "hot_selection": sel,
            "ranks": everyone,
            "max_peak_state_bytes": peak,
            "bound_bytes": 3 * int(sel.get("hot_bytes", 0)) + (16 << 20),
            "within_bound": peak <= 3 * int(sel.get("hot_bytes", 0)) + (16 << 20),
            # What the dense layout before issue 12 held per rank for the same tables: a float32
            # change and a bool frozen mask per row of every table, float32 counts per local row.
            "dense_layout_bytes_per_rank": sum(rows) * 5 + max(r["local_rows"] for r in everyone) * 4,
            "records_rank0": records,
        }  # fmt: skip
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(out, indent=1))
        print(json.dumps({k: out[k] for k in ("tables", "max_peak_state_bytes", "bound_bytes", "within_bound", "dense_layout_bytes_per_rank")} | {"hot_bytes": sel.get("hot_bytes"), "hot_rows": sel.get("hot_rows"), "samples_per_second": [r["samples_per_second"] for r in everyone]}))
    close_distributed()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", type=int, default=32_000_000, help="rows of each big table")
    p.add_argument("--big-tables", type=int, default=2)
    p.add_argument("--small-tables", type=int, default=4)
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--batch", type=int, default=2048, help="samples per rank per step")
    p.add_argument("--count-steps", type=int, default=40)
    p.add_argument("--count-fraction", type=float, default=0.25)
    p.add_argument("--min-count", type=int, default=2)
    p.add_argument("--snapshot-interval", type=int, default=20)
    p.add_argument("--hot-budget-mb", type=float, default=256.0)
    p.add_argument("--lockstep-every", type=int, default=1)
    p.add_argument("--out", default=str(ROOT / "benchmarks/results/slipstream_state_scale.json"))
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        worker(args)
        return
    cmd = [str(BIN / "torchrun"), "--standalone", "--nproc_per_node", "2", __file__, "--worker", *sys.argv[1:]]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    raise SystemExit(subprocess.run(cmd, cwd=ROOT, env=env).returncode)


if __name__ == "__main__":
    main()
