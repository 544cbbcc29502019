"""Testing with the pytest plugin's ``streamworks_runtime`` fixture.

Run with pytest: the plugin is registered by installing streamworks.
"""

from __future__ import annotations

from collections.abc import Callable

from streamworks import App, RetryPolicy
from streamworks.testing import TestRuntime

app = App("notifications")
app.stream("signups", shards=2)
sent: list[str] = []


@app.handler("signups", retry=RetryPolicy(max_attempts=2, backoff=0.01))
async def welcome(user: dict[str, str]) -> None:
    if "@" not in user["email"]:
        raise ValueError(f"bad address {user['email']!r}")
    sent.append(user["email"])


async def test_welcome_mails(streamworks_runtime: Callable[..., TestRuntime]) -> None:
    async with streamworks_runtime(app, workers=2) as rt:
        await app.publish("signups", {"email": "ada@example.org"})
        await app.publish("signups", {"email": "nobody"})
        await rt.wait_idle(timeout=5)
        assert sent == ["ada@example.org"]
        [dead] = await rt.dead_letters("signups")
        assert "bad address" in dead.error and dead.attempts == 2
