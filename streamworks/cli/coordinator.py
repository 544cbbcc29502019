"""``streamworks coordinator`` — one coordinator replica (HTTP API + event loop)."""

from __future__ import annotations

import logging
import signal
import socket
from typing import Any

import anyio
import click

from streamworks.cli.common import (
    EXIT_USAGE,
    configure_logging,
    fail,
    logging_options,
    make_settings,
    record_history,
    redis_options,
    run_async,
    safe_url,
)
from streamworks.coordinator.http import QuietServer, create_api, server_config
from streamworks.coordinator.service import CoordinatorService
from streamworks.redis.client import create_redis
from streamworks.runtime.process import freeze_startup_heap
from streamworks.settings import Settings

log = logging.getLogger("streamworks.cli")


@click.command()
@redis_options
@click.option("--host", help="listen address [env STREAMWORKS_COORDINATOR__HOST]")
@click.option("--port", type=click.IntRange(0, 65535), help="[env STREAMWORKS_COORDINATOR__PORT]")
@click.option("--token", help="bearer token required from clients [env STREAMWORKS_TOKEN]")
@click.option(
    "--admin-token", help="bearer token for topology changes [env STREAMWORKS_ADMIN_TOKEN]"
)
@click.option(
    "--viewer-token",
    help="read-only token of the /ui dashboard [env STREAMWORKS_VIEWER_TOKEN]",
)
@logging_options("INFO")
def coordinator(
    host: str | None, port: int | None, log_level: str, log_format: str, **flags: Any
) -> None:
    """Run one coordinator replica. Run as many as you like against one Redis.

    SIGTERM enters terminating mode: /readyz fails, new critical sections are refused
    with the retryable COORDINATOR_TERMINATING, in-flight ones finish, then it exits.
    """
    configure_logging(log_level, log_format)
    record_history()
    settings = make_settings(**flags)
    changes = {k: v for k, v in {"host": host, "port": port}.items() if v is not None}
    if changes:
        settings = settings.model_copy(
            update={"coordinator": settings.coordinator.model_copy(update=changes)}
        )
    run_async(_run)(settings)


async def _run(settings: Settings) -> None:
    redis = create_redis(settings)
    try:
        try:
            await redis.ping()
        except Exception as e:
            fail(f"cannot reach Redis at {safe_url(settings.redis_url)}: {e}")
        host, port = settings.coordinator.host, settings.coordinator.port
        try:
            sock = bind_listener(host, port)
        except OSError as e:
            fail(
                f"cannot listen on {host}:{port}: {e.strerror or e} (another process, maybe "
                "a coordinator, uses it: choose another with --port)",
                EXIT_USAGE,
            )
        port = sock.getsockname()[1]
        service = CoordinatorService(redis, settings, replica=f"{socket.gethostname()}:{port}")
        # Written at start (SET NX): workers and producers check it in their Redis.
        log.info(
            "namespace %s (key %s)", await service.ensure_namespace(), service.keyspace.namespace()
        )
        config = server_config(create_api(service), settings, host=host, port=port)
        server = QuietServer(config)
        async with anyio.create_task_group() as tg:
            tg.start_soon(service.run_loop)
            tg.start_soon(_serve, server, tg.cancel_scope, sock)
            with anyio.fail_after(10):
                while not server.started and not server.should_exit:  # noqa: ASYNC110
                    await anyio.sleep(0.01)  # uvicorn exposes no started event
            if not server.started:
                fail(f"could not listen on {host}:{port}")
            freeze_startup_heap()  # the full GC passes were the heartbeat p99
            base = f"http://{f'[{host}]' if ':' in host else host}:{port}"
            log.info(
                "coordinator listening on %s (Redis %s, prefix %r, auth %s); dashboard: %s/ui/",
                base,
                safe_url(settings.redis_url),
                settings.key_prefix,
                "on" if settings.token else "off",
                base,
            )
            with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
                async for signum in signals:
                    log.info("%s: terminating", signal.Signals(signum).name)
                    await service.terminate(timeout=settings.coordinator.mutex_ttl * 2)
                    server.should_exit = True
                    break
    finally:
        await redis.aclose()


def bind_listener(host: str, port: int) -> socket.socket:
    """The listening socket, bound here so that a port in use is one clear error (uvicorn
    would log a traceback and exit with code 3)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
    except OSError:
        sock.close()
        raise
    return sock


async def _serve(server: QuietServer, scope: anyio.CancelScope, sock: socket.socket) -> None:
    await server.serve(sockets=[sock])
    scope.cancel()  # the server stopped (signal handled, or it failed to start)
