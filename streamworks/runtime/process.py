"""A worker process: the app's connection, its coordinator membership, and the worker.

``open_worker`` is what ``streamworks worker`` runs: it connects the app (declared
streams are created if missing, producer routing is leased from the coordinator),
joins the group through heartbeats, and runs the worker until the block exits,
then stops it gracefully (finish in-flight work, ack, leave). The app's startup hooks
run once it is connected, before it joins; its shutdown hooks after it left
(``streamworks/lifecycle.py``).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

import anyio

from streamworks.clock import Clock
from streamworks.lifecycle import open_lifespan, unwrap_startup_error
from streamworks.protocol.transport import CoordinatorTransport
from streamworks.runtime.connection import open_connection
from streamworks.runtime.membership import CoordinatorAssignment
from streamworks.runtime.worker import Worker
from streamworks.settings import Settings

if TYPE_CHECKING:
    from streamworks.app import App

__all__ = ("open_worker",)


@contextlib.asynccontextmanager
async def open_worker(
    app: App,
    settings: Settings,
    *,
    redis: Any = None,
    coordinator: CoordinatorTransport | None = None,
    member_id: str | None = None,
    clock: Clock | None = None,
) -> AsyncIterator[Worker]:
    """Run one member of ``app``'s group while the block runs.

    Raises:
        StartupError: one of the app's startup hooks (or its lifespan) failed; the
            member never joined.
    """
    try:
        async with (
            open_connection(
                app, settings, redis=redis, coordinator=coordinator, clock=clock
            ) as conn,
            app.attached(conn),
            open_lifespan(app, shutdown_timeout=settings.worker.shutdown_timeout),
        ):
            membership = CoordinatorAssignment(conn.coordinator, settings)
            worker = Worker(
                app, conn.redis, membership, settings=settings, member_id=member_id, clock=clock
            )
            async with anyio.create_task_group() as tg:
                await tg.start(worker.run)
                try:
                    yield worker
                finally:
                    worker.request_stop()
    except BaseExceptionGroup as group:
        # The connection's task group wraps what its block raised; a failed startup
        # is one clear error, not a group.
        startup = unwrap_startup_error(group)
        if startup is None:
            raise
        raise startup from startup.__cause__
