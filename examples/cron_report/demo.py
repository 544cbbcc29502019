"""The cron report on an embedded Redis: orders in two hours, two reports.

Time moves with ``TestRuntime.advance`` (no waiting for the top of the hour): the
schedule's owner sleeps on the runtime's clock, and the tick is compared with Redis
time plus the same offset.
"""

from __future__ import annotations

from datetime import UTC, datetime

import anyio

from examples.cron_report.app import Order, app, delivered, orders
from streamworks.testing import TestRuntime
from streamworks.testing.runtime import fast_settings

HOUR = 3600.0


async def main() -> None:
    orders.clear()
    delivered.clear()
    # Leases longer than the jumps of the clock below (a jump past a lease ends it,
    # as a pause that long would; the demo is about the schedule).
    settings = fast_settings(lease_ttl=10 * HOUR)
    async with TestRuntime(app, workers=2, settings=settings) as rt:
        for batch, count in enumerate((10, 5)):
            now = datetime.fromtimestamp(rt.clock.time(), UTC)
            for n in range(count):
                await app.publish(
                    "orders", Order(id=f"o-{batch}-{n}", amount=100 * (n + 1), placed_at=now)
                )
            await rt.wait_idle()
            # On to just past the next top of the hour: its tick publishes one report.
            await rt.advance(HOUR - rt.clock.time() % HOUR + 1)
            with anyio.fail_after(10):
                # The report is published, then handled: poll for it (bounded).
                while len(delivered) < batch + 1:  # noqa: ASYNC110 - a list, no event
                    await anyio.sleep(0.01)
        first, second = delivered
        assert (first.orders, first.revenue) == (10, 5500)
        assert (second.orders, second.revenue) == (5, 1500)
        assert second.start == first.end and first.end.minute == 0
        for report in delivered:
            print(f"{report.start:%H:%M}-{report.end:%H:%M} UTC: {report.orders} orders")


if __name__ == "__main__":
    anyio.run(main)
