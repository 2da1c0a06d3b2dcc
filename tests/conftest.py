"""Suite-wide hooks: tests marked ``gpu`` run only where torch sees a CUDA device."""

from __future__ import annotations

from typing import List

import pytest


def pytest_collection_modifyitems(config: pytest.Config, items: List[pytest.Item]) -> None:
    gpu_items = [item for item in items if item.get_closest_marker("gpu") is not None]
    if not gpu_items:
        return
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(
        reason="needs a CUDA device and nccl: torch.cuda.is_available() is False on this machine"
    )
    for item in gpu_items:
        item.add_marker(skip)
