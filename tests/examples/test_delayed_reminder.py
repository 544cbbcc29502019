"""examples/delayed_reminder runs against a real Redis and coordinator: reminders wait
a (fast-forwarded) day, a retried sign-up sends one, a completed profile none."""

from __future__ import annotations

import pytest

from examples.delayed_reminder import app as reminder


async def test_delayed_reminder(
    streamworks_redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("STREAMWORKS_TEST_REDIS_URL", streamworks_redis_url)
    await reminder.main()
    assert sorted(reminder.sent) == ["ada", "bob"]
