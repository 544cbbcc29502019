"""An instrumented app for the end-to-end tests: its handler records every processing.

Run as ``streamworks worker tests.e2e.apps.instrumented:app``. Each processing of a
message appends two records to ``{prefix}:e2e:log`` in the worker's Redis:

* at the start, in one script: a number from the shared sequence ``{prefix}:e2e:seq``
  and the shard's owner fence for the group (``<grant epoch>:<member id>``) as it is
  at that instant; with the handler's entry time on ``time.monotonic()`` (the system's
  CLOCK_MONOTONIC on Linux, so the test can compare it with when it sent a signal);
* at the end (the handler returned; the ack follows): another sequence number.

The sequence is one counter in one Redis, so it totally orders the records of every
process; the fence read at the start tells whether the member was the shard's owner
when it began. ``tests/e2e/harness.py`` reads the log back.

What a message asks for (its payload, an :class:`Event`):

* ``sleep`` seconds inside the handler (``sleep_once``: only the first time the
  event id is processed, so a redelivery is quick);
* ``fail_until_healed``: fail until the key ``{prefix}:e2e:healed:<id>`` exists.

Environment: ``E2E_GROUP`` (group, default ``e2e``), ``E2E_SHARDS`` (default 6),
``E2E_ORDERING`` (default ``key``), ``E2E_MAX_ATTEMPTS`` (default 2),
``E2E_SLEEP`` (seconds every processing takes at least, default 0),
``E2E_RECORD_AS_DEFAULT_USER`` (the records are written as the default user:
``tests.e2e.apps.record_url``).
"""

from __future__ import annotations

import os
import time
from typing import Any, Literal, cast

import anyio
import orjson
from pydantic import BaseModel

from streamworks import App, Context, RetryPolicy
from streamworks.protocol.shards import ShardId
from tests.e2e.apps import record_client

STREAM = "events"
GROUP = os.environ.get("E2E_GROUP", "e2e")
SHARDS = int(os.environ.get("E2E_SHARDS", "6"))
ORDERING = cast(Literal["shard", "key", "none"], os.environ.get("E2E_ORDERING", "key"))
MAX_ATTEMPTS = int(os.environ.get("E2E_MAX_ATTEMPTS", "2"))
BASE_SLEEP = float(os.environ.get("E2E_SLEEP", "0"))

app = App(GROUP)
app.stream(STREAM, shards=SHARDS)


class Event(BaseModel):
    id: str
    sleep: float = 0.0
    sleep_once: bool = False
    fail_until_healed: bool = False


class NotHealed(Exception):
    """The test has not allowed this event to succeed yet."""


# KEYS: sequence, owner fence of the shard, log. ARGV: the record (JSON, without seq/fence).
_START = """
local seq = redis.call('INCR', KEYS[1])
local fence = redis.call('GET', KEYS[2]) or ''
redis.call('RPUSH', KEYS[3], ARGV[1] .. '|' .. seq .. '|' .. fence)
return seq
"""
# KEYS: sequence, log. ARGV: the record.
_END = """
local seq = redis.call('INCR', KEYS[1])
redis.call('RPUSH', KEYS[2], ARGV[1] .. '|' .. seq .. '|')
return seq
"""


def log_key(prefix: str) -> str:
    return f"{prefix}:e2e:log"


def seq_key(prefix: str) -> str:
    return f"{prefix}:e2e:seq"


def healed_key(prefix: str, event_id: str) -> str:
    return f"{prefix}:e2e:healed:{event_id}"


def slept_key(prefix: str, event_id: str) -> str:
    return f"{prefix}:e2e:slept:{event_id}"


@app.handler(
    STREAM,
    ordering=ORDERING,
    concurrency=16,
    retry=RetryPolicy(max_attempts=MAX_ATTEMPTS, backoff=0.05, max_backoff=0.2),
)
async def record(event: Event, ctx: Context) -> None:
    entered = time.monotonic()  # CLOCK_MONOTONIC: comparable across processes (Linux)
    conn = ctx.app.connection
    redis: Any = record_client(conn.redis)
    prefix = conn.keyspace.prefix
    message = ctx.message
    fence_key = conn.keyspace.fence(ShardId.parse(message.shard), GROUP)
    head = {
        "member": ctx.member_id,
        "pid": os.getpid(),
        "shard": message.shard,
        "entry": message.id,
        "id": event.id,
        "attempt": message.attempt,
        "entered": entered,
    }
    start = await redis.eval(
        _START,
        3,
        seq_key(prefix),
        fence_key,
        log_key(prefix),
        orjson.dumps({**head, "ev": "start"}).decode(),
    )
    delay = BASE_SLEEP
    if event.sleep and (
        not event.sleep_once or await redis.set(slept_key(prefix, event.id), 1, nx=True)
    ):
        delay = max(delay, event.sleep)
    if delay:
        await anyio.sleep(delay)
    if event.fail_until_healed and not await redis.exists(healed_key(prefix, event.id)):
        raise NotHealed(event.id)
    await redis.eval(
        _END,
        2,
        seq_key(prefix),
        log_key(prefix),
        orjson.dumps({**head, "ev": "end", "start": int(start)}).decode(),
    )
