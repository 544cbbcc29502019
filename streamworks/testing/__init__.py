"""In-process test mode: real workers (and coordinator) against a real Redis."""

from __future__ import annotations

from streamworks.testing.embedded import EmbeddedRedis as EmbeddedRedis
from streamworks.testing.runtime import DeadLetter as DeadLetter
from streamworks.testing.runtime import TestRuntime as TestRuntime

__all__ = ("DeadLetter", "EmbeddedRedis", "TestRuntime")
