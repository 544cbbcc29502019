"""A slow app for the exclusive-processing tests: each run records its start AND end.

Run as ``streamworks worker tests.e2e.apps.slow:app``. Stream ``jobs`` (``E2E_SHARDS``
shards, default 2), group ``ex``, ``ordering="key"``. The handler is ``async def`` or,
with ``E2E_SYNC=1``, a plain ``def`` (run in a worker thread, never cancellable). A
job sleeps ``sleep`` seconds (``sleep_once``: only on its first run, so the run that
takes over is quick).

Every run appends two records to ``{prefix}:ex:runs``: ``start`` when the handler is
entered and ``end`` when it is left (returned, raised or was cancelled: the end of a
cancelled async run is written in a shielded ``finally``). Each record carries a
number from the one counter ``{prefix}:ex:seq`` (a total order over every process),
``time.monotonic()`` (CLOCK_MONOTONIC: comparable across processes on Linux), the
member id, pid, shard and ``ctx.fencing_token``; an end says whether the run
completed (``ok``) or was cut short. A run whose process died has a start and no end.
"""

from __future__ import annotations

import os
import threading
import time
from typing import Any

import anyio
import orjson
import redis as redis_sync
from pydantic import BaseModel

from streamworks import App, Context
from tests.e2e.apps import record_client, record_url

STREAM = "jobs"
GROUP = "ex"
SHARDS = int(os.environ.get("E2E_SHARDS", "2"))
SYNC = os.environ.get("E2E_SYNC") == "1"

app = App(GROUP)
app.stream(STREAM, shards=SHARDS)

# KEYS: sequence, log. ARGV: the record (JSON without seq).
_RECORD = """
local seq = redis.call('INCR', KEYS[1])
redis.call('RPUSH', KEYS[2], ARGV[1] .. '|' .. seq)
return seq
"""


class Job(BaseModel):
    id: str
    sleep: float = 0.0
    sleep_once: bool = False


def runs_key(prefix: str) -> str:
    return f"{prefix}:ex:runs"


def seq_key(prefix: str) -> str:
    return f"{prefix}:ex:seq"


def slept_key(prefix: str, job_id: str) -> str:
    return f"{prefix}:ex:slept:{job_id}"


def _record(job: Job, ctx: Context, ev: str, ok: bool = False) -> bytes:
    return orjson.dumps(
        {
            "ev": ev,
            "ok": ok,
            "member": ctx.member_id,
            "pid": os.getpid(),
            "shard": ctx.message.shard,
            "entry": ctx.message.id,
            "id": job.id,
            "token": ctx.fencing_token,
            "mono": time.monotonic(),
        }
    )


if SYNC:
    _local = threading.local()

    def _redis() -> Any:
        client = getattr(_local, "client", None)
        if client is None:
            url = record_url() or os.environ["STREAMWORKS_REDIS_URL"]
            client = _local.client = redis_sync.Redis.from_url(url, driver_info=None)
        return client

    @app.handler(STREAM, ordering="key", concurrency=4)
    def handle_sync(job: Job, ctx: Context) -> None:
        prefix = ctx.app.connection.keyspace.prefix
        r = _redis()
        r.eval(_RECORD, 2, seq_key(prefix), runs_key(prefix), _record(job, ctx, "start"))
        ok = False
        try:
            if job.sleep and (not job.sleep_once or r.set(slept_key(prefix, job.id), 1, nx=True)):
                time.sleep(job.sleep)  # a thread: nothing can cancel it
            ok = True
        finally:
            r.eval(_RECORD, 2, seq_key(prefix), runs_key(prefix), _record(job, ctx, "end", ok))

else:

    @app.handler(STREAM, ordering="key", concurrency=4)
    async def handle(job: Job, ctx: Context) -> None:
        conn = ctx.app.connection
        r: Any = record_client(conn.redis)
        prefix = conn.keyspace.prefix
        await r.eval(_RECORD, 2, seq_key(prefix), runs_key(prefix), _record(job, ctx, "start"))
        ok = False
        try:
            if job.sleep and (
                not job.sleep_once or await r.set(slept_key(prefix, job.id), 1, nx=True)
            ):
                await anyio.sleep(job.sleep)
            ok = True
        finally:
            with anyio.CancelScope(shield=True):
                await r.eval(
                    _RECORD, 2, seq_key(prefix), runs_key(prefix), _record(job, ctx, "end", ok)
                )
