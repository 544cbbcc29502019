"""A fenced member rejoins only once its runs ended (docs/guarantees.md#exclusive-processing).

In-process (``TestRuntime``): a heartbeat with a forced stale epoch is answered
``FENCED`` while a plain ``def`` handler runs. The member drops its shard but must not
rejoin (the join would renew the lease the run was allowed under) while the run goes
on; at the old lease's fail-stop point the fail-stop is recorded (a worker process
would exit); the rejoin follows the end of the run, and the message — whose run ended
after its lease — is not settled by it but runs again under a newer grant.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import anyio

from streamworks import App
from streamworks.protocol.control import HeartbeatRequest, HeartbeatResponse, HeartbeatStatus
from streamworks.runtime.message import Context
from streamworks.testing import TestRuntime
from streamworks.testing.runtime import fast_settings
from tests.coordinator.harness import CutTransport
from tests.support import wait_for


class StaleEpochTransport(CutTransport):
    """Sends the next heartbeat with a wrong epoch when ``stale_next`` is set."""

    def __init__(self, inner: Any) -> None:
        super().__init__(inner)
        self.stale_next = False

    async def heartbeat(self, group: str, request: HeartbeatRequest) -> HeartbeatResponse:
        if self.stale_next and request.member_epoch > 0:
            self.stale_next = False
            request = request.model_copy(update={"member_epoch": request.member_epoch + 7})
        return await super().heartbeat(group, request)


async def test_a_fenced_member_rejoins_only_after_its_sync_run_ended(
    streamworks_runtime: Callable[..., TestRuntime],
) -> None:
    app = App("g")
    app.stream("orders", shards=1)
    started = threading.Event()
    release = threading.Event()
    tokens: list[int] = []

    @app.handler("orders")
    def handle(value: dict[str, Any], ctx: Context) -> None:
        tokens.append(ctx.fencing_token)
        started.set()
        release.wait(30)

    async with streamworks_runtime(app, workers=0, settings=fast_settings()) as rt:
        assert rt.coordinator is not None
        link = StaleEpochTransport(rt.coordinator)
        rt.coordinator = link
        worker = await rt.add_worker()
        await app.publish("orders", {"n": 1})
        assert await anyio.to_thread.run_sync(started.wait, 10)
        link.stale_next = True
        await wait_for(
            lambda: any(r.status is HeartbeatStatus.FENCED for r in link.responses),
            message="the stale heartbeat to be fenced",
        )
        fenced_at = len(link.heartbeats)
        await wait_for(lambda: bool(rt.fail_stops), message="the old lease's fail-stop point")
        assert "still going" in rt.fail_stops[0]
        # Still running, and no join was sent while it ran.
        assert worker.runs.count() == 1
        assert not any(req.member_epoch == 0 for _, req in link.heartbeats[fenced_at:])
        await wait_for(lambda: not worker.lease.held(), message="the old lease to expire")
        release.set()  # the run ends after its lease
        await wait_for(
            lambda: any(req.member_epoch == 0 for _, req in link.heartbeats[fenced_at:]),
            message="the rejoin once the run ended",
        )
        await rt.wait_idle()
    # The run ended after its lease: it did not ack, so the message ran again, under
    # a strictly newer grant.
    assert len(tokens) == 2 and tokens[1] > tokens[0] >= 1
