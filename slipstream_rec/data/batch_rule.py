"""The one rule for the ``trainer.batch_size`` a command suggests for a small dataset, shared
by ``slipstream-data`` (the train command it prints) and the trainer's batch check (its fix).

The largest that fits is not useful: 1,800 rows per rank at batch 1,800 (or 1,024) is one step
per epoch, a model that has barely moved. The suggestion is the largest power of two that gives
at least ``MIN_STEPS_PER_EPOCH`` steps per epoch on a rank's rows (a power of two: what the
kernels and the docs use), never above the configured default.
"""

from __future__ import annotations

MIN_STEPS_PER_EPOCH = 20


def suggested_batch_size(rows_per_rank: int, default: int) -> int:
    """The batch per rank to suggest for ``rows_per_rank`` training rows (at least 1)."""
    target = max(1, min(default, rows_per_rank // MIN_STEPS_PER_EPOCH))
    return 1 << (target.bit_length() - 1)


def needs_suggestion(rows_per_rank: int, batch_size: int) -> bool:
    """Whether ``batch_size`` leaves fewer than ``MIN_STEPS_PER_EPOCH`` steps per epoch."""
    return rows_per_rank // batch_size < MIN_STEPS_PER_EPOCH


def steps_per_epoch(rows_per_rank: int, batch_size: int) -> int:
    return rows_per_rank // batch_size
