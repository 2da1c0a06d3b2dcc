"""The step-time model (benchmarks/step_model.py) on hand-worked cases: what each phase adds, how a
token bucket and the pipeline's overlap discount it, how a measured run's bytes scale to other
fabrics, and that the compute set from a published share gives that share back."""

from __future__ import annotations

import json

import pytest

from benchmarks import netns
from benchmarks.step_model import (
    Fabric, Phase, Workload, check, exposed_seconds, main, predict, run_phases, step_seconds,
)  # fmt: skip

MB = 1e6
LINK = Fabric("test", nodes=2, ranks_per_node=1, cross_bytes_per_s=1e9, intra_bytes_per_s=float("inf"),
              latency_s=10e-6)  # fmt: skip


def test_each_phase_adds_its_bytes_over_the_link_and_a_latency_per_collective():
    # forward: one all-to-all of 2 MB at 1 GB/s
    assert exposed_seconds("forward", Phase(cross=2 * MB), LINK, 0.05) == pytest.approx(2e-3 + 10e-6)
    # backward: the gradients' all-to-all and DDP's all-reduce, two collectives
    assert exposed_seconds("backward", Phase(cross=1 * MB), LINK, 0.05) == pytest.approx(1e-3 + 20e-6)
    # the ids travel behind the step's compute: only what outlasts it shows
    assert exposed_seconds("input", Phase(cross=2 * MB), LINK, 1.5e-3) == pytest.approx(0.51e-3)
    assert exposed_seconds("input", Phase(cross=2 * MB), LINK, 5e-3) == 0.0
    # serve every 10 steps: its occurrence's time spread over them
    assert exposed_seconds("serve", Phase(cross=5 * MB, every=10), LINK, 0.0) == pytest.approx((5e-3 + 20e-6) / 10)
    assert exposed_seconds("forward", Phase(), LINK, 0.0) == 0.0  # nothing sent, no latency


def test_a_token_bucket_sends_what_it_refilled_free_and_nvlink_runs_beside_the_nic():
    bucket = Fabric("tbf", 2, 1, 1e9, float("inf"), 0.0, burst_bytes=0.5 * MB)
    # 10 ms of compute refill far more than the bucket holds: its 0.5 MB go free
    assert exposed_seconds("forward", Phase(cross=2 * MB), bucket, 0.01) == pytest.approx(1.5e-3)
    assert exposed_seconds("forward", Phase(cross=0.4 * MB), bucket, 0.01) == 0.0
    # 0.4 ms of compute, half of it before this phase: 0.2 MB refilled
    assert exposed_seconds("forward", Phase(cross=2 * MB), bucket, 0.4e-3) == pytest.approx(1.8e-3)
    node = Fabric("node", 2, 8, 1e9, 100e9, 0.0)
    # the longer of the two: 1 ms across, 0.5 ms within
    assert exposed_seconds("forward", Phase(intra=50 * MB, cross=1 * MB), node, 0.0) == pytest.approx(1e-3)
    parts = step_seconds(0.02, {"forward": Phase(cross=2 * MB), "backward": Phase(cross=1 * MB)}, LINK)
    assert parts["total"] == pytest.approx(0.02 + 2.01e-3 + 1.02e-3)
    assert parts["input"] == parts["serve"] == parts["control"] == parts["link_bound"] == 0.0


def test_no_step_is_shorter_than_its_bytes_at_the_link_s_rate():
    # 5 MB of ids hidden behind 2 ms of compute would take 5 ms on the wire: the link sets the step
    phases = {"input": Phase(cross=5 * MB), "forward": Phase(cross=1 * MB)}
    parts = step_seconds(2e-3, phases, LINK)
    assert parts["input"] == pytest.approx(5.01e-3 - 2e-3)
    assert parts["total"] == pytest.approx(max(2e-3 + 3.01e-3 + 1.01e-3, 6e-3))
    # serve's bytes count at their occurrence rate
    sparse = step_seconds(0.05, {"serve": Phase(cross=100 * MB, every=10)}, LINK)
    assert sparse["total"] == pytest.approx(0.05 + (0.1 + 20e-6) / 10)
    dense = step_seconds(0.0, {"serve": Phase(cross=100 * MB, every=10)}, LINK)
    assert dense["total"] == pytest.approx(0.01 + 2e-6) and dense["link_bound"] == pytest.approx(0.0)


def test_the_emulated_link_s_bucket_is_the_one_netns_gives_tc():
    # 10 ms of the rate, at least 256 KiB
    assert netns.tbf_burst_bytes(200e6) == 256 * 1024
    assert netns.tbf_burst_bytes(1e9) == 1_250_000


def _run(job, rate, train_s, off, replica=None, wire=1.0):
    return {"job": job, "rate": rate, "seed": 0, "train_seconds": train_s, "steps": 100, "world_size": 2,
            "samples_trained": 100 * 2 * 1000, "program_off_rank_bytes_per_sample": off,
            "program_bytes_per_sample": {k: 2 * v for k, v in off.items()}, "replica": replica,
            "wire_train": {"wire_over_program": wire}}  # fmt: skip


OFF = {"input": 100.0, "output": 1000.0, "gradient": 500.0, "dense": 300.0, "data_parallel": 0.0, "control": 0.0}


