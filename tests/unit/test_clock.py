"""The injectable clock: offsets, and waits that an advance ends at once."""

from __future__ import annotations

import time

import anyio
import pytest

from streamworks.clock import Clock


def test_advance_moves_monotonic_and_wall_time() -> None:
    clock = Clock()
    mono, wall = clock.monotonic(), clock.time()
    clock.advance(3600)
    assert clock.monotonic() - mono >= 3600
    assert clock.time() - wall >= 3600
    assert abs(clock.time_ms() - (time.time() + 3600) * 1000) < 1000
    assert clock.offset_ms == 3_600_000
    with pytest.raises(ValueError, match="forward"):
        clock.advance(-1)


async def test_sleep_until_ends_when_the_clock_is_advanced_past_it() -> None:
    clock = Clock()
    woke = anyio.Event()

    async def sleeper() -> None:
        await clock.sleep(3600)
        woke.set()

    started = time.monotonic()
    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            tg.start_soon(sleeper)
            await anyio.wait_all_tasks_blocked()
            clock.advance(1800)  # not yet: it goes back to sleep
            await anyio.wait_all_tasks_blocked()
            assert not woke.is_set()
            clock.advance(1800)
            await woke.wait()
    assert time.monotonic() - started < 5
    assert not clock._listeners  # nothing left registered


async def test_move_on_at_ends_in_real_time_or_on_advance() -> None:
    clock = Clock()
    with clock.move_on_after(0.01) as scope:
        await anyio.sleep_forever()
    assert scope.cancelled_caught

    async def advance_soon() -> None:
        await anyio.wait_all_tasks_blocked()
        clock.advance(60)

    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            tg.start_soon(advance_soon)
            with clock.move_on_after(59) as scope:
                await anyio.sleep_forever()
    assert scope.cancelled_caught


def test_on_advance_calls_until_unregistered() -> None:
    clock = Clock()
    calls: list[float] = []
    stop = clock.on_advance(lambda: calls.append(clock.offset))
    clock.advance(1)
    stop()
    clock.advance(1)
    assert calls == [1.0]
