"""``streamworks worker MODULE:APP`` — one member of the app's consumer group."""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import signal
import socket
import sys
from typing import Any

import anyio
import click

from streamworks.app import App
from streamworks.cli.common import (
    EXIT_USAGE,
    configure_logging,
    coordinator_options,
    fail,
    load_app,
    logging_options,
    make_settings,
    record_history,
    redis_options,
    run_async,
    safe_url,
)
from streamworks.cli.logs import ContextFilter
from streamworks.exceptions import NamespaceMismatchError
from streamworks.protocol.control import CLIENT_METRICS
from streamworks.redis.client import create_redis
from streamworks.runtime.deadlines import lease_misfit
from streamworks.runtime.http import bind, open_worker_http
from streamworks.runtime.process import freeze_startup_heap, open_worker
from streamworks.settings import Settings

log = logging.getLogger("streamworks.cli")


@click.command()
@click.argument("target", metavar="MODULE:APP")
@click.option("--concurrency", type=click.IntRange(1, 100_000), help="override every handler's")
@click.option(
    "--processes",
    type=click.IntRange(1, 256),
    help="run N worker processes (N members) under a supervisor; see docs/operations.md",
)
@redis_options
@coordinator_options
@click.option(
    "--http-port",
    type=click.IntRange(0, 65535),
    help="port of /metrics, /livez, /readyz; 0 = any free one  [default: 9400; env "
    "STREAMWORKS_WORKER__HTTP_PORT]",
)
@click.option(
    "--http-host",
    help="address to serve them on  [default: 127.0.0.1; env STREAMWORKS_WORKER__HTTP_HOST]",
)
@click.option(
    "--no-http", is_flag=True, help="open no port  [env STREAMWORKS_WORKER__HTTP_ENABLED=false]"
)
# The supervisor's children: the port to try first when none was chosen (9400 + i).
@click.option("--default-http-port", type=click.IntRange(0, 65535), hidden=True)
@logging_options("INFO")
def worker(
    target: str,
    concurrency: int | None,
    processes: int | None,
    http_port: int | None,
    http_host: str | None,
    no_http: bool,
    default_http_port: int | None,
    log_level: str,
    log_format: str,
    **flags: Any,
) -> None:
    """Run one member of the app's group: read its shards, run its handlers.

    Serves /metrics (Prometheus), /livez and /readyz on --http-port unless --no-http.
    When no port was chosen (no --http-port, no STREAMWORKS_WORKER__HTTP_PORT) and the
    default 9400 is taken (another worker on this host), a free port is used and
    logged; a chosen port that is taken is an error.
    SIGTERM or Ctrl-C stops gracefully (finish in-flight work, ack, leave the group);
    a second signal exits at once (unfinished work stays pending for the next owner).
    With --processes N, N such workers run as children of a supervisor that restarts
    crashed ones and forwards the signals (docs/operations.md).
    """
    context = configure_logging(log_level, log_format)
    record_history()
    app = load_app(target)
    context.fields["group"] = app.name
    if not app.handlers and not app.schedules:
        fail(f"{target} declares no handlers and no schedules: nothing to run")
    settings = make_settings(**flags)
    http = {
        "http_port": http_port,
        "http_host": http_host,
        "http_enabled": False if no_http else None,
    }
    http = {k: v for k, v in http.items() if v is not None}
    chosen = http_port is not None or _port_in_environment()
    if default_http_port is not None and not chosen:
        http["http_port"] = default_http_port
    if http:
        settings = settings.model_copy(update={"worker": settings.worker.model_copy(update=http)})
    misfit = lease_misfit(settings)
    if misfit is not None:
        fail(f"invalid STREAMWORKS_* setting: {misfit}")
    if processes is not None:
        from streamworks.cli.supervisor import supervise_workers

        options = ["--log-level", log_level, "--log-format", log_format]
        if concurrency is not None:
            options += ["--concurrency", str(concurrency)]
        sys.exit(supervise_workers(target, processes, settings, flags, options, port_chosen=chosen))
    if concurrency is not None:
        for spec in app.handlers.values():
            spec.concurrency = concurrency
    run_async(_run)(app, settings, context, chosen)


