"""Fencing your own side effects with ``ctx.fencing_token`` (docs/guarantees.md).

The token is the fence token of the grant under which the worker read the message. It
never goes down per (group, shard): every grant takes a token above every earlier one,
made from Redis time so that not even a Redis failover that lost writes repeats one.
Store the highest token seen per shard next to your data, in the same transaction as
the side effect, and refuse a lower one: a run of a worker that lost the shard (e.g.
a process paused by SIGSTOP that resumes its run) can then never overwrite what the
shard's newer owner wrote.
"""

from __future__ import annotations

import sqlite3

import anyio
from pydantic import BaseModel

from streamworks import App, Context
from streamworks.testing import TestRuntime

app = App("billing")
app.stream("payments", shards=2)

db = sqlite3.connect(":memory:")  # stands for your database
db.executescript(
    """
    CREATE TABLE shard_fence (shard TEXT PRIMARY KEY, token INTEGER NOT NULL);
    CREATE TABLE balance (account TEXT PRIMARY KEY, cents INTEGER NOT NULL);
    """
)


class Payment(BaseModel):
    account: str
    cents: int


class StaleOwner(Exception):
    """A newer owner of the shard has written: this run must not."""


def apply_payment(shard: str, token: int, payment: Payment) -> None:
    """Raise the shard's fence to ``token`` (never lower it) and apply the payment, in
    one transaction; a token below the fence raises :class:`StaleOwner`."""
    with db:  # one transaction: the fence check and the write commit together
        raised = db.execute(
            "INSERT INTO shard_fence (shard, token) VALUES (?, ?) "
            "ON CONFLICT (shard) DO UPDATE SET token = excluded.token "
            "WHERE excluded.token >= shard_fence.token",
            (shard, token),
        ).rowcount
        if not raised:
            raise StaleOwner(f"{shard}: token {token} is below the fence")
        db.execute(
            "INSERT INTO balance (account, cents) VALUES (?, ?) "
            "ON CONFLICT (account) DO UPDATE SET cents = cents + excluded.cents",
            (payment.account, payment.cents),
        )


@app.handler("payments", ordering="key")
async def pay(payment: Payment, ctx: Context) -> None:
    # A StaleOwner is a failed run: nothing is acked, the shard's owner runs it.
    apply_payment(ctx.message.shard, ctx.fencing_token, payment)


async def main() -> None:
    async with TestRuntime(app) as rt:
        for cents in (100, 250, -50):
            await app.publish("payments", Payment(account="alice", cents=cents), key="alice")
        await rt.wait_idle()
        assert db.execute("SELECT cents FROM balance").fetchone() == (300,)
        [(shard, token)] = db.execute("SELECT shard, token FROM shard_fence").fetchall()
        assert token >= 1
        # A run that read under an older grant (a stale owner) is refused:
        try:
            apply_payment(shard, token - 1, Payment(account="alice", cents=1_000))
        except StaleOwner:
            pass
        else:
            raise AssertionError("a stale owner's write went through")
        assert db.execute("SELECT cents FROM balance").fetchone() == (300,)


if __name__ == "__main__":
    anyio.run(main)
