"""Periodic schedules in a ``TestRuntime``: ``advance`` makes them tick, exactly one
message per tick whichever member owns the schedule shard, catch-up policies after an
outage, cron in a time zone, the tick's function, and what ``status`` says.

Real Redis, the real coordinator, real workers; time moves with ``advance`` (Redis
time plus the clock offset is what the schedule scripts compare).
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo

import httpx
import pytest
from pydantic import BaseModel
from redis.asyncio import RedisCluster
from rich.console import Console

from streamworks import App, Message, Tick
from streamworks.cli.render import status_view
from streamworks.coordinator.dashboard.schedules import tick_time
from streamworks.exceptions import CoordinatorError
from streamworks.protocol.control import ScheduleInfo
from streamworks.schedule import Schedule
from streamworks.testing import TestRuntime
from streamworks.testing.runtime import fast_settings
from tests.support import wait_for

MINUTE = 60.0
#: Long leases: a jump of the clock by hours does not end them (the schedule's owner
#: keeps its grant; a test of a lost owner ends it on purpose).
LONG_LEASES = fast_settings(lease_ttl=7 * 86_400.0)


class Seen:
    """Every tick message the app's handler got: (event id, key, payload)."""

    def __init__(self) -> None:
        self.messages: list[tuple[str, str | None, dict[str, Any]]] = []

    def ticks(self) -> list[int]:
        return [int(e.rsplit(":", 1)[1]) for e, _, _ in self.messages]


def reports_app(seen: Seen, **schedule: Any) -> App:
    app = App("g")
    app.stream("reports", shards=3)

    @app.schedule("beat", stream="reports", **schedule)
    def beat(tick: Tick) -> None:
        return None

    @app.handler("reports")
    async def handle(value: dict[str, Any], msg: Message) -> None:
        assert msg.event_id is not None
        seen.messages.append((msg.event_id, msg.key, value))

    return app


async def schedule_info(rt: TestRuntime, name: str = "beat") -> ScheduleInfo | None:
    assert rt.service is not None
    group = await rt.service.group_info(rt.app.name)
    return next((s for s in group.schedules if s.name == name), None)


async def planned(rt: TestRuntime, name: str = "beat", after: int = 0) -> ScheduleInfo:
    """Wait until the schedule's owner planned a next tick after ``after``."""
    found: list[ScheduleInfo] = []

    async def ready() -> bool:
        info = await schedule_info(rt, name)
        if info is None or info.next_tick_ms is None or info.next_tick_ms <= after:
            return False
        found.append(info)
        return True

    await wait_for(ready, 10, f"schedule {name} to plan a tick after {after}")
    return found[-1]


async def advance_to(rt: TestRuntime, tick_ms: int) -> None:
    """Move the clock just past ``tick_ms`` (Redis time plus the offset)."""
    now = await redis_now(rt)
    await rt.advance(max(0.0, (tick_ms - now) / 1000) + 0.05)


async def redis_now(rt: TestRuntime) -> int:
    seconds, micros = await rt.redis.time()
    return int(seconds) * 1000 + int(micros) // 1000 + rt.clock.offset_ms


async def test_advance_makes_a_schedule_tick_exactly_once_with_three_workers(
    streamworks_runtime: Callable[..., TestRuntime],
) -> None:
    seen = Seen()
    app = reports_app(seen, every=timedelta(minutes=5))
    async with streamworks_runtime(app, workers=3, settings=LONG_LEASES) as rt:
        info = await planned(rt)
        assert info.spec == "every 5m" and info.stream == "reports"
        assert info.next_tick_ms is not None and info.next_tick_ms % 300_000 == 0
        owners = [w for w in rt.workers if w.scheduler is not None and w.scheduler.runners]
        assert len(owners) == 1  # one member runs the schedules

        first = info.next_tick_ms
        for n in range(3):
            await advance_to(rt, first + n * 300_000)
            await wait_for(lambda n=n: len(seen.messages) == n + 1, 10, f"tick {n + 1}")
            await rt.wait_idle()

        assert seen.ticks() == [first, first + 300_000, first + 600_000]
        assert sorted(await stream_ticks(rt)) == seen.ticks()
        event, key, payload = seen.messages[0]
        assert event == f"sw-tick:g:beat:{first}" and key == "beat"
        assert payload["schedule"] == "beat" and payload["tick_ms"] == first
        assert datetime.fromisoformat(payload["at"]) == datetime.fromtimestamp(first / 1000, UTC)
        after = await schedule_info(rt)
        assert after is not None
        assert (after.last_tick_ms, after.next_tick_ms) == (first + 600_000, first + 900_000)
        assert (after.published, after.duplicate, after.skipped, after.pending_tick_ms) == (
            3,
            0,
            0,
            None,
        )
        index = next(i for i, s in enumerate(rt.slots) if s.worker is owners[0])
        metrics = await rt.worker_metrics(index)
        published = (
            'streamworks_schedule_ticks_total{group="g",outcome="published",schedule="beat"}'
        )
        assert f"{published} 3.0" in metrics


