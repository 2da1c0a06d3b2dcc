"""End to end through torchrun, 2 ranks: the replica stays equal to the shards at every sync while
syncs read only the rows that may have moved (those pushed since the last one, and for a while
after a rebuild the rows that joined), every row only where serving resumes after a pause.

``serve`` serving always on ``experiment=clicklog_quick`` (fp32, fp32 syncs with bound 0, a sync
every 5 steps between snapshots 20 steps apart), row-wise tables beside data-parallel ones. After
every sync each rank compares the replica's rows that its shards hold with the shards themselves
(``_checked_train``): an independent read of every row, where a sync of the pushed rows reads
only those. The batches TorchRec's pipeline split before a rebuild still look the rows that
joined up through the shards after it (and, split while serving paused, every row); a sync that
trusted the pushes alone right after a rebuild would leave those copies behind, and the check
counts them.
"""

from __future__ import annotations

import json

import pytest

from tests._fixtures import BIN, _run


RECHECKED = ["slipstream.serve_when=auto", "slipstream.serve_window_steps=20", "slipstream.serve_min_gain=-9",
             "slipstream.serve_recheck_windows=2", "slipstream.serve_look_budget=1"]  # fmt: skip


@pytest.mark.parametrize("lever", ["always", "rechecked"])
def test_syncs_of_the_pushed_rows_keep_the_replica_equal_to_the_shards(tmp_path, lever):
    # rechecked: serving kept (a step may take 10x as long) and re-checked every 2 windows by a
    # window without serving, whose batches train every row through the shards; when serving
    # resumes the rebuild and the syncs until those batches have trained compare every row
    out = tmp_path / "checks"
    _run([
        str(BIN / "torchrun"), "--standalone", "--nproc_per_node", "2", "-m", "tests.slipstream.serve._checked_train",
        str(out), "experiment=clicklog_quick", f"data.root={tmp_path / 'data'}", f"trainer.run_dir={tmp_path / 'run'}",
        "trainer.progress_bar=false", "trainer.test_at_end=false", "trainer.precision=fp32", "downsampling=off",
        "slipstream=serve", "slipstream.sync_precision=fp32", "slipstream.replica_sync_bound=0",
        "slipstream.replica_sync_steps=5", "slipstream.snapshot_interval=20", "sharding=row_wise",
        *(["slipstream.serve_when=always"] if lever == "always" else RECHECKED),
    ])  # fmt: skip
    counts = [json.loads((tmp_path / f"checks.rank{r}.json").read_text()) for r in range(2)]
    for c in counts:
        assert c["rows_checked"] > 0 and c["moved"] > 0, c
        assert c["mismatched_rows"] == 0, c
        # every row compared only where serving resumed after a window without it
        assert (c["full"] > 0) == (lever == "rechecked"), c
    # the syncs of the suspect rows did send rows: the pushes move what they cover
    assert sum(c["moved_rows_sent"] for c in counts) > 0, counts
    assert counts[0]["moved"] == counts[1]["moved"] and counts[0]["full"] == counts[1]["full"]
