"""A billing service: charge each order once, in order per customer.

Run a worker with ``streamworks worker examples.orders.app:app``.
"""

from __future__ import annotations

import uuid

from pydantic import BaseModel

from streamworks import App, Context, RetryPolicy

app = App("billing")
app.stream("orders", shards=8)


class Order(BaseModel):
    id: str
    customer: str
    amount: int


@app.producer("orders", key=lambda order: order.customer, event_id=lambda order: order.id)
async def place_order(customer: str, amount: int) -> Order:
    return Order(id=uuid.uuid4().hex, customer=customer, amount=amount)


class PaymentDeclined(Exception):
    """The (simulated) payment gateway refused the charge."""


@app.handler(
    "orders",
    ordering="key",  # in order per customer, customers in parallel
    concurrency=64,
    retry=RetryPolicy(max_attempts=3, backoff=0.05, max_backoff=1.0),
    idempotency_key=lambda order, ctx: f"charge:{order.id}",
)
async def charge(order: Order, ctx: Context) -> None:
    if order.amount <= 0:
        raise PaymentDeclined(f"cannot charge {order.amount}")  # dead-lettered after 3 tries
    if order.amount % 97 == 0 and ctx.message.attempt == 1:
        raise TimeoutError("payment gateway timed out")  # retried, then succeeds
    # The side effect, keyed by the order id (a real app would use its database here).
    redis = ctx.app.connection.redis
    fresh = await redis.sadd(f"demo:charged:{ctx.app.name}", order.id)
    await redis.hincrby(f"demo:by-member:{ctx.app.name}", ctx.member_id, 1)
    if not fresh:
        await redis.incr(f"demo:duplicates:{ctx.app.name}")