async def test_a_tick_is_not_published_before_it_is_due(
    streamworks_runtime: Callable[..., TestRuntime],
) -> None:
    seen = Seen()
    app = reports_app(seen, every=timedelta(minutes=5))
    async with streamworks_runtime(app, settings=LONG_LEASES) as rt:
        info = await planned(rt)
        assert info.next_tick_ms is not None
        now = await redis_now(rt)
        await rt.advance((info.next_tick_ms - now) / 1000 - 1.0)  # a second early
        again = await planned(rt)
        assert again.next_tick_ms == info.next_tick_ms
        assert seen.messages == [] and again.published == 0
        await advance_to(rt, info.next_tick_ms)
        await wait_for(lambda: len(seen.messages) == 1, 10, "the tick")


@pytest.mark.parametrize(
    ("catch_up", "published", "skipped"),
    [("latest", [10], 9), ("all", list(range(1, 11)), 0), (3, [8, 9, 10], 7)],
)
async def test_missed_ticks_follow_the_catch_up_policy(
    streamworks_runtime: Callable[..., TestRuntime],
    catch_up: Any,
    published: list[int],
    skipped: int,
) -> None:
    """Ten ticks are due at once (the clock jumps ten periods, as after an outage):
    the policy decides which are published; the others are counted as skipped."""
    seen = Seen()
    app = reports_app(seen, every=timedelta(minutes=5), catch_up=catch_up)
    async with streamworks_runtime(app, settings=LONG_LEASES) as rt:
        info = await planned(rt)
        assert info.next_tick_ms is not None
        first = info.next_tick_ms
        await advance_to(rt, first + 9 * 300_000)  # ticks 1..10 due
        await wait_for(lambda: len(seen.messages) == len(published), 10, "the caught-up ticks")
        done = await planned(rt, after=first + 9 * 300_000)
        await rt.wait_idle()

        assert sorted(seen.ticks()) == [first + (n - 1) * 300_000 for n in published]
        assert (done.published, done.skipped) == (len(published), skipped)
        assert done.last_tick_ms == first + 9 * 300_000


async def test_cron_ticks_in_its_time_zone(
    streamworks_runtime: Callable[..., TestRuntime],
) -> None:
    """``0 9 * * *`` in Europe/Paris ticks at 09:00 Paris time (08:00 UTC in winter,
    07:00 in summer), whatever the day."""
    seen = Seen()
    paris = ZoneInfo("Europe/Paris")
    app = reports_app(seen, cron="0 9 * * *", tz="Europe/Paris")
    async with streamworks_runtime(app, settings=LONG_LEASES) as rt:
        info = await planned(rt)
        assert info.spec == "cron 0 9 * * * (Europe/Paris)"
        assert info.next_tick_ms is not None
        ticked = info.next_tick_ms - 1
        for n in range(2):
            tick = (await planned(rt, after=ticked)).next_tick_ms
            assert tick is not None
            local = datetime.fromtimestamp(tick / 1000, paris)
            assert (local.hour, local.minute, local.second) == (9, 0, 0)
            await advance_to(rt, tick)
            await wait_for(lambda n=n: len(seen.messages) == n + 1, 10, f"tick {n + 1}")
            ticked = tick
        first, second = seen.ticks()
        assert (second - first) // 3_600_000 in (23, 24, 25)  # a day (or a DST day)
        assert Schedule(cron="0 9 * * *", tz="Europe/Paris").next_tick(first) == second


class Report(BaseModel):
    period_end: datetime
    rows: int


async def test_the_schedules_function_makes_the_message(
    streamworks_runtime: Callable[..., TestRuntime],
) -> None:
    app = App("g")
    app.stream("reports", shards=2)
    got: list[tuple[str, Any]] = []

    @app.schedule("hourly", stream="reports", every=timedelta(hours=1), key="r")
    async def hourly(tick: Tick) -> Report:
        return Report(period_end=tick.at, rows=7)

    @app.schedule("plain", stream="reports", every=timedelta(hours=1))
    def plain() -> dict[str, int]:
        return {"n": 1}

    @app.handler("reports")
    async def handle(value: dict[str, Any], msg: Message) -> None:
        assert msg.key is not None
        got.append((msg.key, value))

    async with streamworks_runtime(app, settings=LONG_LEASES) as rt:
        info = await planned(rt, "hourly")
        await planned(rt, "plain")
        assert info.next_tick_ms is not None
        await advance_to(rt, info.next_tick_ms)
        await wait_for(lambda: len(got) == 2, 10, "both ticks")
        at = datetime.fromtimestamp(info.next_tick_ms / 1000, UTC)
        assert sorted(got, key=lambda g: g[0]) == [
            ("plain", {"n": 1}),
            ("r", {"period_end": at.isoformat().replace("+00:00", "Z"), "rows": 7}),
        ]


