"""Dense references of the per-row change state: every row of the flat key space at once.

O(num_rows) each, which is why the package keeps only the sparse forms (``RowState``'s sorted
keys and values and its per-table lookup view); the tests compare those with these.
"""

from __future__ import annotations

import torch
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from slipstream_rec.slipstream.rows import RowIndex, RowState


def dense_change(state: RowState) -> torch.Tensor:
    """Every row's change as one (num_rows,) float32 tensor; +inf for a row that is not hot."""
    out = torch.full((state.num_rows,), float("inf"), dtype=torch.float32)
    out[state.keys] = state.values
    return out


def stale_mask(state: RowState, threshold: float) -> torch.Tensor:
    """Bool (num_rows,): ``change < threshold``, the rows ``state.stale_keys`` gives."""
    out = torch.zeros(state.num_rows, dtype=torch.bool)
    out[state.stale_keys(threshold)] = True
    return out


def hot_mask(state: RowState) -> torch.Tensor:
    """Bool (num_rows,): rows with a finite change."""
    out = torch.zeros(state.num_rows, dtype=torch.bool)
    out[state.keys] = True
    return out


def lookup_changes(kjt: KeyedJaggedTensor, index: RowIndex, change: torch.Tensor) -> torch.Tensor:
    """The change of every lookup of ``kjt`` (KJT value order) from a dense per-flat-row ``change``."""
    return change.index_select(0, index.flat_keys(kjt))
