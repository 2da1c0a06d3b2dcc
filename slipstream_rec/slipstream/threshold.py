"""The staleness threshold T: chosen from the inputs about to be trained, and the stale set it gives.

A hot row is stale while its change over the last snapshot interval is below T. At the first
snapshot that measures a change, and at every later one with ``refresh_threshold``, T is chosen
from a sample of the upcoming inputs in every rank's look-ahead buffer so that a target fraction
D of the hot inputs among them would have every lookup stale (``threshold_for_target``), capped
by ``max_threshold``. With the quality check (``quality.py``) D itself is moved first, from how
well the model already predicts the inputs that T would make skippable; the check always runs
before T is chosen.

``reactivate=false`` is the paper's rule: a row once stale stays stale (its change is pinned to 0
at every later snapshot).
"""

from __future__ import annotations

import logging
import math
from typing import Any, Callable, Dict, Optional, Tuple

import torch

from slipstream_rec.data.batch_ops import slice_rows
from slipstream_rec.distributed import gather_varlen
from slipstream_rec.slipstream.classify import per_sample_max_change
from slipstream_rec.slipstream.config import SlipstreamConfig
from slipstream_rec.slipstream.quality import NoQuality, QualityCheck
from slipstream_rec.slipstream.rows import RowIndex, RowState

__all__ = ["StaleThreshold", "threshold_for_target"]

logger = logging.getLogger(__name__)

_INF = float("inf")


class StaleThreshold:
    """T and the rows found stale for good (``reactivate=false``), the same on every rank."""

    def __init__(
        self, cfg: SlipstreamConfig, index: RowIndex, row_state: RowState, is_rank0: bool
    ) -> None:
        self.cfg = cfg
        self.index = index
        self.row_state = row_state
        self.is_rank0 = is_rank0
        self.value: Optional[float] = None  # None: nothing is stale
        self.info: Dict[str, Any] = {}
        # reactivate=false: the sorted flat keys of the rows found stale once (stale for good).
        self.frozen_keys = torch.zeros(0, dtype=torch.int64)
        # where this rank's bytes given to the gather of sampled values go (the controller's
        # byte meter, kind ``tracking``)
        self.meter: Callable[[int], None] = lambda nbytes: None

    def active(self, step: int) -> Optional[float]:
        """T as the data side applies it: none before ``warmup_steps``."""
        return self.value if step >= self.cfg.warmup_steps else None

    def stale_now(self, step: int) -> torch.Tensor:
        """The flat keys stale under the active threshold (none before it)."""
        t = self.active(step)
        return self.row_state.stale_keys(t) if t is not None else torch.zeros(0, dtype=torch.int64)

    def after_snapshot(
        self, stream: Any, quality: "QualityCheck | NoQuality", step: int
    ) -> Optional[Dict[str, Any]]:
        """After a snapshot that measured the hot rows' changes: pin the rows stale for good,
        check quality and choose T (when there is none yet or it is refreshed), and freeze what
        is stale now. Collective when T is chosen (all ranks). Returns the quality decision."""
        cfg = self.cfg
        if not cfg.reactivate:  # the paper: once stale, stale for the rest of training
            self.row_state.set_changes(self.frozen_keys, torch.zeros(self.frozen_keys.numel()))
        decision = None
        if self.value is None or cfg.refresh_threshold:
            decision = self._choose(stream, quality, step)
        if not cfg.reactivate and self.value is not None:
            stale = self.row_state.stale_keys(self.value)
            self.frozen_keys = torch.unique(torch.cat([self.frozen_keys, stale]))
        return decision

    def _choose(self, stream: Any, quality: "QualityCheck | NoQuality", step: int) -> Optional[Dict[str, Any]]:
        """T from upcoming inputs of every rank (collective: one gather of per-sample values);
        the quality check first moves D (collectives, ``QualityCheck.check``)."""
        assert stream is not None, "a threshold before the stream"
        cfg = self.cfg
        sample = stream.peek_upcoming(max(cfg.threshold_sample_size, quality.sample_size))
        if sample is None:
            values = torch.zeros(0)
        else:
            values = per_sample_max_change(
                slice_rows(sample, 0, min(sample.batch_size, cfg.threshold_sample_size)).sparse_features,
                self.index, self.row_state,
            )  # fmt: skip
        values = gather_varlen(values.float(), meter=self.meter)  # all ranks
        t_max, _ = threshold_for_target(values, cfg.target_skip_fraction, cfg.max_threshold)
        decision = quality.check(sample, t_max, step)  # all ranks, with the quality check
        threshold, info = threshold_for_target(values, quality.target, cfg.max_threshold)
        if info["n_sampled"] == 0 and self.value is not None:
            # The look-ahead is empty only at the end of the data: keep the last threshold.
            return decision
        self.value, self.info = float(threshold), info
        if info.get("reason") and self.is_rank0:
            logger.warning("slipstream: threshold %.3g at step %d: %s", threshold, step, info["reason"])
        return decision

    def state_dict(self) -> Dict[str, Any]:
        return {"threshold": self.value, "threshold_info": self.info, "frozen_keys": self.frozen_keys.clone()}

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        self.value = state["threshold"]
        self.info = state["threshold_info"]
        self.frozen_keys = state["frozen_keys"].clone()


