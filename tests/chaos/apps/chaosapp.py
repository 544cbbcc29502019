"""The app the chaos workers run: its handler records every run in Redis.

Run as ``streamworks worker tests.chaos.apps.chaosapp:app``. It is the instrumented
app of the end-to-end tests (``tests/e2e/apps/instrumented.py``) made for long runs
under faults, and writes to the same log key with the same scripts' idea:

* at the start of every run, in one script: a number from the shared sequence and
  the shard's owner fence for the group *as it is at that instant* (so the checker
  can tell whether the member owned the shard when it began), with the group, the
  message's entry id, event id, partition key, attempt, the member id and pid, and
  the handler's entry time on ``time.monotonic()`` (CLOCK_MONOTONIC: comparable with
  the times at which the harness sent its signals, across processes);
* when the run ends, whichever way, with the time it ended: ``end`` when the handler
  succeeded (the ack follows), ``fail`` when it raised on purpose (``flaky``/``poison``
  messages), ``exit`` when it ended otherwise (cancelled by the runtime at its lease's
  deadline, a Redis error). A run's *interval* (entry to end) is what the checker's
  exclusive-processing check compares across members. An end record that cannot be
  written (Redis cut off) is kept and written by a later run of the same process
  (marked ``late``), with the time the run really ended. Every end record is also
  appended, before Redis sees it, to this process's own file in ``CHAOS_ENDS_DIR``
  (``ends-<pid>.jsonl``): a ``write()`` that returned is in the kernel's page cache and
  survives a SIGKILL of the process, so the checker knows when a run ended even when
  its Redis write (or the buffered late record) died with the process.

Records are compact JSON (short field names): a 30-minute run writes hundreds of
thousands of them. A message may ask for ``work`` seconds of sleep inside the handler
(a spread up to several seconds, so that kills, pauses and lease losses find work in
flight), to fail on its first attempt (``flaky``: exercises retries) or on every
attempt (``poison``: ends in the DLQ).

Environment: ``CHAOS_GROUP`` (default ``chaos``), ``CHAOS_SHARDS`` (initial shard
count, default 4), ``CHAOS_SYNC`` (``1``: the handler is a plain ``def`` run in a
thread, sleeping with ``time.sleep`` — it cannot be cancelled, so a run that outlives
its lease makes the worker fail-stop, exit code 75), ``CHAOS_MAX_ATTEMPTS`` (default
15: a handler whose Redis writes fail during a cut or a Redis restart fails attempts
quickly), ``CHAOS_CONCURRENCY`` (default 16), ``CHAOS_ORDERING`` (default ``key``),
``CHAOS_ENDS_DIR`` (where the local end records go; none when unset), ``CHAOS_SCHEDULE``
(``1``, the default in group ``chaos``: run the schedule ``tick``, every second to the
stream ``chaos-ticks``).

A delayed message's start record also has its due time ``d`` (``Message.due_at``, ms,
Redis clock) and the run's wall-clock entry time ``w`` (``time.time()``), for the
delayed-message checks (``tests/chaos/feature_checks.py``).
"""

from __future__ import annotations

import itertools
import os
import threading
import time
from datetime import timedelta
from typing import Any, Literal, cast

import anyio
import orjson
import redis as redis_sync
from pydantic import BaseModel
from redis.exceptions import RedisError

from streamworks import App, Context, RetryPolicy, Tick
from streamworks.protocol.shards import ShardId
from streamworks.redis.client import create_redis
from streamworks.settings import Settings

STREAM = "chaos"
GROUP = os.environ.get("CHAOS_GROUP", "chaos")
SHARDS = int(os.environ.get("CHAOS_SHARDS", "4"))
SYNC = os.environ.get("CHAOS_SYNC", "") == "1"
MAX_ATTEMPTS = int(os.environ.get("CHAOS_MAX_ATTEMPTS", "15"))
CONCURRENCY = int(os.environ.get("CHAOS_CONCURRENCY", "16"))
ORDERING = cast(Literal["shard", "key", "none"], os.environ.get("CHAOS_ORDERING", "key"))
ENDS_DIR = os.environ.get("CHAOS_ENDS_DIR", "")
RETRY = RetryPolicy(max_attempts=MAX_ATTEMPTS, backoff=0.1, max_backoff=1.0)
# --replica runs: dead letters written durably (a failover must not lose them), and the
# records kept on a server of their own that no fault touches (LOG_REDIS_URL), so a
# failover that loses the lag's writes cannot lose the evidence the checker reads.
MIN_REPLICAS = int(os.environ.get("CHAOS_MIN_REPLICAS", "0"))
LOG_REDIS_URL = os.environ.get("CHAOS_LOG_REDIS_URL", "")

app = App(GROUP)
app.stream(STREAM, shards=SHARDS, min_replicas=MIN_REPLICAS)

