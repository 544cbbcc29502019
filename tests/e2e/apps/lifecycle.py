"""An app whose startup and shutdown hooks leave a trace in Redis, for the e2e tests.

Run as ``streamworks worker tests.e2e.apps.lifecycle:app``. Every event is pushed to
the list ``{prefix}:e2e:lifecycle`` in the worker's Redis, in the order it happened:
``startup``, then ``start <id>`` / ``end <id>`` around each handler run (each run
sleeps ``sleep`` seconds, from its payload), then ``shutdown``. With
``LIFECYCLE_FAIL_STARTUP`` set, the startup hook raises instead.
"""

from __future__ import annotations

import os
from typing import Any

import anyio

from streamworks import App, Context
from tests.e2e.apps import record_client

STREAM = "life"
SHARDS = 2

app = App(os.environ.get("E2E_GROUP", "e2e-life"))
app.stream(STREAM, shards=SHARDS)


def log_key(prefix: str) -> str:
    return f"{prefix}:e2e:lifecycle"


async def record(event: str) -> None:
    conn = app.connection  # the worker's connection: hooks run while it is open
    await record_client(conn.redis).rpush(log_key(conn.keyspace.prefix), event)


@app.on_startup
async def started() -> None:
    if os.environ.get("LIFECYCLE_FAIL_STARTUP"):
        raise ConnectionRefusedError("the payments database is down")
    await record("startup")


@app.on_shutdown
async def stopped() -> None:
    await record("shutdown")


@app.handler(STREAM)
async def handle(value: dict[str, Any], ctx: Context) -> None:
    await record(f"start {value['id']}")
    await anyio.sleep(float(value.get("sleep", 0)))
    await record(f"end {value['id']}")
