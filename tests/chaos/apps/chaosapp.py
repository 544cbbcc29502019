"""The app the chaos workers run: its handler records every processing in Redis.

Run as ``streamworks worker tests.chaos.apps.chaosapp:app``. It is the instrumented
app of the end-to-end tests (``tests/e2e/apps/instrumented.py``) made for long runs
under faults, and writes to the same log key with the same scripts' idea:

* at the start of every processing, in one script: a number from the shared sequence
  and the shard's owner fence for the group *as it is at that instant* (so the
  checker can tell whether the member owned the shard when it began), with the
  message's entry id, event id, partition key, attempt, the member id and pid, and
  the handler's entry time on ``time.monotonic()`` (CLOCK_MONOTONIC: comparable with
  the times at which the harness sent its signals);
* when the handler succeeded (the ack follows): ``end`` with another sequence number;
* when it raised on purpose (``flaky``/``poison`` messages): ``fail`` (best effort).

Records are compact JSON (short field names): a 30-minute run writes hundreds of
thousands of them. A message may ask for ``work`` seconds of sleep inside the handler
(so that kills and pauses find work in flight), to fail on its first attempt
(``flaky``: exercises retries) or on every attempt (``poison``: ends in the DLQ).

Environment: ``CHAOS_GROUP`` (default ``chaos``), ``CHAOS_SHARDS`` (initial shard
count, default 4), ``CHAOS_MAX_ATTEMPTS`` (default 15: a handler whose
Redis writes fail during a cut or a Redis restart fails attempts quickly), ``CHAOS_CONCURRENCY``
(default 16), ``CHAOS_ORDERING`` (default ``key``).
"""

from __future__ import annotations

import contextlib
import os
import time
from typing import Any, Literal, cast

import anyio
import orjson
from pydantic import BaseModel
from redis.exceptions import RedisError

from streamworks import App, Context, RetryPolicy
from streamworks.protocol.shards import ShardId

STREAM = "chaos"
GROUP = os.environ.get("CHAOS_GROUP", "chaos")
SHARDS = int(os.environ.get("CHAOS_SHARDS", "4"))
MAX_ATTEMPTS = int(os.environ.get("CHAOS_MAX_ATTEMPTS", "15"))
CONCURRENCY = int(os.environ.get("CHAOS_CONCURRENCY", "16"))
ORDERING = cast(Literal["shard", "key", "none"], os.environ.get("CHAOS_ORDERING", "key"))
RETRY = RetryPolicy(max_attempts=MAX_ATTEMPTS, backoff=0.1, max_backoff=1.0)

app = App(GROUP)
app.stream(STREAM, shards=SHARDS)


class Event(BaseModel):
    id: str
    work: float = 0.0
    flaky: bool = False
    poison: bool = False


class Failed(Exception):
    """A failure the message asked for."""


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
    return f"{prefix}:chaos:log"


def seq_key(prefix: str) -> str:
    return f"{prefix}:chaos:seq"


@app.handler(STREAM, ordering=ORDERING, concurrency=CONCURRENCY, retry=RETRY)
async def record(event: Event, ctx: Context) -> None:
    entered = time.monotonic()  # CLOCK_MONOTONIC: comparable across processes (Linux)
    conn = ctx.app.connection
    redis: Any = conn.redis
    prefix = conn.keyspace.prefix
    message = ctx.message
    fence_key = conn.keyspace.fence(ShardId.parse(message.shard), GROUP)
    head = {
        "m": ctx.member_id,
        "p": os.getpid(),
        "s": message.shard,
        "e": message.id,
        "i": event.id,
        "k": message.key,
        "a": message.attempt,
    }
    start = await redis.eval(
        _START,
        3,
        seq_key(prefix),
        fence_key,
        log_key(prefix),
        orjson.dumps({**head, "ev": "start", "t": entered}).decode(),
    )
    if event.work:
        await anyio.sleep(event.work)
    if event.poison or (event.flaky and message.attempt == 1):
        failed = {**head, "ev": "fail", "start": int(start), "t": time.monotonic()}
        with contextlib.suppress(RedisError, OSError):
            await redis.eval(
                _END, 2, seq_key(prefix), log_key(prefix), orjson.dumps(failed).decode()
            )
        raise Failed(f"{event.id} fails on purpose (attempt {message.attempt})")
    await redis.eval(
        _END,
        2,
        seq_key(prefix),
        log_key(prefix),
        orjson.dumps({**head, "ev": "end", "start": int(start), "t": time.monotonic()}).decode(),
    )
