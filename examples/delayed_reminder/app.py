"""Delayed reminders: a sign-up schedules a "finish your profile" reminder for a day
later, and a cancellation check happens when it is due, not when it was published.

``publish(..., delay=...)`` stores the reminder in its shard's slot in Redis; the
shard's owner moves it into the stream when it is due, and the handler runs then. A
retried publish of the same sign-up (same ``event_id``) is one reminder, whether the
first copy is still waiting or already delivered. Run as a service::

    streamworks worker examples.delayed_reminder.app:app

or ``python -m examples.delayed_reminder.app`` for a day compressed into a second, on
an embedded Redis (``TestRuntime.advance`` moves the clock forward).
"""

from __future__ import annotations

from datetime import timedelta

import anyio
from pydantic import BaseModel

from streamworks import App, Message
from streamworks.testing import TestRuntime

app = App("reminders")
# Dedup by event id for a week: a retried sign-up publishes no second reminder.
app.stream("reminders", shards=2, dedup_window=7 * 86_400)

completed: set[str] = set()  # users who finished their profile (stands in for a DB)
sent: list[str] = []  # reminders sent (stands in for a mailer)


class Reminder(BaseModel):
    user: str
    kind: str


@app.handler("reminders")
async def remind(reminder: Reminder, msg: Message) -> None:
    # Decide when it is due: the user may have finished meanwhile.
    if reminder.user in completed:
        return
    sent.append(reminder.user)


async def signed_up(user: str) -> None:
    """What the sign-up endpoint calls: one reminder a day later, per user."""
    await app.publish(
        "reminders",
        Reminder(user=user, kind="finish-profile"),
        key=user,
        event_id=f"finish-profile:{user}",
        delay=timedelta(days=1),
    )


async def main() -> None:
    """Three sign-ups (one retried); one user finishes the profile; a day passes."""
    completed.clear()
    sent.clear()
    async with TestRuntime(app, workers=1) as rt:
        for user in ("ada", "bob", "cy", "bob"):  # bob's sign-up retried: one reminder
            await signed_up(user)
        await anyio.sleep(0.2)
        assert sent == []  # not due yet
        completed.add("cy")
        await rt.advance(seconds=86_400)  # a day passes at once
        with anyio.fail_after(10):
            while rt.handled("reminders") < 3:  # noqa: ASYNC110 - a counter
                await anyio.sleep(0.01)
        assert sorted(sent) == ["ada", "bob"]
        print(f"reminded {sorted(sent)} a day later; cy had finished")


if __name__ == "__main__":
    anyio.run(main)
