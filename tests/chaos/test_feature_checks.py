"""The delayed-message and schedule checks of the chaos run (``feature_checks.py``) on
hand-made inputs: each must fail on the violation it exists for — a delayed message
lost, handled early or entered twice, a tick published twice, missing or early, a
schedule that stopped, delayed keys left behind — and pass a clean history."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any

import orjson

from streamworks.protocol.shards import ShardId
from streamworks.redis.keyspace import Keyspace
from tests.chaos.checker import Acked, DeadLetter, FaultWindow, check, parse_log
from tests.chaos.feature_checks import (
    CLOCK_TOLERANCE_MS,
    TICK_MS,
    FeatureReport,
    TickEntry,
    check_ticks,
    delayed_starts,
    leftover_delayed_keys,
    read_ticks,
)

DUE = 1_767_000_000_000  # ms since the epoch (Redis clock)
FENCE = "1:" + "a" * 32


class Log:
    """Log lines the way the chaos app writes them (``json|seq|fence``)."""

    def __init__(self) -> None:
        self.seq = itertools.count(1)
        self.lines: list[bytes] = []

    def run(
        self,
        event: str,
        entry: str,
        *,
        due: int | None = None,
        wall_ms: float = 0.0,
        shard: str = "chaos/0@0",
        ok: bool = True,
    ) -> None:
        run_id = f"1-{len(self.lines)}"
        head = {"g": "chaos", "m": "a" * 32, "p": 1, "s": shard, "e": entry, "i": event}
        start = {**head, "k": "k1", "a": 1, "r": run_id, "ev": "start", "t": 1.0}
        if due is not None:
            start |= {"d": due, "w": wall_ms / 1000}
        self.lines.append(orjson.dumps(start) + f"|{next(self.seq)}|{FENCE}".encode())
        if ok:
            end = {**head, "r": run_id, "ev": "end", "t": 1.01}
            self.lines.append(orjson.dumps(end) + f"|{next(self.seq)}|".encode())


def delayed(event: str, due: int = DUE, shard: str = "chaos/0@0", **kw: Any) -> Acked:
    return Acked(event, "k1", shard, "", due_ms=due, **kw)


def features(log: Log, acked: list[Acked], dead: Sequence[DeadLetter] = ()) -> FeatureReport:
    """Through the whole checker: a failing feature check fails the run."""
    runs = parse_log(log.lines)
    report = check(runs, acked, dead, [], delayed=delayed_starts(log.lines))
    if not report.features.ok:
        assert not report.ok and report.failures()
    return report.features


def test_a_clean_history_of_delayed_messages_passes() -> None:
    log = Log()
    log.run("p0-1", f"{DUE}-0", due=DUE, wall_ms=DUE + 3)
    log.run("p0-2", f"{DUE + 500}-0", due=DUE + 500, wall_ms=DUE + 504)
    log.run("p0-3", f"{DUE - 9000}-0")  # an immediate one: not part of these checks
    acked = [delayed("p0-1"), delayed("p0-2", DUE + 500), Acked("p0-3", "k1", "chaos/0@0", "")]
    report = features(log, acked)
    assert report.ok, report.failures()
    assert report.delayed == 2 and report.delayed_handled == 2 and report.delayed_runs == 2
    assert sorted(report.lateness_ms) == [3, 4]


def test_a_lost_delayed_message_fails_the_run() -> None:
    log = Log()
    log.run("p0-1", f"{DUE}-0", due=DUE, wall_ms=DUE + 3)
    log.run("p0-2", f"{DUE}-1", due=DUE, wall_ms=DUE + 3, ok=False)  # never completed
    report = features(log, [delayed("p0-1"), delayed("p0-2"), delayed("p0-3")])
    assert not report.ok
    assert [x.split()[0] for x in report.delayed_lost] == ["p0-2", "p0-3"]
    assert any(f.startswith("delayed messages lost: 2") for f in report.failures())


def test_a_dead_lettered_delayed_message_is_not_lost() -> None:
    log = Log()
    log.run("p0-1", f"{DUE}-0", due=DUE, wall_ms=DUE + 1, ok=False)
    dead = [DeadLetter("p0-1", "chaos/0@0", f"{DUE}-0", "max_attempts", 15)]
    report = features(log, [delayed("p0-1")], dead)
    assert report.ok, report.failures()
    assert report.delayed_dead_lettered == 1


def test_a_run_started_before_its_due_time_is_an_early_delivery() -> None:
    log = Log()
    # Within the stated tolerance: not early; 2 ms before: early.
    log.run("p0-1", f"{DUE}-0", due=DUE, wall_ms=DUE - CLOCK_TOLERANCE_MS)
    log.run("p0-2", f"{DUE}-1", due=DUE, wall_ms=DUE - CLOCK_TOLERANCE_MS - 1)
    report = features(log, [delayed("p0-1"), delayed("p0-2")])
    assert not report.ok
    assert len(report.early_runs) == 1 and report.early_runs[0].startswith("p0-2 ")
    assert not report.early_entries


def test_an_entry_added_to_the_stream_before_its_due_time_is_early() -> None:
    log = Log()
    log.run("p0-1", f"{DUE - 1}-0", due=DUE, wall_ms=DUE + 5)  # in the stream 1 ms early
    report = features(log, [delayed("p0-1")])
    assert not report.ok
    assert report.early_entries and not report.early_runs


def test_a_due_time_other_than_the_publish_said_fails() -> None:
    log = Log()
    log.run("p0-1", f"{DUE + 5000}-0", due=DUE + 5000, wall_ms=DUE + 5001)
    report = features(log, [delayed("p0-1", DUE)])
    assert report.due_mismatch and not report.ok
    # A retried publish may have stored a second copy with its own due time (E18).
    retried = features(log, [delayed("p0-1", DUE, retried=True)])
    assert retried.ok, retried.failures()


def test_a_delayed_message_entered_twice_on_one_shard_fails() -> None:
    log = Log()
    log.run("p0-1", f"{DUE}-0", due=DUE, wall_ms=DUE + 1)
    log.run("p0-1", f"{DUE + 7}-0", due=DUE, wall_ms=DUE + 8)  # a second entry
    report = features(log, [delayed("p0-1")])
    assert not report.ok and report.delayed_entered_twice
    # Re-runs of the same entry (a redelivery) are not a second entry.
    again = Log()
    again.run("p0-1", f"{DUE}-0", due=DUE, wall_ms=DUE + 1)
    again.run("p0-1", f"{DUE}-0", due=DUE, wall_ms=DUE + 900)
    assert features(again, [delayed("p0-1")]).ok


def ticks(*times: int, schedule: str = "sw-tick:chaos:tick", late: int = 20) -> list[TickEntry]:
    return [TickEntry(f"{schedule}:{t}", "chaos-ticks/0@0", f"{t + late}-0") for t in times]


def test_contiguous_ticks_each_once_pass() -> None:
    report = FeatureReport()
    check_ticks(report, ticks(*(DUE + k * TICK_MS for k in range(10))), healed_ms=DUE + 8000)
    assert report.ok, report.failures()
    assert report.ticks == 10 and report.schedules == 1


def test_a_tick_published_twice_fails() -> None:
    report = FeatureReport()
    entries = ticks(DUE, DUE + TICK_MS, DUE + 2 * TICK_MS) + ticks(DUE + TICK_MS, late=300)
    check_ticks(report, entries)
    assert not report.ok
    assert len(report.duplicate_ticks) == 1 and f":{DUE + TICK_MS} x2" in report.duplicate_ticks[0]


def test_a_missing_tick_is_a_gap() -> None:
    report = FeatureReport()
    check_ticks(report, ticks(DUE, DUE + TICK_MS, DUE + 4 * TICK_MS))
    assert not report.ok
    assert report.tick_gaps == [f"sw-tick:chaos:tick: 2 tick(s) after {DUE + TICK_MS}"]


def test_a_tick_published_before_its_time_fails() -> None:
    report = FeatureReport()
    check_ticks(report, ticks(DUE) + ticks(DUE + TICK_MS, late=-1))
    assert not report.ok and len(report.early_ticks) == 1


def test_a_schedule_that_stopped_before_the_heal_fails() -> None:
    report = FeatureReport()
    check_ticks(report, ticks(DUE, DUE + TICK_MS), healed_ms=DUE + 10 * TICK_MS)
    assert not report.ok and report.stale_schedules
    none = FeatureReport()
    check_ticks(none, [], healed_ms=DUE)
    assert none.stale_schedules == ["no schedule published any tick"]


def test_schedules_are_checked_apart() -> None:
    report = FeatureReport()
    entries = ticks(DUE, DUE + TICK_MS) + ticks(DUE + 5 * TICK_MS, schedule="sw-tick:chaos:b")
    check_ticks(report, entries)
    assert report.ok and report.schedules == 2


async def test_ticks_and_leftover_delayed_keys_are_read_from_redis(
    redis: Any, keyspace: Keyspace
) -> None:
    prefix = keyspace.prefix
    ticks_shard = ShardId.parse("chaos-ticks/0@0")
    await redis.xadd(keyspace.stream(ticks_shard), {"e": f"sw-tick:chaos:tick:{DUE}"})
    [entry] = await read_ticks(redis, prefix, ["chaos-ticks/0@0"])
    assert entry.tick_ms == DUE and entry.schedule == "sw-tick:chaos:tick"

    active, retired = ShardId.parse("chaos/0@1"), ShardId.parse("chaos/3@0")
    await redis.incr(keyspace.delayed_counter(active))  # these stay with an active shard
    await redis.xadd(keyspace.delayed_wake(active), {"w": "1"})
    assert await leftover_delayed_keys(redis, prefix, "chaos", ["chaos/0@1"]) == []
    await redis.zadd(keyspace.delayed(active), {"1": DUE})  # still waiting at the end
    await redis.incr(keyspace.delayed_counter(retired))  # a retired shard's key
    left = await leftover_delayed_keys(redis, prefix, "chaos", ["chaos/0@1"])
    assert left == sorted(
        [
            f"{keyspace.delayed(active)} (still holds delayed messages)",
            f"{keyspace.delayed_counter(retired)} (shard retired)",
        ]
    )


def test_a_second_entry_after_a_redis_failover_is_counted_not_failed() -> None:
    log = Log()
    log.run("p0-1", f"{DUE}-0", due=DUE, wall_ms=DUE + 1)  # its move lost by the failover
    log.run("p0-1", f"{DUE + 3000}-0", due=DUE, wall_ms=DUE + 3001)  # moved again
    runs = parse_log(log.lines)
    starts = delayed_starts(log.lines)
    # A failover window between the two entries (monotonic s + wall offset = wall s).
    failover = FaultWindow("redis-failover", "redis", 1.0, 2.0)
    offset = DUE / 1000 - 0.5
    report = check(runs, [delayed("p0-1")], [], [failover], delayed=starts, wall_offset=offset)
    assert report.features.ok, report.features.failures()
    assert len(report.features.moved_again_after_failover) == 1
    # The same failover long before: the second entry is a violation.
    early = FaultWindow("redis-failover", "redis", -100.0, -99.0)
    bad = check(runs, [delayed("p0-1")], [], [early], delayed=starts, wall_offset=offset)
    assert bad.features.delayed_entered_twice and not bad.ok
