"""Where a new group starts on a stream that already has entries."""

from __future__ import annotations

import uuid

import anyio

from streamworks import App
from streamworks.testing import TestRuntime

orders = App("orders")
orders.stream("events", shards=2)  # start="earliest" (the default): every retained entry

alerts = App("alerts")
alerts.stream("events", shards=2, start="latest")  # only entries published after it joins

seen: dict[str, list[int]] = {"orders": [], "alerts": []}


@orders.handler("events")
async def record_order(value: dict[str, int]) -> None:
    seen["orders"].append(value["n"])


@alerts.handler("events")
async def alert(value: dict[str, int]) -> None:
    seen["alerts"].append(value["n"])


async def main() -> None:
    shared = {"key_prefix": f"docs-{uuid.uuid4().hex[:8]}"}  # both groups on one stream
    async with TestRuntime(orders, **shared) as first:
        for n in range(3):
            await orders.publish("events", {"n": n}, key=str(n))
        async with TestRuntime(alerts, attach=False, **shared) as second:  # joins now
            for n in range(3, 5):
                await orders.publish("events", {"n": n}, key=str(n))
            await first.wait_idle()
            await second.wait_idle()
    assert sorted(seen["orders"]) == [0, 1, 2, 3, 4]
    assert sorted(seen["alerts"]) == [3, 4]  # started at the tail when it subscribed


if __name__ == "__main__":
    anyio.run(main)
