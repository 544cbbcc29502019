"""Batch handlers and rate limits: what each costs or buys, in the same run.

1. **SQLite writer** — a backlog of ``--messages`` events (~100 bytes, 8 shards, 64
   keys) written into a SQLite file (stdlib ``sqlite3``, WAL, ``synchronous=NORMAL``,
   in a temporary directory) by:

   * ``per-message`` — ``@app.handler`` inserting one row and committing per message
     (the commit must precede the ack: at-least-once, nothing acked that is not
     stored);
   * ``batch`` — ``@app.handler(batch=Batch(max_size=500, max_wait=50 ms))``:
     ``executemany`` and one commit per batch.

   Same machine, same server, alternating rounds, each on a fresh consumer group and
   database; the clock runs from the worker's start until every row is in. Postgres
   is not used (no server is assumed here).

2. **Rate limiter cost** — a no-op handler with and without
   ``rate_limit="1000000/s"`` (a limit that never binds: what is left is the cost of
   asking the group's bucket and parking each message until its slot), reported as
   microseconds per message.

Run: ``python bench/batch.py`` (``--messages``, ``--rounds``, ``--quick``).
"""

from __future__ import annotations

import argparse
import sqlite3
import sys
import tempfile
import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import anyio
from pydantic import BaseModel

from bench.common import median, print_noise_note, print_table, start_server, write_json
from streamworks import App, Batch, Record
from streamworks.testing import TestRuntime
from streamworks.testing.runtime import fast_settings

SHARDS = 8
KEYS = 64


class Event(BaseModel):
    id: int
    account: str
    amount: int
    note: str


def _database(path: Path) -> sqlite3.Connection:
    db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("PRAGMA synchronous=NORMAL")
    db.execute(
        "CREATE TABLE events (id INTEGER PRIMARY KEY, account TEXT, amount INTEGER, note TEXT)"
    )
    return db


def _sqlite_app(kind: str, db: sqlite3.Connection) -> App:
    app = App(f"bench-{kind}")
    app.stream("events", shards=SHARDS)
    insert = "INSERT OR IGNORE INTO events VALUES (?, ?, ?, ?)"
    if kind == "batch":

        @app.handler("events", batch=Batch(max_size=500, max_wait=timedelta(milliseconds=50)))
        async def write_many(events: list[Event]) -> None:
            db.execute("BEGIN")
            db.executemany(insert, [(e.id, e.account, e.amount, e.note) for e in events])
            db.execute("COMMIT")

    else:

        @app.handler("events")
        async def write_one(e: Event) -> None:
            db.execute(insert, (e.id, e.account, e.amount, e.note))  # autocommit: one commit

    return app


def _noop_app(kind: str) -> App:
    app = App(f"bench-{kind}")
    app.stream("events", shards=SHARDS)

    @app.handler("events", rate_limit="1000000/s" if kind == "rate-limited" else None)
    async def handle(e: Event) -> None:
        return None

    return app


async def _drain(app: App, url: str, n: int, done: Callable[[TestRuntime], int]) -> float:
    """Publish ``n`` events, start one worker, return messages per second."""
    # Leases of 10 s: a stalled event loop on a loaded machine must not pause the run.
    settings = fast_settings(lease_ttl=10.0)
    async with TestRuntime(app, workers=0, redis_url=url, lifespan=False, settings=settings) as rt:
        records = [
            Record(
                Event(id=i, account=f"acct-{i % KEYS}", amount=i % 1000, note="x" * 40),
                key=f"acct-{i % KEYS}",
            )
            for i in range(n)
        ]
        for i in range(0, n, 1000):
            await app.publish_many("events", records[i : i + 1000])
        # The clock runs from the first row (the worker's start, its assignment and its
        # first read are not what is compared) to the last.
        started = time.perf_counter()
        await rt.add_worker(wait=False)
        while (first := done(rt)) == 0:  # noqa: ASYNC110 - polls a count (rows stored)
            await anyio.sleep(0.001)
        t_first = time.perf_counter()
        while done(rt) < n:  # noqa: ASYNC110 - polls a count (rows stored)
            await anyio.sleep(0.002)
        ended = time.perf_counter()
        if first >= n or ended - t_first < 0.05:  # too few to time: the whole run
            return n / (ended - started)
        return (n - first) / (ended - t_first)


async def run(args: Any) -> None:
    server = start_server(args.server)
    try:
        print_noise_note()
        writers: dict[str, list[float]] = {"per-message": [], "batch": []}
        limiter: dict[str, list[float]] = {"plain": [], "rate-limited": []}
        for r in range(args.rounds):
            for kind in writers if r % 2 == 0 else reversed(list(writers)):
                with tempfile.TemporaryDirectory() as tmp:
                    db = _database(Path(tmp) / "events.db")
                    app = _sqlite_app(kind, db)

                    def rows(_: TestRuntime, db: sqlite3.Connection = db) -> int:
                        return int(db.execute("SELECT count(*) FROM events").fetchone()[0])

                    rate = await _drain(app, server.url, args.messages, rows)
                    db.close()
                writers[kind].append(rate)
                print(f"sqlite round {r + 1} {kind:12s} {rate:10,.0f} msg/s", flush=True)
            for kind in limiter if r % 2 == 0 else reversed(list(limiter)):
                rate = await _drain(
                    _noop_app(kind), server.url, args.messages, lambda rt: rt.handled("events")
                )
                limiter[kind].append(rate)
                print(f"limiter round {r + 1} {kind:12s} {rate:10,.0f} msg/s", flush=True)
    finally:
        server.stop()
    per, bat = median(writers["per-message"]), median(writers["batch"])
    print_table(
        f"SQLite writer, {args.messages:,} events (medians of {args.rounds} alternating rounds)",
        ["handler", "msg/s", "× per-message"],
        [("per-message", per, 1.0), ("batch (max_size=500)", bat, bat / per)],
    )
    print(f"batch_ratio={bat / per:.2f}")
    plain, limited = median(limiter["plain"]), median(limiter["rate-limited"])
    print_table(
        "Rate limiter cost, no-op handler (a limit of 1,000,000/s that never binds)",
        ["handler", "msg/s", "µs/msg"],
        [("no rate limit", plain, 1e6 / plain), ("rate_limit=1000000/s", limited, 1e6 / limited)],
    )
    print(f"rate_limit_cost_us={1e6 / limited - 1e6 / plain:.1f} per message")
    if args.json:
        write_json(
            args.json,
            {
                "messages": args.messages,
                "sqlite": {k: [round(x, 1) for x in v] for k, v in writers.items()},
                "batch_ratio": round(bat / per, 3),
                "limiter": {k: [round(x, 1) for x in v] for k, v in limiter.items()},
                "rate_limit_cost_us": round(1e6 / limited - 1e6 / plain, 2),
            },
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=50_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="5,000 messages, 1 round")
    parser.add_argument("--server", help="redis-server/valkey-server binary (default: embedded)")
    parser.add_argument("--json", type=Path, help="also write the results to this JSON file")
    args = parser.parse_args()
    if args.quick:  # (an explicit --messages still wins)
        args.rounds = 1
        if "--messages" not in sys.argv:
            args.messages = 5_000
    anyio.run(run, args)


if __name__ == "__main__":
    sys.exit(main())