# A schedule under the faults (tests/chaos/feature_checks.py): a tick every second,
# every missed one published, to a stream nobody consumes (the harness reads it back).
TICKS = "chaos-ticks"
TICK_SHARDS = 2
if os.environ.get("CHAOS_SCHEDULE", "1" if GROUP == "chaos" else "") == "1":
    app.stream(TICKS, shards=TICK_SHARDS, min_replicas=MIN_REPLICAS)

    @app.schedule("tick", stream=TICKS, every=timedelta(seconds=1), catch_up="all")
    def tick(tick: Tick) -> None: ...


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
# The same with the fence read before, from another server. KEYS: sequence, log.
# ARGV: the record, the fence.
_START_AT = """
local seq = redis.call('INCR', KEYS[1])
redis.call('RPUSH', KEYS[2], ARGV[1] .. '|' .. seq .. '|' .. ARGV[2])
return seq
"""
# KEYS: sequence, log. ARGV: the records (one or more).
_END = """
for i = 1, #ARGV do
  local seq = redis.call('INCR', KEYS[1])
  redis.call('RPUSH', KEYS[2], ARGV[i] .. '|' .. seq .. '|')
end
return #ARGV
"""


def log_key(prefix: str) -> str:
    return f"{prefix}:chaos:log"


def seq_key(prefix: str) -> str:
    return f"{prefix}:chaos:seq"


# End records not written yet (Redis was unreachable), oldest first; shared by the
# async runs and the threads of sync runs.
_unsent: list[str] = []
_unsent_lock = threading.Lock()
_sync_client: redis_sync.Redis | None = None
_runs = itertools.count(1)
_ends_fd: int | None = None
_ends_lock = threading.Lock()


def ends_file(directory: str, pid: int) -> str:
    return os.path.join(directory, f"ends-{pid}.jsonl")


def _note_end(line: str) -> None:
    """Append one end record to this process's local file (one ``write`` of a whole
    line to an ``O_APPEND`` file: concurrent writers never interleave within it)."""
    global _ends_fd
    if not ENDS_DIR:
        return
    with _ends_lock:
        if _ends_fd is None:
            flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT
            _ends_fd = os.open(ends_file(ENDS_DIR, os.getpid()), flags, 0o644)
        os.write(_ends_fd, (line + "\n").encode())


def _take_unsent() -> list[str]:
    with _unsent_lock:
        out = list(_unsent)
        _unsent.clear()
        return out


def _keep_unsent(records: list[str]) -> None:
    with _unsent_lock:
        _unsent[:0] = records


def _late(record: dict[str, Any]) -> str:
    return orjson.dumps({**record, "late": 1}).decode()


def _head(event: Event, ctx: Context) -> dict[str, Any]:
    message = ctx.message
    return {
        "g": GROUP,
        "m": ctx.member_id,
        "p": os.getpid(),
        "s": message.shard,
        "e": message.id,
        "i": event.id,
        "k": message.key,
        "a": message.attempt,
        "r": f"{os.getpid()}-{next(_runs)}",  # the run's id: its end record names it
        "f": ctx.fencing_token,  # what an application fences its side effects with
    }


def _end_kind(error: BaseException | None) -> str:
    if error is None:
        return "end"
    return "fail" if isinstance(error, Failed) else "exit"


def _ended(head: dict[str, Any], error: BaseException | None) -> tuple[dict[str, Any], list[str]]:
    """The run's end record, already in the local file, and the records to send now:
    it first, then the end records earlier runs could not write."""
    record = {**head, "ev": _end_kind(error), "t": time.monotonic()}
    line = orjson.dumps(record).decode()
    _note_end(line)
    return record, [line, *_take_unsent()]


def _due(ctx: Context, wall: float) -> dict[str, Any]:
    """For a delayed message's start record: its due time (ms, Redis clock) and the
    run's wall-clock entry time (s): the checker proves none ran early."""
    due = ctx.message.due_at
    return {} if due is None else {"d": due, "w": wall}


def _should_fail(event: Event, ctx: Context) -> bool:
    return event.poison or (event.flaky and ctx.message.attempt == 1)