def test_a_run_s_phases_are_its_off_rank_bytes_per_rank_with_its_headers():
    serve = dict(OFF, push=40.0, replica=60.0)
    phases = run_phases(_run("serve", "200mbit", 5.0, serve, replica={"pushes": 10}, wire=1.02))
    # 1000 samples per rank per step, times the run's wire / program ratio
    assert phases["forward"].cross == pytest.approx(1000.0 * 1000 * 1.02)
    assert phases["backward"].cross == pytest.approx((500 + 300) * 1000 * 1.02)
    assert phases["input"].cross == pytest.approx(100 * 1000 * 1.02)
    # 100 steps, 10 pushes: every 10 steps, 10 steps' bytes each time
    assert phases["serve"].every == 10 and phases["serve"].cross == pytest.approx(100 * 1000 * 1.02 * 10)


def test_check_predicts_a_shaped_run_from_its_unshaped_twin():
    runs = [_run("off", "none", 2.0, OFF), _run("off", "200mbit", 3.0, OFF),
            dict(_run("off", "none", 9.0, OFF), file="another configuration")]  # not its twin
    (row,) = check(runs, nodes=2)
    # compute 20 ms; 200 Mbit/s = 25 MB/s; the bucket (256 KiB) refills by 25 MB/s x 10 ms =
    # 250 kB before each waited-for phase; the ids hide behind the compute
    rate, credit = 25e6, min(256 * 1024, 25e6 * 0.01)
    forward = (1000 * 1000 - credit) / rate
    backward = (800 * 1000 - credit) / rate
    phased = 0.02 + forward + backward
    wire = (100 + 1000 + 800) * 1000 / rate  # every byte of the step at the link's rate
    assert wire > phased  # here the link sets the step
    assert row["predicted_ms"] == pytest.approx(wire * 1e3, abs=0.01)
    assert row["phases_ms"]["link_bound"] == pytest.approx((wire - phased) * 1e3, abs=0.01)
    assert row["measured_ms"] == 30.0 and row["unshaped_ms"] == 20.0
    assert row["error"] == pytest.approx(row["predicted_ms"] / 30.0 - 1, abs=1e-4)


def test_a_workload_scales_its_bytes_to_another_fabric():
    run = _run("off", "1gbit", 3.0, OFF)
    run["row_wise_bytes_per_sample"] = {"output/row_wise": 400.0}
    w = Workload.from_run(run)
    # the row-wise output was counted for both ranks' samples: one rank's share at scale
    assert w.a2a_per_sample["output"] == pytest.approx(2000.0 - 400.0 * 0.5)
    # the ring's buffer: off-rank dense 300 B/sample x 1000 samples, sent 2(W-1)/W = once on 2 ranks
    assert w.all_reduce_bytes == pytest.approx(300.0 * 1000)
    fab = Fabric("2 x 8", 2, 8, 1e9, 100e9, 0.0)
    p = w.phases(fab)
    x = w.a2a_per_sample["output"] * 1000  # one rank's buffer per step
    assert p["forward"].intra == pytest.approx(x * 7 / 16) and p["forward"].cross == pytest.approx(x * 8 / 16)
    g = w.a2a_per_sample["gradient"] * 1000
    assert p["backward"].intra == pytest.approx(g * 7 / 16 + 300e3 * 2 * 7 / 8)
    assert p["backward"].cross == pytest.approx(g * 8 / 16 + 300e3 * 2 * (1 / 2) / 8)
    q = Workload.from_run(run, name="off+qcomms", qcomms=True)
    assert q.a2a_per_sample["output"] == w.a2a_per_sample["output"] / 2
    assert q.a2a_per_sample["input"] == w.a2a_per_sample["input"]  # ids are not quantized
    assert q.all_reduce_bytes == w.all_reduce_bytes / 2


def test_serve_s_sync_grows_with_the_ranks_it_leaves_for():
    run = _run("serve", "1gbit", 3.0, dict(OFF, push=40.0, replica=60.0), replica={"pushes": 10})
    w = Workload.from_run(run)
    assert w.serve_every == 10 and w.serve_off_rank == pytest.approx(100 * 1000 * 10)
    p = w.phases(Fabric("16 x 8", 16, 8, 1e9, 100e9, 0.0))["serve"]
    out = w.serve_off_rank * (127 / 128) / (1 / 2)
    assert p.intra + p.cross == pytest.approx(out) and p.cross == pytest.approx(out * 120 / 127)


def test_the_compute_set_from_a_published_share_gives_the_share_back():
    off = Workload("off", 1000, {"input": 100, "output": 1000, "gradient": 500}, 300e3, 0.0, 1, 2)
    lean = Workload("lean", 1000, {"input": 50, "output": 250, "gradient": 125}, 300e3, 0.0, 1, 2)
    fab = Fabric("2 nodes x 8 GPUs, one 100 GbE NIC per node", 2, 8, 12e9 / 8, 370e9, 50e-6)
    rows = {r["job"]: r for r in predict([off, lean], [fab], "off")}
    assert rows["off"]["published_share"] == 0.60
    assert rows["off"]["comm_ms"] / rows["off"]["step_ms"] == pytest.approx(0.60, abs=1e-4)
    assert rows["off"]["speedup_vs_off"] == 1.0
    assert rows["lean"]["compute_ms"] == rows["off"]["compute_ms"]
    assert rows["lean"]["speedup_vs_off"] == pytest.approx(rows["off"]["step_ms"] / rows["lean"]["step_ms"], abs=1e-3)
    assert rows["lean"]["speedup_vs_off"] > 1


def test_results_without_counts_are_refused_in_one_line(tmp_path, capsys):
    path = tmp_path / "old.json"
    path.write_text(json.dumps({"runs": [{"job": "off", "rate": "none"}]}))
    assert main(["check", str(path)]) == 2
    assert len(capsys.readouterr().err.strip().splitlines()) == 1
