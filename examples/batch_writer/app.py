"""A batch writer: meter readings inserted into SQLite 500 rows per transaction.

One transaction and one commit per batch instead of one per message; a reading the
database refuses (a negative value breaks the table's CHECK) is failed alone with
``ctx.fail(i, error)`` and dead-lettered after its attempts, while the rest of its
batch is stored and acked. A batch may run again (a crash before its acks):
``ON CONFLICT (id) DO NOTHING`` makes that harmless. Run it as a service::

    METERS_READINGS_DB=/var/lib/meters.db streamworks worker examples.batch_writer.app:app

or ``python -m examples.batch_writer.app`` for a demo on an embedded Redis.
"""

from __future__ import annotations

import os
import sqlite3
import tempfile
from datetime import timedelta
from pathlib import Path

import anyio
from pydantic import BaseModel

from streamworks import App, Batch, BatchContext, Record, RetryPolicy
from streamworks.testing import TestRuntime


class Reading(BaseModel):
    id: str
    meter: str
    value: int


app = App("meters")
app.stream("readings", shards=4)
_db: sqlite3.Connection | None = None


def database(path: str | Path | None = None) -> sqlite3.Connection:
    """The readings database (opened once per process)."""
    global _db
    if _db is None:
        path = path or os.environ.get("METERS_READINGS_DB", "readings.db")
        _db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        _db.execute("PRAGMA journal_mode=WAL")
        _db.execute(
            "CREATE TABLE IF NOT EXISTS readings (id TEXT PRIMARY KEY, meter TEXT NOT NULL,"
            " value INTEGER NOT NULL CHECK (value >= 0))"
        )
    return _db


@app.handler(
    "readings",
    batch=Batch(max_size=500, max_wait=timedelta(milliseconds=50)),
    retry=RetryPolicy(max_attempts=2, backoff=0.05),
)
def store(readings: list[Reading], ctx: BatchContext) -> None:
    """A plain ``def``: sqlite3 blocks, so the batch runs in a worker thread."""
    db = database()
    db.execute("BEGIN")
    for i, r in enumerate(readings):
        try:
            db.execute(
                "INSERT INTO readings VALUES (?, ?, ?) ON CONFLICT (id) DO NOTHING",
                (r.id, r.meter, r.value),
            )
        except sqlite3.IntegrityError as e:
            ctx.fail(i, e)  # this reading only (and the later ones of its meter wait)
    db.execute("COMMIT")  # raising before this fails (and retries) the whole batch


async def main(path: str | Path | None = None, count: int = 2_000) -> tuple[int, int]:
    """Publish ``count`` readings (every 100th one invalid) to two workers on an
    embedded Redis; return (rows stored, readings dead-lettered)."""
    global _db
    _db = None
    with tempfile.TemporaryDirectory() as tmp:
        db = database(path or Path(tmp) / "readings.db")
        async with TestRuntime(app, workers=2) as rt:
            readings = [
                Reading(id=f"r{n}", meter=f"m{n % 25}", value=-1 if n % 100 == 99 else n)
                for n in range(count)
            ]
            for i in range(0, count, 500):
                await app.publish_many(
                    "readings", [Record(r, key=r.meter) for r in readings[i : i + 500]]
                )
            await rt.wait_idle(timeout=60)
            letters = await rt.dead_letters("readings")
        rows = int(db.execute("SELECT count(*) FROM readings").fetchone()[0])
        db.close()
        _db = None
    print(f"stored {rows} readings, dead-lettered {len(letters)}")
    return rows, len(letters)


if __name__ == "__main__":
    anyio.run(main)
