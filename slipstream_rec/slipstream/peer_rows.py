"""Which rows another rank's snapshot changes belong to, worked out rather than sent.

Every rank holds the same hot set (the tracker's ``hot_keys``: sorted flat keys), and a shard
unit's hot rows are the hot keys in its row range, ascending (``StalenessTracker.local_rows``).
So once every rank knows every rank's units (each one's first flat key and row count, gathered
once), the snapshot's gather of the hot rows' changes needs no keys: a rank sends its units'
measured row counts (an int32 a unit) and the changes, and every rank rebuilds the keys in the
sender's order. Per hot row a float instead of a float and a key.
"""

from __future__ import annotations

from typing import Callable, List, Optional

import torch

from slipstream_rec.distributed import gather_varlen

__all__ = ["PeerUnits"]


class PeerUnits:
    """Every rank's shard units as (first flat key, rows), in each rank's own unit order."""

    def __init__(self, spans: List[torch.Tensor]) -> None:
        self.spans = spans  # per rank: a (units, 2) int64 tensor

    @classmethod
    def gather(cls, local: torch.Tensor, meter: Optional[Callable[[int], None]] = None) -> "PeerUnits":
        """Collective (all ranks): ``local`` is this rank's (units, 2) int64 (first key, rows)."""
        flat, lengths = gather_varlen(local.reshape(-1).to(torch.int64), with_lengths=True, meter=meter)
        return cls([part.view(-1, 2) for part in flat.split(lengths)])

    @property
    def units_per_rank(self) -> List[int]:
        """Each rank's unit count (the lengths of a gather of one value a unit)."""
        return [int(s.shape[0]) for s in self.spans]

    def keys(self, hot_keys: torch.Tensor, rows_per_unit: torch.Tensor) -> torch.Tensor:
        """The flat keys of the rows every rank measured, in the order their changes were
        gathered: rank by rank, unit by unit, a unit's hot rows ascending. ``hot_keys``: the hot
        set (sorted, the same on every rank); ``rows_per_unit``: every rank's units' measured
        row counts, gathered (0: a unit not measured)."""
        counts = rows_per_unit.tolist()
        assert len(counts) == sum(self.units_per_rank), "one count per unit of every rank"
        spans = torch.cat(self.spans) if self.spans else torch.zeros(0, 2, dtype=torch.int64)
        bounds = torch.searchsorted(hot_keys, torch.stack([spans[:, 0], spans[:, 0] + spans[:, 1]], 1))
        out = []
        for (lo, hi), n in zip(bounds.tolist(), counts):
            if n:
                assert hi - lo == n, "a unit measures every hot row in its range"
                out.append(hot_keys[lo:hi])
        return torch.cat(out) if out else torch.zeros(0, dtype=torch.int64)
