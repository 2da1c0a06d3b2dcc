"""The ``image`` marker: tests that build a container image (tools/image_check.py)."""

from __future__ import annotations

import pytest


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "image: builds a container image with docker or podman (slow; skipped where no engine can be had)",
    )
