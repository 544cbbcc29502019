"""Rate-limit specs ("200/s", "10/m", "5/100ms") and the GCRA reservation that
rate_take.lua runs: whatever members ask, in any window at most burst + W/interval
runs start, and with a backlog they start at the limit."""

from __future__ import annotations

import bisect
from datetime import timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streamworks.exceptions import ConfigurationError
from streamworks.ratelimit import RateLimit, reserve, start_waits


@pytest.mark.parametrize(
    ("spec", "count", "per"),
    [
        ("200/s", 200, timedelta(seconds=1)),
        ("10/m", 10, timedelta(minutes=1)),
        ("5/100ms", 5, timedelta(milliseconds=100)),
        ("1000/h", 1000, timedelta(hours=1)),
        ("3/1.5s", 3, timedelta(seconds=1.5)),
        (" 7 / 2d ", 7, timedelta(days=2)),
    ],
)
def test_specs_parse(spec: str, count: int, per: timedelta) -> None:
    limit = RateLimit.parse(spec)
    assert (limit.count, limit.per, limit.burst) == (count, per, 1)


@pytest.mark.parametrize(
    ("spec", "words"),
    [
        ("200", "use <count>/<period>"),
        ("200/", "use <count>/<period>"),
        ("/s", "use <count>/<period>"),
        ("200/sec", "invalid rate limit period"),
        ("200/10", "invalid rate limit period"),
        ("0/s", "count must be an int >= 1"),
        ("-1/s", "use <count>/<period>"),
        ("2000000/s", "above 1,000,000 per second"),
        ("1/0s", "must be more than zero"),
        (200, "must be a string"),
    ],
)
def test_bad_specs_are_refused_clearly(spec: object, words: str) -> None:
    with pytest.raises(ConfigurationError, match=words):
        RateLimit.parse(spec)  # type: ignore[arg-type]


def test_burst_must_be_positive() -> None:
    with pytest.raises(ConfigurationError, match="burst"):
        RateLimit(10, timedelta(seconds=1), burst=0)


@pytest.mark.parametrize("spec", ["200/s", "10/m", "5/100ms", "1000/h", "3/1500ms", "7/2d"])
def test_str_reads_back(spec: str) -> None:
    limit = RateLimit.parse(spec)
    assert RateLimit.parse(str(limit)) == limit
    assert str(RateLimit.parse("200/s", burst=5)) == "200/s (burst 5)"


def test_interval_and_tolerance() -> None:
    limit = RateLimit.parse("200/s", burst=4)
    assert limit.interval_ms == 5.0
    assert limit.tolerance_ms == 15.0
    assert limit.script_args(timedelta(seconds=1), 7) == ["5.000000", "15.000000", 1000, 7]


def test_an_empty_bucket_grants_a_burst_then_spaces_runs() -> None:
    limit = RateLimit.parse("10/s", burst=3)
    r = reserve(None, 1_000.0, 6, limit, 1_000)
    assert r.granted == 6
    assert start_waits(r.granted, r.base_ms, limit) == [0, 0, 0, 100, 200, 300]
    assert r.tat_ms == 1_600.0


def test_nothing_is_granted_beyond_the_horizon() -> None:
    limit = RateLimit.parse("10/s")
    r = reserve(5_000.0, 1_000.0, 3, limit, 1_000)
    assert (r.granted, r.base_ms, r.tat_ms) == (0, 4_000.0, 5_000.0)
    with pytest.raises(ValueError, match="horizon"):
        reserve(None, 0, 1, limit, -1)


@settings(deadline=None)  # CPU-bound examples on a shared machine
@given(
    st.sampled_from(["200/s", "10/s", "3/100ms", "7/2s"]),
    st.integers(1, 5),
    st.lists(
        st.tuples(st.integers(0, 3), st.integers(0, 60), st.integers(0, 2_000)),
        min_size=1,
        max_size=60,
    ),
)
def test_no_window_holds_more_than_burst_plus_its_share(
    spec: str, burst: int, asks: list[tuple[int, int, int]]
) -> None:
    """Members ask at arbitrary times for arbitrary counts with arbitrary horizons."""
    limit = RateLimit.parse(spec, burst=burst)
    tat: float | None = None
    now = 0.0
    starts: list[float] = []
    for _, wanted, step in asks:
        now += step
        r = reserve(tat, now, wanted, limit, 1_000)
        starts += [now + w for w in start_waits(r.granted, r.base_ms, limit)]
        if r.granted:
            tat = r.tat_ms
    starts.sort()
    t = limit.interval_ms
    for width in (t, 10 * t, 1_000.0):
        for i, s in enumerate(starts):
            inside = bisect.bisect_right(starts, s + width - 1e-6) - i
            assert inside <= burst + width / t + 1e-9


@settings(deadline=None)  # CPU-bound examples on a shared machine
@given(st.sampled_from(["200/s", "10/s", "3/100ms"]), st.integers(1, 3))
def test_a_backlog_starts_at_the_limit(spec: str, members: int) -> None:
    limit = RateLimit.parse(spec)
    tat: float | None = None
    starts: list[float] = []
    next_ask = [0.0] * members
    now = 0.0
    horizon = 20 * limit.interval_ms
    while now < 400 * limit.interval_ms:
        for m in range(members):
            if next_ask[m] > now:
                continue
            r = reserve(tat, now, 8, limit, horizon)
            waits = start_waits(r.granted, r.base_ms, limit)
            starts += [now + w for w in waits]
            tat = r.tat_ms if r.granted else tat
            next_ask[m] = now + (waits[-1] if waits else r.base_ms - horizon)
        now = min(next_ask)
    starts.sort()
    span = starts[-1] - starts[0]
    assert len(starts) - 1 == pytest.approx(span / limit.interval_ms, abs=1)
