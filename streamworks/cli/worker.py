"""``streamworks worker MODULE:APP`` — one member of the app's consumer group."""

from __future__ import annotations

import logging
import os
import signal
import sys
from typing import Any

import anyio
import click

from streamworks.app import App
from streamworks.cli.common import (
    configure_logging,
    coordinator_options,
    fail,
    load_app,
    logging_options,
    make_settings,
    redis_options,
    run_async,
    safe_url,
)
from streamworks.cli.logs import ContextFilter
from streamworks.redis.client import create_redis
from streamworks.runtime.process import open_worker
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
@logging_options("INFO")
def worker(
    target: str,
    concurrency: int | None,
    processes: int | None,
    log_level: str,
    log_format: str,
    **flags: Any,
) -> None:
    """Run one member of the app's group: read its shards, run its handlers.

    SIGTERM or Ctrl-C stops gracefully (finish in-flight work, ack, leave the group);
    a second signal exits at once (unfinished work stays pending for the next owner).
    With --processes N, N such workers run as children of a supervisor that restarts
    crashed ones and forwards the signals (docs/operations.md).
    """
    context = configure_logging(log_level, log_format)
    app = load_app(target)
    context.fields["group"] = app.name
    if not app.handlers:
        fail(f"{target} declares no handlers: nothing to consume")
    settings = make_settings(**flags)
    if processes is not None:
        from streamworks.cli.supervisor import supervise_workers

        options = ["--log-level", log_level, "--log-format", log_format]
        if concurrency is not None:
            options += ["--concurrency", str(concurrency)]
        sys.exit(supervise_workers(target, processes, settings, flags, options))
    if concurrency is not None:
        for spec in app.handlers.values():
            spec.concurrency = concurrency
    run_async(_run)(app, settings, context)


async def _run(app: App, settings: Settings, context: ContextFilter) -> None:
    redis = create_redis(settings)
    try:
        try:
            await redis.ping()
        except Exception as e:
            fail(f"cannot reach Redis at {safe_url(settings.redis_url)}: {e}")
        async with open_worker(app, settings, redis=redis) as member:
            context.fields["member"] = member.member_id
            log.info(
                "member %s of group %s started (handlers: %s; coordinator: %s)",
                member.member_id,
                app.name,
                ", ".join(sorted(app.handlers)),
                ", ".join(settings.coordinator_urls),
            )
            async with anyio.create_task_group() as tg:
                tg.start_soon(_watch_signals, member)
                await member.stopped.wait()
                tg.cancel_scope.cancel()
    finally:
        await redis.aclose()


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
