"""The quality check: a skip rate steered by how well the model already predicts what it skips.

Slipstream's premise is that inputs whose lookups all hit stale rows teach little. Whether that
holds is measurable while training: at every snapshot, before the threshold T is refreshed, the
controller takes a sample of upcoming inputs (not trained yet, so held out), marks the ones the
policy would skip at its configured maximum rate (``target_skip_fraction``), and runs one no-grad
forward of the whole sample with the current parameters. The per-sample log loss of the two groups
is compared:

* the skip candidates are *measurably better predicted* when their mean loss is below
  ``(1 - min_gain)`` times the other inputs' mean loss by more than ``z`` standard errors of the
  difference: they add less gradient than what is trained (the log loss's gradient with respect
  to the logit is p - y), so skipping them costs little. The target D is raised by ``step``, up to
  ``target_skip_fraction``;
* otherwise the skip candidates still teach about as much as the trained inputs, and D is
  lowered by ``step``, down to 0 (no skipping).

D starts at ``target_skip_fraction``; the first decision is taken at the first threshold, before
anything is skipped. The candidates are always those of the maximum rate, so the check keeps
measuring after D has fallen to 0 and can raise it back.

``QualityStats`` holds the sufficient statistics (count, sum, sum of squares of the loss, per
group) summed over ranks, so every rank takes the same decision from the same numbers.
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import asdict, dataclass
from typing import Any, Callable, Dict, Optional

import torch
import torch.distributed as dist
from torch import nn

from slipstream_rec.data.batch_ops import slice_rows
from slipstream_rec.data.types import Batch
from slipstream_rec.distributed import all_reduce_
from slipstream_rec.slipstream.classify import skippable_by_threshold
from slipstream_rec.slipstream.config import SlipstreamConfig
from slipstream_rec.slipstream.rows import RowIndex, RowState

__all__ = ["NoQuality", "QualityCheck", "QualityStats", "QualityGovernor", "group_stats"]

logger = logging.getLogger(__name__)


@dataclass
class QualityStats:
    """Per-sample log-loss statistics of the skip candidates (c) and the other inputs (o)."""

    n_c: float = 0.0
    sum_c: float = 0.0
    sumsq_c: float = 0.0
    n_o: float = 0.0
    sum_o: float = 0.0
    sumsq_o: float = 0.0

    def to_tensor(self) -> torch.Tensor:
        return torch.tensor(
            [self.n_c, self.sum_c, self.sumsq_c, self.n_o, self.sum_o, self.sumsq_o], dtype=torch.float64
        )

    @classmethod
    def from_tensor(cls, t: torch.Tensor) -> "QualityStats":
        return cls(*(float(v) for v in t.tolist()))


def group_stats(losses: torch.Tensor, candidate: torch.Tensor) -> QualityStats:
    """This rank's statistics from per-sample losses and the candidate mask (both (n,))."""
    losses = losses.detach().to(torch.float64).reshape(-1)
    candidate = candidate.reshape(-1).to(torch.bool)
    assert losses.shape == candidate.shape, (losses.shape, candidate.shape)
    c, o = losses[candidate], losses[~candidate]
    return QualityStats(
        float(c.numel()), float(c.sum()), float((c * c).sum()),
        float(o.numel()), float(o.sum()), float((o * o).sum()),
    )


def _mean_var(n: float, s: float, ss: float) -> tuple[float, float]:
    mean = s / n
    var = max(0.0, (ss - n * mean * mean) / (n - 1)) if n > 1 else float("inf")
    return mean, var


class QualityGovernor:
    """Holds the current target D and moves it from one ``QualityStats`` per snapshot."""

    def __init__(self, max_target: float, step: float, min_gain: float, z: float, min_samples: int) -> None:
        # max_target: the ceiling and starting value of D (slipstream.target_skip_fraction).
        # step: how much one decision moves D (slipstream.quality_step).
        # min_gain: relative log-loss advantage the candidates need (slipstream.quality_min_gain).
        # z: standard errors the advantage must clear (slipstream.quality_z).
        # min_samples: fewer candidates (or others) than this, summed over ranks: no evidence that
        #   they are better predicted, so D is lowered (slipstream.quality_min_samples).
        self.max_target = float(max_target)
        self.step = float(step)
        self.min_gain = float(min_gain)
        self.z = float(z)
        self.min_samples = int(min_samples)
        self.target = self.max_target
        self.decisions = 0
        self.last: Optional[Dict[str, Any]] = None

    def update(self, stats: QualityStats, step: int) -> Dict[str, Any]:
        """One decision; returns its record (also kept as ``last``)."""
        before = self.target
        record: Dict[str, Any] = {"step": step, "target_before": before, **asdict(stats)}
        if stats.n_c < self.min_samples or stats.n_o < self.min_samples:
            better = False
            record["reason"] = (
                f"too few samples to measure ({int(stats.n_c)} candidates, {int(stats.n_o)} others; "
                f"need {self.min_samples} each): lower"
            )
        else:
            mean_c, var_c = _mean_var(stats.n_c, stats.sum_c, stats.sumsq_c)
            mean_o, var_o = _mean_var(stats.n_o, stats.sum_o, stats.sumsq_o)
            se = math.sqrt(var_c / stats.n_c + var_o / stats.n_o)
            margin = (1.0 - self.min_gain) * mean_o - mean_c
            better = margin > self.z * se
            gain = (mean_o - mean_c) / mean_o if mean_o > 0 else 0.0
            record.update(loss_candidates=mean_c, loss_others=mean_o, gain=gain, se=se)
            record["reason"] = (
                f"candidates' log loss {mean_c:.4f} vs others' {mean_o:.4f} (gain {gain:+.3f}, "
                f"need {self.min_gain:.3f} + {self.z:g} se = "
                f"{self.min_gain + (self.z * se / mean_o if mean_o > 0 else 0.0):.3f}): "
                + ("better predicted, raise" if better else "not measurably better, lower")
            )
        if better:
            self.target = min(self.max_target, before + self.step)
        else:
            self.target = max(0.0, before - self.step)
        # Float steps (0.3 - 0.1 - 0.1 - 0.1) must land on 0 exactly, not on 5e-17.
        self.target = round(self.target, 12)
        self.decisions += 1
        record.update(better=better, target_after=self.target)
        self.last = record
        return record

    def state_dict(self) -> Dict[str, Any]:
        return {"target": self.target, "decisions": self.decisions, "last": self.last}

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        self.target = float(state["target"])
        self.decisions = int(state["decisions"])
        self.last = state["last"]


