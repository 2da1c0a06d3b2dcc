"""Counting each shard's lookups on the sampled steps: where the hot rows are found.

Each rank sees, after the input all-to-all, exactly the lookups that hit the table shards it
holds (``sharding/sharded.py``). TorchRec's post-lookup hook (``register_post_lookup_tracker_fn``
of its sharded module) hands each sharding group's post-all-to-all KJT to ``count_lookups``
right after the group's lookup, in training and evaluation alike; it counts only while
``counting`` is set (the schedule's counted steps) and the module trains. The group is found by
the KJT's keys, which are its units' features in KJT order. Local: no collective.
"""

from __future__ import annotations

from typing import Any, Dict, List, Tuple

import torch

from slipstream_rec.sharding.sharded import ShardUnit
from slipstream_rec.timing import timed

__all__ = ["LookupCounter"]

Groups = Dict[Tuple[str, ...], List[ShardUnit]]


class LookupCounter:
    """Adds the lookups of the counted steps to every local shard's sparse counts (``ShardUnit``
    ``add_counts``)."""

    def __init__(self, modules: List[Any]) -> None:
        self.counting = False  # set on the sampled counting steps
        self.seconds = 0.0  # host seconds counting (Slipstream's own work)
        self._groups: Dict[int, Groups] = {}  # per module, built at its first count
        for module in modules:
            module.register_post_lookup_tracker_fn(self._on_lookup)

    def _on_lookup(self, features: Any, _embs: Any, module: Any, _grad: Any) -> None:
        if self.counting and module.training:
            self.count_lookups(module, features)

    @torch.no_grad()
    def count_lookups(self, module: Any, features: Any) -> None:
        """Add one sharding group's lookups (its post-all-to-all KJT) to its local shards' sparse
        counts: a sort of the step's ids, so the cost follows the lookups and the memory the
        distinct rows looked up."""
        with timed(self, "seconds"):
            keys = tuple(features.keys())
            if id(module) not in self._groups:
                self._groups[id(module)] = groups_by_keys(module.units)
            units = self._groups[id(module)].get(keys)
            assert units is not None or not keys, f"a sharding group's keys {keys} match no local shard"
            if units:
                parts = torch.split(features.values(), features.length_per_key())  # feature-major
                for unit in units:
                    unit.add_counts(parts[unit.position])


def groups_by_keys(units: List[ShardUnit]) -> Groups:
    """A module's units by sharding group, each group keyed by its post-all-to-all KJT's keys
    (the units' features in position order), as the post-lookup hook sees the group."""
    by_group: Dict[int, List[ShardUnit]] = {}
    for unit in units:
        by_group.setdefault(unit.group, []).append(unit)
    out: Groups = {}
    for members in by_group.values():
        members.sort(key=lambda u: u.position)
        assert [u.position for u in members] == list(range(len(members))), "one unit per KJT key"
        keys = tuple(u.feature for u in members)
        assert keys not in out, f"two sharding groups look up the same features {keys}"
        out[keys] = members
    return out
