"""Producers: publish, publish_many, decorated producers, shard-level dedup."""

from __future__ import annotations

import anyio

from streamworks import App, Record
from streamworks.testing import TestRuntime

app = App("checkout")
app.stream("payments", shards=4, dedup_window=3600)  # remember event ids for an hour


@app.producer("payments", key=lambda p: p["account"], event_id=lambda p: p["id"])
def payment(account: str, cents: int, payment_id: str) -> dict[str, object]:
    return {"id": payment_id, "account": account, "cents": cents}


async def main() -> None:
    async with TestRuntime(app, workers=0):
        one = await app.publish("payments", {"cents": 100}, key="acct-1", headers={"trace": "t-1"})
        same_key = await app.publish("payments", {"cents": 200}, key="acct-1")
        assert one.shard == same_key.shard  # same key, same shard (same layout)

        batch = await app.publish_many(
            "payments", [Record({"cents": c}, key=f"acct-{c % 7}") for c in range(100)]
        )
        assert len(batch) == 100  # one Published per record, in order

        first = await payment("acct-9", 500, "pay-1")
        retry = await payment("acct-9", 500, "pay-1")  # e.g. a client retry
        assert not first.duplicate and retry.duplicate
        assert retry.entry_id == first.entry_id  # written once on that shard


if __name__ == "__main__":
    anyio.run(main)
