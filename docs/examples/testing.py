"""Testing with the pytest plugin's ``streamworks_runtime`` fixture.

Run with pytest: the plugin is registered by installing streamworks.
"""

from __future__ import annotations

from collections.abc import Callable

import anyio

from streamworks import App, Message, Retry, RetryPolicy
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


reminders = App("reminders")
reminders.stream("invoices", shards=1)
reminded: list[int] = []


@reminders.handler("invoices")
async def remind(invoice: dict[str, str], msg: Message) -> None:
    if msg.attempt == 1:
        raise Retry(delay=3600)  # not paid yet: look again in an hour
    reminded.append(msg.attempt)


async def test_reminder_an_hour_later(streamworks_runtime: Callable[..., TestRuntime]) -> None:
    async with streamworks_runtime(reminders) as rt:
        await reminders.publish("invoices", {"id": "inv-1"})
        await wait_parked(rt, "invoices")
        assert reminded == []
        await rt.advance(seconds=3601)  # the hour passes at once
        await rt.wait_idle(timeout=5)
        assert reminded == [2]


async def wait_parked(rt: TestRuntime, stream: str) -> None:
    """Until the first attempt has failed and its retry is scheduled."""
    with anyio.fail_after(5):
        while rt.statistics(stream).get("retried", 0) < 1:  # noqa: ASYNC110 - a counter
            await anyio.sleep(0.01)
