"""Consume throughput: streamworks ``Worker`` vs raw redis-py loops, FastStream and taskiq.

200,000 pre-published messages of ~100 bytes on 8 shards, a no-op handler, one
consumer process per contestant, each through a consumer group of its own:

* ``raw-per-shard`` — the loop anyone would write for 8 shards, and the **headline
  baseline** of the ratios: one asyncio task per shard, each ``XREADGROUP COUNT
  100`` + a no-op per message + one ``XACK`` per batch, all in one process (the
  tasks' commands overlap on 8 connections of one client).
* ``raw-lean`` — the leanest loop (``raw_lean.py``): one task per shard on a
  connection of its own, a pre-packed ``XREADGROUP COUNT 100``, the reply left as the
  parser built it (no callbacks, no decoding), one hand-packed ``XACK`` per batch.
  streamworks' ratio against it is printed next to the headline one.
* ``raw-100`` / ``raw-500`` — the hand-written loop of ``throughput.py``: one
  coroutine, ``XREADGROUP COUNT 100`` (or 500) shard after shard, a no-op per
  message, one ``XACK`` per batch (one command in flight at a time). Its ratio
  is shown too (``× raw-100``).
* ``streamworks`` — a ``Worker`` with default settings, ``ordering="key"``, a
  ``StaticAssignment`` of all 8 shards (fenced reads, batched acks).
* ``faststream`` — one ``StreamSub(batch=True, max_records=100)`` subscriber per
  shard in a consumer group, ``AckPolicy.REJECT_ON_ERROR`` (ack after the handler,
  one ``XACK`` per batch).
* ``taskiq`` — ``taskiq_redis.RedisStreamBroker`` over the 8 shard streams
  (``queue_name`` + ``additional_streams``) driven by taskiq's ``Receiver`` with
  the ``taskiq worker`` defaults (100 async tasks, no prefetch, ack when saved).

FastStream and taskiq need their own entry formats, so each gets its own copy of
the data (same count, payload and shard layout); raw and streamworks read the same
entries. Then a **1 ms handler** variant (the handler awaits
``asyncio.sleep(0.001)``) on 20,000 messages: streamworks (``ordering="key"``,
default concurrency 64) vs a strictly sequential loop (computed: 1,000 msg/s, and
measured on a sample) vs FastStream with ``max_workers`` and taskiq with
``max_async_tasks``, both sized to 64 messages in flight in total.

Run: ``python bench/consume.py`` (``--messages``, ``--slow-messages``, ``--rounds``,
``--only``, ``--server``, ``--profile``). ``--help`` for all.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
import uuid
from typing import Any

import common
from common import KEYS, PAYLOAD, PREFIX, SHARDS, Suite

#: Contestants of the no-op run, in round order (reversed on odd rounds).
NOOP = (
    "raw-per-shard",
    "raw-lean",
    "raw-100",
    "raw-500",
    "streamworks",
    "streamworks-lib",
    "faststream-100",
    "faststream-500",
    "taskiq",
)
#: Contestants of the 1 ms run.
SLOW = ("sequential", "streamworks", "faststream", "taskiq")
#: Messages in flight for the 1 ms run: streamworks' default handler concurrency.
SLOW_IN_FLIGHT = 64
#: FastStream / taskiq settings (see README: why these are their fastest correct ones).
FS_MAX_RECORDS = 100  # per-message subscribers of the 1 ms run read this many per XREADGROUP
TQ_MAX_ASYNC_TASKS = 100
#: How each contestant is set up (copied into the JSON results).
#: The headline baseline of the no-op ratios, and the second one.
BASELINE = "raw-per-shard"
SECOND_BASELINE = "raw-100"
#: The leanest raw loop: streamworks' ratio against it is printed too (issue 23).
LEAN = "raw-lean"
CONFIG = {
    "raw-per-shard": "one asyncio task per shard, each XREADGROUP COUNT 100 on its shard; "
    "no-op; one XACK per batch; one process, one client (8 connections)",
    "raw-lean": "one asyncio task per shard on its own connection; pre-packed XREADGROUP "
    "COUNT 100, reply left undecoded (no redis-py callbacks); no-op; one hand-packed XACK "
    "per batch",
    "raw-N": "one coroutine; XREADGROUP COUNT N per shard in turn; no-op; one XACK per batch",
    "streamworks": "a worker process as `streamworks worker` runs it: Worker, default Settings "
    "(read_batch 500, read_ahead 3, ack_batch 1000), ordering='key', concurrency 64, "
    "StaticAssignment of the 8 shards, handler(payload: bytes); the startup heap frozen "
    "(freeze_startup_heap, as the command does once up)",
    "streamworks-lib": "the same Worker embedded as a library, without freeze_startup_heap "
    "(the cyclic collector rescans the startup heap)",
    "faststream-N": "8 x StreamSub(shard, group, consumer, batch=True, max_records=N), "
    "ack_policy=REJECT_ON_ERROR (ack after the handler, one XACK per batch), logger=None, "
    "handler(body: list[Any])",
    "faststream (1 ms)": f"8 x StreamSub(shard, group, consumer, max_records={FS_MAX_RECORDS}), "
    f"max_workers={SLOW_IN_FLIGHT // SHARDS} each (= {SLOW_IN_FLIGHT} in flight), "
    "ack_policy=REJECT_ON_ERROR (one XACK per message)",
    "taskiq": "RedisStreamBroker(queue_name=shard 0, additional_streams=shards 1-7, "
    "xread_count=100) + Receiver(max_async_tasks=100, max_prefetch=0, ack when_saved), "
    "task noop(payload: dict); one XACK per task",
    "taskiq (1 ms)": f"same with max_async_tasks={SLOW_IN_FLIGHT}",
    "sequential": "raw-100 loop awaiting the 1 ms handler for each message in turn",
}
#: A contestant that has not handled everything after this long reports a failure.
CHILD_TIMEOUT = 200.0


# -- data --------------------------------------------------------------------------------
def sw_keys(stream: str) -> list[str]:
    from streamworks.protocol.shards import ShardId
    from streamworks.redis.keyspace import Keyspace

    keyspace = Keyspace(PREFIX)
    return [keyspace.stream(ShardId(stream, i)) for i in range(SHARDS)]


def fs_keys(stream: str) -> list[str]:
    return [f"fs:{stream}/{i}" for i in range(SHARDS)]


def tq_keys(stream: str) -> list[str]:
    return [f"tq:{stream}/{i}" for i in range(SHARDS)]


async def prepare_sw(redis: Any, stream: str, n: int) -> list[str]:
    """Shard keys created the streamworks way, entries in the streamworks format."""
    from streamworks.coordinator.provision import create_shards
    from streamworks.protocol.shards import ShardId
    from streamworks.redis.keyspace import Keyspace
    from streamworks.redis.scripts import Scripts

    keys = sw_keys(stream)
    shards = [ShardId(stream, i) for i in range(SHARDS)]
    await create_shards(Scripts(redis), Keyspace(PREFIX), shards, ["seed"])
    data = common.payload_bytes()
    await common.xadd_pipelined(
        redis,
        (
            (keys[i % SHARDS], ("v", data, "t", "0", "f", "1", "k", f"c{i % KEYS}"))
            for i in range(n)
        ),
    )
    return keys


async def prepare_fs(redis: Any, stream: str, n: int) -> list[str]:
    """Entries as FastStream's ``broker.publish(..., stream=...)`` writes them: one
    ``__data__`` field in its binary message format (JSON body + headers)."""
    from faststream.redis.parser.binary import BinaryMessageFormatV1

    keys = fs_keys(stream)
    bodies = [
        await BinaryMessageFormatV1.encode(
            message=PAYLOAD, reply_to=None, headers=None, correlation_id=uuid.uuid4().hex
        )
        for _ in range(n)
    ]
    await common.xadd_pipelined(
        redis, ((keys[i % SHARDS], ("__data__", bodies[i])) for i in range(n))
    )
    return keys


async def prepare_tq(redis: Any, stream: str, n: int) -> list[str]:
    """Entries as ``RedisStreamBroker.kick`` writes them: one ``data`` field holding a
    JSON ``TaskiqMessage`` for the task ``bench.noop`` with the payload as argument."""
    from taskiq.formatters.json_formatter import JSONFormatter
    from taskiq.message import TaskiqMessage

    formatter = JSONFormatter()
    keys = tq_keys(stream)

    def entry(i: int) -> tuple[str, tuple[str, bytes]]:
        msg = TaskiqMessage(
            task_id=uuid.uuid4().hex,
            task_name="bench.noop",
            labels={},
            labels_types={},
            args=[PAYLOAD],
            kwargs={},
        )
        return keys[i % SHARDS], ("data", formatter.dumps(msg).message)

    await common.xadd_pipelined(redis, (entry(i) for i in range(n)))
    return keys


# -- contestants (each runs in its own process) ------------------------------------------
async def raw_child(
    url: str, keys: list[str], group: str, total: int, count: int, sleep: float = 0.0
) -> dict[str, Any]:
    """The hand-written loop: XREADGROUP COUNT n shard after shard, no-op (or a
    ``sleep`` per message, strictly one after another), one XACK per batch."""
    redis = common.create_client(url)
    await redis.ping()
    consumer = "raw"
    done = 0
    start = time.perf_counter()
    while done < total:
        for key in keys:
            reply = await redis.xreadgroup(group, consumer, {key: ">"}, count=count)
            if not reply:
                continue
            entries = reply[0][1]
            ids = []
            for entry_id, _fields in entries:
                if sleep:
                    await asyncio.sleep(sleep)
                ids.append(entry_id)
            await redis.xack(key, group, *ids)
            done += len(ids)
            if done >= total:
                break
    elapsed = time.perf_counter() - start
    await redis.aclose()
    return {"rate": done / elapsed, "elapsed": elapsed, "handled": done}


async def raw_tasks_child(
    url: str, keys: list[str], group: str, total: int, count: int = 100
) -> dict[str, Any]:
    """One task per shard: XREADGROUP COUNT n on its own shard, no-op, one XACK per
    batch, until its shard has nothing left (the entries were published before)."""
    redis = common.create_client(url)
    await redis.ping()
    done = 0

    async def drain(key: str) -> None:
        nonlocal done
        while True:
            reply = await redis.xreadgroup(group, "raw", {key: ">"}, count=count)
            if not reply or not reply[0][1]:
                return
            ids = [entry_id for entry_id, _fields in reply[0][1]]
            await redis.xack(key, group, *ids)
            done += len(ids)

    start = time.perf_counter()
    await asyncio.gather(*(drain(key) for key in keys))
    elapsed = time.perf_counter() - start
    await redis.aclose()
    if done != total:
        raise RuntimeError(f"raw-per-shard handled {done} of {total}")
    return {"rate": done / elapsed, "elapsed": elapsed, "handled": done}


def _sw_worker(url: str, group: str, stream: str, sleep: float) -> tuple[Any, Any, Any]:
    """An app with one no-op (or sleeping) handler and a worker owning all shards;
    returns ``(worker, redis, fences)`` where fences still have to be written."""
    from streamworks import App, Settings
    from streamworks.coordinator.provision import grant_token
    from streamworks.protocol.shards import ShardId
    from streamworks.redis.client import create_redis
    from streamworks.runtime.assignment import StaticAssignment
    from streamworks.runtime.worker import Worker

    settings = Settings(redis_url=url, key_prefix=PREFIX)
    redis = create_redis(settings)
    app = App(group, settings=settings)
    app.stream(stream, shards=SHARDS)

    if sleep:

        @app.handler(stream, ordering="key")
        async def handle_slow(payload: bytes) -> None:
            await asyncio.sleep(sleep)

    else:

        @app.handler(stream, ordering="key")
        async def handle(payload: bytes) -> None:
            return None

    member = uuid.uuid4().hex
    shards = [ShardId(stream, i) for i in range(SHARDS)]
    grants = {shard: grant_token(1, member) for shard in shards}
    worker = Worker(app, redis, StaticAssignment(grants), settings=settings, member_id=member)
    return worker, redis, shards


async def _sw_write_fences(worker: Any, shards: list[Any]) -> None:
    from streamworks.coordinator.provision import write_fence

    for shard in shards:
        await write_fence(worker.scripts, worker.keyspace, shard, worker.group, 1, worker.member_id)


async def sw_child(
    url: str, group: str, stream: str, total: int, sleep: float = 0.0, freeze: bool = True
) -> dict[str, Any]:
    """A streamworks ``Worker`` (default settings, ordering="key") on all shards.

    ``freeze``: as the ``streamworks worker`` command runs it, with the startup heap
    (modules, app, clients) moved out of the cyclic collector's reach once up
    (``freeze_startup_heap``); off, as a library embedding the Worker would run it."""
    import anyio

    from streamworks.runtime.process import freeze_startup_heap

    worker, redis, shards = _sw_worker(url, group, stream, sleep)
    if freeze:
        freeze_startup_heap()  # before the clock starts, as the command does before work
    await _sw_write_fences(worker, shards)
    stats = worker.handlers[stream].statistics
    start = time.perf_counter()
    async with anyio.create_task_group() as tg:
        await tg.start(worker.run)
        # Done when every message was handled and its ack confirmed.
        while worker.acker.acked < total:  # noqa: ASYNC110 - polling a counter, cheaply
            await asyncio.sleep(0.002)
        elapsed = time.perf_counter() - start
        worker.request_stop()
    await redis.aclose()
    return {"rate": total / elapsed, "elapsed": elapsed, "handled": stats.handled}


async def fs_child(
    url: str,
    keys: list[str],
    group: str,
    total: int,
    sleep: float = 0.0,
    max_workers: int = 1,
    max_records: int = FS_MAX_RECORDS,
) -> dict[str, Any]:
    """FastStream: one Redis stream subscriber per shard key in a consumer group.

    ``max_workers == 1``: batch mode (``max_records`` entries per XREADGROUP, the
    handler gets the batch, one XACK per batch after it returns). ``max_workers > 1``:
    per-message subscribers with a pool of that many concurrent handlers each (one
    XACK per message; FastStream ignores ``max_workers`` in batch mode).
    Ack policy REJECT_ON_ERROR (the Redis default, spelled out): ack after the
    handler returned; a failed message stays pending.
    """
    from faststream import AckPolicy
    from faststream.redis import RedisBroker, StreamSub

    broker = RedisBroker(url, logger=None)
    handled = 0
    done = asyncio.Event()

    def count(n: int) -> None:
        nonlocal handled
        handled += n
        if handled >= total:
            done.set()

    for key in keys:
        if max_workers == 1:

            @broker.subscriber(
                stream=StreamSub(
                    key, group=group, consumer="bench", batch=True, max_records=max_records
                ),
                ack_policy=AckPolicy.REJECT_ON_ERROR,
            )
            async def handle_batch(body: list[Any]) -> None:
                if sleep:
                    for _ in body:
                        await asyncio.sleep(sleep)
                count(len(body))

        else:

            @broker.subscriber(
                stream=StreamSub(key, group=group, consumer="bench", max_records=max_records),
                ack_policy=AckPolicy.REJECT_ON_ERROR,
                max_workers=max_workers,
            )
            async def handle_one(body: Any) -> None:
                if sleep:
                    await asyncio.sleep(sleep)
                count(1)

    probe = common.create_client(url)
    await broker.connect()
    start = time.perf_counter()
    await broker.start()
    await common.wait_handled(done, lambda: handled, CHILD_TIMEOUT)
    await common.wait_all_acked(probe, keys, group)
    elapsed = time.perf_counter() - start
    await broker.stop()
    await probe.aclose()
    return {"rate": total / elapsed, "elapsed": elapsed, "handled": handled}


async def tq_child(
    url: str,
    keys: list[str],
    group: str,
    total: int,
    sleep: float = 0.0,
    max_async_tasks: int = TQ_MAX_ASYNC_TASKS,
) -> dict[str, Any]:
    """taskiq: ``RedisStreamBroker`` reading all shard streams in one XREADGROUP,
    ``Receiver`` with the ``taskiq worker`` defaults (ack when saved = after the
    task ran and its result went to the (dummy) result backend, one XACK per task)."""
    from taskiq.receiver import Receiver
    from taskiq_redis import RedisStreamBroker

    broker = RedisStreamBroker(
        url,
        queue_name=keys[0],
        additional_streams=dict.fromkeys(keys[1:], ">"),
        consumer_group_name=group,
        consumer_name="bench",
        xread_count=100,
        xread_block=1000,
    )
    handled = 0
    done = asyncio.Event()

    @broker.task(task_name="bench.noop")
    async def noop(payload: dict[str, Any]) -> None:
        nonlocal handled
        if sleep:
            await asyncio.sleep(sleep)
        handled += 1
        if handled >= total:
            done.set()

    broker.is_worker_process = True
    receiver = Receiver(broker, max_async_tasks=max_async_tasks, max_prefetch=0)
    finish = asyncio.Event()
    probe = common.create_client(url)
    start = time.perf_counter()
    listen = asyncio.create_task(receiver.listen(finish))
    await common.wait_handled(done, lambda: handled, CHILD_TIMEOUT)
    await common.wait_all_acked(probe, keys, group)
    elapsed = time.perf_counter() - start
    # Stop listening; taskiq's Receiver may take a while (or, seen with 1000 async
    # tasks, forever) to wind down, which is not part of the measurement.
    finish.set()
    await asyncio.wait([listen], timeout=2)
    await probe.aclose()
    return {"rate": total / elapsed, "elapsed": elapsed, "handled": handled}


# -- the suite ---------------------------------------------------------------------------
def _target(name: str) -> str:
    return f"consume:{name}"


async def _round(
    suite: Suite, name: str, stream: str, total: int, group: str, sleep: float
) -> dict[str, Any]:
    """Create ``group`` for contestant ``name``, run it in its own process, drop the group."""
    from streamworks.coordinator.provision import create_group
    from streamworks.protocol.shards import ShardId
    from streamworks.redis.keyspace import Keyspace
    from streamworks.redis.scripts import Scripts

    if name.startswith(("raw", "sequential", "streamworks")):
        keys = sw_keys(stream)
        shards = [ShardId(stream, i) for i in range(SHARDS)]
        await create_group(Scripts(suite.redis), Keyspace(PREFIX), shards, group, "earliest")
    elif name.startswith("faststream"):
        keys = fs_keys(stream)
        await common.create_groups(suite.redis, keys, group)
    else:
        keys = tq_keys(stream)
        await common.create_groups(suite.redis, keys, group)
    try:
        if name == "raw-per-shard":
            return suite.child(
                _target("raw_tasks_child"), url=suite.url, keys=keys, group=group, total=total
            )
        if name == "raw-lean":
            return suite.child(
                "raw_lean:lean_child", url=suite.url, keys=keys, group=group, total=total
            )
        if name.startswith("raw"):
            count = int(name.split("-")[1])
            return suite.child(
                _target("raw_child"), url=suite.url, keys=keys, group=group, total=total,
                count=count,
            )  # fmt: skip
        if name == "sequential":
            return suite.child(
                _target("raw_child"),
                url=suite.url,
                keys=keys,
                group=group,
                total=total,
                count=100,
                sleep=sleep,
            )
        if name in ("streamworks", "streamworks-lib"):
            return suite.child(
                _target("sw_child"), url=suite.url, group=group, stream=stream, total=total,
                sleep=sleep, freeze=name == "streamworks",
            )  # fmt: skip
        if name.startswith("faststream"):
            # faststream-N: batch subscribers reading N entries per XREADGROUP;
            # faststream (1 ms run): per-message subscribers with max_workers each.
            if sleep:
                workers, records = max(1, SLOW_IN_FLIGHT // SHARDS), FS_MAX_RECORDS
            else:
                workers, records = 1, int(name.split("-")[1])
            return suite.child(
                _target("fs_child"), url=suite.url, keys=keys, group=group, total=total,
                sleep=sleep, max_workers=workers, max_records=records,
            )  # fmt: skip
        tasks = TQ_MAX_ASYNC_TASKS if not sleep else SLOW_IN_FLIGHT
        return suite.child(
            _target("tq_child"), url=suite.url, keys=keys, group=group, total=total,
            sleep=sleep, max_async_tasks=tasks,
        )  # fmt: skip
    finally:
        await common.destroy_groups(suite.redis, keys, group)


def _format(name: str) -> str:
    """Which entry format (and so which copy of the data) a contestant reads."""
    if name.startswith("faststream"):
        return "fs"
    if name == "taskiq":
        return "tq"
    return "sw"


async def prepare(suite: Suite, noop: dict[str, int], slow: dict[str, int]) -> float:
    """Pre-publish, per entry format, as many messages as its contestants consume."""
    start = time.perf_counter()
    preparers = {"sw": prepare_sw, "fs": prepare_fs, "tq": prepare_tq}
    for stream, counts in (("orders", noop), ("slow", slow)):
        need: dict[str, int] = {}
        for name, count in counts.items():
            fmt = _format(name)
            need[fmt] = max(need.get(fmt, 0), count)
        for fmt, count in need.items():
            await preparers[fmt](suite.redis, stream, count)
    return time.perf_counter() - start


async def run_suite(suite: Suite, args: argparse.Namespace) -> dict[str, Any]:
    """Run both consume variants; returns the JSON-able results."""
    n, n_slow, n_seq = args.messages, args.slow_messages, args.sequential_sample
    only = set(args.only.split(",")) if args.only else None
    noop = {
        c: (min(n, args.taskiq_messages) if c == "taskiq" else n)
        for c in NOOP
        if only is None or c in only
    }
    slow = {
        c: (min(n_seq, n_slow) if c == "sequential" else n_slow)
        for c in SLOW
        if n_slow and (only is None or c in only)
    }
    payload_len = len(common.payload_bytes())
    print(
        f"# consume: pre-publishing {n:,} messages of {payload_len} bytes on {SHARDS} shards "
        f"per entry format (taskiq: {noop.get('taskiq', 0):,}), + {n_slow:,} for the 1 ms run"
    )
    took = await prepare(suite, noop, slow)
    print(f"# pre-published in {took:.1f}s")

    noop_rates: dict[str, list[float]] = {c: [] for c in noop}
    for r in range(args.rounds):
        for name in common.alternate(list(noop), r):
            res = await _round(suite, name, "orders", noop[name], f"{name}-{r}", 0.0)
            noop_rates[name].append(res["rate"])
            print(f"consume no-op round {r + 1} {name:15s} {res['rate']:12,.0f} msg/s")

    slow_rates: dict[str, list[float]] = {}
    for c in slow:
        slow_rates[c] = []
        if c == "sequential":
            slow_rates["sequential (computed)"] = []
    for r in range(args.rounds):
        for name in common.alternate(list(slow), r):
            res = await _round(suite, name, "slow", slow[name], f"slow-{name}-{r}", 0.001)
            slow_rates[name].append(res["rate"])
            print(f"consume 1 ms round {r + 1} {name:15s} {res['rate']:12,.0f} msg/s")
        if "sequential" in slow:
            slow_rates["sequential (computed)"].append(1000.0)

    for stream in ("orders", "slow"):  # free the server's memory for the next suites
        for key in sw_keys(stream) + fs_keys(stream) + tq_keys(stream):
            await suite.redis.delete(key)

    noop_results = common.summarize(noop_rates, BASELINE if BASELINE in noop else None)
    second = common.summarize(noop_rates, SECOND_BASELINE if SECOND_BASELINE in noop else None)
    lean = common.summarize(noop_rates, LEAN if LEAN in noop else None)
    for name, r in noop_results.items():
        r["ratio_raw_100"] = second[name]["ratio"]
        r["ratio_raw_lean"] = lean[name]["ratio"]
    results = {
        "consume_noop": {
            "messages": noop,
            "baseline": BASELINE,
            "second_baseline": SECOND_BASELINE,
            "unit": "msg/s",
            "results": noop_results,
        },
        "consume_1ms": {
            "messages": slow,
            "sequential_sample": n_seq,
            "in_flight": SLOW_IN_FLIGHT,
            "baseline": "sequential (computed)",
            "unit": "msg/s",
            "results": common.summarize(
                slow_rates, "sequential (computed)" if "sequential" in slow else None
            ),
        },
        "consume_config": CONFIG,
    }
    print_results(results)
    return results


def print_results(results: dict[str, Any]) -> None:
    noop = results["consume_noop"]
    common.print_table(
        "consume, no-op handler (8 shards; medians of alternating rounds)",
        [
            "contestant",
            "messages",
            "msg/s",
            f"× {BASELINE}",
            "× raw-100",
            f"× {LEAN}",
            "rounds (msg/s)",
        ],
        [
            (
                name,
                noop["messages"][name],
                r["median"],
                r["ratio"],
                r.get("ratio_raw_100"),
                r.get("ratio_raw_lean"),
                " ".join(f"{x:,.0f}" for x in r["rounds"]),
            )
            for name, r in noop["results"].items()
        ],
        caption=f"{BASELINE}: one task per shard (XREADGROUP COUNT 100 + one XACK per batch, "
        "one process) — the headline baseline; raw-100: one coroutine visiting the shards "
        f"in turn; {LEAN}: one task per shard, replies left undecoded, hand-packed XACK",
    )
    verdict = _verdict(noop["results"])
    if verdict:
        print(verdict)
    slow = results["consume_1ms"]
    if slow["results"]:
        common.print_table(
            f"consume, 1 ms handler ({slow['in_flight']} messages in flight; medians)",
            ["contestant", "messages", "msg/s", "× sequential", "rounds (msg/s)"],
            [
                (
                    name,
                    slow["messages"].get(name),
                    r["median"],
                    r["ratio"],
                    " ".join(f"{x:,.0f}" for x in r["rounds"]),
                )
                for name, r in slow["results"].items()
            ],
            caption="sequential: one message after another (a raw loop awaiting the 1 ms "
            "handler per message); computed: exactly 1 ms per message",
        )


def _verdict(rows: dict[str, Any]) -> str:
    """The issue-14 targets in one line: streamworks ≥ 0.8× the one-task-per-shard raw
    loop and ≥ 3× FastStream's fastest setting, from this run's medians."""
    sw = rows.get("streamworks")
    raw = rows.get(BASELINE)
    if not sw or not raw:
        return ""
    line = f"streamworks: {sw['median'] / raw['median']:.2f}× {BASELINE} (target ≥ 0.8)"
    lean = rows.get(LEAN)
    if lean:
        line += f", {sw['median'] / lean['median']:.2f}× {LEAN} (target ≥ 0.85)"
    fs = {n: r["median"] for n, r in rows.items() if n.startswith("faststream")}
    if fs:
        best = max(fs, key=lambda n: fs[n])
        line += f", {sw['median'] / fs[best]:.1f}× the fastest FastStream ({best}; target ≥ 3)"
    return line


# -- profiling -----------------------------------------------------------------------------
async def _profile(url: str, n: int, out_dir: Any) -> None:
    """Run the streamworks contestant in this process under cProfile."""
    import cProfile
    import io
    import pstats

    from streamworks.coordinator.provision import create_group
    from streamworks.protocol.shards import ShardId
    from streamworks.redis.keyspace import Keyspace
    from streamworks.redis.scripts import Scripts

    redis = common.create_client(url)
    await prepare_sw(redis, "orders", n)
    shards = [ShardId("orders", i) for i in range(SHARDS)]
    await create_group(Scripts(redis), Keyspace(PREFIX), shards, "prof", "earliest")
    profiler = cProfile.Profile()
    profiler.enable()
    res = await sw_child(url, "prof", "orders", n)
    profiler.disable()
    await redis.aclose()
    out_dir.mkdir(parents=True, exist_ok=True)
    profiler.dump_stats(str(out_dir / "consume.prof.tmp"))
    buf = io.StringIO()
    stats = pstats.Stats(profiler, stream=buf)
    buf.write(f"streamworks consume under cProfile: {n:,} msgs, {res['rate']:,.0f} msg/s\n")
    stats.sort_stats("tottime").print_stats(30)
    stats.sort_stats("cumulative").print_stats(40)
    text = buf.getvalue()
    (out_dir / "profile-consume.txt").write_text(text)
    print(text)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    common.add_common_args(p)
    p.add_argument("--messages", type=int, default=200_000, help="no-op run (default 200000)")
    p.add_argument(
        "--taskiq-messages",
        type=int,
        default=30_000,
        help="taskiq's no-op run (default 30000: it runs at a few thousand msg/s)",
    )
    p.add_argument(
        "--slow-messages", type=int, default=20_000, help="1 ms run (default 20000; 0 skips it)"
    )
    p.add_argument(
        "--sequential-sample",
        type=int,
        default=2_000,
        help="messages of the measured sequential 1 ms loop (default 2000)",
    )
    p.add_argument("--only", help=f"comma-separated contestants of {NOOP + SLOW}")
    p.add_argument(
        "--profile",
        action="store_true",
        help="instead: profile the streamworks contestant in-process (cProfile) and write "
        "bench/results/profile-consume.txt",
    )
    return p


def main() -> None:
    args = parser().parse_args()
    if args.profile:
        server = common.start_server(args.server)
        try:
            common.run_async(_profile(server.url, args.messages, common.RESULTS_DIR), args.uvloop)
        finally:
            server.stop()
        return
    common.standalone(run_suite, args)


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    sys.exit(main())
