"""``torchrun -m tests.slipstream.serve._checked_train OUT OVERRIDES``: the main job, with every
replica sync checked against the shards it copies.

After each sync of the replica (``StaleReplica.rebuild``), every rank reads the replica's rows
that its own shards hold, every column, straight from the shard weights, and counts the rows
whose copy differs from them in any element; it also counts the syncs that compared every row
and those that compared only the rows that may have moved (``suspects``), and the row slices
those sent. Rank r writes the counts to ``OUT.rank<r>.json`` when the job ends. With fp32 syncs
and ``slipstream.replica_sync_bound=0`` the copy must equal the shards after every sync.
"""

from __future__ import annotations

import atexit
import json
import os
import sys

import torch

from slipstream_rec.slipstream.serve.replica import StaleReplica

COUNTS = {"full": 0, "moved": 0, "moved_rows_sent": 0, "rows_checked": 0, "mismatched_rows": 0}


def _mismatched(replica: StaleReplica, units, feature_idx) -> int:
    """Rows of ``replica`` held by this rank's ``units`` whose copy is not their shard's row."""
    keys, bad = replica.keys, 0
    for unit in units:
        first = int(replica.index.offset_list[feature_idx[unit.feature]]) + unit.row_offset
        at = ((keys >= first) & (keys < first + unit.rows)).nonzero().view(-1)
        shard = unit.weights.detach().index_select(0, keys[at] - first).float().cpu()
        copy = replica.values[at, unit.col_offset : unit.col_offset + unit.cols]
        COUNTS["rows_checked"] += int(at.numel())
        bad += int((shard != copy).any(1).sum())
    return bad


def _checked(rebuild):
    def run(self, units, keys, feature_idx, bound=-1.0, suspects=None):
        sent = self.rows_sent
        rebuild(self, units, keys, feature_idx, bound, suspects=suspects)
        COUNTS["full" if suspects is None else "moved"] += 1
        if suspects is not None:
            COUNTS["moved_rows_sent"] += self.rows_sent - sent
        COUNTS["mismatched_rows"] += _mismatched(self, units, feature_idx)

    return run


def main() -> int:
    out, overrides = sys.argv[1], sys.argv[2:]
    StaleReplica.rebuild = _checked(StaleReplica.rebuild)

    def write() -> None:
        with open(f"{out}.rank{os.environ.get('RANK', '0')}.json", "w") as f:
            json.dump(COUNTS, f)

    atexit.register(write)
    from slipstream_rec.train import main as train

    return train(overrides)


if __name__ == "__main__":
    sys.exit(main())
