"""``Runs.run_coroutine`` and ``FirstSteps``: the consume hot path's handler run (ownership.py).

A handler that finishes without suspending runs with no cancel scope; one that
suspends is counted and cancellable exactly as under ``Runs.run``.
"""

from __future__ import annotations

import asyncio

import anyio
import pytest

from streamworks.runtime.ownership import FirstSteps, RunCancelled, Runs


async def test_a_handler_that_never_suspends_returns_its_value_uncounted() -> None:
    runs = Runs()
    seen: list[int] = []

    async def handler() -> str:
        seen.append(runs.count())
        return "done"

    assert await runs.run_coroutine("s/0@0", handler()) == "done"
    assert seen == [0] and runs.count() == 0


async def test_its_failure_is_its_own() -> None:
    async def handler() -> None:
        raise KeyError("x")

    with pytest.raises(KeyError):
        await Runs().run_coroutine("s/0@0", handler())


async def test_a_handler_that_suspends_is_counted_and_gets_what_it_awaited() -> None:
    runs = Runs()
    counts: list[int] = []
    fut: asyncio.Future[int] = asyncio.get_running_loop().create_future()

    async def handler() -> int:
        await asyncio.sleep(0)  # a bare yield first
        counts.append(runs.count())
        value = await fut
        counts.append(runs.count())
        return value + 1

    async with anyio.create_task_group() as tg:
        results: list[int] = []

        async def go() -> None:
            results.append(await runs.run_coroutine("s/0@0", handler()))

        tg.start_soon(go)
        await anyio.wait_all_tasks_blocked()
        assert runs.count(["s/0@0"]) == 1
        fut.set_result(41)
    assert results == [42] and counts == [1, 1] and runs.count() == 0


async def test_a_suspended_handler_is_cancelled_and_not_settled() -> None:
    runs = Runs()
    outcome: list[str] = []

    async def handler() -> None:
        try:
            await anyio.sleep_forever()
        finally:
            outcome.append("unwound")

    async def go() -> None:
        try:
            await runs.run_coroutine("s/0@0", handler())
        except RunCancelled:
            outcome.append("cancelled")

    async with anyio.create_task_group() as tg:
        tg.start_soon(go)
        await anyio.wait_all_tasks_blocked()
        assert runs.cancel(["s/0@0"]) == 1
    assert outcome == ["unwound", "cancelled"] and runs.count() == 0


async def test_a_handler_that_swallows_the_cancellation_is_cancelled_again() -> None:
    runs = Runs()
    swallowed: list[int] = []

    async def stubborn() -> None:
        for _ in range(3):
            try:
                await anyio.sleep_forever()
            except anyio.get_cancelled_exc_class():
                swallowed.append(1)  # and awaits again: the scope cancels it again

    async def go() -> None:
        with pytest.raises(RunCancelled):
            await runs.run_coroutine("s/0@0", stubborn())

    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            tg.start_soon(go)
            await anyio.wait_all_tasks_blocked()
            runs.cancel()
    assert swallowed == [1, 1, 1]


async def test_start_and_settle_are_checked() -> None:
    allowed = {"start": False, "settle": True}
    runs = Runs(lambda: allowed["start"], lambda: allowed["settle"])
    ran: list[int] = []

    async def handler() -> None:
        ran.append(1)

    with pytest.raises(RunCancelled, match="before the run started"):
        await runs.run_coroutine("s/0@0", handler())  # closed, never run: no warning
    assert ran == []
    allowed.update(start=True, settle=False)
    with pytest.raises(RunCancelled, match="after the lease expired"):
        await runs.run_coroutine("s/0@0", handler())

    async def suspending() -> None:
        await asyncio.sleep(0)
        ran.append(2)

    with pytest.raises(RunCancelled, match="after the lease expired"):
        await runs.run_coroutine("s/0@0", suspending())
    assert ran == [1, 2]


# -- FirstSteps + Runs.run_rest: the first step driven without a StopIteration -----------


async def test_first_steps_return_values_on_one_driver() -> None:
    steps = FirstSteps()
    returned = steps.returned

    async def handler(n: int) -> int:
        return n * 2

    for n in range(3):
        step = steps.step(handler(n))
        assert step is steps.returned is returned and step.value == n * 2


async def test_a_first_step_that_raises_leaves_a_working_driver() -> None:
    steps = FirstSteps()

    async def failing() -> None:
        raise KeyError("x")

    async def fine() -> str:
        return "ok"

    with pytest.raises(KeyError):
        steps.step(failing())
    steps.recover()
    assert steps.step(fine()).value == "ok"


async def test_a_suspended_first_step_finishes_as_a_counted_run_beside_new_ones() -> None:
    runs = Runs()
    steps = FirstSteps()
    fut: asyncio.Future[int] = asyncio.get_running_loop().create_future()
    counts: list[int] = []

    async def suspending() -> int:
        await asyncio.sleep(0)  # a bare yield first
        value = await fut
        counts.append(runs.count())
        return value + 1

    async def quick() -> str:
        return "quick"

    first = steps.step(suspending())
    assert first is not steps.returned
    rest = steps.take(first)
    results: list[int] = []

    async def go() -> None:
        results.append(await runs.run_rest("s/0@0", rest))

    async with anyio.create_task_group() as tg:
        tg.start_soon(go)
        await anyio.wait_all_tasks_blocked()
        assert runs.count(["s/0@0"]) == 1
        assert steps.step(quick()).value == "quick"  # a new driver meanwhile
        fut.set_result(41)
    assert results == [42] and counts == [1] and runs.count() == 0


async def test_a_suspended_first_step_is_cancelled_through_its_driver() -> None:
    runs = Runs()
    steps = FirstSteps()
    outcome: list[str] = []

    async def stubborn() -> None:
        for _ in range(2):
            try:
                await anyio.sleep_forever()
            except anyio.get_cancelled_exc_class():
                outcome.append("swallowed")  # and awaits again: cancelled again
        outcome.append("returned")

    rest = steps.take(steps.step(stubborn()))

    async def go() -> None:
        try:
            await runs.run_rest("s/0@0", rest)
        except RunCancelled:
            outcome.append("cancelled")

    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            tg.start_soon(go)
            await anyio.wait_all_tasks_blocked()
            assert runs.cancel(["s/0@0"]) == 1
    assert outcome == ["swallowed", "swallowed", "returned", "cancelled"]
    assert runs.count() == 0
