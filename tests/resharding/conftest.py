"""Fixtures of the live-resharding tests: the process harness of ``tests/e2e`` (its
``cluster`` fixture: coordinators and workers as real subprocesses, killed at
teardown, logs printed)."""

from __future__ import annotations

from tests.e2e.conftest import cluster

__all__ = ("cluster",)
