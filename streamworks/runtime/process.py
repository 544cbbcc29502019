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
import gc
from collections.abc import AsyncIterator, Mapping
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
    from streamworks.runtime.app_view import AppView

__all__ = ("freeze_startup_heap", "open_worker")


@contextlib.asynccontextmanager
async def open_worker(
    app: AppView,
    settings: Settings,
    *,
    redis: Any = None,
    coordinator: CoordinatorTransport | None = None,
    member_id: str | None = None,
    clock: Clock | None = None,
    client_info: Mapping[str, str] | None = None,
) -> AsyncIterator[Worker]:
    """Run one member of ``app``'s group while the block runs (``client_info``: more
    of what the member tells the coordinator about itself, e.g. its metrics URL).

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
            membership = CoordinatorAssignment(conn.coordinator, settings, client_info=client_info)
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


#: Allocations between two young collections of a command's process (CPython's
#: default: 700).
YOUNG_THRESHOLD = 50_000


def freeze_startup_heap() -> None:
    """Tune the cyclic collector for a long-running process, once it is up.

    * What is alive now (the modules, the app, settings, clients) never becomes
      garbage, yet every full pass of the collector would scan it again: it is moved
      into the permanent generation (still freed by reference counting if released).
    * Young collections run every ``YOUNG_THRESHOLD`` allocations, not every 700. A
      consumer has thousands of messages in flight; at the default, each young pass
      finds them alive, promotes them, and the promotions trigger full passes that
      collect almost nothing. A worker's messages (and a coordinator's requests) are
      gone before the next pass, so far fewer objects are ever scanned or promoted.
      Cyclic garbage still goes, a little later.

    Measured on the consume hot path (``docs/performance.md``): the freeze ~0.5 µs of
    CPU per message, the threshold another ~0.4 µs; on the coordinator, the full passes
    of 90-200 ms that were the heartbeat p99. Process-wide, so the ``streamworks
    worker`` and ``streamworks coordinator`` commands call it, not the library.
    """
    gc.collect()
    gc.freeze()
    _, middle, old = gc.get_threshold()
    gc.set_threshold(YOUNG_THRESHOLD, middle, old)
