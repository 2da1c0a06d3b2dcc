"""Weighted draws for the click-log world, vectorized by inverse CDF: Zipf-like weights, groups
that are never empty, and ``GroupedSampler`` ("a member of group g, by weight", for many rows at
once), the one primitive every entity draw in world.py uses.
"""

from __future__ import annotations

from typing import Optional

import numpy as np

__all__ = [
    "zipf_weights", "ranked_weights", "apportion", "assign_all", "draw", "GroupedSampler", "single",
]  # fmt: skip

# Guide-table buckets per member of a GroupedSampler (more: fewer fallback searches, more memory).
GUIDE_BUCKETS_PER_MEMBER = 4


def zipf_weights(n: int, s: float, rng: np.random.Generator) -> np.ndarray:
    """Weights k^-s over a random assignment of the ranks 1..n to the n items."""
    return (rng.permutation(n) + 1.0) ** -s


def ranked_weights(sizes: np.ndarray, s: float) -> np.ndarray:
    """Within each contiguous group of ``sizes``, weights 1^-s, 2^-s, ... (first is the head)."""
    starts = np.repeat(np.cumsum(sizes) - sizes, sizes)
    return (np.arange(int(sizes.sum())) - starts + 1.0) ** -s


def apportion(total: int, weights: np.ndarray) -> np.ndarray:
    """``total`` split over len(weights) groups proportionally, every group at least 1."""
    n = len(weights)
    assert total >= n, (total, n)
    share = weights / weights.sum() * (total - n)
    out = np.floor(share).astype(np.int64)
    rest = total - n - int(out.sum())
    out[np.argsort(-(share - out), kind="stable")[:rest]] += 1  # largest remainders
    return out + 1


def assign_all(n: int, groups: int, weights: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Group of each of ``n`` items: the first ``groups`` items one per group (no empty group),
    the others drawn by ``weights``."""
    assert n >= groups, (n, groups)
    out = np.empty(n, dtype=np.int64)
    out[:groups] = rng.permutation(groups)
    out[groups:] = draw(weights, rng.random(n - groups))
    return rng.permutation(out)


def draw(weights: np.ndarray, u: np.ndarray) -> np.ndarray:
    """Indices drawn by ``weights`` for the uniforms ``u`` (inverse CDF)."""
    cdf = np.cumsum(weights, dtype=np.float64)
    cdf /= cdf[-1]
    return np.minimum(np.searchsorted(cdf, u, side="right"), len(weights) - 1)


class GroupedSampler:
    """Draws a member of a given group by weight, for many (group, uniform) pairs at once.

    All members' CDFs are stacked into one array: group g's members occupy the values (g, g+1],
    so ``searchsorted(cdf, g + u)`` finds the member of g for the uniform u in one call.
    Zero-weight members are never drawn; a group must have a positive total weight to be asked.
    """

    def __init__(self, group_of: np.ndarray, num_groups: int) -> None:
        self.order = np.argsort(group_of, kind="stable")
        self.groups = group_of[self.order]
        bounds = np.searchsorted(self.groups, np.arange(num_groups + 1))
        self.starts, self.ends = bounds[:-1], bounds[1:]
        self.cdf = np.empty(len(group_of))
        self.totals = np.zeros(num_groups)
        self.num_groups = num_groups

    def set_weights(self, weights: np.ndarray) -> "GroupedSampler":
        """Weights per member (in the members' original order); returns self."""
        w = weights[self.order].astype(np.float64)
        cum = np.concatenate([[0.0], np.cumsum(w)])
        base = cum[self.starts]
        self.totals = cum[self.ends] - base
        total = self.totals[self.groups]
        within = (cum[1:] - base[self.groups]) / np.where(total > 0, total, 1.0)
        np.clip(within, 0.0, 1.0, out=within)
        within[total <= 0] = 1.0
        last = self.ends[self.ends > self.starts] - 1
        within[last] = 1.0  # exact upper end of every group despite rounding
        np.add(self.groups, within, out=self.cdf)
        # Guide table (indexed search): bucket b of [0, num_groups) starts at the first member
        # whose cdf exceeds the bucket's left edge, usually the answer for any x in the bucket.
        self.guide_scale = GUIDE_BUCKETS_PER_MEMBER * len(self.cdf) / self.num_groups
        edges = np.arange(GUIDE_BUCKETS_PER_MEMBER * len(self.cdf)) / self.guide_scale
        self.guide = np.minimum(np.searchsorted(self.cdf, edges, side="right"),
                                len(self.cdf) - 1).astype(np.int32)
        # cdf[i - 1] with -inf before the first member: the lower end of member i's interval.
        self.cdf_prev = np.concatenate([[-np.inf], self.cdf[:-1]])
        return self

    def sample(self, groups: Optional[np.ndarray], u: np.ndarray) -> np.ndarray:
        """Members (original indices) for groups (None: the single group 0) and uniforms u.

        Exactly ``searchsorted(cdf, x, side="right")`` (the first member with cdf > x): the guide
        table's guess is kept where cdf[guess - 1] <= x < cdf[guess], the rest are searched.
        """
        x = u if groups is None else groups + u
        bucket = np.minimum((x * self.guide_scale).astype(np.int64), len(self.guide) - 1)
        idx = self.guide[bucket].astype(np.int64)
        wrong = np.flatnonzero((self.cdf[idx] <= x) | (self.cdf_prev[idx] > x))
        if wrong.size:
            idx[wrong] = np.searchsorted(self.cdf, x[wrong], side="right")
            np.minimum(idx, len(self.cdf) - 1, out=idx)
        return self.order[idx]


def single(weights: np.ndarray) -> GroupedSampler:
    return GroupedSampler(np.zeros(len(weights), dtype=np.int64), 1).set_weights(weights)
