"""``@app.schedule``: every mistake is a clear ConfigurationError at decoration time,
and a valid declaration registers the schedule and the internal schedule stream."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from streamworks import App, ConfigurationError, Tick
from streamworks.redis.keyspace import Keyspace


def app() -> App:
    a = App("g")
    a.stream("reports", shards=2)
    return a


def test_a_valid_schedule_registers_itself_and_the_schedule_stream() -> None:
    a = app()

    @a.schedule("hourly", stream="reports", cron="@hourly", tz="Europe/Paris", catch_up=3)
    def hourly(tick: Tick) -> dict[str, Any]:
        return {"at": tick.at}

    @a.schedule("beat", stream="reports", every=timedelta(minutes=5), key="k")
    async def beat() -> None: ...

    assert set(a.schedules) == {"hourly", "beat"}
    assert a.schedules["hourly"].key == "hourly" and a.schedules["beat"].key == "k"
    assert a.schedules["hourly"].wants_tick and not a.schedules["beat"].wants_tick
    assert a.schedules["beat"].is_async
    assert a.schedules["hourly"].schedule.describe() == "cron @hourly (Europe/Paris)"
    assert a.streams[Keyspace.SCHEDULE_STREAM].shards == 1
    assert hourly(Tick.of("hourly", 0)) == {"at": datetime(1970, 1, 1, tzinfo=UTC)}


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"stream": "nope", "every": timedelta(minutes=1)}, "undeclared stream 'nope'"),
        ({"stream": "sw-schedules", "every": timedelta(minutes=1)}, "internal schedule stream"),
        ({"stream": "reports"}, "exactly one of every= or cron="),
        (
            {"stream": "reports", "every": timedelta(minutes=1), "cron": "* * * * *"},
            "exactly one of every= or cron=",
        ),
        ({"stream": "reports", "every": timedelta(milliseconds=500)}, "shorter than the minimum"),
        ({"stream": "reports", "every": 60}, "every= must be a timedelta"),
        ({"stream": "reports", "cron": "61 * * * *"}, "invalid cron expression"),
        ({"stream": "reports", "cron": "0 9 * * *", "tz": "Mars/Olympus"}, "unknown time zone"),
        ({"stream": "reports", "every": timedelta(hours=1), "tz": "UTC"}, "tz= applies to cron="),
        ({"stream": "reports", "every": timedelta(hours=1), "catch_up": 0}, "catch_up="),
        ({"stream": "reports", "every": timedelta(hours=1), "catch_up": "some"}, "catch_up="),
        ({"stream": "reports", "every": timedelta(hours=1), "catch_up": True}, "catch_up="),
        (
            {"stream": "reports", "every": timedelta(hours=1), "anchor": datetime(2026, 1, 1)},
            "timezone-aware",
        ),
        ({"stream": "reports", "every": timedelta(hours=1), "key": 5}, "key= must be a str"),
        ({"stream": "reports", "every": timedelta(hours=1), "headers": {"a": 1}}, "headers="),
    ],
)
def test_an_invalid_declaration_is_refused_when_decorated(
    kwargs: dict[str, Any], message: str
) -> None:
    with pytest.raises(ConfigurationError, match=message):
        app().schedule("s", **kwargs)


@pytest.mark.parametrize("name", ["", "has space", "a:b", "x" * 101])
def test_an_invalid_name_is_refused(name: str) -> None:
    with pytest.raises(ConfigurationError):
        app().schedule(name, stream="reports", every=timedelta(hours=1))


def test_a_name_is_used_once() -> None:
    a = app()
    a.schedule("s", stream="reports", every=timedelta(hours=1))(lambda: None)
    with pytest.raises(ConfigurationError, match="declared twice"):
        a.schedule("s", stream="reports", every=timedelta(hours=2))


def test_the_function_takes_the_tick_or_nothing() -> None:
    a = app()
    decorate = a.schedule("s", stream="reports", every=timedelta(hours=1))

    def two(tick: Tick, other: int) -> None: ...

    with pytest.raises(ConfigurationError, match="must take the tick"):
        decorate(two)
    with pytest.raises(ConfigurationError, match="needs a function"):
        decorate(42)  # type: ignore[arg-type]
    assert a.schedules == {}


def test_the_schedule_stream_is_reserved() -> None:
    a = app()
    with pytest.raises(ConfigurationError, match="reserved"):
        a.stream("sw-schedules", shards=1)
    a.schedule("s", stream="reports", every=timedelta(hours=1))(lambda: None)
    with pytest.raises(ConfigurationError, match="internal"):
        a.handler("sw-schedules")
