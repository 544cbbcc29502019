"""``python -m examples.idempotency.demo``: payments delivered twice, credited once.

Every payment is published, and a third of them a second time (a client that retried
after a timeout: two entries with the same payment id). The handler runs for every
entry; the unique constraint turns each second run into a no-op, so each account is
credited exactly the sum of its distinct payments.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import anyio

from examples.idempotency import ledger as example
from streamworks.testing import TestRuntime


async def run(ledger: example.Ledger, payments: int = 60) -> dict[str, int]:
    """Publish ``payments`` payments (every third one twice) to a TestRuntime of the
    example app writing to ``ledger``; returns the balances."""
    example.ledger = ledger
    example.duplicates.clear()
    ledger.create_schema()
    items = [
        example.Payment(id=f"pay-{n}", account=f"acct-{n % 5}", cents=100 + n)
        for n in range(payments)
    ]
    async with TestRuntime(example.app, workers=2) as rt:
        for item in items:
            await example.app.publish("payments", item, key=item.account, event_id=item.id)
        for item in items[::3]:  # the retried publishes: a second entry, same payment id
            await example.app.publish("payments", item, key=item.account, event_id=item.id)
        await rt.wait_idle(timeout=20)
        assert rt.handled("payments") == payments + len(items[::3])  # every entry ran
    expected: dict[str, int] = {}
    for item in items:
        expected[item.account] = expected.get(item.account, 0) + item.cents
    balances = ledger.balances()
    assert balances == expected, (balances, expected)  # ... and was credited once
    assert ledger.payments() == payments
    assert sorted(example.duplicates) == sorted(i.id for i in items[::3])
    return balances


async def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        ledger = example.Ledger(f"sqlite:///{Path(tmp) / 'ledger.db'}")
        try:
            balances = await run(ledger)
        finally:
            ledger.close()
    print("credited once each:", balances)


if __name__ == "__main__":
    anyio.run(main)
