"""Delayed messages: delay=, at=, publish_many, a producer route, dedup, TestRuntime."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import anyio

from streamworks import App, Message, Record
from streamworks.testing import TestRuntime

app = App("reminders")
app.stream("reminders", shards=2, dedup_window=7 * 86_400)
handled: list[tuple[str, int | None]] = []


@app.handler("reminders")
async def remind(text: str, msg: Message) -> None:
    handled.append((text, msg.due_at))  # due_at: when it was due (ms, Redis clock)


@app.producer("reminders", key=lambda text: text)
def reminder(text: str) -> str:
    return text


async def main() -> None:
    handled.clear()
    async with TestRuntime(app) as rt:
        # Relative: due 30 minutes after it reaches Redis (Redis clock).
        later = await app.publish("reminders", "call back", key="u-1", delay=timedelta(minutes=30))
        assert later.delayed and later.entry_id is None and later.due_ms is not None
        # Absolute: a timezone-aware instant (a naive datetime is refused).
        paris = datetime.now(ZoneInfo("Europe/Paris")) + timedelta(hours=1)
        await app.publish("reminders", "standup", key="u-2", at=paris)
        # A batch, and a producer route: delay=/at= are keyword-only on its call.
        await app.publish_many("reminders", [Record("renew", key="u-3", delay=7200)])
        await reminder("check in", delay=timedelta(hours=3))
        # Dedup by event id: a retried publish is one message, waiting or delivered.
        first = await app.publish("reminders", "pay", event_id="inv-7", delay=60)
        again = await app.publish("reminders", "pay", event_id="inv-7", delay=60)
        assert again.duplicate and again.delay_id == first.delay_id
        # In the past (or delay=0): straight into the stream.
        await app.publish("reminders", "overdue", at=datetime(2020, 1, 1, tzinfo=UTC))

        await rt.advance(seconds=3 * 3600 + 1)  # every one is due now
        with anyio.fail_after(10):
            while len(handled) < 6:  # noqa: ASYNC110 - a list filled by the handler
                await anyio.sleep(0.01)
        assert sorted(text for text, _ in handled) == sorted(
            ["overdue", "pay", "call back", "standup", "renew", "check in"]
        )


if __name__ == "__main__":
    anyio.run(main)
