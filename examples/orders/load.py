"""A steady stream of orders for the billing example (the ``load`` service of
``deploy/compose.yaml``), so the dashboard and Grafana have something to show.

Run with ``python -m examples.orders.load --rate 20`` next to a coordinator; it reads
the same ``STREAMWORKS_*`` settings as every streamworks process. ``--count 0`` (the
default) publishes until SIGTERM or Ctrl-C. About one order in 500 has a negative
amount and ends in the dead-letter queue, as ``examples.orders.app`` documents.
"""

from __future__ import annotations

import argparse
import random
import time

import anyio

from examples.orders.app import Order, app
from streamworks import Record


async def publish_orders(count: int, rate: float, seed: int = 1) -> int:
    """Publish ``count`` orders (forever when 0) at about ``rate`` per second, in
    batches of a tenth of a second; returns how many were published."""
    rng = random.Random(seed)
    batch = max(1, round(rate / 10))
    sent = 0
    started = time.monotonic()
    async with app.connect():
        while count == 0 or sent < count:
            size = batch if count == 0 else min(batch, count - sent)
            records = []
            for n in range(sent, sent + size):
                amount = -1 if rng.randrange(500) == 0 else rng.randint(1, 500)
                order = Order(
                    id=f"load-{seed}-{n}", customer=f"c{rng.randint(1, 200)}", amount=amount
                )
                records.append(Record(order, key=order.customer, event_id=order.id))
            await app.publish_many("orders", records)
            sent += size
            ahead = sent / rate - (time.monotonic() - started)
            if ahead > 0:
                await anyio.sleep(ahead)  # pacing, not synchronisation
    return sent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rate", type=float, default=20.0, help="orders per second")
    parser.add_argument("--count", type=int, default=0, help="orders to publish; 0: forever")
    parser.add_argument("--seed", type=int, default=1, help="order ids are load-SEED-N")
    args = parser.parse_args()
    if args.rate <= 0 or args.count < 0:
        parser.error("--rate must be positive and --count at least 0")
    try:
        anyio.run(publish_orders, args.count, args.rate, args.seed)
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
