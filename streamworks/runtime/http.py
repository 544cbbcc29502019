"""The worker's HTTP endpoint: ``/metrics``, ``/livez`` and ``/readyz``.

``streamworks worker`` serves it by default (``--http-port``, ``--no-http``) from
inside its task group; ``docs/operations.md`` describes the metrics and checks.

* ``/livez`` — 200 while the process answers and the worker has not stopped;
* ``/readyz`` — 200 while the worker holds a valid assignment lease: it reads its
  shards, or it is joined and heartbeating with nothing to read (more members than
  shards). 503 before the first answer of the coordinator, once the lease ran out
  (coordinator unreachable past the lease, fenced and not yet rejoined) and while
  stopping;
* ``/metrics`` — the Prometheus text exposition of the worker's own registry.
"""

from __future__ import annotations

import contextlib
import logging
import socket
from collections.abc import AsyncIterator, Iterator
from typing import TYPE_CHECKING

import anyio
import uvicorn
from prometheus_client import CONTENT_TYPE_LATEST
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import Route

if TYPE_CHECKING:
    from streamworks.runtime.worker import Worker

__all__ = ("bind", "create_worker_api", "open_worker_http", "readiness")

log = logging.getLogger("streamworks.http")


def readiness(worker: Worker) -> tuple[bool, str]:
    """Whether ``worker`` is ready, and a few words saying why (or why not)."""
    if worker.stopped.is_set():
        return False, "stopped"
    if worker.stopping:
        return False, "stopping"
    remaining = worker.lease.remaining()
    if remaining > 0:
        return True, f"assignment lease valid ({len(worker.readers)} shards)"
    if worker.lease.renewals == 0:
        return False, "not joined yet: no answer from the coordinator"
    return False, "assignment lease expired: not reading"


def create_worker_api(worker: Worker) -> Starlette:
    """The ASGI app of one worker's endpoint."""

    async def metrics(_: Request) -> Response:
        body = await worker.metrics.exposition()
        return Response(body, media_type=CONTENT_TYPE_LATEST)

    async def livez(_: Request) -> Response:
        if worker.stopped.is_set():
            return PlainTextResponse("stopped\n", status_code=503)
        return PlainTextResponse("ok\n")

    async def readyz(_: Request) -> Response:
        ready, why = readiness(worker)
        return PlainTextResponse(f"{why}\n", status_code=200 if ready else 503)

    return Starlette(
        routes=[
            Route("/metrics", metrics, methods=["GET"]),
            Route("/livez", livez, methods=["GET"]),
            Route("/readyz", readyz, methods=["GET"]),
        ]
    )


class _Server(uvicorn.Server):
    """Leaves signal handling to the worker command (graceful stop on SIGTERM)."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


def bind(host: str, port: int) -> socket.socket:
    """A listening socket on ``host:port`` (``OSError`` when it is taken)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(128)
        sock.setblocking(False)
    except BaseException:
        sock.close()
        raise
    return sock


@contextlib.asynccontextmanager
async def open_worker_http(worker: Worker, sock: socket.socket) -> AsyncIterator[str]:
    """Serve ``worker``'s endpoint on ``sock`` (from :func:`bind`, so a taken port is
    reported before the worker joins) while the block runs; yields its base URL. The
    socket is closed on exit."""
    host, bound = sock.getsockname()[:2]
    config = uvicorn.Config(
        create_worker_api(worker),
        log_level="warning",
        lifespan="off",
        access_log=False,
    )
    server = _Server(config)
    shown = f"[{host}]" if ":" in host else host
    url = f"http://{shown}:{bound}"
    done = anyio.Event()

    async def serve() -> None:
        try:
            await server.serve([sock])
        finally:
            done.set()

    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(serve)
            try:
                yield url
            finally:
                # A graceful stop closes the listening socket and open connections.
                server.should_exit = True
                with anyio.move_on_after(5, shield=True):
                    await done.wait()
                tg.cancel_scope.cancel()
    finally:
        sock.close()
