"""The random control of a finished run: the overrides that make ``slipstream=random`` skip like it.

A staleness policy's selection is worth something only if it beats skipping the same number of
samples uniformly at random, starting at the same step. The control of a run therefore starts
skipping at the run's ``first_skip_step`` (``slipstream.warmup_steps``: the early steps shape much
of where training goes) and then skips at the rate that gives the run's skip count over the
samples seen from that step on, so the two runs see and train the same numbers of samples.
"""

from __future__ import annotations

from typing import Any, List, Mapping


def random_control_overrides(summary: Mapping[str, Any]) -> List[str]:
    """Hydra overrides for ``slipstream=random`` from a run's ``summary.json`` contents."""
    first = summary.get("first_skip_step")
    skipped = int(summary.get("samples_skipped") or 0)
    if first is None or skipped == 0:
        raise ValueError(
            f"the reference run skipped nothing (policy {summary.get('policy')!r}, skip fraction "
            f"{summary.get('skip_fraction')}): there is no skip fraction for a random control to match"
        )
    global_batch = int(summary["samples_trained"]) // max(1, int(summary["steps"]))
    # No sample was skipped before first_skip_step, so every sample seen before it was trained.
    seen_after = int(summary["samples_seen"]) - int(first) * global_batch
    rate = skipped / max(1, seen_after)
    if not 0 < rate < 1:
        raise ValueError(f"random control: a skip rate of {rate} after step {first} cannot be matched")
    return [f"slipstream.warmup_steps={int(first)}", f"slipstream.random_skip_fraction={rate:.6f}"]
