"""``streamworks dev MODULE:APP`` — everything in one process, for a first run."""

from __future__ import annotations

import logging
import signal
from typing import Any

import anyio
import click
from rich.console import Console

from streamworks.app import App
from streamworks.cli.common import configure_logging, fail, load_app, make_settings, run_async
from streamworks.cli.render import status_view
from streamworks.settings import Settings
from streamworks.testing.embedded import EmbeddedRedis
from streamworks.testing.runtime import TestRuntime

console = Console()
log = logging.getLogger("streamworks.cli")


@click.command()
@click.argument("target", metavar="MODULE:APP")
@click.option("--workers", type=click.IntRange(0, 64), default=2, show_default=True)
@click.option("--log-level", default="WARNING", show_default=True)
def dev(target: str, workers: int, log_level: str, **_: Any) -> None:
    """Embedded Redis + a coordinator (HTTP) + N workers of the app, in one process.

    The coordinator URL is printed, so `streamworks status --coordinator URL` works
    from another terminal. Ctrl-C stops everything; the embedded Redis is discarded.
    """
    configure_logging(log_level)
    app = load_app(target)
    settings = make_settings()
    console.print(
        f"starting an embedded Redis, a coordinator and {workers} workers of {app.name!r}"
    )
    # Always a private server: never a Redis named by the environment (such as
    # STREAMWORKS_TEST_REDIS_URL, which TestRuntime would otherwise pick up).
    try:
        server = EmbeddedRedis().start()
    except (OSError, RuntimeError) as e:
        fail(f"cannot start an embedded Redis: {e}")
    try:
        run_async(_run)(app, workers, settings.with_overrides(redis_url=server.url))
    finally:
        server.stop()


async def _run(app: App, workers: int, settings: Settings) -> None:
    async with TestRuntime(
        app, workers=workers, settings=settings, redis_url=settings.redis_url, http=True
    ) as rt:
        console.print(f"coordinator: [b]{rt.http_url}[/b]  Redis: [b]{rt.settings.redis_url}[/b]")
        console.print(f"  streamworks status --coordinator {rt.http_url}")
        assert rt.service is not None
        console.print(status_view(await rt.service.status()))
        console.print("running; Ctrl-C to stop")
        with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
            async for _ in signals:
                console.print("stopping ...")
                break
