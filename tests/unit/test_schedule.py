"""The schedule model: ticks of every= and cron= (with time zones and DST), the ticks
due after an outage under each catch-up policy, and the tick's identity."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streamworks.exceptions import ConfigurationError
from streamworks.schedule import SKIPPED_COUNT_CAP, Schedule, tick_event_id

MIN = 60_000
HOUR = 60 * MIN
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def ms(dt: datetime) -> int:
    return int((dt - EPOCH) / timedelta(milliseconds=1))


def at(text: str, tz: str = "UTC") -> int:
    return ms(datetime.fromisoformat(text).replace(tzinfo=ZoneInfo(tz)))


def local(tick: int, tz: str) -> str:
    return (EPOCH + timedelta(milliseconds=tick)).astimezone(ZoneInfo(tz)).isoformat()


# -- every= ---------------------------------------------------------------------------
def test_every_ticks_on_a_grid_anchored_at_the_epoch() -> None:
    s = Schedule(every=timedelta(minutes=5))
    assert s.next_tick(at("2026-12-02T10:03:10")) == at("2026-12-02T10:05:00")
    assert s.next_tick(at("2026-12-02T10:05:00")) == at("2026-12-02T10:10:00")


def test_every_with_an_anchor() -> None:
    anchor = datetime(2026, 1, 1, 6, 30, tzinfo=UTC)
    s = Schedule(every=timedelta(days=1), anchor=anchor)
    assert s.next_tick(at("2026-12-02T10:00:00")) == at("2026-12-03T06:30:00")


periods = st.integers(1, 7 * 24 * 3600).map(lambda s: timedelta(seconds=s))
instants = st.integers(0, 2**41)


@settings(deadline=None)  # CPU-bound examples on a shared machine
@given(periods, instants, st.integers(0, 2**33))
def test_every_next_tick_is_the_first_grid_point_after(
    period: timedelta, after: int, anchor_ms: int
) -> None:
    anchor = EPOCH + timedelta(milliseconds=anchor_ms)
    s = Schedule(every=period, anchor=anchor)
    p = int(period / timedelta(milliseconds=1))
    tick = s.next_tick(after)
    assert after < tick <= after + p
    assert (tick - anchor_ms) % p == 0


@settings(deadline=None)  # CPU-bound examples on a shared machine
@given(
    periods,
    instants,
    st.integers(0, 50),
    st.sampled_from(["latest", "all", 1, 2, 3, 10]),
)
def test_due_ticks_follow_the_catch_up_policy(
    period: timedelta, last: int, missed: int, catch_up: str | int
) -> None:
    s = Schedule(every=period, catch_up=catch_up)  # type: ignore[arg-type]
    p = int(period / timedelta(milliseconds=1))
    now = last + missed * p
    expected = []
    tick = s.next_tick(last)
    while tick <= now:
        expected.append(tick)
        tick += p
    due = s.due(last, now)
    keep = {"latest": 1, "all": len(expected)}.get(catch_up, catch_up)  # type: ignore[arg-type]
    assert list(due.publish) == expected[len(expected) - min(keep, len(expected)) :]
    assert due.skipped + len(due.publish) == len(expected)
    assert all(last < t <= now for t in due.publish)


def test_all_is_published_in_slices_oldest_first() -> None:
    s = Schedule(every=timedelta(seconds=1), catch_up="all")
    first = s.due(0, 10_000, limit=4)
    assert first.publish == (1000, 2000, 3000, 4000) and first.skipped == 0
    assert s.due(first.publish[-1], 10_000, limit=4).publish == (5000, 6000, 7000, 8000)


def test_nothing_is_due_at_or_before_the_last_tick() -> None:
    s = Schedule(every=timedelta(minutes=1))
    assert s.due(10 * MIN, 10 * MIN).publish == ()
    assert s.due(10 * MIN, 10 * MIN + MIN - 1).publish == ()
    assert s.due(10 * MIN, 11 * MIN).publish == (11 * MIN,)


def test_a_last_tick_off_the_grid_after_a_period_change() -> None:
    s = Schedule(every=timedelta(minutes=10), catch_up="all")
    assert s.due(7 * MIN, 31 * MIN).publish == (10 * MIN, 20 * MIN, 30 * MIN)


# -- cron= ----------------------------------------------------------------------------
def test_cron_next_tick_in_utc() -> None:
    s = Schedule(cron="0 * * * *")
    assert s.next_tick(at("2026-12-02T10:00:00")) == at("2026-12-02T11:00:00")
    assert s.next_tick(at("2026-12-02T10:59:59.999")) == at("2026-12-02T11:00:00")


def test_cron_aliases_and_seconds_field() -> None:
    assert Schedule(cron="@daily").next_tick(at("2026-12-02T10:00:00")) == at("2026-12-03T00:00:00")
    assert Schedule(cron="*/15 * * * * *").next_tick(at("2026-12-02T10:00:01")) == at(
        "2026-12-02T10:00:15"
    )


def test_cron_in_a_time_zone() -> None:
    s = Schedule(cron="0 9 * * MON-FRI", tz="Europe/Paris")
    tick = s.next_tick(at("2026-12-04T09:00:00", "Europe/Paris"))  # a Friday
    assert local(tick, "Europe/Paris") == "2026-12-07T09:00:00+01:00"


def test_a_fixed_time_in_the_skipped_hour_runs_once_after_the_change() -> None:
    s = Schedule(cron="30 2 * * *", tz="Europe/Paris", catch_up="all")
    start = at("2026-03-28T12:00:00", "Europe/Paris")
    ticks = s.due(start, start + 3 * 24 * HOUR).publish
    assert [local(t, "Europe/Paris") for t in ticks] == [
        "2026-03-29T03:00:00+02:00",
        "2026-03-30T02:30:00+02:00",
        "2026-03-31T02:30:00+02:00",
    ]


def test_a_fixed_time_in_the_repeated_hour_runs_once() -> None:
    s = Schedule(cron="30 2 * * *", tz="Europe/Paris", catch_up="all")
    start = at("2026-10-24T12:00:00", "Europe/Paris")
    ticks = s.due(start, start + 2 * 24 * HOUR).publish
    assert [local(t, "Europe/Paris") for t in ticks] == [
        "2026-10-25T02:30:00+02:00",
        "2026-10-26T02:30:00+01:00",
    ]


def test_an_interval_in_the_repeated_hour_runs_in_both() -> None:
    s = Schedule(cron="*/30 * * * *", tz="Europe/Paris", catch_up="all")
    start = at("2026-10-25T01:50:00", "Europe/Paris")
    ticks = s.due(start, start + 2 * HOUR + 20 * MIN).publish
    assert [local(t, "Europe/Paris") for t in ticks] == [
        "2026-10-25T02:00:00+02:00",
        "2026-10-25T02:30:00+02:00",
        "2026-10-25T02:00:00+01:00",
        "2026-10-25T02:30:00+01:00",
        "2026-10-25T03:00:00+01:00",
    ]


@settings(deadline=None)  # CPU-bound examples on a shared machine
@given(st.integers(ms(datetime(2020, 1, 1, tzinfo=UTC)), ms(datetime(2035, 1, 1, tzinfo=UTC))))
def test_cron_agrees_with_a_minute_by_minute_scan(after: int) -> None:
    s = Schedule(cron="7,37 */3 * * *")
    tick = s.next_tick(after)
    t = after - after % MIN + MIN
    while True:
        d = EPOCH + timedelta(milliseconds=t)
        if d.minute in (7, 37) and d.hour % 3 == 0:
            break
        t += MIN
    assert tick == t


@pytest.mark.parametrize("catch_up", ["latest", 2, "all"])
def test_cron_catch_up_after_an_outage(catch_up: str | int) -> None:
    s = Schedule(cron="0 * * * *", catch_up=catch_up)  # type: ignore[arg-type]
    last = at("2026-12-02T10:00:00")
    due = s.due(last, at("2026-12-02T13:30:00"))
    hours = [at(f"2026-12-02T{h}:00:00") for h in (11, 12, 13)]
    expected = {"latest": hours[2:], 2: hours[1:], "all": hours}[catch_up]
    assert list(due.publish) == expected
    assert due.skipped == 3 - len(expected)


def test_a_tick_exactly_at_now_is_due() -> None:
    s = Schedule(cron="0 * * * *")
    now = at("2026-12-02T11:00:00")
    assert s.due(at("2026-12-02T10:00:00"), now).publish == (now,)


def test_a_huge_outage_counts_skipped_ticks_up_to_the_cap() -> None:
    s = Schedule(cron="* * * * * *")  # every second
    due = s.due(0, at("2026-12-02T00:00:00"))
    assert len(due.publish) == 1
    assert due.skipped == SKIPPED_COUNT_CAP


# -- validation -----------------------------------------------------------------------
@pytest.mark.parametrize(
    ("kwargs", "words"),
    [
        ({}, "exactly one of every= or cron="),
        ({"every": timedelta(minutes=1), "cron": "* * * * *"}, "exactly one"),
        ({"every": timedelta(milliseconds=500)}, "shorter than the minimum"),
        ({"every": 60}, "must be a timedelta"),
        ({"every": timedelta(minutes=1), "tz": "Europe/Paris"}, "tz= applies to cron="),
        ({"every": timedelta(minutes=1), "anchor": datetime(2026, 1, 1)}, "timezone-aware"),
        ({"cron": "0 * * *"}, "invalid cron expression"),
        ({"cron": "61 * * * *"}, "invalid cron expression"),
        ({"cron": "0 * * * *", "tz": "Mars/Olympus"}, "unknown time zone"),
        ({"cron": "0 * * * *", "anchor": datetime(2026, 1, 1, tzinfo=UTC)}, "every= only"),
        ({"cron": "0 * * * *", "catch_up": 0}, "catch_up="),
        ({"cron": "0 * * * *", "catch_up": "some"}, "catch_up="),
        ({"cron": "0 * * * *", "catch_up": True}, "catch_up="),
    ],
)
def test_a_bad_schedule_is_refused_with_a_clear_error(
    kwargs: dict[str, object], words: str
) -> None:
    with pytest.raises(ConfigurationError, match=words):
        Schedule(**kwargs)  # type: ignore[arg-type]


def test_describe() -> None:
    assert Schedule(every=timedelta(minutes=5)).describe() == "every 5m"
    assert Schedule(cron="0 * * * *", tz="Europe/Paris").describe() == (
        "cron 0 * * * * (Europe/Paris)"
    )


def test_tick_event_id_names_group_schedule_and_tick() -> None:
    assert tick_event_id("billing", "hourly", 1_700_000_000_000) == (
        "sw-tick:billing:hourly:1700000000000"
    )
    with pytest.raises(ConfigurationError, match="invalid schedule name"):
        tick_event_id("billing", "hourly report", 0)
