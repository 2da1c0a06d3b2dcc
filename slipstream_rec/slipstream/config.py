"""Slipstream policy configuration (the stale-embedding skipping method, arXiv 2404.04270)."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum


class Policy(Enum):
    """Which Slipstream behaviour runs. ``off`` is a policy, not a separate code path."""

    off = "off"  # nothing tracked, nothing skipped: the baseline


@dataclass
class SlipstreamConfig:
    """Selects and tunes the Slipstream policy."""

    # off: plain TorchRec training through the same sharder, pipeline and loop.
    policy: Policy = Policy.off
