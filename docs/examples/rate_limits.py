"""Rate limits: 20 calls per second for the whole group, and 2 per second per customer."""

from __future__ import annotations

import time

import anyio
from pydantic import BaseModel

from streamworks import App, Message, RateLimit, Record
from streamworks.testing import TestRuntime

app = App("notifier")
app.stream("sms", shards=4)
app.stream("emails", shards=2)


class Sms(BaseModel):
    customer: str
    text: str


sent: list[float] = []
mailed: dict[str, list[float]] = {}


# At most 20 runs start per second across every member of the group, evenly spaced
# (burst 1). Messages wait for their turn: never failed, never dead-lettered for it.
@app.handler("sms", rate_limit="20/s")
async def send(sms: Sms) -> None:
    sent.append(time.monotonic())  # call the SMS provider here


# One limit per key: each customer gets at most 2 mails a second (bursts of 2).
@app.handler(
    "emails",
    rate_limit=RateLimit.parse("2/s", burst=2),
    rate_limit_key=lambda message: message.key,  # the read-only message view
)
async def mail(body: dict[str, str], msg: Message) -> None:
    mailed.setdefault(msg.key or "", []).append(time.monotonic())


async def main() -> None:
    sent.clear()
    mailed.clear()
    async with TestRuntime(app, workers=2) as rt:
        await app.publish_many(
            "sms",
            [Record(Sms(customer=f"c{i % 5}", text="hi"), key=f"c{i % 5}") for i in range(30)],
        )
        await app.publish_many(
            "emails", [Record({"n": str(i)}, key=f"c{i % 3}") for i in range(12)]
        )
        await rt.wait_idle(timeout=30)
    # 30 runs at 20/s: the last starts 29 intervals (1.45 s) after the first.
    assert len(sent) == 30 and max(sent) - min(sent) >= 1.4
    # 4 mails per customer at 2/s with bursts of 2: the 3rd waits half a second.
    assert all(len(times) == 4 for times in mailed.values())
    assert all(max(t) - min(t) >= 0.45 for t in mailed.values())
    print(f"sent 30 SMS in {max(sent) - min(sent):.2f}s")


if __name__ == "__main__":
    anyio.run(main)
