"""The lease's local deadlines and the run tracker (docs/guarantees.md#exclusive-processing)."""

from __future__ import annotations

import threading

import anyio
import pytest

from streamworks.runtime.deadlines import Deadlines, effective_grace, lease_misfit
from streamworks.runtime.ownership import RunCancelled, Runs
from streamworks.settings import Settings, WorkerSettings


def test_default_deadlines_end_every_run_before_the_coordinator_may_expire() -> None:
    d = Deadlines.after_heartbeat(100.0, 10.0, margin=1.0, grace=5.0, drift=0.01)
    assert d.expires_at == pytest.approx(109.9)  # 10 s lease, 1 % slower clock
    assert d.cancel_at == pytest.approx(108.9)
    assert d.fail_stop_at == pytest.approx(109.4)
    assert d.start_until == pytest.approx(103.9)
    assert 100.0 < d.start_until < d.cancel_at < d.fail_stop_at < d.expires_at


def test_a_grace_that_does_not_fit_the_granted_lease_is_cut_to_half_the_room() -> None:
    assert effective_grace(1.0, margin=0.05, grace=5.0, drift=0.01) == pytest.approx(0.47)
    d = Deadlines.after_heartbeat(0.0, 1.0, margin=0.05, grace=5.0, drift=0.01)
    assert 0.0 < d.start_until < d.cancel_at < d.fail_stop_at < d.expires_at


def test_an_unset_grace_is_five_seconds_where_it_fits_else_half_the_room() -> None:
    assert effective_grace(10.0, margin=1.0, grace=None, drift=0.01) == 5.0
    assert effective_grace(2.0, margin=0.2, grace=None, drift=0.01) == pytest.approx(0.89)
    assert lease_misfit(Settings(lease_ttl=2.0, heartbeat_interval=0.2)) is None


def test_an_ended_lease_cancels_at_once_but_keeps_the_old_fail_stop_point() -> None:
    d = Deadlines.after_heartbeat(0.0, 10.0, margin=1.0, grace=5.0, drift=0.01)
    ended = d.ended(2.0)
    assert ended.start_until == ended.cancel_at == 2.0
    assert ended.fail_stop_at == d.fail_stop_at and ended.expires_at == d.expires_at


def test_a_hand_set_lease_never_fail_stops() -> None:
    d = Deadlines.fixed(5.0, 1.0)
    assert (d.start_until, d.cancel_at) == (5.0, 6.0)
    assert d.fail_stop_at == d.expires_at == float("inf")


def test_settings_whose_grace_does_not_fit_the_lease_are_named() -> None:
    assert lease_misfit(Settings()) is None
    bad = Settings(lease_ttl=2.0, heartbeat_interval=0.2, worker=WorkerSettings(lease_grace=2.0))
    problem = lease_misfit(bad)
    assert problem is not None and "lease_grace" in problem


async def test_an_async_run_is_counted_and_a_cancelled_one_is_not_settled() -> None:
    runs = Runs()
    entered = anyio.Event()
    outcome: list[str] = []

    async def run() -> None:
        try:
            with runs.run("s/0@0"):
                entered.set()
                await anyio.sleep_forever()
        except RunCancelled:
            outcome.append("cancelled")

    async with anyio.create_task_group() as tg:
        tg.start_soon(run)
        await entered.wait()
        assert runs.count() == runs.count(["s/0@0"]) == 1
        assert runs.count(["s/1@0"]) == 0
        assert runs.cancel(["s/1@0"]) == 0
        assert runs.cancel(["s/0@0"]) == 1
        with anyio.fail_after(5):
            await runs.wait_ended()
    assert outcome == ["cancelled"]
    assert runs.count() == 0


async def test_a_handler_that_swallows_its_cancellation_is_still_not_settled() -> None:
    runs = Runs()
    entered = anyio.Event()

    async def stubborn() -> None:
        with runs.run("s/0@0"):
            entered.set()
            try:
                await anyio.sleep_forever()
            except anyio.get_cancelled_exc_class():
                pass  # returns as if it had succeeded

    async def failing() -> None:
        with runs.run("s/0@0"):
            try:
                await anyio.sleep_forever()
            finally:
                raise ValueError("cleanup failed")

    results: list[BaseException] = []

    async def guard(fn: object) -> None:
        try:
            await fn()  # type: ignore[operator]
        except RunCancelled as e:
            results.append(e)

    async with anyio.create_task_group() as tg:
        tg.start_soon(guard, stubborn)
        tg.start_soon(guard, failing)
        await entered.wait()
        await anyio.wait_all_tasks_blocked()
        assert runs.count() == 2
        runs.cancel()
    assert len(results) == 2 and runs.count() == 0


async def test_a_run_may_not_start_or_settle_outside_the_lease() -> None:
    allowed = {"start": False, "settle": True}
    runs = Runs(lambda: allowed["start"], lambda: allowed["settle"])
    with pytest.raises(RunCancelled, match="before the run started"), runs.run("s/0@0"):
        raise AssertionError("must not run")
    allowed.update(start=True, settle=False)
    ran = []
    with pytest.raises(RunCancelled, match="after the lease expired"), runs.run("s/0@0"):
        ran.append(1)
    assert ran == [1]
    allowed["settle"] = True
    with pytest.raises(KeyError), runs.run("s/0@0"):  # a failure while owned: the handler's
        raise KeyError("x")


async def test_a_sync_run_counts_once_and_an_abandoned_thread_still_counts() -> None:
    runs = Runs()
    release = threading.Event()
    started = threading.Event()

    def work() -> str:
        started.set()
        release.wait(30)
        return "done"

    call = runs.in_thread("s/0@0", work)
    # A handler timeout: the awaiting task gives up, the thread is abandoned.
    with anyio.move_on_after(0.2), runs.run("s/0@0", cancellable=False):
        assert runs.cancel() == 0  # a sync run cannot be cancelled: not even tried
        await anyio.to_thread.run_sync(call, abandon_on_cancel=True)
    assert started.is_set()
    assert runs.count() == 1  # the abandoned thread is still a run
    release.set()
    with anyio.fail_after(10):
        await runs.wait_ended(["s/0@0"])
    assert runs.count() == 0
