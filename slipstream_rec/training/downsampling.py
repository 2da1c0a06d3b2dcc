"""Negative downsampling beside any policy: a rate chosen from the data, guarded while training.

Raw click logs are mostly non-clicks the model soon predicts well; dropping a uniform fraction f
of them and adding log(1 - f) to every logit at evaluation trains on fewer samples at the same
calibration (He et al. 2014, "Practical lessons from predicting clicks on ads at Facebook"). How
much f costs depends on the data, so ``downsampling=auto`` (``downsampling.rate=auto``) decides it:

* **The rule** (once, before the first batch is classified): from the click rate c of the
  upcoming samples in every rank's look-ahead buffer (labels only, summed over ranks), the
  largest f that still trains ``negatives_per_click`` non-clicks per click:
  ``(1 - f)(1 - c) / c >= m``, i.e. ``f = 1 - m c / (1 - c)``, floored at 0 and rounded down to
  a multiple of 0.05. At c = 0.02 and m = 20 that is 0.55; at c = 0.25 it is 0 (a log already
  downsampled, like Criteo's, is left alone). Rare-event logistic regression loses little
  efficiency from case-control sampling while the controls per case stay many (King and Zeng
  2001); the value of m comes from measurements (docs/performance.md).
* **The guard** (every ``downsampling_guard_steps`` steps, on held-out samples): progressive
  validation, each trained batch scored by the forward that trains it, i.e. before any update
  from it, with the calibrated click probability p = sigmoid(logit + log(1 - f)). Dropping a
  fraction f of the non-clicks (weight back 1/(1 - f)) adds f / (1 - f) times the non-clicks'
  share of the gradient's variance with respect to the logits, Sum_neg p^2 / (Sum_pos (1 - p)^2
  + Sum_neg p^2) (the non-clicks trained stand for 1/(1 - f) each). That *added noise* R(f) is
  what downsampling costs the gradient; when it exceeds ``downsampling_max_noise`` the guard
  lowers f to the largest rate whose R is within it (down to 0) and never raises it again. The
  first window only measures: the model is still learning the click rate there.

Every decision, rule or guard, is a record with its reason (``decisions``), logged by the
trainer and shown by the report. A fixed number (``downsampling.rate=0.5``) forces that rate: no
rule, no guard decision (the guard's measurement is still recorded). The draws come from their
own random stream, per rank.

Where it runs: the drop mask and the rule on the data side, before the Slipstream policy decides
on the samples that remain (the controller's ``on_host_batch`` and ``wrap`` call it); the guard,
the calibration and the summary in the trainer.
"""

from __future__ import annotations

import logging
import math
from typing import Any, Dict, List, Optional, Union

import torch
import torch.distributed as dist

from slipstream_rec.distributed import all_reduce_
from slipstream_rec.training.config import DownsamplingConfig

logger = logging.getLogger(__name__)

__all__ = ["NegativeDownsampler", "rate_for_click_rate", "rate_within_noise"]

AUTO = "auto"
_GRID = 0.05  # rates are multiples of this: readable decisions, and no chasing of noise


def rate_for_click_rate(click_rate: float, negatives_per_click: float) -> float:
    """The largest multiple of 0.05 below ``1 - m c / (1 - c)`` (0 when c is 0 or 1: no evidence)."""
    c = float(click_rate)
    if not 0.0 < c < 1.0:
        return 0.0
    f = 1.0 - negatives_per_click * c / (1.0 - c)
    return _floor_grid(f)


def rate_within_noise(negative_share: float, max_noise: float) -> float:
    """The largest multiple of 0.05 whose added noise f / (1 - f) * share stays within ``max_noise``."""
    if negative_share <= 0:
        return _floor_grid(0.95)
    return _floor_grid(max_noise / (negative_share + max_noise))


def _floor_grid(f: float) -> float:
    f = min(max(f, 0.0), 0.95)
    return round(math.floor(f / _GRID + 1e-9) * _GRID, 10)


def added_noise(rate: float, negative_share: float) -> float:
    return rate / (1.0 - rate) * negative_share


