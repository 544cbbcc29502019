"""rate_take.lua: GCRA reservations shared by every member of a group.

Contract: {now, granted_1, base_1, ...}; run i (from 0) of bucket j waits
max(0, base_j + i * interval - tolerance) ms. The script is checked against
``streamworks.ratelimit.reserve`` (the same algorithm in Python), and the rate it
enforces is measured over 10 s of Redis-clock time with three members asking.
"""

from __future__ import annotations

import bisect
import itertools
from datetime import timedelta
from typing import Any

import pytest

from streamworks.ratelimit import RateLimit, reserve, start_waits
from streamworks.redis.keyspace import Keyspace
from streamworks.redis.scripts import Scripts

pytestmark = pytest.mark.cluster

HORIZON = timedelta(seconds=1)


async def take(
    scripts: Scripts,
    buckets: list[str],
    wanted: list[int],
    limit: RateLimit,
    *,
    offset: int = 0,
    horizon: timedelta = HORIZON,
) -> tuple[float, list[tuple[int, float]]]:
    reply = await scripts.rate_take(
        keys=buckets, args=[*limit.script_args(horizon, offset), *wanted]
    )
    now = float(reply[0])
    pairs = [(int(reply[i]), float(reply[i + 1])) for i in range(1, len(reply), 2)]
    return now, pairs


async def test_an_idle_bucket_grants_a_burst_then_spaces_runs(
    redis: Any, scripts: Scripts, keyspace: Keyspace
) -> None:
    limit = RateLimit.parse("10/s", burst=5)
    bucket = keyspace.rate_bucket("billing", "orders")

    now, [(granted, base)] = await take(scripts, [bucket], [10], limit)

    assert (granted, base) == (10, 0.0)
    waits = start_waits(granted, base, limit)
    assert waits == [0.0] * 5 + [100.0, 200.0, 300.0, 400.0, 500.0]
    # The bucket holds the next free slot and expires a second after it has passed.
    assert float(await redis.get(bucket)) == pytest.approx(now + 1000.0)
    assert 1000 < await redis.pttl(bucket) <= 2000


async def test_the_script_reserves_what_the_reference_reserves(
    scripts: Scripts, keyspace: Keyspace
) -> None:
    limit = RateLimit.parse("50/s", burst=3)  # interval 20 ms: exact in decimal text
    bucket = keyspace.rate_bucket("billing", "orders")
    tat: float | None = None
    for wanted, horizon_ms in ((5, 100), (100, 300), (1, 0), (40, 1000), (3, 50)):
        now, [(granted, base)] = await take(
            scripts, [bucket], [wanted], limit, horizon=timedelta(milliseconds=horizon_ms)
        )
        expected = reserve(tat, now, wanted, limit, horizon_ms)
        assert (granted, base) == (expected.granted, pytest.approx(expected.base_ms, abs=1e-3))
        tat = expected.tat_ms if expected.granted else tat


async def test_runs_beyond_the_horizon_wait_for_a_later_ask(
    scripts: Scripts, keyspace: Keyspace
) -> None:
    limit = RateLimit.parse("1/s")
    bucket = keyspace.rate_bucket("billing", "orders")

    first, [(granted, _)] = await take(scripts, [bucket], [50], limit)
    assert granted == 2  # waits 0 and 1000 ms: within the 1 s horizon
    second, [(again, base)] = await take(scripts, [bucket], [50], limit)
    # The next free slot is 2 s after the first ask: beyond the horizon of the second
    # (unless a full second passed between the two calls).
    assert again == 0
    assert base == pytest.approx(first + 2000 - second, abs=0.01)


async def test_each_key_has_its_own_bucket(scripts: Scripts, keyspace: Keyspace) -> None:
    limit = RateLimit.parse("1/s")
    keys = [keyspace.rate_key_bucket("billing", "orders", k) for k in ("a", "b", "a{x}")]

    t1, first = await take(scripts, keys, [1, 1, 1], limit)
    t2, second = await take(scripts, keys, [1, 0, 1], limit)

    assert [g for g, _ in first] == [1, 1, 1]
    assert [b for _, b in first] == [0, 0, 0]
    assert [g for g, _ in second] == [1, 0, 1]
    # Asked again within the second: a and a{x} wait for their next slot, each alone.
    assert second[0][1] == pytest.approx(t1 + 1000 - t2, abs=0.01)
    assert second[2][1] == pytest.approx(t1 + 1000 - t2, abs=0.01)


async def test_three_members_share_the_limit_within_ten_percent(
    scripts: Scripts, keyspace: Keyspace
) -> None:
    """Three members each ask for a read batch of 50, again as soon as the runs they
    were given have started, for 10 s of Redis-clock time (moved with the offset):
    the starts of all of them are ``period / count`` apart."""
    limit = RateLimit.parse("200/s")
    bucket = keyspace.rate_bucket("billing", "orders")
    starts: list[float] = []
    next_ask = [0, 0, 0]  # offset (ms) at which each member asks again
    offset = 0
    while offset < 11_000:
        for member in range(3):
            if next_ask[member] > offset:
                continue
            now, [(granted, base)] = await take(scripts, [bucket], [50], limit, offset=offset)
            waits = start_waits(granted, base, limit)
            starts += [now + w for w in waits]
            last = max(
                waits, default=base - limit.tolerance_ms - HORIZON / timedelta(milliseconds=1)
            )
            next_ask[member] = offset + int(last) + 1
        offset = min(next_ask)
    starts.sort()
    window = [s for s in starts if starts[0] + 500 <= s < starts[0] + 10_500]
    assert 1800 <= len(window) <= 2200  # 200/s over 10 s, within 10 %
    assert abs(len(window) - 2000) <= 2  # in fact exactly paced
    gaps = [b - a for a, b in itertools.pairwise(starts)]
    assert min(gaps) >= limit.interval_ms - 0.01
    # No window of 1 s holds more than the limit (plus the one at its edge).
    for i, s in enumerate(starts):
        assert bisect.bisect_left(starts, s + 1000) - i <= 201


async def test_an_idle_period_is_not_saved_up(scripts: Scripts, keyspace: Keyspace) -> None:
    """A bucket whose slot passed long ago allows a burst, not the runs it missed."""
    limit = RateLimit.parse("10/s")
    bucket = keyspace.rate_bucket("billing", "orders")
    await take(scripts, [bucket], [1], limit)

    _, [(granted, base)] = await take(scripts, [bucket], [50], limit, offset=5_000)

    assert (granted, base) == (11, 0.0)
