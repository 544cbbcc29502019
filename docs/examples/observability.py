"""Worker metrics and dead-letter tracebacks, read in a test (no port needed)."""

from __future__ import annotations

import anyio

from streamworks import App, RetryPolicy
from streamworks.testing import TestRuntime

app = App("billing")
app.stream("orders", shards=2)


@app.handler("orders", retry=RetryPolicy(max_attempts=1))
async def charge(order: dict[str, int]) -> None:
    if order["amount"] < 0:
        raise ValueError("negative amount")


async def main() -> None:
    async with TestRuntime(app) as rt:
        await app.publish("orders", {"amount": 5}, key="a")
        await app.publish("orders", {"amount": -1}, key="b")
        await rt.wait_idle()
        text = await rt.worker_metrics()  # what GET /metrics serves
        assert 'streamworks_messages_handled_total{group="billing"' in text
        assert "streamworks_messages_dead_lettered_total" in text
        [dead] = await rt.dead_letters("orders")
        traceback = dead.fields["traceback"].decode()  # the last attempt's, <= 8 KB
        assert traceback.rstrip().endswith("ValueError: negative amount")


if __name__ == "__main__":
    anyio.run(main)
