"""``SkippingStream``: constant-size batches of the inputs a skip decision keeps.

Source batches are classified one at a time, as late as possible (only when the rows are needed
to fill the next output batch), so a stale set updated between steps applies to every input
not yet classified. A look-ahead buffer of raw (unclassified) source batches lets a threshold be
computed from the very inputs that will be classified next (``peek_upcoming``).
"""

from __future__ import annotations

from collections import deque
from typing import Any, Callable, Deque, Dict, Iterable, Iterator, List, Optional, Tuple

import torch

from slipstream_rec.data.types import Batch
from slipstream_rec.data.batch_ops import (
    batch_from_state,
    batch_to_state,
    concat_batches,
    select_rows,
    slice_rows,
)

__all__ = ["SkippingStream", "DecideFn"]

# decide(batch) -> (keep (B,) bool, weights (B,) float): keep rows where keep is True, and
# multiply their loss weights by `weights` (entries of dropped rows are ignored).
DecideFn = Callable[[Batch], Tuple[torch.Tensor, torch.Tensor]]


class SkippingStream:
    """Iterator of ``Batch``es of exactly ``batch_size`` rows: the rows ``decide`` keeps.

    Kept rows are packed in source order; rows beyond a full batch are carried into the next one.
    When the source ends, the last incomplete remainder is dropped (``samples_dropped_at_end``)
    so every rank keeps a constant batch size. Counters: ``samples_seen`` (rows pulled from the
    source and classified) == ``samples_kept`` + ``samples_skipped``; kept rows are either emitted
    or, at the end, dropped.
    """

    def __init__(
        self,
        source: Iterable[Batch],
        batch_size: int,
        decide: DecideFn,
        lookahead_batches: int = 0,
    ) -> None:
        # source: the raw batches (any sizes), e.g. an NpyBatchLoader epoch.
        # batch_size: rows of every emitted batch.
        # decide: called once per source batch, when its rows are first needed.
        # lookahead_batches: raw source batches kept prefetched (unclassified) for peek_upcoming.
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"SkippingStream: batch_size must be a positive int, got {batch_size!r}")
        if (
            isinstance(lookahead_batches, bool)
            or not isinstance(lookahead_batches, int)
            or lookahead_batches < 0
        ):
            raise ValueError(
                f"slipstream.lookahead_batches must be an int >= 0, got {lookahead_batches!r}"
            )
        self._source: Iterator[Batch] = iter(source)
        self.batch_size = batch_size
        self.decide = decide
        self.lookahead_batches = lookahead_batches
        self._upcoming: Deque[Batch] = deque()  # raw, unclassified, in source order
        self._carry: List[Batch] = []  # classified, kept, weighted rows not yet emitted
        self._carry_rows = 0
        self._ready: Deque[Batch] = deque()  # built by prepare(), not handed out yet
        # Batches every rank has agreed to hand out before the next agreement (lockstep's
        # counter, kept here so that a checkpoint resumes on the same agreement schedule).
        self.agreed_ahead = 0
        self.agreed_last = 0  # 1: no agreement follows the current one (a rank ran out)
        # The agreed sharded size of each feature of each of those batches (serving splits
        # them; lockstep).
        self.agreed_shard: List[List[int]] = []  # each agreed batch's slots per feature
        self._source_done = False
        self._finished = False
        self.samples_seen = 0  # rows pulled from the source and classified
        self.samples_kept = 0  # classified rows kept (emitted, carried, or dropped at the end)
        self.samples_skipped = 0  # classified rows decide() dropped
        self.samples_dropped_at_end = 0  # kept rows of the final incomplete batch
        self.source_batches_classified = 0
        self.source_batches_pulled = 0  # raw batches taken from the source (the data position)
        self.batches_emitted = 0

    # -- source / look-ahead ---------------------------------------------------------------

    def _pull(self) -> Optional[Batch]:
        if self._source_done:
            return None
        try:
            batch = next(self._source)
        except StopIteration:
            self._source_done = True
            return None
        self.source_batches_pulled += 1
        return batch

    def _fill(self) -> None:
        while len(self._upcoming) < self.lookahead_batches:
            b = self._pull()
            if b is None:
                return
            self._upcoming.append(b)

    def _next_raw(self) -> Optional[Batch]:
        if self._upcoming:
            return self._upcoming.popleft()
        return self._pull()

    def peek_upcoming(self, max_samples: int) -> Optional[Batch]:
        """Up to ``max_samples`` raw rows that will be classified next, without consuming them.

        They come from the look-ahead buffer (filled here if needed), in the order they will be
        classified. None when there are none (``lookahead_batches`` == 0, or the source is done).
        Rows already classified and carried are not included.
        """
        if max_samples < 1:
            return None
        self._fill()
        parts: List[Batch] = []
        n = 0
        for b in self._upcoming:
            if n >= max_samples:
                break
            take = min(b.batch_size, max_samples - n)
            if take > 0:
                parts.append(slice_rows(b, 0, take))
                n += take
        if not parts:
            return None
        return concat_batches(parts)

    # -- iteration -------------------------------------------------------------------------

    @property
    def exhausted(self) -> bool:
        """True once no further batch can be emitted (the source is known to be done and what is
        left is less than a batch). ``samples_dropped_at_end`` is final only after StopIteration."""
        if self._ready:
            return False
        return self._finished or (
            self._source_done and not self._upcoming and self._carry_rows < self.batch_size
        )

    def __iter__(self) -> "SkippingStream":
        return self

    def _classify(self, raw: Batch) -> None:
        b = raw.batch_size
        keep, weights = self.decide(raw)
        keep = torch.as_tensor(keep)
        weights = torch.as_tensor(weights)
        if keep.dtype != torch.bool or keep.shape != (b,):
            raise ValueError(
                f"decide() must return keep as a bool ({b},) tensor, got {keep.dtype} "
                f"{tuple(keep.shape)}"
            )
        if weights.shape != (b,):
            raise ValueError(f"decide() must return weights of shape ({b},), got {tuple(weights.shape)}")
        n_keep = int(keep.sum())
        self.samples_seen += b
        self.samples_kept += n_keep
        self.samples_skipped += b - n_keep
        self.source_batches_classified += 1
        if n_keep == 0:
            return
        if n_keep == b:
            kept = Batch(
                dense_features=raw.dense_features,
                sparse_features=raw.sparse_features,
                labels=raw.labels,
                weights=raw.weights * weights.to(raw.weights.dtype),
            )
        else:
            idx = keep.nonzero().view(-1)
            kept = select_rows(raw, idx)
            kept.weights = kept.weights * weights.index_select(0, idx).to(kept.weights.dtype)
        self._carry.append(kept)
        self._carry_rows += n_keep

    def prepare(self, n: int) -> int:
        """Build up to ``n`` batches ahead (classifying what they need now); returns how many are
        ready. Fewer than ``n`` only when the source is done: this stream then ends after them."""
        while len(self._ready) < n:
            batch = self._build()
            if batch is None:
                break
            self._ready.append(batch)
        return len(self._ready)

    def ready_batches(self) -> List[Batch]:
        """The batches built ahead, in the order they will be handed out (not copies)."""
        return list(self._ready)

    def drop_ready(self) -> int:
        """Discard the batches built ahead (the run ends on another rank); returns their rows."""
        rows = sum(b.batch_size for b in self._ready)
        self.samples_dropped_at_end += rows
        self._ready.clear()
        return rows

    def __next__(self) -> Batch:
        if self._ready:
            return self._ready.popleft()
        batch = self._build()
        if batch is None:
            raise StopIteration
        return batch

    def _build(self) -> Optional[Batch]:
        if self._finished:
            return None
        while self._carry_rows < self.batch_size:
            raw = self._next_raw()
            if raw is None:
                self.samples_dropped_at_end += self._carry_rows
                self._carry, self._carry_rows = [], 0
                self._finished = True
                return None
            self._classify(raw)
        merged = concat_batches(self._carry)
        out = slice_rows(merged, 0, self.batch_size)
        rest = merged.batch_size - self.batch_size
        self._carry = [slice_rows(merged, self.batch_size, merged.batch_size)] if rest else []
        self._carry_rows = rest
        self.batches_emitted += 1
        self._fill()
        return out

    # -- checkpointing ---------------------------------------------------------------------
    _COUNTERS = (
        "samples_seen", "samples_kept", "samples_skipped", "samples_dropped_at_end",
        "source_batches_classified", "source_batches_pulled", "batches_emitted", "agreed_ahead",
        "agreed_last",
    )  # fmt: skip

    def state_dict(self) -> Dict[str, Any]:
        """Buffers and counters, batches as plain tensors. With a source that restarts after
        ``source_batches_pulled`` batches, ``load_state_dict`` continues the stream exactly."""
        return {
            "upcoming": [batch_to_state(b) for b in self._upcoming],
            "carry": [batch_to_state(b) for b in self._carry],
            "ready": [batch_to_state(b) for b in self._ready],
            "source_done": self._source_done,
            "finished": self._finished,
            "agreed_shard": [list(x) for x in self.agreed_shard],
            **{k: getattr(self, k) for k in self._COUNTERS},
        }

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        """Restore a fresh stream whose source continues where the saved one's stopped."""
        assert self.source_batches_pulled == 0, "load_state_dict on a stream already in use"
        self._upcoming = deque(batch_from_state(b) for b in state["upcoming"])
        self._carry = [batch_from_state(b) for b in state["carry"]]
        self._carry_rows = sum(b.batch_size for b in self._carry)
        self._ready = deque(batch_from_state(b) for b in state["ready"])
        self._source_done = bool(state["source_done"])
        self._finished = bool(state["finished"])
        for k in self._COUNTERS:
            setattr(self, k, int(state[k]))
        self.agreed_shard = [[int(x) for x in sizes] for sizes in state["agreed_shard"]]

    def buffered_rows(self) -> int:
        """Rows pulled from the source but not yet emitted (look-ahead and carry)."""
        ready = sum(b.batch_size for b in self._ready)
        return sum(b.batch_size for b in self._upcoming) + self._carry_rows + ready

    def counters(self) -> dict:
        """The counters as a dict (for logging)."""
        return {
            "samples_seen": self.samples_seen,
            "samples_kept": self.samples_kept,
            "samples_skipped": self.samples_skipped,
            "samples_dropped_at_end": self.samples_dropped_at_end,
            "samples_carried": self._carry_rows,
            "source_batches_classified": self.source_batches_classified,
            "batches_emitted": self.batches_emitted,
        }