class QualityCheck:
    """``slipstream.quality_check``: scores the upcoming sample at each threshold choice and
    moves D. ``scorer`` (per-sample logits of a batch under the current parameters, no grad: a
    collective, the sharded forward) is set by the trainer before the first step."""

    def __init__(self, cfg: SlipstreamConfig, index: RowIndex, row_state: RowState, is_rank0: bool) -> None:
        self.cfg = cfg
        self.index = index
        self.row_state = row_state
        self.is_rank0 = is_rank0
        self.governor = QualityGovernor(
            cfg.target_skip_fraction, cfg.quality_step, cfg.quality_min_gain, cfg.quality_z, cfg.quality_min_samples
        )
        self.sample_size = cfg.quality_sample_size  # upcoming samples per rank it scores
        self.scorer: Optional[Callable[[Batch], torch.Tensor]] = None
        self.seconds = 0.0

    @property
    def target(self) -> float:
        """The current D."""
        return self.governor.target

    @property
    def decisions(self) -> int:
        return self.governor.decisions

    def check(self, sample: Optional[Batch], t_max: float, step: int) -> Optional[Dict[str, Any]]:
        """Score the upcoming sample and move D. Collectives, all ranks: one MIN all-reduce of
        the sample size, the sharded forward (``scorer``), one SUM all-reduce of the loss
        statistics. None where some rank has no sample (the end of the data): D stays."""
        assert self.scorer is not None, "quality check without a scorer"
        t0 = time.perf_counter()
        cfg = self.cfg
        local = 0 if sample is None else min(sample.batch_size, self.sample_size)
        n = int(all_reduce_(torch.tensor([local], dtype=torch.int64), dist.ReduceOp.MIN).item())
        if n == 0:
            return None
        assert sample is not None
        batch = slice_rows(sample, 0, n)  # the same size on every rank
        candidate = skippable_by_threshold(batch.sparse_features, self.index, self.row_state, t_max, cfg.alpha)
        if cfg.negatives_only:
            candidate &= batch.labels.view(-1) == 0
        logits = self.scorer(batch).detach().float().cpu().view(-1)
        losses = nn.functional.binary_cross_entropy_with_logits(
            logits, batch.labels.view(-1).float(), reduction="none"
        )
        totals = all_reduce_(group_stats(losses, candidate).to_tensor())  # all ranks
        record = self.governor.update(QualityStats.from_tensor(totals), step)
        record["threshold_at_max_target"] = float(t_max)
        if self.is_rank0:
            logger.info(
                "slipstream: quality check at step %d: %s; target %.3f -> %.3f",
                step, record["reason"], record["target_before"], record["target_after"],
            )  # fmt: skip
        record["seconds"] = time.perf_counter() - t0
        self.seconds += record["seconds"]
        return record

    def state_dict(self) -> Optional[Dict[str, Any]]:
        return self.governor.state_dict()

    def load_state_dict(self, state: Optional[Dict[str, Any]]) -> None:
        if state is None:
            raise ValueError(
                "the checkpoint was written without slipstream.quality_check, this run has it "
                "on. Fix: resume with slipstream.quality_check=false, or start a new run directory"
            )
        self.governor.load_state_dict(state)


class NoQuality:
    """No quality check: D stays ``target_skip_fraction``, nothing is scored."""

    sample_size = 0
    decisions = 0
    seconds = 0.0
    scorer: Optional[Callable[[Batch], torch.Tensor]] = None

    def __init__(self, cfg: SlipstreamConfig) -> None:
        self.target = float(cfg.target_skip_fraction)

    def check(self, sample: Optional[Batch], t_max: float, step: int) -> None:
        return None

    def state_dict(self) -> None:
        return None

    def load_state_dict(self, state: Optional[Dict[str, Any]]) -> None:
        pass
