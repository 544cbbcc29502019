"""Tick precision of periodic schedules: how late a tick's message enters its stream.

One app with ``--schedules`` schedules ticking every second (``every=1s``) to a
3-shard stream, run by ``--workers`` in-process workers (a ``TestRuntime``: the real
coordinator, real workers, on the script's own server) for ``--duration`` seconds of
real time. For every tick, from Redis alone:

* **publish lateness** = the entry id's milliseconds (Redis time of the ``XADD``)
  minus the tick's nominal time (in its event id);
* **done lateness** = when the owner recorded the tick done (``last_at`` of the
  schedule's state, the third step of the claim → publish → done state machine)
  minus the tick; per schedule, for its last tick only.

And the check the numbers rest on: every tick in ``(first, last]`` of each schedule is
in the stream exactly once (``catch_up="all"``). The first second is warm-up.

Run: ``python bench/schedules.py`` (``--duration 20 --schedules 50``);
``--quick`` is ``--duration 3 --schedules 5``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import uuid
from datetime import timedelta
from typing import Any

import common
from common import Suite

STREAM = "ticks"
WARMUP_MS = 1000


def build_app(schedules: int) -> Any:
    from streamworks import App

    app = App("bench-schedules")
    app.stream(STREAM, shards=3)
    for n in range(schedules):
        app.schedule(f"s{n}", stream=STREAM, every=timedelta(seconds=1), catch_up="all")(
            lambda: None
        )
    return app


async def measure(suite: Suite, args: Any) -> dict[str, Any]:
    import anyio

    from streamworks.testing import TestRuntime

    app = build_app(args.schedules)
    prefix = f"bs{uuid.uuid4().hex[:8]}"
    async with TestRuntime(
        app, workers=args.workers, redis_url=suite.url, key_prefix=prefix, acl=False
    ) as rt:
        started_ms = rt.clock.time_ms()
        await anyio.sleep(args.duration)
        assert rt.service is not None
        group = await rt.service.group_info(app.name)
        done = [
            s.last_tick_ms and _int(await _last_at(rt, s.name)) - s.last_tick_ms
            for s in group.schedules
        ]
        entries: list[tuple[str, int, int]] = []
        for key in await rt.shard_keys(STREAM):
            for entry_id, fields in await rt.redis.xrange(key):
                name, tick = fields[b"e"].decode().rsplit(":", 2)[1:]
                entries.append((name, int(tick), int(entry_id.decode().split("-")[0])))
    by_schedule: dict[str, list[int]] = {}
    for name, tick, _ in entries:
        by_schedule.setdefault(name, []).append(tick)
    duplicates = sum(len(t) - len(set(t)) for t in by_schedule.values())
    gaps = sum((max(t) - min(t)) // 1000 + 1 - len(set(t)) for t in by_schedule.values() if t)
    late = sorted(at - tick for _, tick, at in entries if tick >= started_ms + WARMUP_MS)
    return {
        "schedules": args.schedules,
        "workers": args.workers,
        "duration_s": args.duration,
        "ticks": len(entries),
        "duplicates": duplicates,
        "gaps": gaps,
        "publish_lateness_ms": _percentiles(late),
        "done_lateness_ms": _percentiles(sorted(d for d in done if d is not None)),
    }


async def _last_at(rt: Any, name: str) -> Any:
    from streamworks.protocol.shards import ShardId

    info = await rt.service.stream_info("sw-schedules")
    shard = ShardId.parse(info.shards[0].shard)
    return await rt.redis.hget(
        rt.keyspace.schedule_state(shard, "bench-schedules", name), "last_at"
    )


def _int(value: Any) -> int:
    return int(value) if value is not None else 0


def _percentiles(xs: list[int]) -> dict[str, float]:
    if not xs:
        return {"p50": float("nan"), "p99": float("nan"), "max": float("nan")}
    p99 = xs[min(len(xs) - 1, int(len(xs) * 0.99))]
    return {"p50": statistics.median(xs), "p99": p99, "max": xs[-1]}


async def main(suite: Suite, args: Any) -> dict[str, Any]:
    rounds = []
    for n in range(args.rounds):
        result = await measure(suite, args)
        rounds.append(result)
        pub, done = result["publish_lateness_ms"], result["done_lateness_ms"]
        print(
            f"round {n + 1}: {result['ticks']} ticks of {args.schedules} schedules, "
            f"{args.workers} workers, {result['duplicates']} duplicate, {result['gaps']} "
            f"missing | tick → in stream ms p50 {common.fmt(pub['p50'])} p99 "
            f"{common.fmt(pub['p99'])} max {common.fmt(pub['max'])} | tick → done ms p50 "
            f"{common.fmt(done['p50'])} max {common.fmt(done['max'])}"
        )
        if result["duplicates"] or result["gaps"]:
            raise SystemExit("a tick was published twice or not at all")
    return {"schedules": rounds}


def parse_args() -> Any:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    common.add_common_args(parser)
    parser.add_argument("--duration", type=float, default=20.0, help="seconds per round")
    parser.add_argument("--schedules", type=int, default=50, help="schedules (every 1 s)")
    parser.add_argument("--workers", type=int, default=3, help="in-process workers")
    parser.add_argument("--quick", action="store_true", help="--duration 3 --schedules 5")
    args = parser.parse_args()
    if args.quick:
        args.duration, args.schedules = 3.0, 5
    return args


if __name__ == "__main__":
    os.environ.pop("STREAMWORKS_TEST_REDIS_ACL", None)
    common.standalone(main, parse_args())
