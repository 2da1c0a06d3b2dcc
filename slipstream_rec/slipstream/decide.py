"""``SkipDecider``: the per-batch keep/weight decision fed to ``SkippingStream``.

For each classified sample:

* not skippable -> kept, weight 1;
* skippable and the window's skip budget is not spent -> kept with probability p and weight 1/p
  (``kept_sampled``), otherwise skipped. p = 0 is pure skipping as in the paper;
* skippable but the window's budget is spent -> kept with weight 1 (``forced_kept_by_ceiling``).

The ceiling: windows are consecutive runs of ``window_samples`` classified samples (across batch
boundaries); at most floor(max_skip_fraction * window_samples) samples of a window are skipped.
Whether a sample is still eligible depends only on the draws of *earlier* samples, so for every
skippable sample E[weight | past] = p * (1/p) = 1 if eligible, and 1 if forced: the expected
total weight of the skippable samples equals their number (p > 0).

``enabled=False`` (tracking only) runs exactly the same decision -- same random draws, same
counters of what WOULD be skipped -- but keeps every row with weight 1.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import asdict, dataclass
from typing import Callable, Deque, Dict, List, Optional, Tuple, Union

import torch

from slipstream_rec.data.types import Batch
from slipstream_rec.slipstream.classify import skippable_by_threshold, validate_alpha
from slipstream_rec.slipstream.config import SlipstreamConfig
from slipstream_rec.slipstream.rows import RowIndex, RowState

__all__ = ["KeepAll", "SkipDecider", "WindowStats", "ThresholdSource"]

# A fixed threshold, None (no threshold yet: nothing is stale), or a getter called per batch.
ThresholdSource = Union[float, None, Callable[[], Optional[float]]]


@dataclass
class WindowStats:
    """Counters of one window of ``window_samples`` classified samples."""

    index: int  # window number, 0 for the first window of this decider
    samples: int = 0  # samples classified in this window (== window_samples once complete)
    skippable: int = 0  # samples whose lookups were stale enough (before sampling and ceiling)
    skipped: int = 0  # samples dropped (with enabled=False: that WOULD have been dropped)
    kept_sampled: int = 0  # skippable samples kept by the p-draw, weight 1/p
    forced_kept_by_ceiling: int = 0  # skippable samples kept with weight 1: budget spent

    def as_dict(self) -> Dict[str, int]:
        return asdict(self)


def _check_fraction(name: str, value: float, what: str) -> float:
    v = float(value)
    if not (0.0 <= v <= 1.0):  # also rejects NaN
        raise ValueError(f"slipstream.{name} must be in [0, 1] ({what}), got {value!r}")
    return v


class SkipDecider:
    """Builds the ``decide(batch) -> (keep, weights)`` callable of ``SkippingStream``."""

    def __init__(
        self,
        index: RowIndex,
        row_state: RowState,
        threshold: ThresholdSource = None,
        active: Optional[Callable[[], bool]] = None,
        alpha: float = 1.0,
        keep_probability: float = 0.0,
        max_skip_fraction: float = 1.0,
        window_samples: int = 65536,
        seed: int = 0,
        enabled: bool = True,
        negatives_only: bool = False,
        random_fraction: float = 0.0,
        keep_windows: int = 64,
    ) -> None:
        # index: flat key space of all tables (maps KJT lookups to rows of row_state).
        # row_state: per-row change; a row is stale iff change < threshold.
        # threshold: fixed float, None (nothing stale), or a zero-arg getter called every batch.
        # active: zero-arg getter called every batch; False = nothing is skippable yet (the
        #   warm-up), for every policy, the random control included. None: always active.
        # alpha: fraction of a sample's lookups that must be stale for it to be skippable (1 = all).
        # keep_probability: p, chance a skippable sample is kept anyway (weight 1/p); 0 = pure skip.
        # max_skip_fraction: at most this fraction of each window's samples is skipped.
        # window_samples: size (classified samples) of a ceiling window.
        # seed: seeds the p-draws; decisions are deterministic given seed and inputs.
        # enabled: False = tracking only: keep everything with weight 1, still count would-be skips.
        # negatives_only: only samples with label 0 are skippable.
        # random_fraction: > 0 = the control: a sample is skippable with this probability,
        #   whatever its lookups (no threshold, no staleness); 0 = classify by staleness.
        # keep_windows: completed windows held for pop_completed_windows (the newest); older ones
        #   are dropped (counted in windows_dropped), so a run without a reader stays bounded.
        if row_state.num_rows != index.num_rows:
            raise ValueError(
                f"SkipDecider: row_state has {row_state.num_rows} rows but index has {index.num_rows}"
            )
        self.index = index
        self.row_state = row_state
        self.threshold: ThresholdSource = threshold
        self.active = active
        self.alpha = validate_alpha(alpha)
        self.keep_probability = _check_fraction(
            "keep_probability", keep_probability, "chance a skippable sample is kept with weight 1/p"
        )
        self.max_skip_fraction = _check_fraction(
            "max_skip_fraction", max_skip_fraction, "most samples of a window that may be skipped"
        )
        if isinstance(window_samples, bool) or not isinstance(window_samples, int) or window_samples < 1:
            raise ValueError(f"slipstream.window_samples must be an int >= 1, got {window_samples!r}")
        self.window_samples = window_samples
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise ValueError(f"slipstream.seed must be an int, got {seed!r}")
        self.seed = seed
        self.enabled = bool(enabled)
        self.negatives_only = bool(negatives_only)
        self.random_fraction = _check_fraction(
            "random_skip_fraction", random_fraction, "fraction of samples skipped at random"
        )
        # Skip budget per window; the epsilon keeps 0.3 * 10 at 3.
        self.window_budget = int(math.floor(self.max_skip_fraction * window_samples + 1e-9))
        self._gen = torch.Generator().manual_seed(seed)
        if isinstance(keep_windows, bool) or not isinstance(keep_windows, int) or keep_windows < 1:
            raise ValueError(f"SkipDecider: keep_windows must be an int >= 1, got {keep_windows!r}")
        self.current_window = WindowStats(index=0)
        # The newest completed windows, drained by pop_completed_windows(); bounded.
        self.completed_windows: Deque[WindowStats] = deque(maxlen=keep_windows)
        self.windows_dropped = 0  # completed windows pushed out unread
        self.totals = WindowStats(index=-1)  # over all windows; index is meaningless here
        self.last_threshold: Optional[float] = None

    @classmethod
    def from_config(
        cls, cfg: SlipstreamConfig, index: RowIndex, row_state: RowState, seed: int,
        threshold: ThresholdSource, active: Optional[Callable[[], bool]],
    ) -> "SkipDecider":  # fmt: skip
        """The decider of a classifying policy (slipstream.*): skipping, tracking only, or the
        random control."""
        return cls(
            index, row_state, threshold=threshold, active=active, alpha=cfg.alpha,
            keep_probability=cfg.keep_probability, max_skip_fraction=cfg.max_skip_fraction,
            window_samples=cfg.window_samples, seed=seed, enabled=cfg.skips,
            negatives_only=cfg.negatives_only, random_fraction=cfg.random_skip_fraction,
        )  # fmt: skip

    def current_threshold(self) -> Optional[float]:
        t = self.threshold() if callable(self.threshold) else self.threshold
        return None if t is None else float(t)

    def pop_completed_windows(self) -> List[WindowStats]:
        """Windows completed since the last call (oldest first)."""
        out = list(self.completed_windows)
        self.completed_windows.clear()
        return out

    def classify(self, batch: Batch) -> torch.Tensor:
        """Bool (B,): samples skippable under the current threshold and alpha (no sampling)."""
        t = self.current_threshold()
        self.last_threshold = t
        return skippable_by_threshold(
            batch.sparse_features, self.index, self.row_state, t, self.alpha
        )

    def __call__(self, batch: Batch, dropped: Optional[torch.Tensor] = None) -> Tuple[torch.Tensor, torch.Tensor]:
        """``dropped``: samples already taken out by negative downsampling (``training/downsampling.py``),
        dropped with weight 1 and no ceiling; the policy decides over the samples that remain."""
        n = batch.batch_size
        if self.random_fraction > 0:
            # The control: skippability is its own draw (independent of the p-draw below).
            sk = torch.rand(n, generator=self._gen) < self.random_fraction
        else:
            sk = self.classify(batch)
        if self.active is not None and not self.active():
            sk = torch.zeros_like(sk)  # warm-up: the draws above still advance the stream
        if dropped is not None:
            sk = sk & ~dropped  # the policy decides over the samples that remain
        u = torch.rand(n, generator=self._gen)  # drawn for every sample: a stable random stream
        if self.negatives_only:
            sk = sk & (batch.labels.view(-1) == 0)
        p = self.keep_probability
        drawn_keep = u < p
        cand = sk & ~drawn_keep  # would be skipped if the window budget allows

        # Window of each sample relative to the current one, and its first position in the batch.
        w_size = self.window_samples
        pos0 = self.current_window.samples
        win = torch.div(torch.arange(n, dtype=torch.int64) + pos0, w_size, rounding_mode="floor")
        start = (win * w_size - pos0).clamp_(min=0)
        cs = torch.zeros(n + 1, dtype=torch.int64)
        torch.cumsum(cand, 0, dtype=torch.int64, out=cs[1:])
        before = cs[:-1] - cs[start]  # candidates strictly before the sample, same window
        budget = torch.full((n,), self.window_budget, dtype=torch.int64)
        budget[win == 0] -= self.current_window.skipped
        eligible = before < budget

        skip = cand & eligible
        kept_sampled = sk & drawn_keep & eligible
        forced = sk & ~eligible
        self._count(win, n, sk, skip, kept_sampled, forced)

        if not self.enabled:
            return torch.ones(n, dtype=torch.bool), torch.ones(n, dtype=torch.float32)
        weights = torch.ones(n, dtype=torch.float32)
        if p > 0:
            weights.masked_fill_(kept_sampled, 1.0 / p)
        if dropped is not None:
            skip = skip | dropped
        return ~skip, weights

    def _count(self, win: torch.Tensor, n: int, *masks: torch.Tensor) -> None:
        if n == 0:
            return
        n_win = int(win[-1]) + 1
        samples = torch.bincount(win, minlength=n_win).tolist()
        per = [torch.bincount(win[m], minlength=n_win).tolist() for m in masks]
        for w in range(n_win):
            cur = self.current_window
            cur.samples += samples[w]
            cur.skippable += per[0][w]
            cur.skipped += per[1][w]
            cur.kept_sampled += per[2][w]
            cur.forced_kept_by_ceiling += per[3][w]
            if cur.samples == self.window_samples:
                if len(self.completed_windows) == self.completed_windows.maxlen:
                    self.windows_dropped += 1
                self.completed_windows.append(cur)
                self.current_window = WindowStats(index=cur.index + 1)
        t = self.totals
        t.samples += n
        t.skippable += sum(per[0])
        t.skipped += sum(per[1])
        t.kept_sampled += sum(per[2])
        t.forced_kept_by_ceiling += sum(per[3])

    def state_dict(self) -> Dict[str, object]:
        """What the next decisions depend on: the random stream, the open window, the totals."""
        return {
            "seed": self.seed,  # whose stream this is: another rank's is not continued
            "generator": self._gen.get_state(),
            "current_window": self.current_window.as_dict(),
            "totals": self.totals.as_dict(),
            "last_threshold": self.last_threshold,
        }

    def load_state_dict(self, state: Dict[str, object]) -> None:
        """Restore. The random streams continue exactly only when the state is this decider's
        own (the same seed, i.e. the same rank). On another world size every rank loads rank 0's
        file: its draws would repeat rank 0's on every rank, so each rank starts fresh streams
        from its own seed and the position instead (reproducible, distinct per rank)."""
        own = state.get("seed", self.seed) == self.seed
        if own:
            self._gen.set_state(state["generator"])  # type: ignore[arg-type]
        else:
            position = int(state["totals"]["samples"])  # type: ignore[index]
            fresh = (self.seed * 1_000_003 + position + 1) % (1 << 62)
            self._gen.manual_seed(fresh)
        self.current_window = WindowStats(**state["current_window"])  # type: ignore[arg-type]
        self.totals = WindowStats(**state["totals"])  # type: ignore[arg-type]
        self.last_threshold = state["last_threshold"]  # type: ignore[assignment]

    def logit_offset(self) -> float:
        """What evaluation adds to every logit for this decider's skips: log(1 - f) for the
        random control restricted to non-clicks at pure skipping (uniform negative downsampling
        at rate f trains the non-clicks at odds 1/(1 - f) too high; He et al. 2014), else 0: with
        p > 0 the 1/p weights keep the loss unbiased, and a skip that depends on the lookups
        shifts some inputs' odds and not others', which no single offset corrects."""
        if self.random_fraction > 0 and self.negatives_only and self.keep_probability == 0:
            return math.log(1.0 - self.random_fraction)
        return 0.0


class KeepAll:
    """The decision of the policies that classify nothing on the data side (``off``, and the
    ``serve`` action, which drops nothing): every sample kept at weight 1, no draw."""

    def __init__(self) -> None:
        self.totals = WindowStats(index=-1)  # never asked: nothing would be skipped

    def __call__(self, batch: Batch, dropped: Optional[torch.Tensor] = None) -> Tuple[torch.Tensor, torch.Tensor]:
        n = batch.batch_size
        return torch.ones(n, dtype=torch.bool), torch.ones(n)

    def logit_offset(self) -> float:
        return 0.0

    def state_dict(self) -> Dict[str, object]:
        return {}

    def load_state_dict(self, state: Dict[str, object]) -> None:
        pass
