"""End to end through the real entry point: `slipstream-train` under torchrun, bare, and TorchX."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from tests._fixtures import BIN, ROOT, _run, _torchrun

SUMMARY_KEYS = {
    "samples_seen",
    "samples_trained",
    "train_seconds",
    "val_auc",
    "val_logloss",
    "test_auc",
    "samples_per_second",
    "world_size",
    "sharding",
    "policy",
}


@pytest.fixture(scope="module")
def data_root(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("data")


def test_two_process_training_learns_and_writes_a_complete_run(tmp_path, data_root):
    run_dir = tmp_path / "run"
    summary = _torchrun(run_dir, data_root, "trainer.wire_interface=lo")
    assert SUMMARY_KEYS <= set(summary), SUMMARY_KEYS - set(summary)
    # Both ranks on this host: what they send each other crosses lo once, so its counter over
    # the training steps (the evaluations at steps 10 and 20 left out) is the wire, and it agrees
    # with the program's own count of what left the ranks (smoke's plan is mostly row-wise:
    # gloo's reduce-scatters send twice what an all-to-all of the same tensor would).
    wire = summary["wire"]
    assert wire["interfaces"] == ["lo"] and wire["nodes_read"] == 1 and wire["steps"] == 20
    assert 1.0 <= wire["wire_over_program"] <= 1.05, wire
    assert summary["world_size"] == 2
    assert summary["policy"] == "off"
    # smoke: 20 steps x 512 per rank x 2 ranks, nothing skipped
    assert summary["steps"] == 20
    assert summary["samples_trained"] == summary["samples_seen"] == 20 * 512 * 2
    assert summary["val_auc"] > 0.62 and summary["test_auc"] > 0.62, summary
    assert summary["samples_per_second"] > 0 and summary["train_seconds"] > 0
    # both ranks' CPU seconds in training: work was done, and no more than 2 ranks' cores could do
    assert 0 < summary["train_cpu_seconds"] <= 2 * (os.cpu_count() or 1) * summary["train_seconds"]
    # the whole validation split, gathered from both ranks
    assert summary["eval_history"][-1]["num_samples"] == 8000
    parts = summary["time_breakdown_rank0"]
    assert parts["total"] == pytest.approx(summary["train_seconds"], abs=0.01)
    assert min(parts.values()) >= 0
    assert all(parts[k] > 0 for k in ("data", "input_all_to_all", "forward", "backward", "optimizer"))
    assert sum(v for k, v in parts.items() if k != "total") == pytest.approx(parts["total"], abs=0.01)

    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    kinds = {r["kind"] for r in records}
    assert {"train", "eval"} <= kinds
    evals = [r for r in records if r["kind"] == "eval" and r["split"] == "val"]
    assert [r["step"] for r in evals] == [10, 20]
    assert list((run_dir / "tensorboard").glob("events.out.tfevents.*"))
    assert "batch_size: 512" in (run_dir / "config.yaml").read_text()  # the resolved config


@pytest.mark.parametrize("policy", ["off", "serve"])
def test_periodic_evaluation_does_not_change_training(tmp_path, data_root, policy):
    # Pausing TorchRec's pipeline for evaluation must not disturb the batches in flight: the same
    # run with and without evaluations every 7 steps ends with bit-identical predictions. Under
    # serve the batches after an evaluation are compacted (variable-batch) ones, whose row-wise
    # output dists need the sizes the pipeline's fresh context after an evaluation lacks.
    common = ("sharding=row_wise", f"slipstream={policy}", "slipstream.serve_when=always")
    if policy == "serve":  # a stale set after the first few steps, so that most steps serve
        common += ("slipstream.count_steps=4", "slipstream.snapshot_interval=2", "slipstream.min_count=1", "slipstream.replica_sync_steps=2")
    a = _torchrun(tmp_path / "a", data_root, *common, "trainer.eval_every_steps=0")
    b = _torchrun(tmp_path / "b", data_root, *common, "trainer.eval_every_steps=7")
    assert len(b["eval_history"]) > len(a["eval_history"])
    assert a["val_logloss"] == b["val_logloss"] and a["test_auc"] == b["test_auc"]
    assert a["sharding_plan"] == b["sharding_plan"] and set(a["sharding_plan"].values()) == {"row_wise"}
    if policy == "serve":
        assert a["slots_fraction"] == b["slots_fraction"] < 0.9, "compacted batches, before and after the evaluations"


def test_every_epoch_is_trained_with_either_pipeline(tmp_path, data_root):
    # smoke: 40,000 rows / 2 ranks / 512 = 39 steps per epoch
    for pipeline in ("sparse_dist", "base"):
        summary = _torchrun(
            tmp_path / pipeline, data_root, "trainer.max_steps=0", "trainer.epochs=2",
            "trainer.eval_every_steps=0", f"trainer.pipeline={pipeline}",
        )  # fmt: skip
        assert summary["epochs"] == 2 and summary["steps"] == 2 * 39, (pipeline, summary["steps"])


def test_bare_single_process_run(tmp_path, data_root):
    run_dir = tmp_path / "run"
    _run(
        [
            sys.executable, "-m", "slipstream_rec.train", "experiment=smoke",
            f"data.root={data_root}", f"trainer.run_dir={run_dir}", "trainer.progress_bar=false",
            "trainer.max_steps=10",
        ]
    )
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["world_size"] == 1 and summary["samples_trained"] == 10 * 512


def test_torchx_local_cwd_runs_two_ranks_into_one_run_dir(tmp_path, data_root):
    run_dir = tmp_path / "run"
    result = _run(
        [
            str(BIN / "torchx"), "run", "-s", "local_cwd", "launch/components.py:train", "-j", "1x2",
            "--", "experiment=smoke", f"data.root={data_root}", f"trainer.run_dir={run_dir}",
            "trainer.progress_bar=false", "trainer.max_steps=6",
        ]
    )
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["world_size"] == 2 and summary["samples_trained"] == 6 * 512 * 2, result.stdout
    assert not list(ROOT.glob("outputs")), "Hydra must not create outputs/ in the working directory"
