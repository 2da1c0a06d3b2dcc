"""What the method takes from outside the package, as interfaces (no import of the layers above).

``Downsampling``: negative downsampling (training/downsampling.py) acts on the data side
before the policy decides, so the controller's ``on_host_batch`` draws its drop mask first and
``wrap`` lets it choose its rate from the first look-ahead; the trainer owns the rest of it (its
guard, its calibration, its summary).
"""

from __future__ import annotations

from typing import Any, Dict, Optional, Protocol

import torch

__all__ = ["Downsampling", "NO_DOWNSAMPLING", "NoDownsampling"]


class Downsampling(Protocol):
    decided: bool  # the rate is known (set, or chosen once by the rule)

    def drop_mask(self, labels: torch.Tensor) -> Optional[torch.Tensor]:
        """Bool (B,): the non-clicks dropped from a batch; None when none is."""

    def choose_from_labels(self, labels: Optional[torch.Tensor], step: int) -> Optional[Dict[str, Any]]:
        """The rate from the upcoming labels (collective, once, while not ``decided``)."""


class NoDownsampling:
    """Every non-click trained."""

    decided = True

    def drop_mask(self, labels: torch.Tensor) -> None:
        return None

    def choose_from_labels(self, labels: Optional[torch.Tensor], step: int) -> None:
        return None


NO_DOWNSAMPLING = NoDownsampling()  # stateless: one instance serves every controller without one
