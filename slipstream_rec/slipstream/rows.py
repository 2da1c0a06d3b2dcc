"""One flat key space over all embedding rows, and the per-row "change" state Slipstream tracks.

Every sparse feature has its own table (``num_embeddings[f]`` rows, ids are global row ids of that
table). A (feature, row) pair maps to the flat key ``offsets[f] + row`` with ``offsets`` the
exclusive cumsum of ``num_embeddings``: one key space over all tables, in which the per-row state
of the hot rows is kept sparse (sorted keys), so it grows with the hot set, not the tables.
"""

from __future__ import annotations

from typing import Dict, List, Optional, Sequence, Tuple, Union

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
        self.offset_list: List[int] = self.offsets.tolist()  # read once, not per call
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
            lo_hi = torch.stack(torch.aminmax(rows)).tolist() if rows.numel() else [0, 0]  # one read
            if not (0 <= lo_hi[0] and lo_hi[1] < size):
                raise ValueError(
                    f"RowIndex.to_flat: rows of feature {self.feature_names[feature_idx]!r} "
                    f"outside [0, {size})"
                )
            return rows + self.offset_list[feature_idx]
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
    """The change of every hot row, in O(hot rows): sorted flat ``keys`` and their ``values``.

    A row not in ``keys`` has change +inf (not hot / unknown). A row is *stale* for a threshold
    T iff ``change < T`` (strict), so an +inf row is never stale. Changes are magnitudes: finite
    values must be >= 0 (so T = 0 makes nothing stale).

    Lookups (``lookup_changes``) go through a per-table view rebuilt when the state changes: a
    dense float32 vector for a table whose rows are few next to its hot rows (at most
    ``DENSE_ROWS_PER_HOT_ROW`` per hot row) or small (``DENSE_SMALL_BYTES`` in all, smallest
    tables first): an index_select per lookup; the table's sorted hot keys otherwise: a binary
    search per lookup. So the memory stays O(hot rows) plus a constant, whatever the total rows.
    """

    DENSE_ROWS_PER_HOT_ROW = 16  # a dense view costs at most 16 * 4 bytes per hot row
    DENSE_SMALL_BYTES = 8 << 20  # small tables: dense below this total, whatever their hot rows

    def __init__(self, num_rows: int, index: Optional[RowIndex] = None) -> None:
        # num_rows: size of the flat key space (RowIndex.num_rows).
        # index: the tables' layout, for the per-table lookup view (None: one table).
        if num_rows < 0:
            raise ValueError(f"RowState: num_rows must be >= 0, got {num_rows}")
        if index is not None and index.num_rows != num_rows:
            raise ValueError(f"RowState: num_rows {num_rows} but the index has {index.num_rows}")
        self._num_rows = int(num_rows)
        self._bounds = (
            torch.cat([index.offsets, torch.tensor([index.num_rows])])
            if index is not None
            else torch.tensor([0, self._num_rows], dtype=torch.int64)
        )
        self.keys: torch.Tensor = torch.zeros(0, dtype=torch.int64)  # sorted, unique
        self.values: torch.Tensor = torch.zeros(0, dtype=torch.float32)  # change of each key
        # version: bumped on every mutation, so callers can cache things derived from the state.
        self.version: int = 0
        self._view_version = -1
        self._dense: Dict[int, torch.Tensor] = {}  # table -> (rows,) float32 change
        self._sparse: Dict[int, Tuple[torch.Tensor, torch.Tensor]] = {}  # table -> (rows, values)

    @property
    def num_rows(self) -> int:
        return self._num_rows

    @property
    def num_hot(self) -> int:
        return int(self.keys.numel())

    def nbytes(self) -> int:
        """Bytes held: the keys and values plus the lookup view (when built)."""
        view = sum(t.numel() * t.element_size() for t in self._dense.values())
        view += sum(r.numel() * 8 + v.numel() * 4 for r, v in self._sparse.values())
        return int(self.keys.numel() * 8 + self.values.numel() * 4 + view)

    def _check(self, keys: torch.Tensor, values: torch.Tensor) -> None:
        if keys.numel() and (int(keys.min()) < 0 or int(keys.max()) >= self._num_rows):
            raise ValueError(f"RowState.set_changes: keys outside [0, {self._num_rows})")
        if bool(torch.isnan(values).any()) or bool((values < 0).any()):
            raise ValueError("RowState.set_changes: change values must be >= 0 or +inf (no NaN)")

    def set_changes(self, keys: torch.Tensor, values: torch.Tensor) -> None:
        """Overwrite the change of flat ``keys`` with ``values`` (+inf: no longer hot); all other
        rows untouched. Values must be >= 0 or +inf (NaN and negatives are rejected); with
        duplicate keys one of the writes wins (unspecified, avoid duplicates)."""
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
        self._check(keys, values)
        # New values first, so that unique's first occurrence (stable sort) is the new one.
        all_keys = torch.cat([keys, self.keys])
        all_values = torch.cat([values, self.values])
        order = torch.sort(all_keys, stable=True).indices
        sorted_keys = all_keys[order]
        first = torch.ones(sorted_keys.numel(), dtype=torch.bool)
        first[1:] = sorted_keys[1:] != sorted_keys[:-1]
        merged_keys, merged_values = sorted_keys[first], all_values[order][first]
        keep = torch.isfinite(merged_values)
        self.keys, self.values = merged_keys[keep].contiguous(), merged_values[keep].contiguous()
        self.version += 1

    def replace(self, keys: torch.Tensor, values: torch.Tensor) -> None:
        """The whole state at once: ``keys`` sorted and unique, their finite ``values``."""
        keys = torch.as_tensor(keys, dtype=torch.int64).reshape(-1)
        values = torch.as_tensor(values, dtype=torch.float32).reshape(-1)
        assert keys.numel() == values.numel()
        assert keys.numel() < 2 or bool((keys[1:] > keys[:-1]).all()), "keys must be sorted, unique"
        self._check(keys, values)
        keep = torch.isfinite(values)
        self.keys, self.values = keys[keep].clone(), values[keep].clone()
        self.version += 1

    def reset(self) -> None:
        """Every row back to +inf (not hot)."""
        self.keys = torch.zeros(0, dtype=torch.int64)
        self.values = torch.zeros(0, dtype=torch.float32)
        self.version += 1

    def stale_keys(self, threshold: float) -> torch.Tensor:
        """Sorted flat keys with ``change < threshold`` (strict, compared in float32)."""
        return self.keys[self.values < float(threshold)]

    def changes_of(self, keys: torch.Tensor) -> torch.Tensor:
        """The change of each flat key (any shape, any order): +inf for rows not hot."""
        keys = torch.as_tensor(keys, dtype=torch.int64)
        out = torch.full(keys.shape, float("inf"), dtype=torch.float32)
        if self.keys.numel() == 0 or keys.numel() == 0:
            return out
        pos = torch.searchsorted(self.keys, keys).clamp_(max=self.keys.numel() - 1)
        hit = self.keys[pos] == keys
        return torch.where(hit, self.values[pos], out)

    def lookup_changes(self, index: RowIndex, kjt: KeyedJaggedTensor) -> torch.Tensor:
        """The change of every lookup of ``kjt``, in KJT value order (as ``index.flat_keys``)."""
        self._build_view()
        values = kjt.values()
        if values.numel() == 0:
            return torch.zeros(0, dtype=torch.float32)
        if self._bounds.numel() == 2:  # built without an index: one table over all flat keys
            feats, parts = [0], [index.flat_keys(kjt)]
        else:
            feats = index.feature_indices(kjt.keys()).tolist()
            parts = list(torch.split(values, kjt.length_per_key()))
        out = []
        for f, ids in zip(feats, parts):
            ids = ids.to(torch.int64)
            dense = self._dense.get(f)
            if dense is not None:
                out.append(dense.index_select(0, ids))
                continue
            rows, vals = self._sparse[f]
            change = torch.full(ids.shape, float("inf"), dtype=torch.float32)
            if rows.numel() and ids.numel():
                pos = torch.searchsorted(rows, ids).clamp_(max=rows.numel() - 1)
                change = torch.where(rows[pos] == ids, vals[pos], change)
            out.append(change)
        return torch.cat(out)

    def _build_view(self) -> None:
        if self._view_version == self.version:
            return
        bounds = self._bounds
        cuts = torch.searchsorted(self.keys, bounds).tolist()
        starts = bounds.tolist()
        sizes = (bounds[1:] - bounds[:-1]).tolist()
        small_left = self.DENSE_SMALL_BYTES
        self._dense, self._sparse = {}, {}
        for t in sorted(range(len(sizes)), key=lambda i: sizes[i]):
            lo, hi = cuts[t], cuts[t + 1]
            rows = self.keys[lo:hi] - starts[t]
            dense = sizes[t] <= self.DENSE_ROWS_PER_HOT_ROW * (hi - lo)
            if not dense and sizes[t] * 4 <= small_left:
                dense, small_left = True, small_left - sizes[t] * 4
            if dense:
                vec = torch.full((sizes[t],), float("inf"), dtype=torch.float32)
                vec[rows] = self.values[lo:hi]
                self._dense[t] = vec
            else:
                self._sparse[t] = (rows, self.values[lo:hi])
        self._view_version = self.version

    def state_dict(self) -> Dict[str, torch.Tensor]:
        return {"num_rows": torch.tensor(self._num_rows), "keys": self.keys.clone(), "values": self.values.clone()}

    def load_state_dict(self, state: Dict[str, torch.Tensor]) -> None:
        self.replace(state["keys"], state["values"])
