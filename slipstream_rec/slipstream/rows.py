"""One flat key space over all embedding rows, and the per-row "change" state Slipstream tracks.

Every sparse feature has its own table (``num_embeddings[f]`` rows, ids are global row ids of that
table). A (feature, row) pair maps to the flat key ``offsets[f] + row`` with ``offsets`` the
exclusive cumsum of ``num_embeddings``, so per-row state for all tables lives in one tensor.
"""

from __future__ import annotations

from typing import List, Sequence, Tuple, Union

import torch
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

__all__ = ["RowIndex", "RowState"]


class RowIndex:
    """Maps (feature, global row id) to one flat key in ``[0, num_rows)``."""

    def __init__(self, feature_names: Sequence[str], num_embeddings: Sequence[int]) -> None:
        # feature_names: the KJT keys, one table per feature (order defines the flat layout).
        # num_embeddings: rows of each feature's table (ids of feature f are < num_embeddings[f]).
        names = [str(n) for n in feature_names]
        nums = [int(n) for n in num_embeddings]
        if len(names) != len(nums):
            raise ValueError(
                f"RowIndex: {len(names)} feature_names but {len(nums)} num_embeddings; need one "
                f"table size per feature"
            )
        if len(set(names)) != len(names):
            raise ValueError(f"RowIndex: duplicate feature names in {names}")
        if any(n < 1 for n in nums):
            raise ValueError(f"RowIndex: every num_embeddings entry must be >= 1, got {nums}")
        self.feature_names: List[str] = names
        self.num_embeddings: List[int] = nums
        sizes = torch.tensor(nums, dtype=torch.int64)
        # offsets[f]: flat key of row 0 of feature f (exclusive cumsum); bounds[f] = offsets[f+1].
        self.offsets: torch.Tensor = torch.cumsum(sizes, 0) - sizes
        self._bounds = torch.cumsum(sizes, 0)
        self._sizes = sizes
        self._position = {n: i for i, n in enumerate(names)}
        self._key_cache: Tuple[Tuple[str, ...], torch.Tensor] = ((), torch.empty(0, dtype=torch.int64))

    @property
    def num_features(self) -> int:
        return len(self.feature_names)

    @property
    def num_rows(self) -> int:
        """Total rows over all tables (size of the flat key space)."""
        return int(self._bounds[-1]) if self.feature_names else 0

    def feature_indices(self, keys: Sequence[str]) -> torch.Tensor:
        """Feature index (position in ``feature_names``) of each KJT key, as an int64 tensor."""
        keys_t = tuple(keys)
        if keys_t == self._key_cache[0]:
            return self._key_cache[1]
        try:
            idx = torch.tensor([self._position[k] for k in keys_t], dtype=torch.int64)
        except KeyError as e:
            raise ValueError(
                f"RowIndex: KJT key {e.args[0]!r} is not one of the indexed features "
                f"{self.feature_names}"
            ) from None
        self._key_cache = (keys_t, idx)
        return idx

    def to_flat(self, feature_idx: Union[int, torch.Tensor], rows: torch.Tensor) -> torch.Tensor:
        """Flat keys of ``rows`` of feature ``feature_idx`` (an int, or a tensor broadcast with rows)."""
        rows = torch.as_tensor(rows, dtype=torch.int64)
        if isinstance(feature_idx, int):
            if not 0 <= feature_idx < self.num_features:
                raise ValueError(f"RowIndex.to_flat: feature_idx {feature_idx} out of range")
            size = self.num_embeddings[feature_idx]
            if rows.numel() and (int(rows.min()) < 0 or int(rows.max()) >= size):
                raise ValueError(
                    f"RowIndex.to_flat: rows of feature {self.feature_names[feature_idx]!r} "
                    f"outside [0, {size})"
                )
            return rows + int(self.offsets[feature_idx])
        feature_idx = torch.as_tensor(feature_idx, dtype=torch.int64)
        if rows.numel() and bool(((rows < 0) | (rows >= self._sizes[feature_idx])).any()):
            raise ValueError("RowIndex.to_flat: rows outside their feature's table")
        return rows + self.offsets[feature_idx]

    def from_flat(self, keys: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        """Inverse of ``to_flat``: (feature_idx, row) int64 tensors of the same shape as ``keys``."""
        keys = torch.as_tensor(keys, dtype=torch.int64)
        if keys.numel() and (int(keys.min()) < 0 or int(keys.max()) >= self.num_rows):
            raise ValueError(f"RowIndex.from_flat: keys outside [0, {self.num_rows})")
        feature_idx = torch.bucketize(keys, self._bounds, right=True)
        return feature_idx, keys - self.offsets[feature_idx]

    def flat_keys(self, kjt: KeyedJaggedTensor, validate: bool = False) -> torch.Tensor:
        """Flat key of every lookup of ``kjt``, in KJT value order (feature-major), int64.

        ``validate`` checks every id is inside its table (one extra pass; off in the hot path).
        """
        values = kjt.values()
        feat = self.feature_indices(kjt.keys())
        if values.numel() == 0:
            return values.to(torch.int64)
        num_keys = feat.numel()
        stride = kjt.stride()
        per_key = _per_key_lengths(kjt, num_keys)
        if bool((per_key == stride).all()):
            # Each key holds exactly `stride` values (e.g. one id per sample): a broadcast add
            # over a (F, B) view, no per-lookup feature index needed.
            base = self.offsets.index_select(0, feat).view(-1, 1)
            keys = values.reshape(num_keys, stride).to(torch.int64) + base
            keys = keys.view(-1)
            if validate:
                self._validate(values.reshape(num_keys, stride), feat.view(-1, 1))
            return keys
        lookup_feat = torch.repeat_interleave(feat, per_key)
        keys = values.to(torch.int64) + self.offsets.index_select(0, lookup_feat)
        if validate:
            self._validate(values, lookup_feat)
        return keys

    def _validate(self, values: torch.Tensor, feat: torch.Tensor) -> None:
        bad = (values < 0) | (values >= self._sizes[feat])
        if bool(bad.any()):
            f = int(feat.expand_as(values)[bad].view(-1)[0])
            raise ValueError(
                f"RowIndex.flat_keys: feature {self.feature_names[f]!r} has ids outside "
                f"[0, {self.num_embeddings[f]})"
            )


def _per_key_lengths(kjt: KeyedJaggedTensor, num_keys: int) -> torch.Tensor:
    """Number of values of each key (int64), from lengths (uniform stride required)."""
    if kjt.variable_stride_per_key():
        raise ValueError("variable-stride KJTs are not supported by slipstream")
    lengths = kjt.lengths()
    if num_keys == 0:
        return torch.zeros(0, dtype=torch.int64)
    return lengths.view(num_keys, -1).sum(1, dtype=torch.int64)


class RowState:
    """Per flat row: ``change`` (float32), +inf = not hot / unknown; finite = a hot row's change.

    A row is *stale* for a threshold T iff ``change < T`` (strict), so an +inf row is never stale.
    Changes are magnitudes: finite values must be >= 0 (so T = 0 makes nothing stale).
    """

    def __init__(self, num_rows: int) -> None:
        # num_rows: size of the flat key space (RowIndex.num_rows).
        if num_rows < 0:
            raise ValueError(f"RowState: num_rows must be >= 0, got {num_rows}")
        self.change: torch.Tensor = torch.full((int(num_rows),), float("inf"), dtype=torch.float32)
        # version: bumped on every mutation, so callers can cache things derived from the state.
        self.version: int = 0

    @property
    def num_rows(self) -> int:
        return int(self.change.numel())

    def set_changes(self, keys: torch.Tensor, values: torch.Tensor) -> None:
        """Overwrite ``change`` at flat ``keys`` with ``values``; all other rows untouched.

        Values must be >= 0 or +inf (NaN and negatives are rejected); with duplicate keys the
        last write wins as in ``index_put_`` (unspecified order, avoid duplicates).
        """
        keys = torch.as_tensor(keys, dtype=torch.int64).reshape(-1)
        values = torch.as_tensor(values, dtype=torch.float32).reshape(-1)
        if values.numel() != keys.numel():
            if values.numel() != 1:
                raise ValueError(
                    f"RowState.set_changes: {keys.numel()} keys but {values.numel()} values"
                )
            values = values.expand(keys.numel())
        if keys.numel() == 0:
            return
        if int(keys.min()) < 0 or int(keys.max()) >= self.num_rows:
            raise ValueError(f"RowState.set_changes: keys outside [0, {self.num_rows})")
        if bool(torch.isnan(values).any()) or bool((values < 0).any()):
            raise ValueError("RowState.set_changes: change values must be >= 0 or +inf (no NaN)")
        self.change.index_put_((keys,), values)
        self.version += 1

    def reset(self) -> None:
        """Every row back to +inf (not hot)."""
        self.change.fill_(float("inf"))
        self.version += 1

    def stale_mask(self, threshold: float) -> torch.Tensor:
        """Bool (num_rows,): ``change < threshold`` (strict, compared in float32)."""
        return self.change < float(threshold)

    @property
    def hot_mask(self) -> torch.Tensor:
        """Bool (num_rows,): rows with a finite change (currently tracked as hot)."""
        return torch.isfinite(self.change)

    @property
    def num_hot(self) -> int:
        return int(self.hot_mask.sum())