async def _record_async(event: Event, ctx: Context) -> None:
    entered = time.monotonic()  # CLOCK_MONOTONIC: comparable across processes (Linux)
    wall = time.time()
    conn = ctx.app.connection
    redis: Any = _async_recorder(conn.redis)
    prefix = conn.keyspace.prefix
    fence_key = conn.keyspace.fence(ShardId.parse(ctx.message.shard), GROUP)
    head = _head(event, ctx)
    error: BaseException | None = None
    try:
        # Inside the try: a start record written whose reply is lost (Redis restarted,
        # the process frozen past its read timeout) still gets its end record.
        start = orjson.dumps({**head, "ev": "start", "t": entered, **_due(ctx, wall)}).decode()
        if LOG_REDIS_URL:
            # The fence read first, then the record elsewhere. A read that fails is
            # recorded all the same (fence "?", the run raises at once, having done
            # nothing): every handler entry is in the log, so no later attempt of the
            # entry looks like its first run.
            failed: BaseException | None = None
            try:
                fence = await redis.get(fence_key) or b""
            except (RedisError, OSError) as e:
                fence, failed = b"?", e
            await _log_async().eval(_START_AT, 2, seq_key(prefix), log_key(prefix), start, fence)
            if failed is not None:
                raise failed
        else:
            await redis.eval(_START, 3, seq_key(prefix), fence_key, log_key(prefix), start)
        if event.work:
            await anyio.sleep(event.work)
        if _should_fail(event, ctx):
            raise Failed(f"{event.id} fails on purpose (attempt {ctx.message.attempt})")
    except BaseException as e:
        error = e
        raise
    finally:
        record, records = _ended(head, error)
        late = records[1:]
        # Shielded: a run cancelled at its deadline still records when it ended.
        with anyio.CancelScope(shield=True), anyio.move_on_after(5):
            try:
                log = _log_async() if LOG_REDIS_URL else redis
                await log.eval(_END, 2, seq_key(prefix), log_key(prefix), *records)
                records = []
            except (RedisError, OSError):
                pass
        if records:
            _keep_unsent([_late(record), *late])


def _record_url() -> str | None:
    """``CHAOS_RECORD_REDIS_URL``: the records go through the worker's own path to
    Redis (its proxy), as the harness's default user: under ``--acl`` the worker's ACL
    user may touch only streamworks' keys (an application keeps its own data under
    its own credentials)."""
    return os.environ.get("CHAOS_RECORD_REDIS_URL") or None


_async_client: Any = None


def _async_recorder(worker_redis: Any) -> Any:
    global _async_client
    url = _record_url()
    if url is None:
        return worker_redis
    if _async_client is None:
        _async_client = create_redis(Settings(redis_url=url))
    return _async_client


_log_async_client: Any = None
_log_sync_client: redis_sync.Redis | None = None


def _log_async() -> Any:
    global _log_async_client
    if _log_async_client is None:
        _log_async_client = create_redis(Settings(redis_url=LOG_REDIS_URL))
    return _log_async_client


def _log_sync() -> redis_sync.Redis:
    global _log_sync_client
    if _log_sync_client is None:
        _log_sync_client = redis_sync.Redis.from_url(
            LOG_REDIS_URL, socket_timeout=3, socket_connect_timeout=3
        )
    return _log_sync_client


def _client() -> redis_sync.Redis:
    global _sync_client
    if _sync_client is None:
        url = _record_url() or os.environ.get("STREAMWORKS_REDIS_URL", "redis://127.0.0.1:6379/0")
        _sync_client = redis_sync.Redis.from_url(url, socket_timeout=3, socket_connect_timeout=3)
    return _sync_client


def _record_sync(event: Event, ctx: Context) -> None:
    entered = time.monotonic()
    wall = time.time()
    client = _client()
    prefix = ctx.app.connection.keyspace.prefix
    fence_key = ctx.app.connection.keyspace.fence(ShardId.parse(ctx.message.shard), GROUP)
    head = _head(event, ctx)
    error: BaseException | None = None
    try:
        start = orjson.dumps({**head, "ev": "start", "t": entered, **_due(ctx, wall)}).decode()
        if LOG_REDIS_URL:
            failed: BaseException | None = None
            try:
                fence = client.get(fence_key) or b""
            except (RedisError, OSError) as e:  # recorded all the same (see the async run)
                fence, failed = b"?", e
            _log_sync().eval(_START_AT, 2, seq_key(prefix), log_key(prefix), start, fence)
            if failed is not None:
                raise failed
        else:
            client.eval(_START, 3, seq_key(prefix), fence_key, log_key(prefix), start)
        if event.work:
            time.sleep(event.work)  # cannot be cancelled: past the lease, a fail-stop
        if _should_fail(event, ctx):
            raise Failed(f"{event.id} fails on purpose (attempt {ctx.message.attempt})")
    except BaseException as e:
        error = e
        raise
    finally:
        record, records = _ended(head, error)
        try:
            log = _log_sync() if LOG_REDIS_URL else client
            log.eval(_END, 2, seq_key(prefix), log_key(prefix), *records)
        except (RedisError, OSError):
            _keep_unsent([_late(record), *records[1:]])


if SYNC:

    @app.handler(STREAM, ordering=ORDERING, concurrency=CONCURRENCY, retry=RETRY)
    def record(event: Event, ctx: Context) -> None:
        _record_sync(event, ctx)

else:

    @app.handler(STREAM, ordering=ORDERING, concurrency=CONCURRENCY, retry=RETRY)
    async def record(event: Event, ctx: Context) -> None:
        await _record_async(event, ctx)
