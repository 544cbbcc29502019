"""The injectable clock: offsets, and waits that an advance ends at once."""

from __future__ import annotations

import time

import anyio
import pytest

from streamworks import clock as clock_module
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


# -- a clock that counts suspend (issue 18, finding 6) ---------------------------------

_SUSPENDED = 1_000.0  # seconds the host spent suspended, as the fake clocks tell it


def _fake_clocks(monkeypatch: pytest.MonkeyPatch) -> None:
    """``time.clock_gettime`` of a host that was suspended for ``_SUSPENDED`` seconds:
    CLOCK_BOOTTIME counts them (as does macOS's CLOCK_MONOTONIC), ``time.monotonic``
    and Linux's CLOCK_MONOTONIC do not."""
    real = time.monotonic

    def clock_gettime(clock_id: int) -> float:
        if clock_id == getattr(time, "CLOCK_BOOTTIME", -1):
            return real() + _SUSPENDED
        return real()

    monkeypatch.setattr(time, "clock_gettime", clock_gettime, raising=False)


def test_member_deadlines_run_on_a_clock_that_counts_suspend(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A member resumed after a host suspend must see its lease as expired: its clock
    counts the suspend (``CLOCK_BOOTTIME`` on Linux), ``time.monotonic`` would not."""
    if not hasattr(time, "CLOCK_BOOTTIME"):
        pytest.skip("CLOCK_BOOTTIME is Linux's")
    _fake_clocks(monkeypatch)
    monkeypatch.setattr(clock_module, "boottime", clock_module._suspend_aware())
    assert Clock().monotonic() - time.monotonic() == pytest.approx(_SUSPENDED, abs=1.0)


def test_without_boottime_the_clock_falls_back_to_clock_monotonic_then_monotonic(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delattr(time, "CLOCK_BOOTTIME", raising=False)
    monkeypatch.setattr(time, "CLOCK_MONOTONIC", 1, raising=False)
    seen: list[int] = []
    monkeypatch.setattr(time, "clock_gettime", lambda i: seen.append(i) or 5.0, raising=False)
    assert clock_module._suspend_aware()() == 5.0 and seen == [1]
    monkeypatch.delattr(time, "clock_gettime")
    assert clock_module._suspend_aware() is time.monotonic
