"""Quickstart: declare a stream, a producer and a handler; run them in a TestRuntime."""

from __future__ import annotations

import anyio
from pydantic import BaseModel

from streamworks import App
from streamworks.testing import TestRuntime

app = App("billing")  # the consumer group
app.stream("orders", shards=4)  # 4 Redis Streams: orders/0 .. orders/3


class Order(BaseModel):
    id: str
    customer: str
    amount: int


@app.producer("orders", key=lambda order: order.customer)
async def place_order(order_id: str, customer: str, amount: int) -> Order:
    return Order(id=order_id, customer=customer, amount=amount)


charged: list[str] = []


@app.handler("orders")
async def charge(order: Order) -> None:
    charged.append(order.id)


async def main() -> None:
    async with TestRuntime(app, workers=2) as rt:  # embedded Redis, 2 workers
        published = await place_order("o-1", "alice", 42)
        print("published to", published.shard, published.entry_id)
        await rt.wait_idle()
        assert charged == ["o-1"]
        assert rt.handled("orders") == 1


if __name__ == "__main__":
    anyio.run(main)
