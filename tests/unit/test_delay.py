"""delay=/at= validation and typed durations: aware datetimes only, no negative or
non-finite delays, a past at= due at once, never rounded early."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streamworks.delay import MAX_DELAY, Due, due_from
from streamworks.durations import format_duration, parse_duration, to_milliseconds
from streamworks.exceptions import ConfigurationError

NOW = datetime(2026, 12, 2, 10, 0, tzinfo=UTC)
NOW_MS = int(NOW.timestamp() * 1000)


def test_no_delay_is_an_ordinary_publish() -> None:
    assert due_from() is None


@pytest.mark.parametrize(
    ("delay", "ms"),
    [
        (timedelta(minutes=5), 300_000),
        (timedelta(0), 0),
        (30, 30_000),
        (0.25, 250),
        (timedelta(microseconds=1), 1),  # rounded up: never early
    ],
)
def test_delay_is_relative_milliseconds(delay: timedelta | float, ms: int) -> None:
    assert due_from(delay) == Due("in", ms)
    assert Due("in", ms).script_args() == ("in", ms)


def test_at_is_absolute_milliseconds_in_any_zone() -> None:
    paris = timezone(timedelta(hours=1))
    assert due_from(at=NOW + timedelta(hours=1), now=NOW) == Due("at", NOW_MS + 3_600_000)
    assert due_from(at=datetime(2026, 12, 2, 12, 0, tzinfo=paris), now=NOW) == Due(
        "at", NOW_MS + 3_600_000
    )
    # Microseconds round up, a past at= is accepted (due at once, decided in Redis).
    assert due_from(at=NOW + timedelta(microseconds=1), now=NOW) == Due("at", NOW_MS + 1)
    assert due_from(at=NOW - timedelta(days=3), now=NOW) == Due("at", NOW_MS - 3 * 86_400_000)


@pytest.mark.parametrize(
    ("kwargs", "words"),
    [
        ({"delay": 1, "at": NOW}, "not both"),
        ({"delay": -1}, "must not be negative"),
        ({"delay": timedelta(seconds=-1)}, "must not be negative"),
        ({"delay": float("nan")}, "must be finite"),
        ({"delay": float("inf")}, "must be finite"),
        ({"delay": True}, "timedelta or a number"),
        ({"delay": "5m"}, "timedelta or a number"),
        ({"delay": MAX_DELAY + timedelta(seconds=1)}, "at most"),
        ({"delay": 400 * 86_400}, "more than 366 days"),
        ({"at": datetime(2026, 12, 2, 10, 0)}, "timezone-aware"),
        ({"at": "2026-12-02T10:00:00Z"}, "must be a datetime"),
        ({"at": NOW + timedelta(days=400)}, "more than 366 days ahead"),
    ],
)
def test_bad_delays_are_refused_clearly(kwargs: dict[str, object], words: str) -> None:
    with pytest.raises(ConfigurationError, match=words):
        due_from(**kwargs, now=NOW)  # type: ignore[arg-type]


@settings(deadline=None)  # CPU-bound examples on a shared machine
@given(st.timedeltas(min_value=timedelta(0), max_value=MAX_DELAY))
def test_a_delay_never_rounds_early(delay: timedelta) -> None:
    due = due_from(delay)
    assert due is not None
    assert timedelta(milliseconds=due.ms) >= delay > timedelta(milliseconds=due.ms - 1)


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("100ms", timedelta(milliseconds=100)),
        ("30s", timedelta(seconds=30)),
        ("5m", timedelta(minutes=5)),
        ("1.5h", timedelta(minutes=90)),
        ("2d", timedelta(days=2)),
        ("s", timedelta(seconds=1)),
    ],
)
def test_durations_parse(text: str, value: timedelta) -> None:
    assert parse_duration(text) == value


@pytest.mark.parametrize("text", ["", "30", "30 sec", "-1s", "0s", "1e3s", "5 m"])
def test_bad_durations_are_refused(text: str) -> None:
    with pytest.raises(ConfigurationError, match="duration"):
        parse_duration(text)


@settings(deadline=None)  # CPU-bound examples on a shared machine
@given(st.integers(1, 10**12))
def test_durations_format_and_read_back(ms: int) -> None:
    value = timedelta(milliseconds=ms)
    assert parse_duration(format_duration(value)) == value
    assert to_milliseconds(value) == ms