class NegativeDownsampler:
    """The rate, the draws, and the rule and guard that move the rate (``auto``)."""

    def __init__(
        self,
        setting: Union[float, str],
        seed: int,
        negatives_per_click: float = 25.0,
        guard_steps: int = 100,
        max_noise: float = 0.05,
    ) -> None:
        # setting: "auto" (rule + guard) or a fixed fraction of non-clicks dropped (0: none).
        # seed: this rank's stream (from_config: seed * 1000 + rank).
        self.auto = setting == AUTO
        self.rate = 0.0 if self.auto else float(setting)
        self.negatives_per_click = float(negatives_per_click)
        self.guard_steps = int(guard_steps)
        self.max_noise = float(max_noise)
        self.seed = seed
        # The stream the skip decider drew negative downsampling from before this module
        # (seed + 7,777,777): the same rate drops the same samples.
        self._gen = torch.Generator().manual_seed(seed + 7_777_777)
        self.decided = not self.auto  # the rule has run (or there is none)
        self.dropped = 0  # non-clicks dropped on this rank
        self.decisions: List[Dict[str, Any]] = []
        self._window = torch.zeros(5, dtype=torch.float64)  # see observe()
        self._windows_seen = 0

    @classmethod
    def from_config(cls, cfg: DownsamplingConfig, seed: int, rank: int) -> "NegativeDownsampler":
        """This rank's downsampler: its own random stream (seed * 1000 + rank)."""
        return cls(cfg.rate, seed * 1000 + rank, cfg.negatives_per_click, cfg.guard_steps, cfg.max_noise)

    # ---- data side (per batch, local) -----------------------------------------------------
    def drop_mask(self, labels: torch.Tensor) -> Optional[torch.Tensor]:
        """Bool (B,): the non-clicks dropped from this batch; None at rate 0 (no draw either)."""
        if self.rate <= 0:
            return None
        v = torch.rand(labels.numel(), generator=self._gen)
        mask = (labels.view(-1) == 0) & (v < self.rate)
        self.dropped += int(mask.sum())
        return mask

    def logit_offset(self) -> float:
        """What evaluation adds to every logit: log(1 - f) undoes the 1/(1 - f) odds."""
        return math.log(1.0 - self.rate) if self.rate > 0 else 0.0

    # ---- the rule (collective, once) ------------------------------------------------------
    def choose_from_labels(self, labels: Optional[torch.Tensor], step: int) -> Optional[Dict[str, Any]]:
        """``auto``: the rule's rate from the click rate of ``labels`` (this rank's upcoming
        samples, None if it has none) summed over ranks; None once decided. Collective while
        ``decided`` is False, which is the same on every rank (one SUM all-reduce)."""
        if self.decided:
            return None
        local = torch.zeros(2, dtype=torch.float64)
        if labels is not None:
            local[0], local[1] = float(labels.numel()), float(labels.sum())
        n, clicks = all_reduce_(local).tolist()  # all ranks
        self.decided = True
        c = clicks / n if n else 0.0
        rate = rate_for_click_rate(c, self.negatives_per_click)
        kept = (1.0 - rate) * (1.0 - c) / c if c > 0 else float("inf")
        reason = (
            f"click rate {c:.4f} of {int(n)} upcoming samples: rate {rate:.2f} keeps "
            f"{kept:.1f} non-clicks per click (at least negatives_per_click={self.negatives_per_click:g})"
            if n
            else "no upcoming samples: no downsampling"
        )
        return self._decide("rule", step, rate, reason, click_rate=c, samples=int(n))

    # ---- the guard (progressive validation, collective on guard steps) --------------------
    def observe(self, logits: torch.Tensor, labels: torch.Tensor) -> None:
        """Accumulate one trained batch's held-out statistics (its logits come from the forward
        that trains it). Local, no collective; summed where the logits are, so a GPU step does
        not wait for a copy to the host (the sums leave the device at the guard step). Nothing
        without a guard."""
        if self.guard_steps <= 0:
            return
        z = logits.detach().double().view(-1) + self.logit_offset()
        y = labels.detach().double().view(-1).to(z.device)
        p = torch.sigmoid(z)
        pos = (y > 0.5).double()  # a 0/1 weight, not a mask: no output sized by the data
        neg = 1.0 - pos
        keep = 1.0 - self.rate  # each trained non-click stands for 1/keep of the log's
        stats = torch.stack([
            torch.full((), float(y.numel()), dtype=torch.float64, device=z.device),
            pos.sum(),
            ((1 - p) ** 2 * pos).sum(),
            (p**2 * neg).sum() / keep,
            (p * pos).sum() + (p * neg).sum() / keep,  # predicted clicks in the log
        ])  # fmt: skip
        self._window = self._window.to(z.device) + stats

    def is_guard_step(self, step: int) -> bool:
        return self.guard_steps > 0 and step > 0 and step % self.guard_steps == 0

    def maybe_guard(self, step: int) -> Optional[Dict[str, Any]]:
        """The guard's record on a guard step, else None. Collective on guard steps: every rank
        calls it after every step."""
        if not self.is_guard_step(step):
            return None
        record = self.guard(step)
        if record["rate_after"] != record["rate_before"] and _is_rank0():
            logger.warning("downsampling: negative downsampling at step %d: %s", step, record["reason"])
        return record

    def guard(self, step: int) -> Dict[str, Any]:
        """Measure R over the window since the last guard step and back off if it is too much.
        Collective: every rank calls it on the same guard steps (one SUM all-reduce)."""
        stats = all_reduce_(self._window.clone()).tolist()  # all ranks
        self._window = torch.zeros_like(self._window)
        n, clicks, pos_var, neg_var, predicted = stats
        total = pos_var + neg_var
        share = neg_var / total if total > 0 else 0.0
        negatives_in_log = (n - clicks) / (1.0 - self.rate)
        log_samples = clicks + negatives_in_log
        measured = {
            "negative_share": share,
            "added_noise": added_noise(self.rate, share),
            "max_noise": self.max_noise,
            "trained_samples": int(n),
            "observed_ctr": clicks / log_samples if log_samples else 0.0,
            "predicted_ctr": predicted / log_samples if log_samples else 0.0,
        }
        self._windows_seen += 1
        first = self._windows_seen == 1
        if not self.auto or first or self.rate == 0 or measured["added_noise"] <= self.max_noise:
            why = (
                "fixed rate: measured only" if not self.auto
                else "first window: the model is still learning the click rate, measured only" if first
                else "rate 0: nothing to back off" if self.rate == 0
                else f"added noise {measured['added_noise']:.4f} <= max_noise {self.max_noise:g}: kept"
            )  # fmt: skip
            return self._record("guard", step, self.rate, why, **measured)
        new = min(self.rate, rate_within_noise(share, self.max_noise))
        reason = (
            f"added noise {measured['added_noise']:.4f} > max_noise {self.max_noise:g} "
            f"(non-clicks carry {share:.3f} of the gradient's variance): backed off"
        )
        return self._decide("guard", step, new, reason, **measured)

    def _record(self, kind: str, step: int, rate: float, reason: str, **extra: Any) -> Dict[str, Any]:
        return {**extra, "step": step, "decision": kind, "rate_before": self.rate, "rate_after": rate, "reason": reason}

    def _decide(self, kind: str, step: int, rate: float, reason: str, **extra: Any) -> Dict[str, Any]:
        """A decision that sets the rate: recorded, kept in ``decisions`` and applied."""
        record = self._record(kind, step, rate, reason, **extra)
        self.decisions.append(record)
        self.rate = rate
        return record

    # ---- checkpointing (local) ------------------------------------------------------------
    def state_dict(self) -> Dict[str, Any]:
        return {
            "seed": self.seed,
            "rate": self.rate,
            "decided": self.decided,
            "generator": self._gen.get_state(),
            "dropped": self.dropped,
            "decisions": list(self.decisions),
            "window": self._window.cpu(),
            "windows_seen": self._windows_seen,
        }

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        """Restore; the random stream continues only when it is this rank's own (same seed)."""
        self.rate = float(state["rate"])
        self.decided = bool(state["decided"])
        self.dropped = int(state["dropped"])
        self.decisions = list(state["decisions"])
        self._window = state["window"].clone()
        self._windows_seen = int(state["windows_seen"])
        if state.get("seed") == self.seed:
            self._gen.set_state(state["generator"])
        else:  # another world size: a fresh, distinct stream per rank from the position
            self._gen.manual_seed((self.seed * 1_000_003 + self.dropped + 7_777_777) % (1 << 62))

    def summary(self) -> Dict[str, Any]:
        """For summary.json: the setting, rate and decisions, and the non-clicks dropped summed
        over ranks. Collective: all ranks enter (one SUM all-reduce)."""
        dropped = all_reduce_(torch.tensor([self.dropped], dtype=torch.int64))  # all ranks
        return {
            "setting": AUTO if self.auto else self.rate,
            "rate": self.rate,
            "decisions": list(self.decisions),
            "negatives_dropped": int(dropped.item()),
        }


def _is_rank0() -> bool:
    return not dist.is_initialized() or dist.get_rank() == 0