async def test_a_new_owner_continues_where_the_killed_one_stopped(
    streamworks_runtime: Callable[..., TestRuntime],
) -> None:
    """Ticks every second in real time, ``catch_up="all"``: the owner crashes (no
    leave); once its lease has expired the other member owns the schedule shard and
    publishes every tick since, each once: no gap, no duplicate."""
    seen = Seen()
    app = reports_app(seen, every=timedelta(seconds=1), catch_up="all")
    async with streamworks_runtime(app, workers=2) as rt:
        await wait_for(lambda: len(seen.messages) >= 2, 10, "two ticks")

        def owner() -> int | None:
            running = [i for i, s in enumerate(rt.slots) if owns(s.worker) and not s.done.is_set()]
            return running[0] if len(running) == 1 else None

        await wait_for(lambda: owner() is not None, 10, "one owner")
        killed = owner()
        assert killed is not None
        await rt.kill_worker(killed)
        survivor = rt.slots[1 - killed].worker
        await wait_for(lambda: owns(survivor), 10, "the survivor to own the schedules")
        at = len(seen.messages)
        await wait_for(lambda: len(seen.messages) >= at + 2, 10, "two more ticks")
        # What the stream holds (a handler may see an entry twice after a crash: that
        # is redelivery, not a second message).
        ticks = await stream_ticks(rt)
        assert len(ticks) == len(set(ticks)), ticks  # none twice
        assert sorted(ticks) == list(range(min(ticks), max(ticks) + 1, 1000))  # none missing


async def stream_ticks(rt: TestRuntime, stream: str = "reports") -> list[int]:
    """The tick of every entry in ``stream``'s shards (from its event id)."""
    ticks = []
    for key in await rt.shard_keys(stream):
        for _, fields in await rt.redis.xrange(key):
            ticks.append(int(fields[b"e"].decode().rsplit(":", 1)[1]))
    return ticks


def owns(worker: Any) -> bool:
    return bool(worker.scheduler is not None and worker.scheduler.runners)


async def test_status_the_cli_and_the_dashboard_show_last_and_next_tick(
    streamworks_runtime: Callable[..., TestRuntime],
) -> None:
    seen = Seen()
    app = reports_app(seen, every=timedelta(minutes=5))
    async with streamworks_runtime(app, settings=LONG_LEASES, http=True) as rt:
        info = await planned(rt)
        assert info.next_tick_ms is not None
        await advance_to(rt, info.next_tick_ms)
        done = await planned(rt, after=info.next_tick_ms)
        assert done.last_tick_ms == info.next_tick_ms and done.published == 1
        last, upcoming = tick_time(done.last_tick_ms), tick_time(done.next_tick_ms)

        assert rt.service is not None
        console = Console(width=200, record=True)
        console.print(status_view(await rt.service.status()))
        text = console.export_text()
        assert "schedules of g" in text and last in text and upcoming in text

        async with httpx.AsyncClient(base_url=str(rt.http_url)) as http:
            panels = (await http.get("/ui/panels")).text
        row = panels.split('data-schedule="beat"', 1)[1].split("</tr>", 1)[0]
        assert last in row and upcoming in row and "every 5m" in row


async def test_the_schedule_stream_cannot_be_scaled(
    streamworks_runtime: Callable[..., TestRuntime],
) -> None:
    app = reports_app(Seen(), every=timedelta(minutes=5))
    async with streamworks_runtime(app, settings=LONG_LEASES) as rt:
        assert rt.service is not None
        for shards in (0, 2):
            with pytest.raises(CoordinatorError) as refused:
                await rt.service.scale_stream("sw-schedules", shards)
            assert refused.value.code == "INVALID_REQUEST" and "internal" in str(refused.value)


@pytest.mark.cluster
async def test_a_durable_tick_is_done_only_once_replicas_have_it(
    streamworks_runtime: Callable[..., TestRuntime],
) -> None:
    """Durable target (``min_replicas=1``). On a server without replicas the entry is
    written but the tick is not recorded done (tried again, a duplicate on the same
    shard, until replicas acknowledge it); on the test cluster (a replica per master)
    it is recorded done."""
    app = App("g")
    app.stream("reports", shards=2, min_replicas=1, replica_timeout=1.0)

    @app.schedule("beat", stream="reports", every=timedelta(minutes=5))
    def beat() -> None: ...

    async with streamworks_runtime(app, settings=LONG_LEASES) as rt:
        replicated = isinstance(rt.redis, RedisCluster)  # the test cluster has replicas
        info = await planned(rt)
        tick = info.next_tick_ms
        assert tick is not None
        await advance_to(rt, tick)

        async def settled() -> bool:
            now = await schedule_info(rt)
            if now is None:
                return False
            return now.last_tick_ms == tick if replicated else now.pending_tick_ms == tick

        await wait_for(settled, 10, "the tick claimed (and done, with replicas)")
        await wait_for(lambda: stream_ticks(rt), 10, "its entry written")
        assert await stream_ticks(rt) == [tick]
        after = await schedule_info(rt)
        assert after is not None
        if replicated:
            assert (after.published, after.pending_tick_ms) == (1, None)
        else:
            assert (after.published, after.pending_tick_ms) == (0, tick)