def threshold_for_target(
    max_changes: torch.Tensor, target: float, max_threshold: float
) -> Tuple[float, Dict[str, Any]]:
    """Threshold T so that about ``target`` of the hot sampled inputs have max change < T.

    ``max_changes``: per-sample max change of a sample of upcoming inputs (``per_sample_max_change``;
    +inf = touches a non-hot row). Among the n_hot finite values, with k = ceil(target * n_hot),
    T is the next float32 above the k-th smallest value, so at least k (more only with ties) hot
    inputs are below T -- the closest achievable fraction that does not go under ``target``.
    Then T = min(T, max_threshold).

    Returns (T, info). T is 0.0 when nothing can be skipped (changes are >= 0, so nothing is
    stale at T = 0) and ``info["reason"]`` then says why; otherwise ``info["reason"]`` is None.
    info keys: n_sampled, n_hot, target, k, threshold, uncapped_threshold, capped,
    achieved_hot_fraction (hot inputs below T / n_hot), achieved_fraction (all sampled inputs
    below T / n_sampled), reason.
    """
    target_f = float(target)
    if not (0.0 <= target_f <= 1.0):  # also rejects NaN
        raise ValueError(
            f"slipstream.target_skip_fraction must be in [0, 1] (fraction of hot upcoming inputs "
            f"to make skippable), got {target!r}"
        )
    cap = float(max_threshold)
    if not (cap >= 0.0):  # also rejects NaN
        raise ValueError(
            f"slipstream.max_threshold must be >= 0 (upper bound on the staleness threshold; "
            f"inf = no cap), got {max_threshold!r}"
        )
    values = torch.as_tensor(max_changes).detach().reshape(-1).to(torch.float32)
    if bool(torch.isnan(values).any()):
        raise ValueError("threshold_for_target: max_changes contains NaN")
    n_sampled = int(values.numel())
    hot = values[torch.isfinite(values)]
    n_hot = int(hot.numel())
    info: Dict[str, Any] = {
        "n_sampled": n_sampled,
        "n_hot": n_hot,
        "target": target_f,
        "k": 0,
        "threshold": 0.0,
        "uncapped_threshold": 0.0,
        "capped": False,
        "achieved_hot_fraction": 0.0,
        "achieved_fraction": 0.0,
        "reason": None,
    }
    if n_sampled == 0:
        info["reason"] = "no upcoming inputs were sampled (empty look-ahead)"
        return 0.0, info
    if n_hot == 0:
        info["reason"] = f"none of the {n_sampled} sampled inputs is hot (all touch a non-hot row)"
        return 0.0, info
    if target_f == 0.0:
        info["reason"] = "slipstream.target_skip_fraction is 0"
        return 0.0, info
    # k-th smallest with k = ceil(target * n_hot); the 1e-9 absorbs float error in the product
    # (0.3 * 10 = 3.0000000000000004 must give 3, not 4).
    k = min(n_hot, max(1, math.ceil(target_f * n_hot - 1e-9)))
    kth = torch.kthvalue(hot, k).values
    uncapped = float(torch.nextafter(kth, torch.tensor(_INF, dtype=torch.float32)))
    threshold = min(uncapped, cap)
    below = int((hot < threshold).sum())  # same float32 comparison as RowState.stale_mask
    info.update(
        k=k,
        threshold=threshold,
        uncapped_threshold=uncapped,
        capped=uncapped > cap,
        achieved_hot_fraction=below / n_hot,
        achieved_fraction=below / n_sampled,
    )
    if below == 0:
        info["reason"] = (
            f"slipstream.max_threshold={cap} binds below every hot input's max change "
            f"(smallest {float(hot.min())}): nothing is skippable"
        )
    return threshold, info