def _port_in_environment() -> bool:
    """Whether the environment chose the worker's port (names are case-insensitive, as
    pydantic-settings reads them)."""
    return any(name.upper() == "STREAMWORKS_WORKER__HTTP_PORT" for name in os.environ)


async def _run(app: App, settings: Settings, context: ContextFilter, chosen: bool) -> None:
    redis = create_redis(settings)
    # Bound before joining: a taken port is one error line, not a member that joins
    # and leaves again.
    sock = _bind(settings, chosen) if settings.worker.http_enabled else None
    try:
        try:
            await redis.ping()
        except Exception as e:
            fail(f"cannot reach Redis at {safe_url(settings.redis_url)}: {e}")
        try:
            await _serve(app, settings, redis, sock, context)
        except* NamespaceMismatchError as group:
            # Raised inside the worker's task groups: one line, not a traceback.
            fail(str(_first(group)))
    finally:
        if sock is not None:
            sock.close()
        await redis.aclose()


def _first(group: BaseExceptionGroup[Any]) -> BaseException:
    error: BaseException = group
    while isinstance(error, BaseExceptionGroup):
        error = error.exceptions[0]
    return error


async def _serve(
    app: App, settings: Settings, redis: Any, sock: socket.socket | None, context: ContextFilter
) -> None:
    info = {CLIENT_METRICS: advertised_url(sock)} if sock is not None else {}
    async with (
        open_worker(app, settings, redis=redis, client_info=info) as member,
        contextlib.AsyncExitStack() as serving,
    ):
        context.fields["member"] = member.member_id
        where = "no HTTP endpoint (--no-http)"
        if sock is not None:
            url = await serving.enter_async_context(open_worker_http(member, sock))
            where = f"metrics at {url}/metrics"
        log.info(
            "member %s of group %s started (handlers: %s; coordinator: %s; %s)",
            member.member_id,
            app.name,
            ", ".join(sorted(app.handlers)),
            ", ".join(settings.coordinator_urls),
            where,
        )
        freeze_startup_heap()  # up and running: what exists now lives as long as the process
        async with anyio.create_task_group() as tg:
            tg.start_soon(_watch_signals, member)
            await member.stopped.wait()
            tg.cancel_scope.cancel()


def _bind(settings: Settings, chosen: bool) -> socket.socket:
    """The endpoint's socket. A port nobody chose that is taken (a second worker on
    this host) gives way to a free one, logged; a chosen one is an error (exit 2)."""
    host, port = settings.worker.http_host, settings.worker.http_port
    try:
        return bind(host, port)
    except OSError as e:
        if chosen or port == 0 or e.errno != errno.EADDRINUSE:
            fail(
                f"cannot serve the worker's HTTP endpoint on {host}:{port}: "
                f"{e.strerror or e} (choose another --http-port, or --no-http)",
                EXIT_USAGE,
            )
        sock = bind(host, 0)
        log.warning(
            "port %d is taken (another worker on this host?): serving /metrics, /livez "
            "and /readyz on %s instead (--http-port chooses one)",
            port,
            advertised_url(sock),
        )
        return sock


def advertised_url(sock: socket.socket) -> str:
    """The base URL others reach the endpoint at: the bound address, or this host's
    name when bound to every interface."""
    host, port = sock.getsockname()[:2]
    if host in ("0.0.0.0", "::"):
        host = socket.gethostname()
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


async def _watch_signals(member: Any) -> None:
    with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        async for signum in signals:
            if not member.stopping:
                log.info(
                    "%s: stopping gracefully (in-flight work finishes, then leave); "
                    "signal again to exit at once",
                    signal.Signals(signum).name,
                )
                member.request_stop()
            else:
                log.warning("second signal: exiting now; unfinished work stays pending")
                os._exit(2)
