"""Fan-out: two apps (two consumer groups) on one stream; each handles every event.

``shipping`` packs every order, ``analytics`` counts every order: one publish reaches
both. The groups are independent: each has its own members, its own position in
every shard, its own retries and dead letters, and one falling behind or failing
does not hold the other back. Run them as separate services::

    streamworks worker examples.fanout.apps:shipping
    streamworks worker examples.fanout.apps:analytics

or ``python -m examples.fanout.apps`` for both in one process on an embedded Redis.
"""

from __future__ import annotations

from collections import Counter

import anyio
from pydantic import BaseModel

from streamworks import App, Context, Record
from streamworks.testing import TestRuntime

SHARDS = 4


class Order(BaseModel):
    id: str
    customer: str
    amount: int


# Each App is one consumer group; both declare the same stream, with the same shards.
shipping = App("shipping")
shipping.stream("orders", shards=SHARDS)
analytics = App("analytics")
analytics.stream("orders", shards=SHARDS)

packed: list[str] = []  # stands in for the shipping service's side effect
revenue: Counter[str] = Counter()  # and for the analytics store


@shipping.handler("orders", ordering="key")
async def pack(order: Order, ctx: Context) -> None:
    ctx.logger.debug("packing %s", order.id)
    packed.append(order.id)


@analytics.handler("orders", ordering="none", concurrency=128)
async def count(order: Order) -> None:
    revenue[order.customer] += order.amount


async def main() -> None:
    """Both groups against one embedded Redis; 100 orders, each handled by both."""
    packed.clear()
    revenue.clear()
    # The second group shares the first runtime's Redis and key prefix: the same
    # streams, another consumer group. Only its workers are started there.
    async with (
        TestRuntime(shipping, workers=2) as rt_shipping,
        TestRuntime(
            analytics,
            workers=1,
            redis_url=rt_shipping.settings.redis_url,
            key_prefix=rt_shipping.settings.key_prefix,
            attach=False,
        ) as rt_analytics,
    ):
        orders = [Order(id=f"o-{n}", customer=f"c{n % 7}", amount=n) for n in range(100)]
        await shipping.publish_many(
            "orders", [Record(o, key=o.customer, event_id=o.id) for o in orders]
        )
        await rt_shipping.wait_idle(timeout=10)
        await rt_analytics.wait_idle(timeout=10)
        assert sorted(packed) == sorted(o.id for o in orders)  # every order, once
        assert sum(revenue.values()) == sum(o.amount for o in orders)
        assert rt_shipping.handled("orders") == rt_analytics.handled("orders") == 100
        print(f"shipping packed {len(packed)}, analytics counted {revenue.total()} cents")


if __name__ == "__main__":
    anyio.run(main)
