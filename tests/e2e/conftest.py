"""Process fixtures of the end-to-end tests.

Each test gets a :class:`~tests.e2e.harness.Cluster` on the session's Redis (embedded,
or ``STREAMWORKS_TEST_REDIS_URL``) with a key prefix of its own; the processes it
starts are killed at teardown, before the prefix's keys are deleted, and the tail of
every process's log is printed (pytest shows it when the test fails).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from streamworks.settings import Settings
from streamworks.testing.acl import open_role_users
from tests.e2e.harness import Cluster


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Run the demo (the newcomer's path) after the other end-to-end tests."""
    demo = [i for i in items if i.nodeid.startswith("tests/e2e/test_demo.py")]
    if demo:
        rest = [i for i in items if i not in demo]
        last_e2e = max(
            (n for n, i in enumerate(rest) if i.nodeid.startswith("tests/e2e/")), default=None
        )
        at = len(rest) if last_e2e is None else last_e2e + 1
        items[:] = rest[:at] + demo + rest[at:]


@pytest.fixture
async def cluster(
    settings: Settings,
    redis: Any,
    tmp_path: Path,
    streamworks_acl: bool,
    request: pytest.FixtureRequest,
) -> AsyncIterator[Cluster]:
    """Processes on the test's Redis and key prefix (``redis`` cleans the prefix after
    they are all dead). With ``--redis-acl`` coordinators, workers and producers log in
    as their role's ACL user, and a command Redis refused them fails the test."""
    async with contextlib.AsyncExitStack() as stack:
        role_urls: dict[str, str] = {}
        if streamworks_acl:
            provoked = request.node.get_closest_marker("acl_refused") is not None
            users = await stack.enter_async_context(
                open_role_users(
                    redis, settings.redis_url, settings.key_prefix, check_log=not provoked
                )
            )
            role_urls = dict(users.urls)
        procs = Cluster(settings.redis_url, settings.key_prefix, tmp_path, role_urls=role_urls)
        try:
            yield procs
        finally:
            procs.kill_all()
            print(procs.report())
