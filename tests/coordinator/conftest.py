"""Coordinator tests: every test's key prefix is cleaned up afterwards."""

from __future__ import annotations

from typing import Any

import pytest


@pytest.fixture(autouse=True)
def _clean_prefix(redis: Any) -> None:
    """Depend on ``redis``, whose teardown deletes every key of the test's prefix (the
    one the ``settings`` fixture gives raw coordinator services)."""