class StreamTotals:
    """The stream counters of the epochs before the running one (a stream per epoch)."""

    def __init__(self) -> None:
        self.totals = {"seen": 0, "skipped": 0, "dropped": 0}

    def close(self, stream: Optional[SkippingStream]) -> None:
        """Add a stream that ends (None: there was none)."""
        if stream is not None:
            self.totals["seen"] += stream.samples_seen
            self.totals["skipped"] += stream.samples_skipped
            self.totals["dropped"] += stream.samples_dropped_at_end

    def dropped_at_end(self, n: int) -> None:
        """Samples a rank built but did not train because another rank ran out (``lockstep``)."""
        self.totals["dropped"] += n

    def with_running(self, stream: Optional[SkippingStream]) -> Tuple[int, int, int]:
        """(seen, skipped, dropped) over every epoch, the running ``stream`` included."""
        t = self.totals
        if stream is None:
            return t["seen"], t["skipped"], t["dropped"]
        return (
            t["seen"] + stream.samples_seen,
            t["skipped"] + stream.samples_skipped,
            t["dropped"] + stream.samples_dropped_at_end,
        )

    def state_dict(self) -> Dict[str, int]:
        return dict(self.totals)

    def load_state_dict(self, state: Dict[str, int]) -> None:
        self.totals.update(state)
